// FP8 quantization of one tile on the CPU (docs/quantization.md).
//
// A quantized tensor is cut into blocks (the tile's origin is a block origin, so every tile is
// quantized on its own); each block gets one scale from the largest finite magnitude among its
// elements, and each element is encoded to FP8 with its block's scale. The arithmetic is
// src/common/quant_math.h, which the CUDA kernels share, so host and device agree bit for bit.
// Block shapes name the schemes: [128, 128] (block), [1, 32] with E8M0 scales (MX),
// [1, K] (per channel), the whole shape (per tensor).
//
// Thread-compatible: QuantizeTile keeps no state; calls on disjoint outputs may run in parallel.
#pragma once

#include <cstdint>

#include "src/common/quant_math.h"
#include "src/plan/dtype.h"
#include "src/plan/spec.h"

namespace reshard::plan {

// How a block's scale is chosen and applied.
enum class QuantArith : uint8_t {
  // scale = amax / Fp8Max (fp32; 1 for a block without a finite nonzero element),
  // q = EncodeFp8(x / scale); dequantized as q * scale.
  kFp32Scale,
  // OCP MX: an E8M0 byte b = floor(log2(amax)) - Fp8Emax + 127 (127 for amax 0),
  // q = EncodeFp8(x * 2^(127 - b)); dequantized as q * 2^(b - 127).
  kMx,
};

// One tile to quantize: where its source elements are, its block shape, and where its FP8
// elements and scales go. Plain data; QuantizeTile reads and writes only through the pointers.
struct QuantTile {
  DType src_dtype = DType::kBf16;            // kBf16, kFp16 or kFp32
  const uint8_t* src = nullptr;              // element i at src + elem * sum_k i_k * src_strides[k]
  int ndim = 0;                              // 0..kMaxTensorDims; 0 = one element
  int64_t extent[kMaxTensorDims] = {};       // the tile's extents (>= 0)
  int64_t src_strides[kMaxTensorDims] = {};  // in elements, any sign
  // Block extents (>= 1); the tile's origin is a block origin; the last block of a dim may be
  // partial, and a block may be larger than the tile (per-tensor scales of a sharded tensor).
  int64_t block[kMaxTensorDims] = {};
  QuantArith arith = QuantArith::kFp32Scale;
  quant::Fp8Format format = quant::Fp8Format::kE4M3;
  uint8_t* out = nullptr;  // row-major tile, 1 byte per element (contiguous)
  // Row-major over ceil(extent / block) per dim: fp32 (4 bytes, kFp32Scale) or E8M0 (1 byte,
  // kMx). Written byte-wise: no alignment needed.
  uint8_t* scales = nullptr;
  // When set, each block's amax (row-major over the tile's blocks, like the scales) is taken from
  // here instead of from the tile's elements: a block the tile shares with other tiles, whose
  // partial amaxes (BlockAmax) were combined first.
  const float* amax = nullptr;
};

// Quantizes the tile: each block's amax over its finite elements, its scale, then every element
// (see QuantArith and quant_math.h for the exact arithmetic). Allocates nothing; the innermost
// dimension is a plain loop, contiguous when its stride is 1. An invalid tile (dtype other than
// bf16/fp16/fp32, ndim out of range, a negative extent, a block extent < 1, a null pointer for a
// non-empty tile) is a broken invariant of the caller: RESHARD_CHECK.
void QuantizeTile(const QuantTile& t);

// The tile's partial amaxes: each block's largest finite magnitude among the tile's elements (0
// when none), row-major over the tile's blocks into `amax` (NumBlocks(t) floats); reads only
// t.src. Combined across the tiles that share a block (their max), they are QuantizeTile's amax.
void BlockAmax(const QuantTile& t, float* amax);

// Blocks of the tile, the product of ceil(extent / block): the number of scales written.
int64_t NumBlocks(const QuantTile& t);

// Bytes of one scale.
inline int ScaleBytes(QuantArith a) { return a == QuantArith::kMx ? 1 : 4; }

}  // namespace reshard::plan
