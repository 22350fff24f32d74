#include "src/plan/quantize.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "src/common/status.h"

namespace reshard::plan {
namespace {

using quant::Fp8Format;

// Blocks along the last dim whose amaxes are gathered before their elements are quantized: the
// two passes over a chunk stay in cache when the chunk's elements fit kChunkBytes, and the
// chunk's amaxes and scales live in fixed arrays on the stack (nothing is allocated).
constexpr int kChunkBlocks = 256;
constexpr int64_t kChunkBytes = 256 << 10;

// A source element type: its raw bits, the mask that clears the sign, and +Inf. Magnitudes are
// compared as raw bits (non-negative floats of one type order as their bit patterns), so the
// amax pass is an integer max-reduction.
struct Bf16Source {
  using Raw = uint16_t;
  static constexpr uint32_t kAbsMask = 0x7FFF;
  static constexpr uint32_t kInf = 0x7F80;
  static float ToFloat(Raw r) { return quant::Bf16ToFloat(r); }
};
struct Fp16Source {
  using Raw = uint16_t;
  static constexpr uint32_t kAbsMask = 0x7FFF;
  static constexpr uint32_t kInf = 0x7C00;
  static float ToFloat(Raw r) { return quant::HalfToFloat(r); }
};
struct Fp32Source {
  using Raw = uint32_t;
  static constexpr uint32_t kAbsMask = 0x7FFFFFFF;
  static constexpr uint32_t kInf = 0x7F800000;
  static float ToFloat(Raw r) { return quant::FloatFromBits(r); }
};

// Unaligned-safe load of one raw element.
template <typename S>
typename S::Raw Load(const uint8_t* p) {
  typename S::Raw r;
  std::memcpy(&r, p, sizeof(r));
  return r;
}

// The largest finite magnitude's bits among n elements (0 when none is finite). kContiguous
// makes the stride a constant so the loop vectorises; the mask instead of a select and the
// signed accumulator of the element's width are what GCC vectorises with plain SSE2.
template <typename S, bool kContiguous>
uint32_t RunAmax(const uint8_t* src, int64_t stride_bytes, int64_t n) {
  using Accumulator = std::conditional_t<sizeof(typename S::Raw) == 2, int16_t, int32_t>;
  const int64_t stride = kContiguous ? int64_t{sizeof(typename S::Raw)} : stride_bytes;
  Accumulator amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t a = Load<S>(src + i * stride) & S::kAbsMask;
    // a - kInf wraps to >= 2^31 exactly when a < kInf (a is below 2^31): all ones when finite.
    const uint32_t finite_mask = 0u - ((a - S::kInf) >> 31);
    const Accumulator finite = static_cast<Accumulator>(a & finite_mask);
    amax = amax > finite ? amax : finite;
  }
  return static_cast<uint32_t>(amax);
}

// Encodes n elements with one block's parameter: the scale (fp32 schemes) or the multiplier
// 2^(127 - b) (MX).
template <typename S, Fp8Format F, bool kMx, bool kContiguous>
void RunQuantize(const uint8_t* src, int64_t stride_bytes, int64_t n, float param, uint8_t* out) {
  const int64_t stride = kContiguous ? int64_t{sizeof(typename S::Raw)} : stride_bytes;
  for (int64_t i = 0; i < n; ++i) {
    const float x = S::ToFloat(Load<S>(src + i * stride));
    out[i] = kMx ? quant::QuantizeMxAs<F>(x, param) : quant::QuantizeScaledAs<F>(x, param);
  }
}

// The tile with ndim >= 1 (a 0-d tile is one element of extent 1), strides in bytes.
struct Geometry {
  int nd = 1;
  int64_t extent[kMaxTensorDims] = {};
  int64_t block[kMaxTensorDims] = {};
  int64_t blocks[kMaxTensorDims] = {};      // ceil(extent / block)
  int64_t src_stride[kMaxTensorDims] = {};  // bytes
  int64_t out_stride[kMaxTensorDims] = {};  // elements of the row-major output
};

// Calls fn(src_offset_bytes, out_offset) for the first element of every row (every index of
// the dims before the last) in the box [lo, hi) of those dims, row-major.
template <typename Fn>
void ForEachRow(const Geometry& g, const int64_t* lo, const int64_t* hi, Fn&& fn) {
  const int outer = g.nd - 1;
  int64_t idx[kMaxTensorDims];
  int64_t src_offset = 0;
  int64_t out_offset = 0;
  for (int k = 0; k < outer; ++k) {
    idx[k] = lo[k];
    src_offset += lo[k] * g.src_stride[k];
    out_offset += lo[k] * g.out_stride[k];
  }
  while (true) {
    fn(src_offset, out_offset);
    int k = outer - 1;
    for (; k >= 0; --k) {
      ++idx[k];
      src_offset += g.src_stride[k];
      out_offset += g.out_stride[k];
      if (idx[k] < hi[k]) break;
      src_offset -= (idx[k] - lo[k]) * g.src_stride[k];
      out_offset -= (idx[k] - lo[k]) * g.out_stride[k];
      idx[k] = lo[k];
    }
    if (k < 0) return;
  }
}

// kAmaxOnly: writes each block's amax to `amax_out` and quantizes nothing (BlockAmax).
template <typename S, Fp8Format F, bool kMx, bool kContiguous, bool kAmaxOnly = false>
void QuantizeBlocks(const QuantTile& t, const Geometry& g, float* amax_out = nullptr) {
  const int last = g.nd - 1;
  const int64_t width = g.extent[last];
  const int64_t block_width = g.block[last];
  const int64_t last_blocks = g.blocks[last];
  const int64_t last_stride = g.src_stride[last];

  // Rows of a block row (at most) and the chunk of blocks along the last dim that fits the cache
  // budget; a single block bigger than the budget is one chunk.
  int64_t rows = 1;
  for (int k = 0; k < last; ++k) rows *= std::min(g.block[k], g.extent[k]);
  const int64_t block_bytes =
      rows * std::min(block_width, width) * int64_t{sizeof(typename S::Raw)};
  const int64_t chunk = std::clamp<int64_t>(kChunkBytes / block_bytes, 1, kChunkBlocks);

  uint32_t amax[kChunkBlocks];
  float param[kChunkBlocks];
  int64_t block_index[kMaxTensorDims] = {};  // of the block row, dims before the last
  int64_t lo[kMaxTensorDims] = {};
  int64_t hi[kMaxTensorDims] = {};
  int64_t block_row = 0;  // row-major index of the block row among all block rows
  while (true) {
    for (int k = 0; k < last; ++k) {
      lo[k] = block_index[k] * g.block[k];
      hi[k] = std::min(lo[k] + g.block[k], g.extent[k]);
    }
    for (int64_t first = 0; first < last_blocks; first += chunk) {
      const int64_t count = std::min(chunk, last_blocks - first);
      const int64_t block0 = block_row * last_blocks + first;  // Row-major block index.
      if (t.amax == nullptr) {
        std::fill(amax, amax + count, 0u);
        ForEachRow(g, lo, hi, [&](int64_t src_offset, int64_t) {
          for (int64_t j = 0; j < count; ++j) {
            const int64_t c0 = (first + j) * block_width;
            const int64_t n = std::min(block_width, width - c0);
            amax[j] = std::max(amax[j], RunAmax<S, kContiguous>(t.src + src_offset + c0 * last_stride,
                                                                last_stride, n));
          }
        });
      }
      if constexpr (kAmaxOnly) {
        for (int64_t j = 0; j < count; ++j) {
          amax_out[block0 + j] = S::ToFloat(static_cast<typename S::Raw>(amax[j]));
        }
        continue;
      }
      for (int64_t j = 0; j < count; ++j) {
        const float block_amax = t.amax != nullptr
                                     ? t.amax[block0 + j]
                                     : S::ToFloat(static_cast<typename S::Raw>(amax[j]));
        uint8_t* scale_out = t.scales + (block0 + j) * ScaleBytes(t.arith);
        if constexpr (kMx) {
          const uint8_t e8m0 = quant::MxScaleFromAmax(block_amax, F);
          *scale_out = e8m0;
          param[j] = quant::MxMultiplier(e8m0);
        } else {
          const float scale = quant::ScaleFromAmax(block_amax, F);
          std::memcpy(scale_out, &scale, sizeof(scale));
          param[j] = scale;
        }
      }
      ForEachRow(g, lo, hi, [&](int64_t src_offset, int64_t out_offset) {
        for (int64_t j = 0; j < count; ++j) {
          const int64_t c0 = (first + j) * block_width;
          const int64_t n = std::min(block_width, width - c0);
          RunQuantize<S, F, kMx, kContiguous>(t.src + src_offset + c0 * last_stride, last_stride, n,
                                              param[j], t.out + out_offset + c0);
        }
      });
    }
    ++block_row;
    int k = last - 1;
    for (; k >= 0; --k) {
      if (++block_index[k] < g.blocks[k]) break;
      block_index[k] = 0;
    }
    if (k < 0) return;
  }
}

template <typename S, Fp8Format F, bool kMx>
void QuantizeAs(const QuantTile& t, const Geometry& g) {
  if (g.src_stride[g.nd - 1] == int64_t{sizeof(typename S::Raw)}) {
    QuantizeBlocks<S, F, kMx, true>(t, g);
  } else {
    QuantizeBlocks<S, F, kMx, false>(t, g);
  }
}

template <typename S>
void QuantizeFrom(const QuantTile& t, const Geometry& g) {
  const bool mx = t.arith == QuantArith::kMx;
  if (t.format == Fp8Format::kE4M3) {
    mx ? QuantizeAs<S, Fp8Format::kE4M3, true>(t, g) : QuantizeAs<S, Fp8Format::kE4M3, false>(t, g);
  } else {
    mx ? QuantizeAs<S, Fp8Format::kE5M2, true>(t, g) : QuantizeAs<S, Fp8Format::kE5M2, false>(t, g);
  }
}

void CheckTile(const QuantTile& t) {
  RESHARD_CHECK_MSG(t.ndim >= 0 && t.ndim <= kMaxTensorDims, "QuantTile: ndim out of range");
  for (int k = 0; k < t.ndim; ++k) {
    RESHARD_CHECK_MSG(t.extent[k] >= 0, "QuantTile: negative extent");
    RESHARD_CHECK_MSG(t.block[k] >= 1, "QuantTile: block extents must be at least 1");
  }
  RESHARD_CHECK_MSG(
      t.src_dtype == DType::kBf16 || t.src_dtype == DType::kFp16 || t.src_dtype == DType::kFp32,
      "QuantTile: the source must be bf16, fp16 or fp32");
  RESHARD_CHECK_MSG(t.arith == QuantArith::kFp32Scale || t.arith == QuantArith::kMx,
                    "QuantTile: unknown arithmetic");
  RESHARD_CHECK_MSG(t.format == Fp8Format::kE4M3 || t.format == Fp8Format::kE5M2,
                    "QuantTile: unknown FP8 format");
}

}  // namespace

int64_t NumBlocks(const QuantTile& t) {
  CheckTile(t);
  int64_t n = 1;
  for (int k = 0; k < t.ndim; ++k) n *= (t.extent[k] + t.block[k] - 1) / t.block[k];
  return n;
}

namespace {

Geometry GeometryOf(const QuantTile& t) {
  Geometry g;
  const int64_t elem = DTypeSize(t.src_dtype);
  if (t.ndim == 0) {
    g.nd = 1;
    g.extent[0] = g.block[0] = g.blocks[0] = 1;
    g.src_stride[0] = elem;
    g.out_stride[0] = 1;
  } else {
    g.nd = t.ndim;
    int64_t out_stride = 1;
    for (int k = t.ndim - 1; k >= 0; --k) {
      g.extent[k] = t.extent[k];
      g.block[k] = t.block[k];
      g.blocks[k] = (t.extent[k] + t.block[k] - 1) / t.block[k];
      g.src_stride[k] = t.src_strides[k] * elem;
      g.out_stride[k] = out_stride;
      out_stride *= t.extent[k];
    }
  }
  return g;
}

template <typename S>
void AmaxFrom(const QuantTile& t, const Geometry& g, float* amax) {
  // The format and arithmetic do not change amaxes: one instantiation serves them all.
  if (g.src_stride[g.nd - 1] == int64_t{sizeof(typename S::Raw)}) {
    QuantizeBlocks<S, Fp8Format::kE4M3, false, true, true>(t, g, amax);
  } else {
    QuantizeBlocks<S, Fp8Format::kE4M3, false, false, true>(t, g, amax);
  }
}

}  // namespace

void QuantizeTile(const QuantTile& t) {
  if (NumBlocks(t) == 0) return;  // an empty tile (NumBlocks checks the tile)
  RESHARD_CHECK_MSG(t.src != nullptr && t.out != nullptr && t.scales != nullptr,
                    "QuantTile: null source, output or scales for a non-empty tile");
  const Geometry g = GeometryOf(t);
  switch (t.src_dtype) {
    case DType::kBf16:
      QuantizeFrom<Bf16Source>(t, g);
      break;
    case DType::kFp16:
      QuantizeFrom<Fp16Source>(t, g);
      break;
    default:
      QuantizeFrom<Fp32Source>(t, g);
      break;
  }
}

void BlockAmax(const QuantTile& t, float* amax) {
  if (NumBlocks(t) == 0) return;
  RESHARD_CHECK_MSG(t.src != nullptr && amax != nullptr,
                    "QuantTile: null source or amax output for a non-empty tile");
  QuantTile own = t;
  own.amax = nullptr;  // Computed here, not taken.
  const Geometry g = GeometryOf(own);
  switch (t.src_dtype) {
    case DType::kBf16:
      AmaxFrom<Bf16Source>(own, g, amax);
      break;
    case DType::kFp16:
      AmaxFrom<Fp16Source>(own, g, amax);
      break;
    default:
      AmaxFrom<Fp32Source>(own, g, amax);
      break;
  }
}

}  // namespace reshard::plan
