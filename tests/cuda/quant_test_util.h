// Random quantization tiles for the CUDA quantization tests (quant_index_test on the host,
// quant_kernel_test on a device): plan::QuantTile descriptions over a padded, permuted and partly
// reversed source buffer, values with the edges (zeros, subnormals, NaN, Inf, huge values), and
// the cuda::QuantShape of a tile.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "src/cuda/quant_index.h"
#include "src/plan/quantize.h"

namespace reshard::cuda::testing {

struct RandomQuantTile {
  plan::QuantTile tile;        // src points into `source`; out, scales unset.
  std::vector<uint8_t> source;
  int64_t num_blocks = 1;
};

// A source bit pattern of `bytes` (2 or 4): mostly ordinary values of a random binade, one in
// eight a special one (zero, subnormal, NaN, Inf, largest finite).
inline uint32_t RandomSourceBits(std::mt19937_64& rng, plan::DType dtype) {
  const uint64_t v = rng();
  const bool fp32 = dtype == plan::DType::kFp32, fp16 = dtype == plan::DType::kFp16;
  const int mant_bits = fp32 ? 23 : fp16 ? 10 : 7, exp_bits = fp16 ? 5 : 8;
  const uint32_t exp_max = (1u << exp_bits) - 1, bias = exp_max / 2;
  uint32_t mant = static_cast<uint32_t>(v >> 20) & ((1u << mant_bits) - 1);
  uint32_t exp = bias - 4 + static_cast<uint32_t>((v >> 8) % 9);
  switch (v & 63) {
    case 0: exp = 0; mant = 0; break;                              // +-0
    case 1: exp = 0; mant |= 1; break;                             // subnormal
    case 2: exp = exp_max; mant |= 1u << (mant_bits - 1); break;   // NaN
    case 3: exp = exp_max; mant = 0; break;                        // +-Inf
    case 4: exp = exp_max - 1; break;                              // huge
    default: break;
  }
  return (static_cast<uint32_t>(v >> 63) << (exp_bits + mant_bits)) | (exp << mant_bits) | mant;
}

inline RandomQuantTile MakeRandomQuantTile(std::mt19937_64& rng, int max_extent = 9) {
  RandomQuantTile r;
  plan::QuantTile& t = r.tile;
  const plan::DType dtypes[] = {plan::DType::kBf16, plan::DType::kFp16, plan::DType::kFp32};
  t.src_dtype = dtypes[rng() % 3];
  t.ndim = static_cast<int>(rng() % 5);
  t.arith = rng() % 2 ? plan::QuantArith::kMx : plan::QuantArith::kFp32Scale;
  t.format = rng() % 2 ? quant::Fp8Format::kE5M2 : quant::Fp8Format::kE4M3;
  // The buffer: the tile's dims in a random order, each padded, some walked backwards.
  int order[plan::kMaxTensorDims];
  for (int d = 0; d < t.ndim; ++d) order[d] = d;
  std::shuffle(order, order + t.ndim, rng);
  int64_t stride = 1, base = 0;
  for (int k = t.ndim - 1; k >= 0; --k) {
    const int d = order[k];
    t.extent[d] = static_cast<int64_t>(rng() % (max_extent + 1));
    t.block[d] = 1 + static_cast<int64_t>(rng() % (max_extent + 3));
    const int64_t padded = t.extent[d] + static_cast<int64_t>(rng() % 3);
    const bool reversed = rng() % 4 == 0;
    t.src_strides[d] = reversed ? -stride : stride;
    if (reversed && t.extent[d] > 0) base += (t.extent[d] - 1) * stride;
    stride *= std::max<int64_t>(padded, 1);
  }
  const int elem = plan::DTypeSize(t.src_dtype);
  r.source.resize(static_cast<size_t>(stride * elem));
  for (size_t i = 0; i < r.source.size(); i += elem) {
    const uint32_t bits = RandomSourceBits(rng, t.src_dtype);
    std::memcpy(&r.source[i], &bits, elem);
  }
  t.src = r.source.data() + base * elem;
  r.num_blocks = plan::NumBlocks(t);
  return r;
}

// The kernels' description of `t`, and the offset of t.src from the buffer's start (elements).
inline QuantShape ShapeOf(const plan::QuantTile& t) {
  QuantShape s;
  s.source = t.src_dtype == plan::DType::kBf16   ? QuantSource::kBf16
             : t.src_dtype == plan::DType::kFp16 ? QuantSource::kFp16
                                                 : QuantSource::kFp32;
  s.ndim = t.ndim;
  s.mx = t.arith == plan::QuantArith::kMx;
  s.e5m2 = t.format == quant::Fp8Format::kE5M2;
  for (int d = 0; d < t.ndim; ++d) {
    s.extent[d] = t.extent[d];
    s.src_stride[d] = t.src_strides[d];
    s.block[d] = t.block[d];
  }
  FinishQuantShape(s);
  return s;
}

}  // namespace reshard::cuda::testing
