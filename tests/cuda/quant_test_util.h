// Random quantization tiles for the CUDA quantization tests (quant_index_test on the host,
// quant_kernel_test on a device): plan::QuantTile descriptions over a padded, permuted and partly
// reversed source buffer, values with the edges (zeros, subnormals, NaN, Inf, huge values), and
// the cuda::QuantShape of a tile.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "src/cuda/quant_index.h"
#include "src/api/quant_shape.h"
#include "src/plan/quant_spec.h"
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

// A requantized FP8 source's tile (plan::QuantizedSource with its own scheme, blocks, element
// and scale views) and the destination quantization it is requantized to. `tile` describes the
// FP8 tile as plan::SourceQuantTile does (src into `bytes`, out and scales unset); `fp8` its
// scales (into `scales`).
struct RandomRequantTile {
  plan::QuantizedSource qs;
  std::vector<int64_t> shape;  // The tensor's.
  plan::Box box;               // The rank's tile of it (non-empty).
  std::vector<uint8_t> bytes;  // The rank's FP8 source buffer.
  std::vector<uint8_t> scales; // The rank's source scale buffer.
  plan::QuantTile tile;
  plan::DequantSource fp8;
};

// Random element strides over `extent` (dims in a random order, each padded by 0-2) with an offset
// of 0-3 elements; returns the buffer's length in elements.
inline int64_t RandomView(std::mt19937_64& rng, int ndim, const int64_t* extent,
                          plan::View& view) {
  view.offset = static_cast<int64_t>(rng() % 4);
  view.strides.assign(static_cast<size_t>(ndim), 0);
  int order[plan::kMaxTensorDims];
  for (int d = 0; d < ndim; ++d) order[d] = d;
  std::shuffle(order, order + ndim, rng);
  int64_t stride = 1;
  for (int k = ndim - 1; k >= 0; --k) {
    view.strides[order[k]] = stride;
    stride *= extent[order[k]] + static_cast<int64_t>(rng() % 3);
  }
  if (rng() % 4 == 0) {  // No strides: row-major over the tile (TileStrides).
    view.strides.clear();
    stride = 1;
    for (int d = 0; d < ndim; ++d) stride *= extent[d];
  }
  return view.offset + stride;
}

// A source scale: fp32 bits (mostly 2^-12 to 2^12, some that make products round to subnormals,
// underflow or overflow, zero, negative, NaN, Inf) or an E8M0 byte (mostly 107-147, also 0, 254,
// 255).
inline uint32_t RandomSourceScale(std::mt19937_64& rng, bool mx) {
  const uint64_t v = rng();
  if (mx) {
    switch (v % 16) {
      case 0: return 0;
      case 1: return 254;
      case 2: return 255;
      case 3: return static_cast<uint32_t>((v >> 8) % 256);
      default: return 107 + static_cast<uint32_t>((v >> 8) % 41);
    }
  }
  const uint32_t mant = static_cast<uint32_t>(v >> 20) & 0x7FFFFF;
  uint32_t exp = 127 - 12 + static_cast<uint32_t>((v >> 8) % 25);
  switch (v % 32) {
    case 0: exp = 0; break;                           // subnormal scale (or zero)
    case 1: exp = 1 + static_cast<uint32_t>((v >> 8) % 20); break;   // tiny: products underflow
    case 2: exp = 230 + static_cast<uint32_t>((v >> 8) % 24); break; // huge: products overflow
    case 3: return 0x7F800000u | (mant & 1 ? 0 : 0x400000u);        // Inf or NaN
    case 4: return static_cast<uint32_t>(v >> 32);                  // any pattern
    default: break;
  }
  const uint32_t sign = (v >> 40) % 8 == 0 ? 0x80000000u : 0u;  // Some negative scales.
  return sign | (exp << 23) | mant;
}

// Source scheme `src` and destination scheme `dst` (kBlock, kChannel, kTensor, kMx), 0-3 dims
// (MX blocks [.., 1, 32]; block schemes random blocks of 1-5), every FP8 byte, random scales.
inline RandomRequantTile MakeRandomRequantTile(std::mt19937_64& rng, plan::QuantScheme src,
                                               plan::QuantScheme dst) {
  using plan::QuantScheme;
  RandomRequantTile r;
  const int nd = src == QuantScheme::kChannel || dst == QuantScheme::kChannel ||
                         src == QuantScheme::kMx || dst == QuantScheme::kMx
                     ? 1 + static_cast<int>(rng() % 3)
                     : static_cast<int>(rng() % 4);
  r.qs.dtype = rng() % 2 ? plan::DType::kFp8E5M2 : plan::DType::kFp8E4M3;
  r.qs.src_scheme = src;
  r.qs.src_block.assign(static_cast<size_t>(nd), 1);
  r.shape.assign(static_cast<size_t>(nd), 1);
  r.box.ndim = nd;
  for (int d = 0; d < nd; ++d) {
    const bool last = d == nd - 1;
    int64_t& sb = r.qs.src_block[d];
    int64_t& n = r.shape[d];
    bool one_block = false;
    switch (src) {
      case QuantScheme::kBlock: sb = 1 + static_cast<int64_t>(rng() % 5); break;
      case QuantScheme::kMx: sb = last ? 32 : 1; break;
      case QuantScheme::kChannel: one_block = last; break;
      default: one_block = true; break;  // kTensor
    }
    if (one_block) {
      n = 1 + static_cast<int64_t>(rng() % 12);
      sb = n + static_cast<int64_t>(rng() % 2);
      r.box.lo[d] = static_cast<int64_t>(rng() % n);  // Any start inside the one block.
    } else {
      n = sb * static_cast<int64_t>(1 + rng() % (sb >= 32 ? 3 : 4)) +
          static_cast<int64_t>(rng() % sb);
      r.box.lo[d] = sb * static_cast<int64_t>(rng() % ((n + sb - 1) / sb));
      // Sometimes inside a block: validation never lets a tile start there on a dim of several
      // blocks, but DequantizeTile and the kernels' index both take any start.
      if (rng() % 4 == 0) r.box.lo[d] = static_cast<int64_t>(rng() % n);
    }
    r.box.hi[d] = r.box.lo[d] + 1 + static_cast<int64_t>(rng() % (n - r.box.lo[d]));
  }
  // The rank's buffers through random views.
  int64_t extent[plan::kMaxTensorDims] = {}, nblocks[plan::kMaxTensorDims] = {};
  plan::Box blocks;
  blocks.ndim = nd;
  for (int d = 0; d < nd; ++d) {
    extent[d] = r.box.extent(d);
    blocks.lo[d] = r.box.lo[d] / r.qs.src_block[d];
    blocks.hi[d] = (r.box.hi[d] + r.qs.src_block[d] - 1) / r.qs.src_block[d];
    nblocks[d] = blocks.extent(d);
  }
  const int64_t n_bytes = RandomView(rng, nd, extent, r.qs.src.view);
  r.qs.src.has_view = true;
  const int64_t n_scales = RandomView(rng, nd, nblocks, r.qs.src_scales.view);
  r.qs.src_scales.has_view = true;
  r.bytes.resize(static_cast<size_t>(n_bytes));
  for (uint8_t& b : r.bytes) b = static_cast<uint8_t>(rng());
  const bool mx = src == QuantScheme::kMx;
  r.scales.resize(static_cast<size_t>(n_scales * (mx ? 1 : 4)));
  for (int64_t i = 0; i < n_scales; ++i) {
    const uint32_t v = RandomSourceScale(rng, mx);
    if (mx) {
      r.scales[i] = static_cast<uint8_t>(v);
    } else {
      std::memcpy(&r.scales[4 * i], &v, 4);
    }
  }
  // The destination quantization of the tile (its origin a destination block origin).
  plan::QuantTile& t = r.tile;
  t.src_dtype = r.qs.dtype;
  t.ndim = nd;
  t.arith = dst == QuantScheme::kMx ? plan::QuantArith::kMx : plan::QuantArith::kFp32Scale;
  t.format = rng() % 2 ? quant::Fp8Format::kE5M2 : quant::Fp8Format::kE4M3;
  std::array<int64_t, plan::kMaxTensorDims> strides{};
  plan::TileStrides(r.qs.src, r.box, strides);
  for (int d = 0; d < nd; ++d) {
    const bool last = d == nd - 1;
    t.extent[d] = extent[d];
    t.src_strides[d] = strides[d];
    switch (dst) {
      case QuantScheme::kBlock: t.block[d] = 1 + static_cast<int64_t>(rng() % 5); break;
      case QuantScheme::kMx: t.block[d] = last ? 32 : 1; break;
      case QuantScheme::kChannel: t.block[d] = last ? extent[d] : 1; break;
      default: t.block[d] = extent[d]; break;
    }
  }
  t.src = r.bytes.data() + r.qs.src.view.offset;
  r.fp8 = plan::DequantSourceOf(r.qs, r.box, r.scales.data());
  return r;
}

// The tile dequantized on the host (plan::DequantizeTile) into `dequantized`, as a dense fp32
// QuantTile with the destination's scheme: what the CPU path quantizes.
inline plan::QuantTile DequantizedOnHost(const RandomRequantTile& r,
                                         std::vector<float>& dequantized) {
  dequantized.assign(static_cast<size_t>(r.box.NumElements()), 0.0f);
  plan::DequantizeTile(r.qs, r.shape, r.box, r.bytes.data(), r.scales.data(), dequantized.data());
  plan::QuantTile q = r.tile;
  q.src_dtype = plan::DType::kFp32;
  q.src = reinterpret_cast<const uint8_t*>(dequantized.data());
  int64_t stride = 1;
  for (int d = q.ndim - 1; d >= 0; --d) {
    q.src_strides[d] = stride;
    stride *= q.extent[d];
  }
  return q;
}

// What the CPU path computes for it (plan::DequantizeTile into fp32, then plan::QuantizeTile):
// `out` (elements) and `scales` (NumBlocks of the destination) resized and written. With `amax`,
// each destination block's amax is taken from there.
inline void RequantizeOnHost(const RandomRequantTile& r, std::vector<uint8_t>& out,
                             std::vector<uint8_t>& scales, const float* amax = nullptr) {
  const int64_t n = r.box.NumElements();
  std::vector<float> dequantized;
  plan::QuantTile q = DequantizedOnHost(r, dequantized);
  out.assign(static_cast<size_t>(n), 0);
  scales.assign(static_cast<size_t>(plan::NumBlocks(q) * plan::ScaleBytes(q.arith)), 0);
  q.out = out.data();
  q.scales = scales.data();
  q.amax = amax;
  plan::QuantizeTile(q);
}

// The destination blocks' amaxes of the dequantized tile (plan::BlockAmax).
inline std::vector<float> RequantAmaxOnHost(const RandomRequantTile& r) {
  std::vector<float> dequantized;
  plan::QuantTile q = DequantizedOnHost(r, dequantized);
  std::vector<float> amax(static_cast<size_t>(plan::NumBlocks(q)));
  plan::BlockAmax(q, amax.data());
  return amax;
}

// The kernels' description of `t`.
inline QuantShape ShapeOf(const plan::QuantTile& t) { return internal::QuantShapeOf(t); }

}  // namespace reshard::cuda::testing
