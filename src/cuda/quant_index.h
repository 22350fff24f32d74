// What the FP8 quantization kernels (quant_kernels.cu) compute per element and per block,
// compiled for host and device (RESHARD_HD) so that the CPU tests it: where element `linear` of
// a tile lives in the source and which block it belongs to, its value as fp32, its contribution
// to the block's amax, the block's scale, and its FP8 byte. The arithmetic is quant_math.h's;
// composed as the kernels compose it (tests/cuda/quant_index_test.cc), it equals
// plan::QuantizeTile bit for bit, and for an FP8 source of another scheme (requantized: each
// element dequantized with its source block's scale as it is loaded) plan::DequantizeTile then
// plan::QuantizeTile.
#pragma once

#include <cstdint>
#include <cstring>

#include "src/common/host_device.h"
#include "src/common/quant_math.h"

namespace reshard::cuda {

inline constexpr int kMaxQuantDims = 8;  // plan::kMaxTensorDims

// kFp8E4M3 / kFp8E5M2: a requantized FP8 source, read with its own block scales (QuantShape's
// fp8_* fields) as plan::DequantizeTile reads it.
enum class QuantSource : int32_t { kBf16 = 0, kFp16 = 1, kFp32 = 2, kFp8E4M3 = 3, kFp8E5M2 = 4 };

RESHARD_HD inline bool IsFp8Source(QuantSource s) {
  return s == QuantSource::kFp8E4M3 || s == QuantSource::kFp8E5M2;
}

// One tile as plan::QuantTile describes it, without its pointers: `ndim` dims of `extent`
// elements read at element `src_stride`s (any sign), cut into blocks of `block` (the tile's
// origin a block origin; `blocks` = ceil(extent / block) per dim), `elements` and `num_blocks`
// their products. FP8 bytes are written row-major over the tile, scales row-major over the blocks
// (fp32, or E8M0 bytes when `mx`).
//
// An FP8 source (IsFp8Source) has blocks of its own, `fp8_block` per dim, each with one scale
// (fp32, or E8M0 when `fp8_mx`) read at element `fp8_scale_stride`s from the scale of the tile's
// first source block; `fp8_phase` is where the tile starts inside that block (the tile's global
// origin modulo fp8_block: nonzero only along a dim the source holds as one block, whose tiles
// may start anywhere). Element i of a dim then has source block (fp8_phase + i) / fp8_block.
struct QuantShape {
  QuantSource source = QuantSource::kBf16;
  int32_t ndim = 0;
  bool mx = false;
  bool e5m2 = false;
  int64_t extent[kMaxQuantDims] = {};
  int64_t src_stride[kMaxQuantDims] = {};
  int64_t block[kMaxQuantDims] = {};
  int64_t blocks[kMaxQuantDims] = {};
  int64_t elements = 1;
  int64_t num_blocks = 1;
  bool fp8_mx = false;
  int64_t fp8_block[kMaxQuantDims] = {};
  int64_t fp8_phase[kMaxQuantDims] = {};
  int64_t fp8_scale_stride[kMaxQuantDims] = {};
};

// Fills blocks, elements and num_blocks from ndim, extent and block.
inline void FinishQuantShape(QuantShape& s) {
  s.elements = 1;
  s.num_blocks = 1;
  for (int d = 0; d < s.ndim; ++d) {
    s.blocks[d] = (s.extent[d] + s.block[d] - 1) / s.block[d];
    s.elements *= s.extent[d];
    s.num_blocks *= s.blocks[d];
  }
}

struct QuantElement {
  int64_t src_offset = 0;  // In elements from the tile's first source element.
  int64_t block = 0;       // Row-major over the tile's blocks.
  int64_t src_scale = 0;   // An FP8 source's: its source block's scale, in scales from the first.
};

// Element `linear` (row-major over the tile's extents, also its FP8 byte's index).
RESHARD_HD inline QuantElement LocateQuantElement(const QuantShape& s, int64_t linear) {
  QuantElement e;
  int64_t block_stride = 1;
  const bool fp8 = IsFp8Source(s.source);
  for (int d = s.ndim - 1; d >= 0; --d) {
    const int64_t i = linear % s.extent[d];
    linear /= s.extent[d];
    e.src_offset += i * s.src_stride[d];
    e.block += (i / s.block[d]) * block_stride;
    block_stride *= s.blocks[d];
    if (fp8) e.src_scale += ((s.fp8_phase[d] + i) / s.fp8_block[d]) * s.fp8_scale_stride[d];
  }
  return e;
}

// An aligned element of T (uint16_t, uint32_t) at element `offset` from `src`.
template <typename T>
RESHARD_HD inline T LoadAligned(const uint8_t* src, int64_t offset) {
#if defined(__CUDA_ARCH__)
  return reinterpret_cast<const T*>(src)[offset];
#else
  T v;
  std::memcpy(&v, src + offset * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return v;
#endif
}

// The source element at `offset` (elements) from `src` as fp32, exactly.
RESHARD_HD inline float LoadQuantSource(QuantSource source, const uint8_t* src, int64_t offset) {
  switch (source) {
    case QuantSource::kBf16:
      return quant::Bf16ToFloat(LoadAligned<uint16_t>(src, offset));
    case QuantSource::kFp16:
      return quant::HalfToFloat(LoadAligned<uint16_t>(src, offset));
    case QuantSource::kFp32:
    case QuantSource::kFp8E4M3:  // Not through here: LoadQuantElement.
    case QuantSource::kFp8E5M2:
      break;
  }
  return quant::FloatFromBits(LoadAligned<uint32_t>(src, offset));
}

// Element `at` of the tile as fp32: LoadQuantSource, or for an FP8 source DecodeFp8 times its
// source block's scale (one IEEE fp32 multiplication, quant::DequantizeAs; an E8M0 scale is
// MxScale of its byte), exactly as plan::DequantizeTile computes it. `src_scales` points at the
// scale of the tile's first source block (fp32 scales 4-byte aligned); unused otherwise.
RESHARD_HD inline float LoadQuantElement(const QuantShape& s, const uint8_t* src,
                                         const uint8_t* src_scales, const QuantElement& at) {
  if (!IsFp8Source(s.source)) return LoadQuantSource(s.source, src, at.src_offset);
  const float scale =
      s.fp8_mx ? quant::MxScale(src_scales[at.src_scale])
               : quant::FloatFromBits(LoadAligned<uint32_t>(src_scales, at.src_scale));
  return s.source == QuantSource::kFp8E4M3
             ? quant::DequantizeAs<quant::Fp8Format::kE4M3>(src[at.src_offset], scale)
             : quant::DequantizeAs<quant::Fp8Format::kE5M2>(src[at.src_offset], scale);
}

// The bits of |x| when x is finite, else 0: a block's amax is the largest of these (non-negative
// floats order as their bit patterns), as quant::AmaxUpdate from 0 gives it.
RESHARD_HD inline uint32_t AmaxBits(float x) {
  const uint32_t a = quant::FloatBits(x) & 0x7FFFFFFFu;
  return a < 0x7F800000u ? a : 0u;
}

// A block's scale from its amax, written to `scale` (4 bytes of fp32, byte-wise, or one E8M0
// byte), and the factor its elements are quantized with (the scale, or MxMultiplier).
RESHARD_HD inline float BlockScale(const QuantShape& s, float amax, uint8_t* scale) {
  const quant::Fp8Format f = s.e5m2 ? quant::Fp8Format::kE5M2 : quant::Fp8Format::kE4M3;
  if (s.mx) {
    const uint8_t e8m0 = quant::MxScaleFromAmax(amax, f);
    scale[0] = e8m0;
    return quant::MxMultiplier(e8m0);
  }
  const float value = quant::ScaleFromAmax(amax, f);
  const uint32_t bits = quant::FloatBits(value);
  for (int i = 0; i < 4; ++i) scale[i] = static_cast<uint8_t>(bits >> (8 * i));
  return value;
}

// One element's FP8 byte with its block's factor (BlockScale).
RESHARD_HD inline uint8_t QuantizeElement(const QuantShape& s, float x, float factor) {
  using quant::Fp8Format;
  if (s.mx) {
    return s.e5m2 ? quant::QuantizeMxAs<Fp8Format::kE5M2>(x, factor)
                  : quant::QuantizeMxAs<Fp8Format::kE4M3>(x, factor);
  }
  return s.e5m2 ? quant::QuantizeScaledAs<Fp8Format::kE5M2>(x, factor)
                : quant::QuantizeScaledAs<Fp8Format::kE4M3>(x, factor);
}

}  // namespace reshard::cuda
