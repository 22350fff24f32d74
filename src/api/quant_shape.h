// The kernels' description (QuantShape, quant_index.h) of a tile that the plan layer describes:
// plan::SourceQuantTile's QuantTile, and for a requantized FP8 source plan::DequantSourceOf's
// scales. Header-only, here because src/api may include both layers (the session and the CUDA
// tests use it); the kernels themselves never see plan types.
#pragma once

#include "src/cuda/quant_index.h"
#include "src/plan/quant_spec.h"
#include "src/plan/quantize.h"

namespace reshard::internal {

// `t.src_dtype` is bf16, fp16 or fp32, or an FP8 type with `fp8` set (its scales).
inline cuda::QuantShape QuantShapeOf(const plan::QuantTile& t,
                                     const plan::DequantSource* fp8 = nullptr) {
  cuda::QuantShape s;
  using cuda::QuantSource;
  switch (t.src_dtype) {
    case plan::DType::kBf16: s.source = QuantSource::kBf16; break;
    case plan::DType::kFp16: s.source = QuantSource::kFp16; break;
    case plan::DType::kFp8E4M3: s.source = QuantSource::kFp8E4M3; break;
    case plan::DType::kFp8E5M2: s.source = QuantSource::kFp8E5M2; break;
    default: s.source = QuantSource::kFp32; break;
  }
  s.ndim = t.ndim;
  s.mx = t.arith == plan::QuantArith::kMx;
  s.e5m2 = t.format == quant::Fp8Format::kE5M2;
  for (int d = 0; d < t.ndim; ++d) {
    s.extent[d] = t.extent[d];
    s.src_stride[d] = t.src_strides[d];
    s.block[d] = t.block[d];
  }
  if (fp8 != nullptr) {
    s.fp8_mx = fp8->mx;
    for (int d = 0; d < t.ndim; ++d) {
      s.fp8_block[d] = fp8->block[d];
      s.fp8_phase[d] = fp8->phase[d];
      s.fp8_scale_stride[d] = fp8->scale_strides[d];
    }
  }
  cuda::FinishQuantShape(s);
  return s;
}

}  // namespace reshard::internal
