#include "tools/reshard/tile_fill.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace reshard::cli {
namespace {

// Calls fn(element offset in the buffer, global flat index) for every element of `tile`, run
// by run along the innermost dim.
template <typename Fn>
void ForEachElement(const LocalTile& tile, Fn&& fn) {
  const size_t nd = tile.lo.size();
  for (size_t d = 0; d < nd; ++d) {
    if (tile.hi[d] <= tile.lo[d]) return;
  }
  if (nd == 0) {
    fn(tile.offset, int64_t{0});
    return;
  }
  std::vector<int64_t> idx(nd, 0);
  const int64_t inner = tile.hi[nd - 1] - tile.lo[nd - 1];
  while (true) {
    int64_t offset = tile.offset, global = 0;
    for (size_t d = 0; d < nd; ++d) {
      offset += idx[d] * tile.strides[d];
      global = global * tile.global_shape[d] + tile.lo[d] + idx[d];
    }
    for (int64_t i = 0; i < inner; ++i) fn(offset + i * tile.strides[nd - 1], global + i);
    if (nd == 1) return;
    size_t d = nd - 1;
    while (true) {
      --d;
      if (++idx[d] < tile.hi[d] - tile.lo[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
  }
}

}  // namespace

uint64_t PatternValue(uint64_t epoch, uint64_t tensor, int64_t index) {
  uint64_t x = (epoch << 48) ^ (tensor << 40) ^ static_cast<uint64_t>(index);
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void PoisonTile(const LocalTile& tile, void* base) {
  auto* bytes = static_cast<uint8_t*>(base);
  const int eb = DTypeSize(tile.dtype);
  ForEachElement(tile, [&](int64_t off, int64_t) { std::memset(bytes + off * eb, 0xA5, eb); });
}

namespace {

// A value of `dtype` (bf16, fp16 or fp32) as its bit pattern, from 64 random bits: one in 4096
// each NaN, +-Inf, +-0 and a subnormal; one in 65536 of the rest near the largest finite value;
// otherwise magnitudes 2^-6 to 2^6.
uint32_t RealBits(DType dtype, uint64_t v) {
  const int mant_bits = dtype == DType::kFp32 ? 23 : dtype == DType::kBf16 ? 7 : 10;
  const int exp_bits = dtype == DType::kFp16 ? 5 : 8;
  const uint32_t bias = (1u << (exp_bits - 1)) - 1, exp_max = (1u << exp_bits) - 1;
  const uint32_t sign = static_cast<uint32_t>(v >> 63);
  uint32_t mant = static_cast<uint32_t>(v >> 20) & ((1u << mant_bits) - 1);
  uint32_t exp = 0;
  switch (v & 4095) {
    case 0:
      exp = exp_max;
      mant |= 1u << (mant_bits - 1);
      break;
    case 1:
      exp = exp_max;
      mant = 0;
      break;
    case 2:
      mant = 0;
      break;
    case 3:
      mant |= 1;
      break;
    default:
      exp = ((v >> 44) & 0xFFFF) == 0 ? exp_max - 1 : bias - 6 + ((v >> 12) % 13);
  }
  return (sign << (exp_bits + mant_bits)) | (exp << mant_bits) | mant;
}

void StoreReal(DType dtype, uint64_t v, uint8_t* at) {
  const uint32_t bits = RealBits(dtype, v);
  if (DTypeSize(dtype) == 4) {
    std::memcpy(at, &bits, 4);
  } else {
    const uint16_t half = static_cast<uint16_t>(bits);
    std::memcpy(at, &half, 2);
  }
}

}  // namespace

TilePatterns::TilePatterns(const RefitSpec& spec, const RefitSpec* values_of)
    : tensors_(spec.tensors()) {
  const std::vector<TensorDesc>& values = values_of != nullptr ? values_of->tensors() : tensors_;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorDesc& d = tensors_[i];
    Tensor t{i, &tensors_[i]};
    t.fp8_source = d.src.quant_scheme != QuantScheme::kNone;
    t.fp8_matched = t.fp8_source && d.src.dtype == d.dst.dtype &&
                    d.src.quant_scheme == d.dst.quant_scheme &&
                    QuantBlockShape(d.shape, d.src.quant_scheme, d.src.quant_block) ==
                        QuantBlockShape(d.shape, d.dst.quant_scheme, d.dst.quant_block);
    t.quantized = d.dst.quant_scheme != QuantScheme::kNone && !t.fp8_matched;
    // FP8 sources hold bit patterns (PatternValue), in `values_of` too.
    const bool values_fp8 = i < values.size() && values[i].src.quant_scheme != QuantScheme::kNone;
    t.real = i < values.size() && values[i].dst.quant_scheme != QuantScheme::kNone && !values_fp8;
    t.scale_number = tensors_.size() + i;
    by_name_[d.name] = t;
  }
}

uint8_t ChangeXor(uint64_t epoch, uint64_t tensor, int64_t index, double fraction) {
  const uint64_t h = PatternValue(epoch ^ 0x7fffull, tensor ^ 0xa5ull, index);
  const double u = static_cast<double>(h >> 11) * 0x1.0p-53;  // Uniform in [0, 1).
  return u < fraction ? static_cast<uint8_t>(1 + (h & 0xff) % 15) : 0;
}

void TilePatterns::Change(const LocalTile& tile, uint64_t epoch, double fraction,
                          void* base) const {
  if (!tile.scales_of.empty()) return;  // An FP8 source's scales keep their values.
  const uint64_t tensor = Of(tile.tensor).number;
  auto* bytes = static_cast<uint8_t*>(base);
  const int eb = DTypeSize(tile.dtype);
  ForEachElement(tile, [&](int64_t off, int64_t g) {
    bytes[off * eb] ^= ChangeXor(epoch, tensor, g, fraction);
  });
}

absl::Status TilePatterns::VerifyChanged(const LocalTile& tile, uint64_t epoch, double fraction,
                                         int rank, const void* base) const {
  std::vector<uint8_t> low;
  for (uint64_t e = 1; e <= epoch; ++e) AdvanceChanged(tile, e, fraction, &low);
  return VerifyChangedLow(tile, epoch, low, rank, base);
}

void TilePatterns::AdvanceChanged(const LocalTile& tile, uint64_t epoch, double fraction,
                                  std::vector<uint8_t>* low) const {
  const Tensor& t = Of(tile);
  if (t.quantized) {
    // The changes to the source elements of the blocks the tile covers, row-major.
    std::vector<int64_t> lo, extents, blocks_lo;
    if (!QuantizedRegion(tile, t, &lo, &extents, &blocks_lo)) return;
    int64_t n = 1;
    for (int64_t e : extents) n *= e;
    if (epoch <= 1) {
      low->assign(static_cast<size_t>(n), 0);
      return;
    }
    LocalTile region = tile;  // Over the tensor's elements (a scale tile's are its blocks).
    region.global_shape = t.desc->shape;
    region.lo = lo;
    region.offset = 0;
    for (size_t d = 0; d < lo.size(); ++d) region.hi[d] = lo[d] + extents[d];
    for (size_t d = lo.size(); d-- > 0;) {
      region.strides[d] = d + 1 == lo.size() ? 1 : region.strides[d + 1] * extents[d + 1];
    }
    ForEachElement(region, [&](int64_t i, int64_t g) {
      (*low)[static_cast<size_t>(i)] ^= ChangeXor(epoch, t.number, g, fraction);
    });
    return;
  }
  const bool scales = !tile.scales_of.empty();
  size_t i = 0;
  if (epoch <= 1) low->clear();
  if (epoch > 1 && scales) return;  // Scales keep their values.
  uint8_t value[8];
  ForEachElement(tile, [&](int64_t, int64_t g) {
    if (epoch <= 1) {
      Element(t, scales, tile.dtype, 1, g, value);
      low->push_back(value[0]);
    } else {
      (*low)[i++] ^= ChangeXor(epoch, t.number, g, fraction);
    }
  });
}

absl::Status TilePatterns::VerifyChangedLow(const LocalTile& tile, uint64_t epoch,
                                            const std::vector<uint8_t>& low, int rank,
                                            const void* base) const {
  const Tensor& t = Of(tile);
  if (t.quantized) return VerifyQuantized(tile, t, epoch, rank, base, &low);
  const bool scales = !tile.scales_of.empty();
  const auto* bytes = static_cast<const uint8_t*>(base);
  const int eb = DTypeSize(tile.dtype);
  int64_t bad = -1;
  size_t i = 0;
  uint8_t want[8];
  ForEachElement(tile, [&](int64_t off, int64_t g) {
    Element(t, scales, tile.dtype, 1, g, want);
    want[0] = low[i++];
    if (bad < 0 && std::memcmp(bytes + off * eb, want, static_cast<size_t>(eb)) != 0) bad = g;
  });
  if (bad < 0) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "tensor \"", tile.tensor, "\" on rank ", rank, ": ", scales ? "scale " : "element ", bad,
      " (flat index) does not hold refit ", epoch, "'s value (tile [", absl::StrJoin(tile.lo, ","),
      "] to [", absl::StrJoin(tile.hi, ","), "))"));
}

const TilePatterns::Tensor& TilePatterns::Of(const std::string& name) const {
  return by_name_.at(name);
}

void TilePatterns::SourceScale(const Tensor& t, uint64_t epoch, int64_t block,
                               uint8_t* out) const {
  const uint64_t v = PatternValue(epoch, t.scale_number, block);
  if (t.desc->src.quant_scheme == QuantScheme::kMx) {
    *out = static_cast<uint8_t>(107 + (v >> 8) % 41);
    return;
  }
  const uint32_t bits =
      ((115 + static_cast<uint32_t>((v >> 8) % 25)) << 23) | (static_cast<uint32_t>(v >> 20) & 0x7FFFFF);
  std::memcpy(out, &bits, 4);
}

void TilePatterns::Element(const Tensor& t, bool scales, DType dtype, uint64_t epoch, int64_t g,
                           uint8_t* out) const {
  if (scales && !t.fp8_matched) {
    SourceScale(t, epoch, g, out);
    return;
  }
  const uint64_t v = PatternValue(epoch, scales ? t.scale_number : t.number, g);
  if (t.real && !scales) {
    StoreReal(dtype, v, out);
  } else {
    std::memcpy(out, &v, static_cast<size_t>(DTypeSize(dtype)));
  }
}

void TilePatterns::Fill(const LocalTile& tile, uint64_t epoch, void* base) const {
  const Tensor& t = Of(tile);
  const bool scales = !tile.scales_of.empty();
  auto* bytes = static_cast<uint8_t*>(base);
  const int eb = DTypeSize(tile.dtype);
  ForEachElement(tile, [&](int64_t off, int64_t g) {
    Element(t, scales, tile.dtype, epoch, g, bytes + off * eb);
  });
}

absl::Status TilePatterns::Verify(const LocalTile& tile, uint64_t epoch, int rank,
                                  const void* base) const {
  const Tensor& t = Of(tile);
  if (t.quantized) return VerifyQuantized(tile, t, epoch, rank, base);
  // Bit patterns, real numbers (an unquantized destination of quantized-style sources), or FP8
  // bytes and scales as the source holds them.
  const bool scales = !tile.scales_of.empty();
  const auto* bytes = static_cast<const uint8_t*>(base);
  const int eb = DTypeSize(tile.dtype);
  int64_t bad = -1;
  uint8_t want[8];
  ForEachElement(tile, [&](int64_t off, int64_t g) {
    if (bad >= 0) return;
    Element(t, scales, tile.dtype, epoch, g, want);
    if (std::memcmp(bytes + off * eb, want, static_cast<size_t>(eb)) != 0) bad = g;
  });
  if (bad < 0) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat(
      "tensor \"", tile.tensor, "\" on rank ", rank, ": ", scales ? "scale " : "element ", bad,
      " (flat index) does not hold epoch ", epoch, "'s value (tile [", absl::StrJoin(tile.lo, ","),
      "] to [", absl::StrJoin(tile.hi, ","), "))"));
}

bool TilePatterns::QuantizedRegion(const LocalTile& tile, const Tensor& t, std::vector<int64_t>* lo,
                                   std::vector<int64_t>* extents,
                                   std::vector<int64_t>* blocks_lo) const {
  const TensorDesc& desc = *t.desc;
  const bool scales = !tile.scales_of.empty();
  const size_t nd = tile.lo.size();
  for (size_t d = 0; d < nd; ++d) {
    if (tile.hi[d] <= tile.lo[d]) return false;
  }
  const std::vector<int64_t> block =
      QuantBlockShape(desc.shape, desc.dst.quant_scheme, desc.dst.quant_block);
  lo->resize(nd);
  extents->resize(nd);
  blocks_lo->resize(nd);
  for (size_t d = 0; d < nd; ++d) {
    const int64_t b = block[d];
    (*blocks_lo)[d] = scales ? tile.lo[d] : tile.lo[d] / b;
    const int64_t blocks_hi = scales ? tile.hi[d] : (tile.hi[d] + b - 1) / b;
    (*lo)[d] = (*blocks_lo)[d] * b;
    (*extents)[d] = std::min(blocks_hi * b, desc.shape[d]) - (*lo)[d];
  }
  return true;
}

absl::Status TilePatterns::VerifyQuantized(const LocalTile& tile, const Tensor& t, uint64_t epoch,
                                           int rank, const void* base,
                                           const std::vector<uint8_t>* changes) const {
  const TensorDesc& desc = *t.desc;
  const bool scales = !tile.scales_of.empty();
  const size_t nd = tile.lo.size();
  // The elements whose blocks the tile covers, their values quantized as the source does.
  std::vector<int64_t> lo, extents, blocks_lo;
  if (!QuantizedRegion(tile, t, &lo, &extents, &blocks_lo)) return absl::OkStatus();
  const std::vector<int64_t> block =
      QuantBlockShape(desc.shape, desc.dst.quant_scheme, desc.dst.quant_block);
  int64_t n = 1;
  for (int64_t e : extents) n *= e;
  if (changes != nullptr && static_cast<int64_t>(changes->size()) != n) {
    return absl::InternalError(absl::StrCat("tensor \"", tile.tensor, "\" on rank ", rank, ": ",
                                            changes->size(), " changes kept for ", n,
                                            " source elements"));
  }
  const uint64_t values_epoch = changes != nullptr ? 1 : epoch;
  // An FP8 source's values: its bytes times its blocks' scales, as fp32.
  const DType src_dtype = t.fp8_source ? DType::kFp32 : desc.dtype;
  const int src_bytes = DTypeSize(src_dtype);
  const std::vector<int64_t> src_block =
      t.fp8_source ? QuantBlockShape(desc.shape, desc.src.quant_scheme, desc.src.quant_block)
                   : std::vector<int64_t>();
  std::vector<uint8_t> source(static_cast<size_t>(n * src_bytes));
  std::vector<int64_t> idx(nd, 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t global = 0, src_block_flat = 0;
    for (size_t d = 0; d < nd; ++d) {
      global = global * desc.shape[d] + lo[d] + idx[d];
      if (t.fp8_source) {
        const int64_t blocks = (desc.shape[d] + src_block[d] - 1) / src_block[d];
        src_block_flat = src_block_flat * blocks + (lo[d] + idx[d]) / src_block[d];
      }
    }
    if (t.fp8_source) {
      uint8_t scale[4];
      SourceScale(t, values_epoch, src_block_flat, scale);
      uint8_t byte = static_cast<uint8_t>(PatternValue(values_epoch, t.number, global));
      if (changes != nullptr) byte ^= (*changes)[static_cast<size_t>(i)];
      const float value = DequantizeReference(*desc.src.dtype, byte, desc.src.quant_scheme, scale);
      std::memcpy(source.data() + i * src_bytes, &value, 4);
    } else {
      StoreReal(desc.dtype, PatternValue(values_epoch, t.number, global),
                source.data() + i * src_bytes);
      if (changes != nullptr)
        source[static_cast<size_t>(i * src_bytes)] ^= (*changes)[static_cast<size_t>(i)];
    }
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < extents[d]) break;
      idx[d] = 0;
    }
  }
  int64_t num_blocks = 1;
  std::vector<int64_t> block_extents(nd);
  for (size_t d = 0; d < nd; ++d) {
    block_extents[d] = (extents[d] + block[d] - 1) / block[d];
    num_blocks *= block_extents[d];
  }
  const DType fp8 = desc.dst.dtype.value_or(DType::kFp8E4M3);
  const int scale_bytes = desc.dst.quant_scheme == QuantScheme::kMx ? 1 : 4;
  std::vector<uint8_t> out(static_cast<size_t>(n)), scale(static_cast<size_t>(num_blocks * scale_bytes));
  if (absl::Status st = QuantizeReference(src_dtype, source.data(), extents, fp8,
                                          desc.dst.quant_scheme, block, out.data(), scale.data());
      !st.ok()) {
    return st;
  }
  // Compare the tile with its part of what was computed (row-major over `extents`, or over the
  // blocks for a scale tile).
  const std::vector<int64_t>& ref_lo = scales ? blocks_lo : lo;
  const std::vector<int64_t>& ref_extents = scales ? block_extents : extents;
  const std::vector<uint8_t>& ref = scales ? scale : out;
  const int eb = scales ? scale_bytes : 1;
  const auto* bytes = static_cast<const uint8_t*>(base);
  std::fill(idx.begin(), idx.end(), 0);
  int64_t count = 1;
  for (size_t d = 0; d < nd; ++d) count *= tile.hi[d] - tile.lo[d];
  for (int64_t i = 0; i < count; ++i) {
    int64_t offset = tile.offset, at = 0;
    for (size_t d = 0; d < nd; ++d) {
      offset += idx[d] * tile.strides[d];
      at = at * ref_extents[d] + tile.lo[d] + idx[d] - ref_lo[d];
    }
    if (std::memcmp(bytes + offset * eb, ref.data() + at * eb, static_cast<size_t>(eb)) != 0) {
      std::vector<int64_t> where(nd);
      for (size_t d = 0; d < nd; ++d) where[d] = tile.lo[d] + idx[d];
      return absl::DataLossError(absl::StrCat(
          "tensor \"", tile.tensor, "\" on rank ", rank, ": ", scales ? "scale" : "element", " [",
          absl::StrJoin(where, ", "), "] is not the quantized value of ",
          changes != nullptr ? "refit " : "epoch ", epoch, "'s source"));
    }
    for (size_t d = nd; d-- > 0;) {
      if (++idx[d] < tile.hi[d] - tile.lo[d]) break;
      idx[d] = 0;
    }
  }
  return absl::OkStatus();
}

}  // namespace reshard::cli
