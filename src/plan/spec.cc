#include "src/plan/spec.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/common/checked.h"
#include "src/common/status.h"
#include "src/plan/plan.h"
#include "src/plan/tiling.h"

namespace reshard::plan {

// Ranks are dense ids; this bound keeps per-rank tables small and catches typos like 1e9.
inline constexpr int32_t kMaxRank = 1 << 20;
// Views whose non-overlap cannot be shown from their strides are checked element by element
// up to this many elements.
inline constexpr int64_t kMaxExactOverlapCheck = int64_t{1} << 24;

std::string Placement::ToString() const {
  return is_shard() ? absl::StrCat("S(", dim, ")") : std::string("R");
}

int64_t Mesh::IndexOf(int32_t rank) const {
  auto it = std::find(ranks.begin(), ranks.end(), rank);
  return it == ranks.end() ? -1 : it - ranks.begin();
}

int32_t Topology::DomainOf(int32_t rank) const {
  if (ranks_per_domain > 0) return static_cast<int32_t>(rank - rank % ranks_per_domain);
  for (const auto& d : domains) {
    if (std::find(d.begin(), d.end(), rank) != d.end()) return *std::min_element(d.begin(), d.end());
  }
  return rank;
}

int32_t RefitSpec::WorldSize() const {
  int32_t max_rank = -1;
  for (const TensorSpec& t : tensors) {
    for (const Layout* l : {&t.src, &t.dst}) {
      for (int32_t r : l->mesh.ranks) max_rank = std::max(max_rank, r);
    }
  }
  for (const auto& d : topology.domains) {
    for (int32_t r : d) max_rank = std::max(max_rank, r);
  }
  return max_rank + 1;
}

namespace {

absl::Status TensorError(const TensorSpec& t, const std::string& message) {
  return absl::InvalidArgumentError(absl::StrCat("tensor \"", t.name, "\": ", message));
}

// Checks meshes with a stamp per rank instead of a hash set: validation runs once per tensor
// and side, so it must stay linear and allocation-free at whole-model scale.
class RankStamp {
 public:
  bool Mark(int32_t rank, uint32_t epoch) {
    if (static_cast<size_t>(rank) >= stamp_.size()) stamp_.resize(rank + 1, 0);
    if (stamp_[rank] == epoch) return false;
    stamp_[rank] = epoch;
    return true;
  }

 private:
  std::vector<uint32_t> stamp_;
};

absl::Status ValidateLayout(const TensorSpec& t, const Layout& l, const char* side,
                            RankStamp& stamp, uint32_t& epoch) {
  const int mesh_ndim = l.mesh.ndim();
  if (mesh_ndim < 1 || mesh_ndim > kMaxMeshDims) {
    return TensorError(t, absl::StrFormat("%s.mesh has %d axes; a mesh has 1 to %d", side,
                                          mesh_ndim, kMaxMeshDims));
  }
  int64_t size = 1;
  for (int a = 0; a < mesh_ndim; ++a) {
    if (l.mesh.shape[a] < 1) {
      return TensorError(t, absl::StrFormat("%s.mesh axis %d is empty", side, a));
    }
    auto s = CheckedMul(size, l.mesh.shape[a]);
    if (!s || *s > kMaxRank) return TensorError(t, absl::StrFormat("%s.mesh is too large", side));
    size = *s;
  }
  if (size != l.mesh.size()) {
    return TensorError(t, absl::StrFormat("%s.mesh has %d ranks but its shape holds %d", side,
                                          l.mesh.size(), size));
  }
  ++epoch;
  for (int32_t r : l.mesh.ranks) {
    if (r < 0 || r >= kMaxRank) {
      return TensorError(t, absl::StrFormat("%s.mesh rank %d is outside [0, %d)", side, r, kMaxRank));
    }
    if (!stamp.Mark(r, epoch)) {
      return TensorError(t, absl::StrFormat("%s.mesh names rank %d twice", side, r));
    }
  }
  if (static_cast<int>(l.placements.size()) != mesh_ndim) {
    return TensorError(t, absl::StrFormat("%s.placements has %d entries but the mesh has %d axes",
                                          side, l.placements.size(), mesh_ndim));
  }
  const int ndim = static_cast<int>(t.shape.size());
  for (int a = 0; a < mesh_ndim; ++a) {
    const Placement& p = l.placements[a];
    if (p.is_shard() && (p.dim < 0 || p.dim >= ndim)) {
      return TensorError(t, absl::StrFormat("%s.placements[%d] shards dim %d of a %d-D tensor",
                                            side, a, p.dim, ndim));
    }
  }
  if (l.view.offset < 0) {
    return TensorError(t, absl::StrFormat("%s.view.offset is negative (%d)", side, l.view.offset));
  }
  if (!l.view.strides.empty()) {
    if (static_cast<int>(l.view.strides.size()) != ndim) {
      return TensorError(t, absl::StrFormat("%s.view.strides has %d entries for a %d-D tensor",
                                            side, l.view.strides.size(), ndim));
    }
    for (int d = 0; d < ndim; ++d) {
      if (l.view.strides[d] < 0) {
        return TensorError(t, absl::StrFormat("%s.view.strides[%d] is negative", side, d));
      }
    }
  }
  // Every tile's extent must fit in int64 bytes. Row-major tiles are no larger than the tensor.
  int64_t extent = l.view.offset;
  for (int d = 0; d < ndim; ++d) {
    const int64_t span_elems = l.view.strides.empty() ? 1 : l.view.strides[d];
    auto span = CheckedMul(std::max<int64_t>(t.shape[d] - 1, 0), span_elems);
    auto sum = span ? CheckedAdd(extent, *span) : std::nullopt;
    if (!sum) return TensorError(t, absl::StrFormat("%s.view addresses overflow", side));
    extent = *sum;
  }
  if (l.view.strides.empty()) {
    int64_t elements = 1;
    for (int64_t n : t.shape) elements *= n;  // Checked by the caller.
    auto sum = CheckedAdd(l.view.offset, elements);
    if (!sum) return TensorError(t, absl::StrFormat("%s.view addresses overflow", side));
    extent = *sum;
  }
  if (!CheckedMul(extent + 1, DTypeSize(t.dtype))) {
    return TensorError(t, absl::StrFormat("%s.view addresses overflow", side));
  }
  return absl::OkStatus();
}

// Element offsets a tile touches, for the exact overlap check. Bounded by the caller.
void TileAddresses(const Layout& l, const Box& tile, std::vector<int64_t>& out) {
  std::array<int64_t, kMaxTensorDims> strides;
  TileStrides(l, tile, strides);
  const int nd = tile.ndim;
  std::array<int64_t, kMaxTensorDims> idx{};
  if (tile.empty()) return;
  while (true) {
    int64_t a = l.view.offset;
    for (int d = 0; d < nd; ++d) a += idx[d] * strides[d];
    out.push_back(a);
    int d = nd - 1;
    while (d >= 0) {
      if (++idx[d] < tile.extent(d)) break;
      idx[d] = 0;
      --d;
    }
    if (d < 0) return;
  }
}

// True when the strides provably give distinct addresses to distinct elements of `tile`.
bool StridesInjective(const Layout& l, const Box& tile) {
  std::array<int64_t, kMaxTensorDims> strides;
  TileStrides(l, tile, strides);
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, extent) for extents > 1
  for (int d = 0; d < tile.ndim; ++d) {
    if (tile.extent(d) > 1) dims.emplace_back(strides[d], tile.extent(d));
  }
  std::sort(dims.begin(), dims.end());
  int64_t reach = 0;  // Largest offset reachable by the dims so far.
  for (const auto& [stride, n] : dims) {
    if (stride <= reach) return false;
    reach += stride * (n - 1);
  }
  return true;
}

// The tile of the largest shape in a layout: per dim the longest interval. A view that is
// injective on it is injective on every tile, since every tile's local box is inside it.
Box LargestTile(const Layout& l, const std::vector<int64_t>& shape) {
  TileGrid grid(l, shape);
  Box b;
  b.ndim = grid.ndim();
  for (int d = 0; d < b.ndim; ++d) {
    int64_t longest = 0;
    for (const Interval& iv : grid.intervals(d)) longest = std::max(longest, iv.size());
    b.lo[d] = 0;
    b.hi[d] = longest;
  }
  return b;
}

absl::Status CheckSelfOverlap(const TensorSpec& t, const Layout& l, const char* side) {
  if (l.view.strides.empty()) return absl::OkStatus();
  const Box tile = LargestTile(l, t.shape);
  if (StridesInjective(l, tile)) return absl::OkStatus();
  if (tile.NumElements() > kMaxExactOverlapCheck) {
    return TensorError(t, absl::StrFormat(
        "%s.view.strides cannot be shown to give every element its own address", side));
  }
  std::vector<int64_t> addresses;
  TileAddresses(l, tile, addresses);
  std::sort(addresses.begin(), addresses.end());
  if (std::adjacent_find(addresses.begin(), addresses.end()) != addresses.end()) {
    return TensorError(t, absl::StrFormat(
        "%s.view.strides give two elements of one tile the same address", side));
  }
  return absl::OkStatus();
}

struct TileInBuffer {
  size_t tensor;
  Box box;
  int64_t lo, hi;  // Address hull [lo, hi) in elements.
};

// Address runs of a tile: its dims sorted by stride, the innermost merged while contiguous, so
// the tile is `starts.size()` runs [start, start + run) of elements. Returns the run length.
// Fused buffers that interleave members (vLLM's w13: gate and up rows of every expert) have few
// long runs, so comparing runs stays cheap where comparing elements would not.
int64_t TileRuns(const Layout& l, const Box& tile, std::vector<int64_t>& starts) {
  std::array<int64_t, kMaxTensorDims> strides;
  TileStrides(l, tile, strides);
  std::vector<std::pair<int64_t, int64_t>> dims;  // (stride, extent) for extents > 1
  for (int d = 0; d < tile.ndim; ++d) {
    if (tile.extent(d) > 1) dims.emplace_back(strides[d], tile.extent(d));
  }
  std::sort(dims.begin(), dims.end());
  int64_t run = 1;
  size_t merged = 0;
  while (merged < dims.size() && dims[merged].first == run) run *= dims[merged++].second;
  starts.clear();
  starts.push_back(l.view.offset);
  for (size_t k = merged; k < dims.size(); ++k) {
    const size_t n = starts.size();
    for (int64_t i = 1; i < dims[k].second; ++i) {
      for (size_t j = 0; j < n; ++j) starts.push_back(starts[j] + i * dims[k].first);
    }
  }
  std::sort(starts.begin(), starts.end());
  return run;
}

int64_t TileRunCount(const Layout& l, const Box& tile) {
  std::array<int64_t, kMaxTensorDims> strides;
  TileStrides(l, tile, strides);
  std::vector<std::pair<int64_t, int64_t>> dims;
  for (int d = 0; d < tile.ndim; ++d) {
    if (tile.extent(d) > 1) dims.emplace_back(strides[d], tile.extent(d));
  }
  std::sort(dims.begin(), dims.end());
  int64_t run = 1, count = 1;
  size_t k = 0;
  while (k < dims.size() && dims[k].first == run) run *= dims[k++].second;
  for (; k < dims.size(); ++k) {
    count = CheckedMul(count, dims[k].second).value_or(std::numeric_limits<int64_t>::max());
  }
  return count;
}

// First element offset two tiles share, or -1. Runs of one tile are disjoint (CheckSelfOverlap).
int64_t FirstCommonAddress(const std::vector<int64_t>& a, int64_t a_run,
                           const std::vector<int64_t>& b, int64_t b_run) {
  size_t i = 0, j = 0;
  int64_t a_end = std::numeric_limits<int64_t>::min();
  int64_t b_end = a_end;  // End of the latest run of each tile.
  while (i < a.size() || j < b.size()) {
    if (j == b.size() || (i < a.size() && a[i] <= b[j])) {
      if (a[i] < b_end) return a[i];
      a_end = a[i++] + a_run;
    } else {
      if (b[j] < a_end) return b[j];
      b_end = b[j++] + b_run;
    }
  }
  return -1;
}

absl::Status CheckBufferOverlap(const RefitSpec& spec, Side side, const std::string& buffer,
                                const std::vector<size_t>& tensors) {
  absl::flat_hash_map<int32_t, std::vector<TileInBuffer>> by_rank;
  for (size_t t : tensors) {
    const Layout& l = spec.layout(t, side);
    ForEachTile(spec, t, side, [&](int32_t rank, const Box& box) {
      if (box.empty()) return;
      by_rank[rank].push_back({t, box, l.view.offset, TileExtent(l, box)});
    });
  }
  std::vector<int32_t> ranks;
  for (const auto& [r, v] : by_rank) ranks.push_back(r);
  std::sort(ranks.begin(), ranks.end());
  // A tile's addresses depend on its tensor's view and its extents only, so ranks holding tiles
  // of the same extents share one answer: (tensor, extents, tensor, extents) -> common offset.
  absl::flat_hash_map<std::vector<int64_t>, int64_t> checked;
  std::vector<int64_t> x, y, key;
  for (int32_t rank : ranks) {
    auto& tiles = by_rank[rank];
    std::sort(tiles.begin(), tiles.end(), [](const TileInBuffer& a, const TileInBuffer& b) {
      return a.lo != b.lo ? a.lo < b.lo : a.tensor < b.tensor;
    });
    for (size_t i = 1; i < tiles.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (tiles[j].hi <= tiles[i].lo) continue;
        // Hulls overlap: compare exact address sets (interleaved views are legal).
        const TensorSpec& a = spec.tensors[tiles[j].tensor];
        const TensorSpec& b = spec.tensors[tiles[i].tensor];
        key.clear();
        for (const TileInBuffer* tile : {&tiles[j], &tiles[i]}) {
          key.push_back(static_cast<int64_t>(tile->tensor));
          for (int d = 0; d < tile->box.ndim; ++d) key.push_back(tile->box.extent(d));
        }
        auto it = checked.find(key);
        if (it == checked.end()) {
          const Layout& la = spec.layout(tiles[j].tensor, side);
          const Layout& lb = spec.layout(tiles[i].tensor, side);
          const int64_t runs =
              CheckedAdd(TileRunCount(la, tiles[j].box), TileRunCount(lb, tiles[i].box))
                  .value_or(std::numeric_limits<int64_t>::max());
          if (runs > kMaxExactOverlapCheck) {
            return TensorError(b, absl::StrFormat(
                "%s.view may overlap tensor \"%s\" in buffer \"%s\" on rank %d and is too large "
                "to check run by run", SideName(side), a.name, buffer, rank));
          }
          const int64_t a_run = TileRuns(la, tiles[j].box, x);
          const int64_t b_run = TileRuns(lb, tiles[i].box, y);
          it = checked.emplace(key, FirstCommonAddress(x, a_run, y, b_run)).first;
        }
        if (it->second >= 0) {
          return TensorError(b, absl::StrFormat(
              "%s.view overlaps tensor \"%s\" in buffer \"%s\" on rank %d (element offset %d)",
              SideName(side), a.name, buffer, rank, it->second));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateTopology(const Topology& topo) {
  if (topo.ranks_per_domain < 0) {
    return absl::InvalidArgumentError("topology.ranks_per_domain is negative");
  }
  if (topo.ranks_per_domain > 0 && !topo.domains.empty()) {
    return absl::InvalidArgumentError(
        "topology gives both domains and ranks_per_domain; give one of them");
  }
  if (!(topo.nic_gbytes_per_s > 0) || !(topo.nvlink_gbytes_per_s > 0)) {
    return absl::InvalidArgumentError("topology bandwidths must be positive");
  }
  absl::flat_hash_map<int32_t, size_t> seen;
  for (size_t i = 0; i < topo.domains.size(); ++i) {
    if (topo.domains[i].empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("topology.domains[%d] is empty", i));
    }
    for (int32_t r : topo.domains[i]) {
      if (r < 0 || r >= kMaxRank) {
        return absl::InvalidArgumentError(
            absl::StrFormat("topology.domains[%d] rank %d is outside [0, %d)", i, r, kMaxRank));
      }
      auto [it, inserted] = seen.emplace(r, i);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "topology.domains[%d] names rank %d, already in domains[%d]", i, r, it->second));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Validate(const RefitSpec& spec) {
  if (spec.tensors.empty()) return absl::InvalidArgumentError("the spec has no tensors");
  RESHARD_RETURN_IF_ERROR(ValidateTopology(spec.topology));
  absl::flat_hash_map<std::string_view, size_t> names;
  RankStamp stamp;
  uint32_t epoch = 0;
  // Buffers per side: name -> tensors, in spec order (the first one sets the element size).
  absl::flat_hash_map<std::string_view, std::vector<size_t>> buffers[2];
  names.reserve(spec.tensors.size());
  for (auto& b : buffers) b.reserve(spec.tensors.size());
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const TensorSpec& t = spec.tensors[i];
    if (t.name.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("tensor %d has an empty name", i));
    }
    if (!names.emplace(t.name, i).second) {
      return TensorError(t, "the name is used by two tensors");
    }
    const int ndim = static_cast<int>(t.shape.size());
    if (ndim > kMaxTensorDims) {
      return TensorError(t, absl::StrFormat("shape has %d dims; at most %d are supported", ndim,
                                            kMaxTensorDims));
    }
    int64_t elements = DTypeSize(t.dtype);
    for (int d = 0; d < ndim; ++d) {
      if (t.shape[d] < 0) {
        return TensorError(t, absl::StrFormat("shape[%d] is negative (%d)", d, t.shape[d]));
      }
      auto n = CheckedMul(elements, t.shape[d]);
      if (!n) return TensorError(t, "shape is too large: its size in bytes overflows 64 bits");
      elements = *n;
    }
    RESHARD_RETURN_IF_ERROR(ValidateLayout(t, t.src, "src", stamp, epoch));
    RESHARD_RETURN_IF_ERROR(ValidateLayout(t, t.dst, "dst", stamp, epoch));
    for (Side side : {Side::kSrc, Side::kDst}) {
      const Layout& l = side == Side::kSrc ? t.src : t.dst;
      RESHARD_RETURN_IF_ERROR(CheckSelfOverlap(t, l, SideName(side)));
      const int s = static_cast<int>(side);
      const std::string& buffer = side == Side::kSrc ? t.src_buffer() : t.dst_buffer();
      std::vector<size_t>& users = buffers[s][buffer];
      if (!users.empty() && DTypeSize(spec.tensors[users.front()].dtype) != DTypeSize(t.dtype)) {
        return TensorError(t, absl::StrFormat(
            "%s.buffer \"%s\" also holds tensor \"%s\" whose dtype has a different size",
            SideName(side), buffer, spec.tensors[users.front()].name));
      }
      users.push_back(i);
    }
  }
  for (Side side : {Side::kSrc, Side::kDst}) {
    // Deterministic order: by first tensor of each buffer.
    std::vector<std::pair<size_t, std::string_view>> order;
    for (const auto& [name, ts] : buffers[static_cast<int>(side)]) {
      if (ts.size() > 1) order.emplace_back(ts.front(), name);
    }
    std::sort(order.begin(), order.end());
    for (const auto& [first, name] : order) {
      RESHARD_RETURN_IF_ERROR(CheckBufferOverlap(spec, side, std::string(name),
                                                 buffers[static_cast<int>(side)][name]));
    }
  }
  return absl::OkStatus();
}

}  // namespace reshard::plan
