#include "src/plan/quant_spec.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/common/json.h"
#include "src/common/status.h"
#include "src/plan/quantize.h"
#include "src/plan/tiling.h"

namespace reshard::plan {
namespace {

using json::QuoteForMessage;

absl::Status QuantError(const TensorSpec& t, const std::string& message) {
  return absl::InvalidArgumentError(
      absl::StrCat("tensor ", QuoteForMessage(t.name), ": ", message));
}

bool IsFp8(DType d) { return d == DType::kFp8E4M3 || d == DType::kFp8E5M2; }
bool IsQuantizable(DType d) {
  return d == DType::kBf16 || d == DType::kFp16 || d == DType::kFp32;
}

// The first tile of `l` that does not start on a block boundary along a dim that `check(d)`
// selects: (dim, rank, start), or dim -1.
struct Cut {
  int dim = -1;
  int32_t rank = -1;
  int64_t start = 0;
};
template <typename Check>
Cut FirstCut(const Layout& l, const std::vector<int64_t>& shape,
             const std::vector<int64_t>& block, Check&& check) {
  const TileGrid grid(l, shape);
  for (int d = 0; d < grid.ndim(); ++d) {
    if (!check(d)) continue;
    const auto ivs = grid.intervals(d);
    for (size_t i = 0; i < ivs.size(); ++i) {
      if (ivs[i].size() == 0 || ivs[i].lo % block[d] == 0) continue;
      TileGrid::Cell cell{};
      cell[d] = static_cast<int64_t>(i);
      return Cut{d, grid.Holder(cell, 0), ivs[i].lo};
    }
  }
  return Cut{};
}

// The largest tile of `l` over `shape`, in elements.
int64_t LargestTileElements(const Layout& l, const std::vector<int64_t>& shape) {
  return LargestTile(l, shape).NumElements();
}

}  // namespace

const char* QuantSchemeName(QuantScheme s) {
  switch (s) {
    case QuantScheme::kNone: return "none";
    case QuantScheme::kBlock: return "block";
    case QuantScheme::kMx: return "mx";
    case QuantScheme::kChannel: return "channel";
    case QuantScheme::kTensor: return "tensor";
  }
  return "?";
}

std::vector<int64_t> BlockShape(const std::vector<int64_t>& shape, const Quant& q) {
  const int ndim = static_cast<int>(shape.size());
  std::vector<int64_t> block(ndim, 1);
  switch (q.scheme) {
    case QuantScheme::kNone:
      break;
    case QuantScheme::kBlock:
    case QuantScheme::kMx: {
      const std::vector<int64_t> given =
          q.block.empty() ? std::vector<int64_t>{32} : q.block;  // Only kMx may omit it.
      const int k = static_cast<int>(given.size());
      for (int i = 0; i < k && i < ndim; ++i) block[ndim - k + i] = given[i];
      break;
    }
    case QuantScheme::kChannel:
      if (ndim > 0) block[ndim - 1] = std::max<int64_t>(1, shape[ndim - 1]);
      break;
    case QuantScheme::kTensor:
      for (int d = 0; d < ndim; ++d) block[d] = std::max<int64_t>(1, shape[d]);
      break;
  }
  return block;
}

std::vector<int64_t> BlockShape(const TensorSpec& t) { return BlockShape(t.shape, t.dst.quant); }
std::vector<int64_t> SourceBlockShape(const TensorSpec& t) {
  return BlockShape(t.shape, t.src.quant);
}

bool SourceMatchesDestination(const TensorSpec& t) {
  return t.src_quantized() && t.quantized() && t.src.dtype == t.dst.dtype &&
         t.src.quant.scheme == t.dst.quant.scheme && SourceBlockShape(t) == BlockShape(t);
}

std::vector<int64_t> BlockedShape(const std::vector<int64_t>& shape,
                                  const std::vector<int64_t>& block) {
  std::vector<int64_t> blocked(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) blocked[d] = (shape[d] + block[d] - 1) / block[d];
  return blocked;
}

DType ScaleDType(QuantScheme scheme) {
  return scheme == QuantScheme::kMx ? DType::kU8 : DType::kFp32;
}

Layout ScaleLayout(const Layout& l, const std::vector<int64_t>& shape,
                   const std::vector<int64_t>& block) {
  Layout s;
  s.mesh = l.mesh;
  s.placements = l.placements;
  for (Placement& p : s.placements) {
    if (p.is_shard() && shape[p.dim] <= block[p.dim]) p = Placement::Replicate();
  }
  return s;
}

TensorSpec ScaleTensor(const TensorSpec& t, Side side) {
  const Layout& l = t.layout(side);
  const std::vector<int64_t> block = BlockShape(t.shape, l.quant);
  TensorSpec s;
  s.name = t.name + ".scale";
  s.dtype = ScaleDType(l.quant.scheme);
  s.shape = BlockedShape(t.shape, block);
  Layout scales = ScaleLayout(l, t.shape, block);
  scales.buffer = l.scale_buffer.empty() ? s.name : l.scale_buffer;
  scales.view = l.scale_view;
  scales.has_view = l.has_scale_view;
  (side == Side::kSrc ? s.src : s.dst) = std::move(scales);
  return s;
}

namespace {

// The fields of one side's quantization: an FP8 dtype, the scheme's block, the scale buffer.
absl::Status CheckQuantFields(const TensorSpec& t, Side side) {
  const Layout& l = t.layout(side);
  const char* sn = SideName(side);
  const int ndim = static_cast<int>(t.shape.size());
  const char* scheme = QuantSchemeName(l.quant.scheme);
  if (!l.dtype || !IsFp8(*l.dtype)) {
    return QuantError(t, absl::StrFormat("%s.quant (scheme %s) needs %s.dtype fp8e4m3 or "
                                         "fp8e5m2%s",
                                         sn, scheme, sn,
                                         l.dtype ? absl::StrCat(", not ", std::string(DTypeName(*l.dtype)))
                                                 : std::string()));
  }
  const std::vector<int64_t>& given = l.quant.block;
  switch (l.quant.scheme) {
    case QuantScheme::kBlock:
      if (given.empty()) {
        return QuantError(t, absl::StrFormat("%s.quant.block is required by scheme block (e.g. "
                                             "[128, 128])",
                                             sn));
      }
      [[fallthrough]];
    case QuantScheme::kMx:
      if (static_cast<int>(given.size()) > ndim || (ndim == 0 && given.empty())) {
        return QuantError(t, absl::StrFormat("%s.quant.block has %d entries for a %d-D tensor", sn,
                                             std::max<size_t>(given.size(), 1), ndim));
      }
      for (size_t i = 0; i < given.size(); ++i) {
        // Below 2^62 like every shape: shape + block - 1 (ceil divisions) cannot wrap.
        if (given[i] < 1 || given[i] >= kMaxSpecBytes) {
          return QuantError(t, absl::StrFormat("%s.quant.block[%d] is %d; blocks are at least 1 "
                                               "and below 2^62",
                                               sn, i, given[i]));
        }
      }
      break;
    case QuantScheme::kChannel:
      if (ndim == 0) {
        return QuantError(t, absl::StrFormat("%s.quant scheme channel needs a tensor of 1 dim or "
                                             "more",
                                             sn));
      }
      [[fallthrough]];
    case QuantScheme::kTensor:
      if (!given.empty()) {
        return QuantError(t, absl::StrFormat("%s.quant.block is not taken by scheme %s (its "
                                             "block is %s)",
                                             sn, scheme,
                                             l.quant.scheme == QuantScheme::kChannel
                                                 ? "a whole row"
                                                 : "the whole tensor"));
      }
      break;
    case QuantScheme::kNone:
      break;
  }
  if (!l.scale_buffer.empty() && absl::StartsWith(l.scale_buffer, kReservedBufferPrefix)) {
    return QuantError(t, absl::StrFormat("%s.scale_buffer %s starts with the reserved prefix "
                                         "\"%s\"",
                                         sn, QuoteForMessage(l.scale_buffer),
                                         kReservedBufferPrefix));
  }
  if (l.has_scale_view) {
    if (l.scale_view.offset < 0) {
      return QuantError(t, absl::StrFormat("%s.scale_view.offset is negative", sn));
    }
    if (!l.scale_view.strides.empty() && static_cast<int>(l.scale_view.strides.size()) != ndim) {
      return QuantError(t, absl::StrFormat("%s.scale_view.strides has %d entries for a %d-D "
                                           "tensor",
                                           sn, l.scale_view.strides.size(), ndim));
    }
  }
  return absl::OkStatus();
}

// A side without quantization: no other dtype, no scale fields.
absl::Status CheckUnquantized(const TensorSpec& t, Side side) {
  const Layout& l = t.layout(side);
  const char* sn = SideName(side);
  if (l.dtype && *l.dtype != t.dtype) {
    return QuantError(t, absl::StrFormat("%s.dtype %s differs from the tensor's dtype %s without "
                                         "%s.quant; a %s of another dtype must be quantized "
                                         "(casting is not supported)",
                                         sn, std::string(DTypeName(*l.dtype)),
                                         std::string(DTypeName(t.dtype)), sn,
                                         side == Side::kSrc ? "source" : "destination"));
  }
  if (!l.scale_buffer.empty() || l.has_scale_view) {
    return QuantError(t, absl::StrFormat("%s.scale_buffer and %s.scale_view need %s.quant", sn,
                                         sn, sn));
  }
  return absl::OkStatus();
}

// The tiles of `side` start on boundaries of `block` (`what` names the blocks), except along a
// dim of one block (`exception` says why that is fine), and split the blocked shape the way
// they split the elements, so that the scales are a tile per rank of ScaleLayout.
absl::Status CheckBlockTiles(const TensorSpec& t, Side side, const std::vector<int64_t>& block,
                             const char* what, const char* exception) {
  const Layout& l = t.layout(side);
  const int ndim = static_cast<int>(t.shape.size());
  const Cut cut = FirstCut(l, t.shape, block, [&](int d) { return t.shape[d] > block[d]; });
  if (cut.dim >= 0) {
    return QuantError(
        t, absl::StrFormat("%s tiles cut the %s of dim %d (rank %d's tile starts at element %d, "
                           "not a multiple of the block's %d); only a dim of one block may be "
                           "cut (%s)",
                           SideName(side), what, cut.dim, cut.rank, cut.start, block[cut.dim],
                           exception));
  }
  const std::vector<int64_t> blocked = BlockedShape(t.shape, block);
  const Layout scales = ScaleLayout(l, t.shape, block);
  const TileGrid elements(l, t.shape), blocks(scales, blocked);
  for (int d = 0; d < ndim; ++d) {
    // A dim of one block: its scale is replicated, nothing to compare.
    if (t.shape[d] <= block[d]) continue;
    // Shard by shard (the same axes shard d in both grids): a strided shard sorts each grid's
    // intervals by where they start, which need not pair a rank's elements with its blocks.
    const auto e = elements.intervals(d), b = blocks.intervals(d);
    const int64_t shards = static_cast<int64_t>(std::min(e.size(), b.size()));
    for (int64_t s = 0; s < shards; ++s) {
      const Interval& ei = e[elements.CellIndexOfShard(d, s)];
      const Interval& bi = b[blocks.CellIndexOfShard(d, s)];
      const bool empty = ei.size() == 0;
      if ((empty && bi.size() == 0) ||
          (!empty && bi.lo == ei.lo / block[d] && bi.hi == (ei.hi + block[d] - 1) / block[d])) {
        continue;
      }
      TileGrid::Cell cell{};
      cell[d] = elements.CellIndexOfShard(d, s);
      return QuantError(
          t, absl::StrFormat("%s tiles of dim %d do not split its %d blocks of %d the way "
                             "they split its elements (rank %d holds elements [%d, %d)), so "
                             "the scales cannot be laid out as a tile per rank",
                             SideName(side), d, blocked[d], block[d], elements.Holder(cell, 0),
                             ei.lo, ei.hi));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateQuant(const TensorSpec& t) {
  if (!t.src_quantized()) RESHARD_RETURN_IF_ERROR(CheckUnquantized(t, Side::kSrc));
  if (!t.quantized()) {
    if (t.src_quantized()) {
      return QuantError(t, "src.quant (an FP8 source) needs dst.quant: FP8 sources refit into "
                           "quantized destinations only (dequantizing into the destination is "
                           "not supported)");
    }
    return CheckUnquantized(t, Side::kDst);
  }
  RESHARD_RETURN_IF_ERROR(CheckQuantFields(t, Side::kDst));
  if (t.src_quantized()) RESHARD_RETURN_IF_ERROR(CheckQuantFields(t, Side::kSrc));
  if (!IsQuantizable(t.dtype)) {
    return QuantError(t, absl::StrFormat("dst.quant quantizes bf16, fp16 or fp32 tensors, not %s%s",
                                         std::string(DTypeName(t.dtype)),
                                         t.src_quantized()
                                             ? " (an FP8 source gives src.dtype and src.quant, "
                                               "and the tensor's dtype stays the unquantized one)"
                                             : ""));
  }
  const std::vector<int64_t> block = BlockShape(t);
  if (t.src_quantized()) {
    // An FP8 source holds whole blocks of its own scheme: its scales are a tile per rank.
    RESHARD_RETURN_IF_ERROR(CheckBlockTiles(t, Side::kSrc, SourceBlockShape(t),
                                            "src.quant blocks",
                                            "its scale is then replicated"));
  }
  if (!SourceMatchesDestination(t)) {
    // Source tiles quantize whole blocks, except along a dim of one block: each tile computes its
    // part's amax there, and the parts are combined (the amax exchange).
    RESHARD_RETURN_IF_ERROR(CheckBlockTiles(
        t, Side::kSrc, block, "quantization blocks",
        "its amax is then combined across the source tiles"));
  }
  // Destination tiles hold whole blocks, except along a dim of one block (scales replicated).
  return CheckBlockTiles(t, Side::kDst, block, "quantization blocks",
                         "its scale is then replicated");
}

absl::StatusOr<std::shared_ptr<const RefitSpec>> LowerQuantization(
    std::shared_ptr<const RefitSpec> spec) {
  bool any = false;
  for (const TensorSpec& t : spec->tensors) any = any || t.quantized();
  if (!any) return spec;
  auto lowered = std::make_shared<RefitSpec>();
  lowered->comment = spec->comment;
  lowered->topology = spec->topology;
  lowered->tensors = spec->tensors;
  auto exchange = std::make_shared<RefitSpec>();
  exchange->comment = "the amax exchange of quantized sources that share blocks";
  exchange->topology = spec->topology;
  absl::flat_hash_set<std::string> names;  // Owned: scale names outlive their TensorSpec moves.
  for (const TensorSpec& t : spec->tensors) names.insert(t.name);
  // Each internal buffer holds every quantized tensor's largest tile in turn: the same offset on
  // every rank (a view is per tensor), contiguous row-major tiles.
  int64_t bytes_offset = 0, scales_offset = 0, partial_offset = 0, gathered_offset = 0;
  for (size_t i = 0; i < spec->tensors.size(); ++i) {
    const TensorSpec& user = spec->tensors[i];
    if (!user.quantized()) continue;
    TensorSpec& t = lowered->tensors[i];
    t.dtype = user.dst_dtype();
    t.src.dtype.reset();
    t.src.quant = Quant{};
    t.src.scale_buffer.clear();
    t.src.scale_view = View{};
    t.src.has_scale_view = false;
    t.dst.dtype.reset();
    t.dst.quant = Quant{};
    t.dst.scale_buffer.clear();
    t.dst.scale_view = View{};
    t.dst.has_scale_view = false;
    if (!names.insert(user.name + ".scale").second) {
      return QuantError(user, absl::StrFormat("its scale tensor's name %s is taken by another "
                                              "tensor",
                                              QuoteForMessage(user.name + ".scale")));
    }
    if (SourceMatchesDestination(user)) {
      // FP8 bytes and scales as the source holds them: two plain tensors on the user's buffers.
      t.src.buffer = user.src_buffer();
      TensorSpec s = ScaleTensor(user, Side::kSrc);
      s.dst = ScaleTensor(user, Side::kDst).dst;
      lowered->tensors.push_back(std::move(s));
      continue;
    }
    QuantizedSource q;
    q.tensor = static_cast<uint32_t>(i);
    q.dtype = user.src_dtype();
    q.src = user.src;
    q.src.buffer = user.src_buffer();
    q.scheme = user.dst.quant.scheme;
    if (user.src_quantized()) {
      q.src_scheme = user.src.quant.scheme;
      q.src_block = SourceBlockShape(user);
      q.src_scales = ScaleTensor(user, Side::kSrc).src;
    }
    q.block = BlockShape(user);
    const std::vector<int64_t> blocked = BlockedShape(user.shape, q.block);
    // Dims of one block that the source shards: their tiles' amaxes are combined.
    const TileGrid src_grid(user.src, user.shape);
    q.cut_parts.assign(user.shape.size(), 1);
    for (int d = 0; d < src_grid.ndim(); ++d) {
      const int64_t parts = static_cast<int64_t>(src_grid.intervals(d).size());
      if (user.shape[d] <= q.block[d] && parts > 1) {
        q.cut_parts[d] = parts;
        q.exchange = true;
      }
    }

    t.src.buffer = kQuantizedBuffer;
    t.src.view = View{bytes_offset, {}};
    t.src.has_view = true;
    bytes_offset += LargestTileElements(user.src, user.shape);

    TensorSpec s;
    s.name = user.name + ".scale";
    s.dtype = ScaleDType(q.scheme);
    s.shape = blocked;
    s.src = ScaleLayout(user.src, user.shape, q.block);
    if (s.dtype == DType::kU8) {
      s.src.buffer = kQuantizedBuffer;
      s.src.view = View{bytes_offset, {}};
      bytes_offset += LargestTileElements(s.src, s.shape);
    } else {
      s.src.buffer = kScaleBuffer;
      s.src.view = View{scales_offset, {}};
      scales_offset += LargestTileElements(s.src, s.shape);
    }
    s.src.has_view = true;
    s.dst = ScaleLayout(user.dst, user.shape, q.block);
    s.dst.buffer = user.dst.scale_buffer.empty() ? s.name : user.dst.scale_buffer;
    s.dst.view = user.dst.scale_view;
    s.dst.has_view = user.dst.has_scale_view;
    q.scale_tensor = static_cast<uint32_t>(lowered->tensors.size());
    lowered->tensors.push_back(std::move(s));

    if (q.exchange) {
      // Partial amaxes: one per block a tile holds, indexed along a cut dim by the tile's shard
      // (torch.chunk of the parts gives every tile exactly one); gathered along the cut dims.
      TensorSpec p;
      p.name = user.name + ".amax";
      p.dtype = DType::kFp32;
      p.shape = blocked;
      for (size_t d = 0; d < p.shape.size(); ++d) {
        if (q.cut_parts[d] > 1) p.shape[d] = q.cut_parts[d];
      }
      p.src.mesh = user.src.mesh;
      p.src.placements = user.src.placements;
      // Nested S(d) over a cut dim of cut_parts entries gives every tile exactly one; a strided
      // shard need not (_S(d, 3) over 2 ranks: 2 and 0 of 2). Which entry a tile takes does not
      // matter: the gathered amax is the maximum over all of them.
      for (Placement& pl : p.src.placements) {
        if (pl.is_shard() && q.cut_parts[pl.dim] > 1) pl = Placement::Shard(pl.dim);
      }
      p.src.buffer = kPartialAmaxBuffer;
      p.src.view = View{partial_offset, {}};
      p.src.has_view = true;
      partial_offset += LargestTileElements(p.src, p.shape);
      p.dst = ScaleLayout(user.src, user.shape, q.block);
      p.dst.buffer = kGatheredAmaxBuffer;
      p.dst.view = View{gathered_offset, {}};
      p.dst.has_view = true;
      gathered_offset += LargestTileElements(p.dst, p.shape);
      q.partial_tensor = static_cast<uint32_t>(exchange->tensors.size());
      exchange->tensors.push_back(std::move(p));
    }
    lowered->quantized_sources.push_back(std::move(q));
  }
  if (!exchange->tensors.empty()) lowered->amax_exchange = std::move(exchange);
  return std::shared_ptr<const RefitSpec>(std::move(lowered));
}

namespace {

// The QuantTile of `tile` (a rank's source tile of qs, non-empty), read as `src_dtype` from
// `src` with `strides`: along a cut dim the tile is one block of its own extent, whose amax
// comes from the exchange.
QuantTile TileOf(const QuantizedSource& qs, DType src_dtype, DType fp8, const Box& tile,
                 const uint8_t* src, const std::array<int64_t, kMaxTensorDims>& strides) {
  QuantTile q;
  q.src_dtype = src_dtype;
  q.src = src;
  q.ndim = tile.ndim;
  for (int d = 0; d < tile.ndim; ++d) {
    q.extent[d] = tile.extent(d);
    q.src_strides[d] = strides[d];
    q.block[d] = qs.cut_parts.empty() || qs.cut_parts[d] == 1
                     ? qs.block[d]
                     : std::max<int64_t>(1, tile.extent(d));
  }
  q.arith = qs.scheme == QuantScheme::kMx ? QuantArith::kMx : QuantArith::kFp32Scale;
  q.format = fp8 == DType::kFp8E5M2 ? quant::Fp8Format::kE5M2 : quant::Fp8Format::kE4M3;
  return q;
}

// The QuantTile of a rank's non-empty source tile of quantized source `q` of `lowered`: the
// user's tile through its view, or a requantized source's tile dequantized into `dequantized`.
QuantTile SourceTileOf(const RefitSpec& lowered, const QuantizedSource& qs, const Box& tile,
                       const uint8_t* user_buffer, const uint8_t* user_scales,
                       float* dequantized) {
  const TensorSpec& t = lowered.tensors[qs.tensor];
  std::array<int64_t, kMaxTensorDims> strides{};
  if (qs.requantized()) {
    DequantizeTile(qs, t.shape, tile, user_buffer, user_scales, dequantized);
    int64_t stride = 1;
    for (int d = tile.ndim - 1; d >= 0; --d) {
      strides[d] = stride;
      stride *= tile.extent(d);
    }
    return TileOf(qs, DType::kFp32, t.dtype, tile,
                  reinterpret_cast<const uint8_t*>(dequantized), strides);
  }
  TileStrides(qs.src, tile, strides);
  return TileOf(qs, qs.dtype, t.dtype, tile,
                user_buffer + qs.src.view.offset * DTypeSize(qs.dtype), strides);
}

}  // namespace

void QuantizeBox(const QuantizedSource& qs, DType fp8, const Box& tile, const uint8_t* src,
                 const std::array<int64_t, kMaxTensorDims>& strides, uint8_t* out,
                 uint8_t* scales) {
  QuantTile q = TileOf(qs, qs.dtype, fp8, tile, src, strides);
  for (int d = 0; d < tile.ndim; ++d) q.block[d] = qs.block[d];  // The whole tensor's blocks.
  q.out = out;
  q.scales = scales;
  QuantizeTile(q);
}

QuantTile SourceQuantTile(const RefitSpec& lowered, size_t q, const Box& tile,
                          const uint8_t* user_buffer, uint8_t* elements_buffer,
                          uint8_t* scales_buffer) {
  const QuantizedSource& qs = lowered.quantized_sources[q];
  const TensorSpec& t = lowered.tensors[qs.tensor];
  const TensorSpec& s = lowered.tensors[qs.scale_tensor];
  QuantTile qt;
  if (qs.requantized()) {
    // The FP8 tile as it is (1-byte elements through the source view): not dequantized here.
    std::array<int64_t, kMaxTensorDims> strides{};
    TileStrides(qs.src, tile, strides);
    qt = TileOf(qs, qs.dtype, t.dtype, tile, user_buffer + qs.src.view.offset, strides);
  } else {
    qt = SourceTileOf(lowered, qs, tile, user_buffer, nullptr, nullptr);
  }
  qt.out = elements_buffer + t.src.view.offset;
  qt.scales = scales_buffer + s.src.view.offset * DTypeSize(s.dtype);
  return qt;
}

DequantSource DequantSourceOf(const QuantizedSource& qs, const Box& tile,
                              const uint8_t* user_scales) {
  // As DequantizeTile reads them: the tile's blocks [lo / block, ceil(hi / block)) through the
  // scale layout's view.
  DequantSource d;
  d.mx = qs.src_scheme == QuantScheme::kMx;
  d.scales = user_scales + qs.src_scales.view.offset * (d.mx ? 1 : 4);
  Box blocks;
  blocks.ndim = tile.ndim;
  for (int k = 0; k < tile.ndim; ++k) {
    d.block[k] = qs.src_block[k];
    d.phase[k] = tile.lo[k] % qs.src_block[k];
    blocks.lo[k] = tile.lo[k] / qs.src_block[k];
    blocks.hi[k] = (tile.hi[k] + qs.src_block[k] - 1) / qs.src_block[k];
  }
  TileStrides(qs.src_scales, blocks, d.scale_strides);
  return d;
}

int64_t DequantizedElements(const QuantizedSource& qs, const Box& tile) {
  return qs.requantized() ? std::max<int64_t>(0, tile.NumElements()) : 0;
}

void DequantizeTile(const QuantizedSource& qs, const std::vector<int64_t>& shape,
                    const Box& tile, const uint8_t* user_buffer, const uint8_t* user_scales,
                    float* out) {
  if (tile.empty()) return;
  const int nd = tile.ndim;
  const quant::Fp8Format format =
      qs.dtype == DType::kFp8E5M2 ? quant::Fp8Format::kE5M2 : quant::Fp8Format::kE4M3;
  const bool mx = qs.src_scheme == QuantScheme::kMx;
  // The tile's scales: its blocks (a dim of one block included: [0, 1)), laid out by the scale
  // layout's view (Validate: the tile starts on a block boundary of every other dim).
  Box blocks;
  blocks.ndim = nd;
  for (int d = 0; d < nd; ++d) {
    blocks.lo[d] = tile.lo[d] / qs.src_block[d];
    blocks.hi[d] = (tile.hi[d] + qs.src_block[d] - 1) / qs.src_block[d];
  }
  std::array<int64_t, kMaxTensorDims> strides{}, scale_strides{};
  TileStrides(qs.src, tile, strides);
  TileStrides(qs.src_scales, blocks, scale_strides);
  const uint8_t* elements = user_buffer + qs.src.view.offset;
  const uint8_t* scales = user_scales + qs.src_scales.view.offset * (mx ? 1 : 4);
  auto scale_at = [&](int64_t offset) {
    if (mx) return quant::MxScale(scales[offset]);
    float s;
    std::memcpy(&s, scales + 4 * offset, 4);
    return s;
  };
  if (nd == 0) {
    out[0] = quant::Dequantize(elements[0], scale_at(0), format);
    return;
  }
  const int last = nd - 1;
  const int64_t inner = tile.extent(last), inner_block = qs.src_block[last];
  const int64_t inner_stride = strides[last];
  std::array<int64_t, kMaxTensorDims> idx{};
  while (true) {
    int64_t at = 0, scale_base = 0;
    for (int d = 0; d < last; ++d) {
      at += idx[d] * strides[d];
      scale_base += ((tile.lo[d] + idx[d]) / qs.src_block[d] - blocks.lo[d]) * scale_strides[d];
    }
    // The row in runs of one source block each: one scale per run, a plain loop inside.
    for (int64_t i = 0; i < inner;) {
      const int64_t g = tile.lo[last] + i;
      const int64_t b = g / inner_block;
      const int64_t run = std::min(inner - i, (b + 1) * inner_block - g);
      const float scale = scale_at(scale_base + (b - blocks.lo[last]) * scale_strides[last]);
      const uint8_t* from = elements + at + i * inner_stride;
      float* to = out + i;
      if (format == quant::Fp8Format::kE4M3) {
        for (int64_t k = 0; k < run; ++k) {
          to[k] = quant::DequantizeAs<quant::Fp8Format::kE4M3>(from[k * inner_stride], scale);
        }
      } else {
        for (int64_t k = 0; k < run; ++k) {
          to[k] = quant::DequantizeAs<quant::Fp8Format::kE5M2>(from[k * inner_stride], scale);
        }
      }
      i += run;
    }
    out += inner;
    int d = last - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < tile.extent(d)) break;
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

std::array<int64_t, kMaxTensorDims> TileBlocks(const QuantizedSource& qs, const Box& tile) {
  std::array<int64_t, kMaxTensorDims> blocks{};
  for (int d = 0; d < tile.ndim; ++d) {
    blocks[d] = qs.cut_parts[d] > 1 ? 1 : (tile.extent(d) + qs.block[d] - 1) / qs.block[d];
  }
  return blocks;
}

void PartialAmaxTile(const RefitSpec& lowered, size_t q, const Box& tile,
                     const uint8_t* user_buffer, float* partial, const uint8_t* user_scales,
                     float* dequantized) {
  const QuantizedSource& qs = lowered.quantized_sources[q];
  const std::array<int64_t, kMaxTensorDims> blocks = TileBlocks(qs, tile);
  int64_t n = 1;
  for (int d = 0; d < tile.ndim; ++d) n *= blocks[d];
  std::fill(partial, partial + n, 0.0f);  // A tile empty along a cut dim holds no element.
  if (tile.empty()) return;
  BlockAmax(SourceTileOf(lowered, qs, tile, user_buffer, user_scales, dequantized), partial);
}

void CombineAmax(const QuantizedSource& qs, const Box& tile, const float* gathered,
                 float* amax) {
  const std::array<int64_t, kMaxTensorDims> blocks = TileBlocks(qs, tile);
  const int nd = tile.ndim;
  // gathered: row-major over `blocks` with every cut dim widened to its parts.
  std::array<int64_t, kMaxTensorDims> g_extent{}, g_stride{};
  int64_t stride = 1, n = 1;
  for (int d = nd - 1; d >= 0; --d) {
    g_extent[d] = qs.cut_parts[d] > 1 ? qs.cut_parts[d] : blocks[d];
    g_stride[d] = stride;
    stride *= g_extent[d];
  }
  for (int d = 0; d < nd; ++d) n *= blocks[d];
  std::array<int64_t, kMaxTensorDims> idx{};
  for (int64_t i = 0; i < n; ++i) {
    // Max over the cut dims' parts at this block (its other indices fixed).
    int64_t base = 0;
    for (int d = 0; d < nd; ++d) base += (qs.cut_parts[d] > 1 ? 0 : idx[d]) * g_stride[d];
    float m = 0.0f;
    std::array<int64_t, kMaxTensorDims> part{};
    while (true) {
      int64_t at = base;
      for (int d = 0; d < nd; ++d) at += part[d] * g_stride[d];
      m = std::max(m, gathered[at]);
      int d = nd - 1;
      for (; d >= 0; --d) {
        if (qs.cut_parts[d] <= 1) continue;
        if (++part[d] < qs.cut_parts[d]) break;
        part[d] = 0;
      }
      if (d < 0) break;
    }
    amax[i] = m;
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[d] < blocks[d]) break;
      idx[d] = 0;
    }
  }
}

void QuantizeSourceTile(const RefitSpec& lowered, size_t q, const Box& tile,
                        const uint8_t* user_buffer, uint8_t* elements_buffer,
                        uint8_t* scales_buffer, const float* amax, const uint8_t* user_scales,
                        float* dequantized) {
  const QuantizedSource& qs = lowered.quantized_sources[q];
  const TensorSpec& t = lowered.tensors[qs.tensor];
  const TensorSpec& s = lowered.tensors[qs.scale_tensor];
  uint8_t* scales = scales_buffer + s.src.view.offset * DTypeSize(s.dtype);
  const quant::Fp8Format format =
      t.dtype == DType::kFp8E5M2 ? quant::Fp8Format::kE5M2 : quant::Fp8Format::kE4M3;
  if (amax != nullptr) {
    // Scales from the combined amaxes: also on a rank whose tile is empty along a cut dim, which
    // holds the (replicated) scales all the same.
    const std::array<int64_t, kMaxTensorDims> blocks = TileBlocks(qs, tile);
    int64_t n = 1;
    for (int d = 0; d < tile.ndim; ++d) n *= blocks[d];
    for (int64_t i = 0; i < n; ++i) {
      if (qs.scheme == QuantScheme::kMx) {
        scales[i] = quant::MxScaleFromAmax(amax[i], format);
      } else {
        const float scale = quant::ScaleFromAmax(amax[i], format);
        std::memcpy(scales + 4 * i, &scale, 4);
      }
    }
  }
  if (tile.empty()) return;
  QuantTile qt = SourceTileOf(lowered, qs, tile, user_buffer, user_scales, dequantized);
  qt.out = elements_buffer + t.src.view.offset;
  qt.scales = scales;
  qt.amax = amax;
  QuantizeTile(qt);
}

}  // namespace reshard::plan
