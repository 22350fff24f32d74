#include "src/plan/fill.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "src/common/hash.h"
#include "src/common/json.h"
#include "src/plan/quant_spec.h"

namespace reshard::plan {
namespace {

std::string Coordinates(const std::vector<int64_t>& shape, int64_t flat) {
  std::vector<int64_t> coord(shape.size());
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    coord[d] = shape[d] == 0 ? 0 : flat % shape[d];
    flat = shape[d] == 0 ? 0 : flat / shape[d];
  }
  return absl::StrCat("[", absl::StrJoin(coord, ", "), "]");
}

// A value of `dtype` (bf16, fp16 or fp32) from 64 random bits, as its bit pattern (see
// FillQuantizedSourceTile for the mix).
uint32_t QuantFillBits(DType dtype, uint64_t v) {
  const int mant_bits = dtype == DType::kFp32 ? 23 : dtype == DType::kBf16 ? 7 : 10;
  const int exp_bits = dtype == DType::kFp16 ? 5 : 8;
  const uint32_t bias = (1u << (exp_bits - 1)) - 1, exp_max = (1u << exp_bits) - 1;
  const uint32_t sign = static_cast<uint32_t>((v >> 63) & 1);
  uint32_t mant = static_cast<uint32_t>(v >> 20) & ((1u << mant_bits) - 1);
  uint32_t exp;
  switch (v & 4095) {  // One in 4096 each: the special values.
    case 0:  // NaN (quiet, payload kept).
      exp = exp_max;
      mant |= 1u << (mant_bits - 1);
      break;
    case 1:  // +-Inf.
      exp = exp_max;
      mant = 0;
      break;
    case 2:  // +-0.
      exp = 0;
      mant = 0;
      break;
    case 3:  // A subnormal.
      exp = 0;
      mant |= 1;
      break;
    default:
      // One in 65536 (of the rest): near the largest finite value; otherwise 2^-6 .. 2^6.
      exp = ((v >> 44) & 0xFFFF) == 0 ? exp_max - 1 : bias - 6 + ((v >> 12) % 13);
      break;
  }
  return (sign << (exp_bits + mant_bits)) | (exp << mant_bits) | mant;
}

}  // namespace

Box SourceScaleBox(const QuantizedSource& qs, const Box& tile) {
  Box blocks;
  blocks.ndim = tile.ndim;
  for (int d = 0; d < tile.ndim; ++d) {
    blocks.lo[d] = tile.lo[d] / qs.src_block[d];
    blocks.hi[d] = (tile.hi[d] + qs.src_block[d] - 1) / qs.src_block[d];
  }
  return blocks;
}

void FillQuantizedSourceTile(const RefitSpec& lowered, size_t q, const Box& tile, uint64_t epoch,
                             uint8_t* user_buffer, uint8_t* user_scales) {
  const QuantizedSource& qs = lowered.quantized_sources[q];
  const TensorSpec& t = lowered.tensors[qs.tensor];
  const uint64_t key = HashString(t.name);
  if (qs.requantized()) {
    if (tile.empty()) return;
    ForEachElement(qs.src, t.shape, tile, [&](int64_t offset, int64_t global) {
      user_buffer[offset] = static_cast<uint8_t>(FillValue(key, static_cast<uint64_t>(global), epoch));
    });
    const uint64_t scale_key = HashString(t.name + ".scale");
    const bool mx = qs.src_scheme == QuantScheme::kMx;
    ForEachElement(qs.src_scales, BlockedShape(t.shape, qs.src_block), SourceScaleBox(qs, tile),
                   [&](int64_t offset, int64_t global) {
      const uint64_t v = FillValue(scale_key, static_cast<uint64_t>(global), epoch);
      const uint64_t kind = v & 63;
      if (mx) {
        // Around 2^0; rarely the extremes, or E8M0's NaN (the block dequantizes to NaN).
        user_scales[offset] = kind == 0 ? 0 : kind == 1 ? 254 : kind == 2 ? 255
                                                             : static_cast<uint8_t>(107 + (v >> 8) % 41);
        return;
      }
      // 2^-12 .. 2^12 with a random mantissa; rarely subnormal-range or overflowing products.
      const uint32_t exp = kind == 0 ? 1 + (v >> 8) % 8 : kind == 1 ? 250 : 115 + (v >> 8) % 25;
      const uint32_t bits = (exp << 23) | (static_cast<uint32_t>(v >> 20) & 0x7FFFFF);
      std::memcpy(user_scales + 4 * offset, &bits, 4);
    });
    return;
  }
  const int elem = DTypeSize(qs.dtype);
  ForEachElement(qs.src, t.shape, tile, [&](int64_t offset, int64_t global) {
    const uint32_t bits = QuantFillBits(qs.dtype, FillValue(key, static_cast<uint64_t>(global), epoch));
    if (elem == 4) {
      std::memcpy(user_buffer + offset * 4, &bits, 4);
    } else {
      const uint16_t half = static_cast<uint16_t>(bits);
      std::memcpy(user_buffer + offset * 2, &half, 2);
    }
  });
}

QuantizedExpectation ExpectQuantized(const RefitSpec& lowered, size_t q, uint64_t epoch) {
  const QuantizedSource& qs = lowered.quantized_sources[q];
  const TensorSpec& t = lowered.tensors[qs.tensor];
  // The whole tensor as one row-major tile of a plain layout, quantized as a source rank would.
  Layout whole;
  whole.mesh.shape = {1};
  whole.mesh.ranks = {0};
  whole.placements = {Placement::Replicate()};
  Box box;
  box.ndim = static_cast<int>(t.shape.size());
  int64_t n = 1;
  for (int d = 0; d < box.ndim; ++d) {
    box.hi[d] = t.shape[d];
    n *= t.shape[d];
  }
  const int elem = DTypeSize(qs.dtype);
  std::vector<uint8_t> source(static_cast<size_t>(n * elem));
  RefitSpec one;
  one.tensors.push_back(t);
  one.tensors[0].dtype = qs.dtype;
  QuantizedSource single = qs;
  single.tensor = 0;
  single.src = whole;
  std::vector<uint8_t> source_scales;
  if (qs.requantized()) {
    single.src_scales = whole;
    int64_t src_blocks = 1;
    for (int64_t e : BlockedShape(t.shape, qs.src_block)) src_blocks *= e;
    source_scales.resize(static_cast<size_t>(src_blocks * (qs.src_scheme == QuantScheme::kMx ? 1 : 4)));
  }
  one.quantized_sources.push_back(single);
  FillQuantizedSourceTile(one, 0, box, epoch, source.data(), source_scales.data());
  const TensorSpec& scales = lowered.tensors[qs.scale_tensor];
  int64_t blocks = 1;
  for (int64_t e : scales.shape) blocks *= e;
  QuantizedExpectation out;
  out.elements.resize(static_cast<size_t>(n));
  out.scales.resize(static_cast<size_t>(blocks * DTypeSize(scales.dtype)));
  std::array<int64_t, kMaxTensorDims> strides{};
  TileStrides(whole, box, strides);  // Row-major.
  if (qs.requantized()) {
    // The source's values: every FP8 element times its block's scale, then quantized as fp32.
    std::vector<float> values(static_cast<size_t>(n));
    DequantizeTile(single, t.shape, box, source.data(), source_scales.data(), values.data());
    QuantizedSource as_fp32 = qs;
    as_fp32.dtype = DType::kFp32;
    QuantizeBox(as_fp32, t.dtype, box, reinterpret_cast<const uint8_t*>(values.data()), strides,
                out.elements.data(), out.scales.data());
    return out;
  }
  QuantizeBox(qs, t.dtype, box, source.data(), strides, out.elements.data(), out.scales.data());
  return out;
}

absl::Status VerifyTileAgainst(const RefitSpec& spec, size_t tensor, const Box& tile,
                               int32_t rank, const uint8_t* buffer, const uint8_t* expected) {
  const TensorSpec& t = spec.tensors[tensor];
  const int elem = DTypeSize(t.dtype);
  int64_t bad = -1;
  int64_t mismatches = 0;
  ForEachElement(t.dst, t.shape, tile, [&](int64_t offset, int64_t global) {
    if (std::memcmp(buffer + offset * elem, expected + global * elem, elem) != 0) {
      if (bad < 0) bad = global;
      ++mismatches;
    }
  });
  if (bad < 0) return absl::OkStatus();
  return absl::DataLossError(absl::StrFormat(
      "tensor %s: rank %d holds a wrong value at global index %s (%d of %d elements wrong)",
      json::QuoteForMessage(t.name), rank, Coordinates(t.shape, bad), mismatches,
      tile.NumElements()));
}

void FillTile(const RefitSpec& spec, size_t tensor, Side side, const Box& tile, uint64_t epoch,
              uint8_t* buffer) {
  const TensorSpec& t = spec.tensors[tensor];
  const int elem = DTypeSize(t.dtype);
  const uint64_t key = HashString(t.name);
  ForEachElement(spec.layout(tensor, side), t.shape, tile, [&](int64_t offset, int64_t global) {
    const uint64_t v = FillValue(key, static_cast<uint64_t>(global), epoch);
    std::memcpy(buffer + offset * elem, &v, elem);
  });
}

absl::Status VerifyTile(const RefitSpec& spec, size_t tensor, const Box& tile, uint64_t epoch,
                        int32_t rank, const uint8_t* buffer) {
  const TensorSpec& t = spec.tensors[tensor];
  const int elem = DTypeSize(t.dtype);
  const uint64_t key = HashString(t.name);
  int64_t bad = -1;
  int64_t mismatches = 0;
  ForEachElement(t.dst, t.shape, tile, [&](int64_t offset, int64_t global) {
    const uint64_t v = FillValue(key, static_cast<uint64_t>(global), epoch);
    if (std::memcmp(buffer + offset * elem, &v, elem) != 0) {
      if (bad < 0) bad = global;
      ++mismatches;
    }
  });
  if (bad < 0) return absl::OkStatus();
  return absl::DataLossError(absl::StrFormat(
      "tensor %s: rank %d holds a wrong value at global index %s (%d of %d elements wrong)",
      json::QuoteForMessage(t.name), rank, Coordinates(t.shape, bad), mismatches, tile.NumElements()));
}

}  // namespace reshard::plan
