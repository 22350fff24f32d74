#include "src/plan/quant_spec.h"

#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/common/json.h"
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

std::vector<int64_t> BlockShape(const TensorSpec& t) {
  const int ndim = static_cast<int>(t.shape.size());
  std::vector<int64_t> block(ndim, 1);
  const Quant& q = t.dst.quant;
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
      if (ndim > 0) block[ndim - 1] = std::max<int64_t>(1, t.shape[ndim - 1]);
      break;
    case QuantScheme::kTensor:
      for (int d = 0; d < ndim; ++d) block[d] = std::max<int64_t>(1, t.shape[d]);
      break;
  }
  return block;
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
                   const std::vector<int64_t>& block, Side side) {
  Layout s;
  s.mesh = l.mesh;
  s.placements = l.placements;
  if (side != Side::kDst) return s;
  for (Placement& p : s.placements) {
    if (p.is_shard() && shape[p.dim] <= block[p.dim]) p = Placement::Replicate();
  }
  return s;
}

absl::Status ValidateQuant(const TensorSpec& t) {
  const Layout& dst = t.dst;
  const int ndim = static_cast<int>(t.shape.size());
  if (t.src.dtype || t.src.quant.scheme != QuantScheme::kNone || !t.src.scale_buffer.empty() ||
      t.src.has_scale_view) {
    return QuantError(t, "src.dtype, src.quant and src scales are not supported yet: quantized "
                         "sources travel as the tensor's dtype (give the source's dtype as the "
                         "tensor's)");
  }
  if (dst.quant.scheme == QuantScheme::kNone) {
    if (dst.dtype && *dst.dtype != t.dtype) {
      return QuantError(t, absl::StrFormat("dst.dtype %s differs from the tensor's dtype %s "
                                           "without dst.quant; a destination of another dtype "
                                           "must be quantized (casting is not supported)",
                                           std::string(DTypeName(*dst.dtype)), std::string(DTypeName(t.dtype))));
    }
    if (!dst.scale_buffer.empty() || dst.has_scale_view) {
      return QuantError(t, "dst.scale_buffer and dst.scale_view need dst.quant");
    }
    return absl::OkStatus();
  }
  const char* scheme = QuantSchemeName(dst.quant.scheme);
  if (!dst.dtype || !IsFp8(*dst.dtype)) {
    return QuantError(t, absl::StrFormat("dst.quant (scheme %s) needs dst.dtype fp8e4m3 or "
                                         "fp8e5m2%s",
                                         scheme,
                                         dst.dtype ? absl::StrCat(", not ", std::string(DTypeName(*dst.dtype)))
                                                   : std::string()));
  }
  if (!IsQuantizable(t.dtype)) {
    return QuantError(t, absl::StrFormat("dst.quant quantizes bf16, fp16 or fp32 tensors, not %s",
                                         std::string(DTypeName(t.dtype))));
  }
  const std::vector<int64_t>& given = dst.quant.block;
  switch (dst.quant.scheme) {
    case QuantScheme::kBlock:
      if (given.empty()) {
        return QuantError(t, "dst.quant.block is required by scheme block (e.g. [128, 128])");
      }
      [[fallthrough]];
    case QuantScheme::kMx:
      if (static_cast<int>(given.size()) > ndim || (ndim == 0 && given.empty())) {
        return QuantError(t, absl::StrFormat("dst.quant.block has %d entries for a %d-D tensor",
                                             std::max<size_t>(given.size(), 1), ndim));
      }
      for (size_t i = 0; i < given.size(); ++i) {
        if (given[i] < 1) {
          return QuantError(t, absl::StrFormat("dst.quant.block[%d] is %d; blocks are at least 1",
                                               i, given[i]));
        }
      }
      break;
    case QuantScheme::kChannel:
      if (ndim == 0) return QuantError(t, "dst.quant scheme channel needs a tensor of 1 dim or more");
      [[fallthrough]];
    case QuantScheme::kTensor:
      if (!given.empty()) {
        return QuantError(t, absl::StrFormat("dst.quant.block is not taken by scheme %s (its "
                                             "block is %s)",
                                             scheme,
                                             dst.quant.scheme == QuantScheme::kChannel
                                                 ? "a whole row"
                                                 : "the whole tensor"));
      }
      break;
    case QuantScheme::kNone:
      break;
  }
  const std::vector<int64_t> block = BlockShape(t);
  // Source tiles quantize whole blocks: each must start on a block boundary.
  const Cut src_cut = FirstCut(t.src, t.shape, block, [](int) { return true; });
  if (src_cut.dim >= 0) {
    return QuantError(
        t, absl::StrFormat("src tiles cut the quantization blocks of dim %d (rank %d's tile "
                           "starts at element %d, not a multiple of the block's %d): combining "
                           "partial amaxes across source tiles is not supported yet",
                           src_cut.dim, src_cut.rank, src_cut.start, block[src_cut.dim]));
  }
  // Destination tiles hold whole blocks, except along a dim of one block (scales replicated).
  const Cut dst_cut = FirstCut(t.dst, t.shape, block,
                               [&](int d) { return t.shape[d] > block[d]; });
  if (dst_cut.dim >= 0) {
    return QuantError(
        t, absl::StrFormat("dst tiles cut the quantization blocks of dim %d (rank %d's tile "
                           "starts at element %d, not a multiple of the block's %d); only a dim "
                           "of one block may be cut (its scale is then replicated)",
                           dst_cut.dim, dst_cut.rank, dst_cut.start, block[dst_cut.dim]));
  }
  // Every tile's scales are a tile of the scale layout (torch.chunk of the blocked shape).
  const std::vector<int64_t> blocked = BlockedShape(t.shape, block);
  for (const Side side : {Side::kSrc, Side::kDst}) {
    const Layout& l = t.layout(side);
    const Layout scales = ScaleLayout(l, t.shape, block, side);
    const TileGrid elements(l, t.shape), blocks(scales, blocked);
    for (int d = 0; d < ndim; ++d) {
      // A destination dim of one block: its scale is replicated, nothing to compare.
      if (side == Side::kDst && t.shape[d] <= block[d]) continue;
      const auto e = elements.intervals(d), b = blocks.intervals(d);
      for (size_t i = 0; i < e.size() && i < b.size(); ++i) {
        const bool empty = e[i].size() == 0;
        if ((empty && b[i].size() == 0) ||
            (!empty && b[i].lo == e[i].lo / block[d] &&
             b[i].hi == (e[i].hi + block[d] - 1) / block[d])) {
          continue;
        }
        TileGrid::Cell cell{};
        cell[d] = static_cast<int64_t>(i);
        return QuantError(
            t, absl::StrFormat("%s tiles of dim %d do not split its %d blocks of %d the way "
                               "they split its elements (rank %d holds elements [%d, %d)), so "
                               "the scales cannot be laid out as a tile per rank",
                               SideName(side), d, blocked[d], block[d], elements.Holder(cell, 0), e[i].lo,
                               e[i].hi));
      }
    }
  }
  if (!dst.scale_buffer.empty() && absl::StartsWith(dst.scale_buffer, kReservedBufferPrefix)) {
    return QuantError(t, absl::StrFormat("dst.scale_buffer %s starts with the reserved prefix "
                                         "\"%s\"",
                                         QuoteForMessage(dst.scale_buffer), kReservedBufferPrefix));
  }
  if (dst.has_scale_view) {
    if (dst.scale_view.offset < 0) {
      return QuantError(t, "dst.scale_view.offset is negative");
    }
    if (!dst.scale_view.strides.empty() && static_cast<int>(dst.scale_view.strides.size()) != ndim) {
      return QuantError(t, absl::StrFormat("dst.scale_view.strides has %d entries for a %d-D "
                                           "tensor",
                                           dst.scale_view.strides.size(), ndim));
    }
  }
  return absl::OkStatus();
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
  absl::flat_hash_set<std::string_view> names;
  for (const TensorSpec& t : spec->tensors) names.insert(t.name);
  // Each internal buffer holds every quantized tensor's largest tile in turn: the same offset on
  // every rank (a view is per tensor), contiguous row-major tiles.
  int64_t bytes_offset = 0, scales_offset = 0;
  for (size_t i = 0; i < spec->tensors.size(); ++i) {
    const TensorSpec& user = spec->tensors[i];
    if (!user.quantized()) continue;
    QuantizedSource q;
    q.tensor = static_cast<uint32_t>(i);
    q.dtype = user.dtype;
    q.src = user.src;
    q.src.buffer = user.src_buffer();
    q.scheme = user.dst.quant.scheme;
    q.block = BlockShape(user);

    TensorSpec& t = lowered->tensors[i];
    t.dtype = user.dst_dtype();
    t.src.buffer = kQuantizedBuffer;
    t.src.view = View{bytes_offset, {}};
    t.src.has_view = true;
    bytes_offset += LargestTileElements(user.src, user.shape);
    t.dst.dtype.reset();
    t.dst.quant = Quant{};
    t.dst.scale_buffer.clear();
    t.dst.scale_view = View{};
    t.dst.has_scale_view = false;

    TensorSpec s;
    s.name = user.name + ".scale";
    if (!names.insert(s.name).second) {
      return QuantError(user, absl::StrFormat("its scale tensor's name %s is taken by another "
                                              "tensor",
                                              QuoteForMessage(s.name)));
    }
    s.dtype = ScaleDType(q.scheme);
    s.shape = BlockedShape(user.shape, q.block);
    s.src = ScaleLayout(user.src, user.shape, q.block, Side::kSrc);
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
    s.dst = ScaleLayout(user.dst, user.shape, q.block, Side::kDst);
    s.dst.buffer = user.dst.scale_buffer.empty() ? s.name : user.dst.scale_buffer;
    s.dst.view = user.dst.scale_view;
    s.dst.has_view = user.dst.has_scale_view;
    q.scale_tensor = static_cast<uint32_t>(lowered->tensors.size());
    lowered->tensors.push_back(std::move(s));
    lowered->quantized_sources.push_back(std::move(q));
  }
  return std::shared_ptr<const RefitSpec>(std::move(lowered));
}

void QuantizeBox(const QuantizedSource& qs, DType fp8, const Box& tile, const uint8_t* src,
                 const std::array<int64_t, kMaxTensorDims>& strides, uint8_t* out,
                 uint8_t* scales) {
  QuantTile q;
  q.src_dtype = qs.dtype;
  q.src = src;
  q.ndim = tile.ndim;
  for (int d = 0; d < tile.ndim; ++d) {
    q.extent[d] = tile.extent(d);
    q.src_strides[d] = strides[d];
    q.block[d] = qs.block[d];
  }
  q.arith = qs.scheme == QuantScheme::kMx ? QuantArith::kMx : QuantArith::kFp32Scale;
  q.format = fp8 == DType::kFp8E5M2 ? quant::Fp8Format::kE5M2 : quant::Fp8Format::kE4M3;
  q.out = out;
  q.scales = scales;
  QuantizeTile(q);
}

void QuantizeSourceTile(const RefitSpec& lowered, size_t q, const Box& tile,
                        const uint8_t* user_buffer, uint8_t* elements_buffer,
                        uint8_t* scales_buffer) {
  if (tile.empty()) return;
  const QuantizedSource& qs = lowered.quantized_sources[q];
  const TensorSpec& t = lowered.tensors[qs.tensor];
  const TensorSpec& s = lowered.tensors[qs.scale_tensor];
  std::array<int64_t, kMaxTensorDims> strides{};
  TileStrides(qs.src, tile, strides);
  QuantizeBox(qs, t.dtype, tile, user_buffer + qs.src.view.offset * DTypeSize(qs.dtype), strides,
              elements_buffer + t.src.view.offset,
              scales_buffer + s.src.view.offset * DTypeSize(s.dtype));
}

}  // namespace reshard::plan
