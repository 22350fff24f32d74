#include "src/plan/spec.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <queue>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "src/common/checked.h"
#include "src/common/json.h"
#include "src/common/status.h"
#include "src/plan/plan.h"
#include "src/plan/quant_spec.h"
#include "src/plan/tiling.h"

namespace reshard::plan {

// Ranks are dense ids; this bound keeps per-rank tables small and catches typos like 1e9.
inline constexpr int32_t kMaxRank = kMaxWorldSize;
// Views whose non-overlap cannot be shown from their strides are checked element by element
// up to this many elements; tiles sharing a buffer whose address ranges intersect are compared
// run by run, up to this many runs per group of such tiles on a rank...
inline constexpr int64_t kMaxExactOverlapCheck = int64_t{1} << 24;
// ...and up to this many runs in all, so that validation stays within seconds.
inline constexpr int64_t kMaxOverlapRunsPerSpec = int64_t{1} << 27;

std::string Placement::ToString() const {
  if (!is_shard()) return "R";
  if (is_strided()) return absl::StrCat("_S(", dim, ", ", split_factor, ")");
  return absl::StrCat("S(", dim, ")");
}

int64_t Mesh::IndexOf(int32_t rank) const {
  auto it = std::find(ranks.begin(), ranks.end(), rank);
  return it == ranks.end() ? -1 : it - ranks.begin();
}

int32_t Topology::DomainOf(int32_t rank) const {
  if (ranks_per_domain > 0) return static_cast<int32_t>(rank - rank % ranks_per_domain);
  for (const auto& d : domains) {
    if (std::find(d.begin(), d.end(), rank) != d.end())
      return *std::min_element(d.begin(), d.end());
  }
  return rank;
}

int32_t RefitSpec::WorldSize() const {
  int32_t max_rank = -1;
  // Most tensors repeat the previous tensor's mesh on a side: comparing is cheaper than a scan.
  const std::vector<int32_t>* previous[2] = {nullptr, nullptr};
  for (const TensorSpec& t : tensors) {
    for (int side = 0; side < 2; ++side) {
      const std::vector<int32_t>& ranks = (side == 0 ? t.src : t.dst).mesh.ranks;
      if (previous[side] != nullptr && *previous[side] == ranks) continue;
      previous[side] = &ranks;
      for (int32_t r : ranks) max_rank = std::max(max_rank, r);
    }
  }
  for (const auto& d : topology.domains) {
    for (int32_t r : d) max_rank = std::max(max_rank, r);
  }
  return max_rank + 1;
}

namespace {

using json::QuoteForMessage;

absl::Status TensorError(const TensorSpec& t, const std::string& message) {
  return absl::InvalidArgumentError(
      absl::StrCat("tensor ", QuoteForMessage(t.name), ": ", message));
}

absl::Status CheckName(const TensorSpec& t, const std::string& name, const std::string& field) {
  if (name.size() > kMaxNameBytes) {
    return TensorError(t, absl::StrFormat("%s is %d bytes long; at most %d are allowed", field,
                                          name.size(), kMaxNameBytes));
  }
  if (!json::IsValidUtf8(name)) return TensorError(t, field + " is not valid UTF-8");
  return absl::OkStatus();
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
  // Whether `ranks` are those of the mesh checked last (in range, none twice): a model's
  // tensors mostly repeat a mesh, and comparing is cheaper than checking hundreds of ranks.
  // One mesh per side ("src", "dst"): a spec's two sides mostly differ.
  bool CheckedBefore(const char* side, const std::vector<int32_t>& ranks) const {
    return checked_[Slot(side)] == ranks;
  }
  void SetChecked(const char* side, const std::vector<int32_t>& ranks) {
    checked_[Slot(side)] = ranks;
  }

 private:
  static int Slot(const char* side) { return side[0] == 's' ? 0 : 1; }
  std::vector<uint32_t> stamp_;
  std::vector<int32_t> checked_[2];
};

// A strided shard can give a rank indices of a dim that are not one range ([0, 2) and [6, 8)
// of 8 rows under _S(0, 2) over 2 ranks alone); a tile is one box per rank, so such a layout
// cannot be held. Checks every composite shard of every dim a strided shard splits with
// DimShare: O(shards * axes), no element or run is ever listed.
absl::Status CheckContiguous(const TensorSpec& t, const Layout& l, const char* side) {
  const int mesh_ndim = l.mesh.ndim();
  for (int a = 0; a < mesh_ndim; ++a) {
    const Placement& p = l.placements[a];
    if (!p.is_strided()) continue;
    const int d = p.dim;
    bool earlier = false;  // One check per dim: from its first strided shard.
    for (int b = 0; b < a; ++b) earlier = earlier || (l.placements[b].is_strided() && l.placements[b].dim == d);
    if (earlier) continue;
    const int64_t shards = NumShards(l, d);
    std::array<ShardStep, kMaxMeshDims> steps;
    for (int64_t s = 0; s < shards; ++s) {
      const int k = ShardSteps(l, d, s, steps);
      const DimShare share(t.shape[d], absl::MakeConstSpan(steps.data(), k));
      if (share.Contiguous()) continue;
      // Name a rank holding this shard: coordinate 0 on every axis not sharding d.
      std::vector<int64_t> coord(mesh_ndim, 0);
      for (int b = 0, j = 0; b < mesh_ndim; ++b) {
        if (l.placements[b].is_shard() && l.placements[b].dim == d) coord[b] = steps[j++].index;
      }
      int64_t index = 0;
      for (int b = 0; b < mesh_ndim; ++b) index = index * l.mesh.shape[b] + coord[b];
      int64_t end = 0;
      const Interval first = share.RunAt(0, &end);
      int64_t after = 0;
      const Interval second = share.RunAt(end, &after);
      return TensorError(
          t, absl::StrFormat("%s.placements[%d] %s gives rank %d (mesh coordinate [%s]) indices "
                             "[%d, %d)%s[%d, %d)%s of dim %d, not one contiguous range; reshard "
                             "holds one box per rank",
                             side, a, p.ToString(), l.mesh.ranks[index],
                             absl::StrJoin(coord, ", "), first.lo, first.hi,
                             after < share.size() ? ", " : " and ", second.lo, second.hi,
                             after < share.size() ? ", ..." : "", d));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateLayout(const TensorSpec& t, const Layout& l, const char* side,
                            DType dtype, bool user_spec, RankStamp& stamp, uint32_t& epoch) {
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
    if (!s || *s > kMaxWorldSize) {
      return TensorError(t, absl::StrFormat("%s.mesh has more than %d ranks, the limit of a world",
                                            side, kMaxWorldSize));
    }
    size = *s;
  }
  if (size != l.mesh.size()) {
    return TensorError(t, absl::StrFormat("%s.mesh has %d ranks but its shape holds %d", side,
                                          l.mesh.size(), size));
  }
  if (!stamp.CheckedBefore(side, l.mesh.ranks)) {
    ++epoch;
    for (int32_t r : l.mesh.ranks) {
      if (r < 0 || r >= kMaxRank) {
        return TensorError(
            t, absl::StrFormat("%s.mesh rank %d is outside [0, %d)", side, r, kMaxRank));
      }
      if (!stamp.Mark(r, epoch)) {
        return TensorError(t, absl::StrFormat("%s.mesh names rank %d twice", side, r));
      }
    }
    stamp.SetChecked(side, l.mesh.ranks);
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
    if (p.split_factor < 1 || p.split_factor > kMaxSplitFactor) {
      return TensorError(t, absl::StrFormat("%s.placements[%d] has split factor %d; a split "
                                            "factor is at least 1 and below 2^62",
                                            side, a, p.split_factor));
    }
    if (!p.is_shard() && p.split_factor != 1) {
      return TensorError(t, absl::StrFormat("%s.placements[%d] replicates but has split factor "
                                            "%d; only a shard takes one",
                                            side, a, p.split_factor));
    }
  }
  RESHARD_RETURN_IF_ERROR(CheckContiguous(t, l, side));
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
  if (!l.buffer.empty()) {
    RESHARD_RETURN_IF_ERROR(CheckName(t, l.buffer, absl::StrCat(side, ".buffer")));
    if (user_spec && absl::StartsWith(l.buffer, kReservedBufferPrefix)) {
      return TensorError(t, absl::StrFormat("%s.buffer %s starts with the reserved prefix \"%s\"",
                                            side, QuoteForMessage(l.buffer),
                                            kReservedBufferPrefix));
    }
  }
  // Every byte a tile addresses must lie below kMaxBufferBytes: offset and strides on their own
  // first (their own sentence), then the extent of the largest tile, which bounds every tile's.
  const int64_t elem = DTypeSize(dtype);
  auto offset_bytes = CheckedMul(l.view.offset, elem);
  if (!offset_bytes || *offset_bytes >= kMaxBufferBytes) {
    return TensorError(
        t, absl::StrFormat("%s.view.offset %d lies beyond the per-rank buffer limit of 2^56 bytes",
                           side, l.view.offset));
  }
  for (size_t d = 0; d < l.view.strides.size(); ++d) {
    auto stride_bytes = CheckedMul(l.view.strides[d], elem);
    if (!stride_bytes || *stride_bytes >= kMaxBufferBytes) {
      return TensorError(
          t, absl::StrFormat(
                 "%s.view.strides[%d] is %d, beyond the per-rank buffer limit of 2^56 bytes", side,
                 d, l.view.strides[d]));
    }
  }
  const Box tile = LargestTile(l, t.shape);
  if (!tile.empty()) {
    std::array<int64_t, kMaxTensorDims> strides;
    TileStrides(l, tile, strides);  // Row-major: products of extents, below the tensor's size.
    std::optional<int64_t> last = l.view.offset;
    for (int d = 0; d < tile.ndim; ++d) {
      auto span = CheckedMul(tile.extent(d) - 1, strides[d]);
      last = span ? CheckedAdd(last, *span) : std::nullopt;
    }
    auto end_bytes = CheckedMul(CheckedAdd(last, 1), elem);
    if (!end_bytes || *end_bytes > kMaxBufferBytes) {
      return TensorError(
          t, absl::StrFormat(
                 "%s.view addresses bytes beyond the per-rank buffer limit of 2^56 bytes", side));
    }
  }
  return absl::OkStatus();
}

// Calls fn(offset) with the element offset of every element of `tile`, for the exact overlap
// check. Bounded by the caller.
template <typename Fn>
void ForEachTileAddress(const Layout& l, const Box& tile, Fn&& fn) {
  std::array<int64_t, kMaxTensorDims> strides;
  TileStrides(l, tile, strides);
  const int nd = tile.ndim;
  std::array<int64_t, kMaxTensorDims> idx{};
  if (tile.empty()) return;
  while (true) {
    int64_t a = l.view.offset;
    for (int d = 0; d < nd; ++d) a += idx[d] * strides[d];
    fn(a);
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
  int64_t reach = 0;  // Largest offset reachable by the dims so far (saturated at INT64_MAX).
  for (const auto& [stride, n] : dims) {
    if (stride <= reach) return false;
    int64_t span = 0;
    if (__builtin_mul_overflow(stride, n - 1, &span) ||
        __builtin_add_overflow(reach, span, &reach)) {
      // Saturated: a later (larger) stride is then not above it, and the strides are not
      // proven injective (the exact check decides).
      reach = std::numeric_limits<int64_t>::max();
    }
  }
  return true;
}

absl::Status CheckSelfOverlap(const TensorSpec& t, const Layout& l, const char* side) {
  if (l.view.strides.empty()) return absl::OkStatus();
  const Box tile = LargestTile(l, t.shape);
  if (StridesInjective(l, tile)) return absl::OkStatus();
  if (tile.NumElements() > kMaxExactOverlapCheck) {
    return TensorError(
        t, absl::StrFormat("%s.view.strides cannot be shown to give every element its own address",
                           side));
  }
  const absl::Status shared = TensorError(
      t, absl::StrFormat("%s.view.strides give two elements of one tile the same address", side));
  // The addresses lie in [offset, offset + span). More elements than that share one; a span of
  // a few addresses per element is checked with a bitmap in linear time (sorting 2^24 addresses
  // took seconds, minutes under the sanitizers); otherwise sort.
  const int64_t elements = tile.NumElements();
  if (elements == 0) return absl::OkStatus();
  const int64_t span = TileExtent(l, tile) - l.view.offset;
  if (elements > span) return shared;
  if (span <= 8 * elements) {
    std::vector<uint64_t> seen(static_cast<size_t>((span + 63) / 64), 0);
    bool collided = false;
    ForEachTileAddress(l, tile, [&](int64_t a) {
      const int64_t bit = a - l.view.offset;
      uint64_t& word = seen[static_cast<size_t>(bit >> 6)];
      const uint64_t mask = uint64_t{1} << (bit & 63);
      collided = collided || (word & mask) != 0;
      word |= mask;
    });
    return collided ? shared : absl::OkStatus();
  }
  std::vector<int64_t> addresses;
  addresses.reserve(static_cast<size_t>(elements));
  ForEachTileAddress(l, tile, [&](int64_t a) { addresses.push_back(a); });
  std::sort(addresses.begin(), addresses.end());
  if (std::adjacent_find(addresses.begin(), addresses.end()) != addresses.end()) return shared;
  return absl::OkStatus();
}

// A tile as the overlap check sorts it: small (a whole model's tiles of one buffer are sorted
// per rank), its box recomputed from its cell only for the tiles whose hulls chain.
struct TileInBuffer {
  size_t tensor;
  int64_t cell;    // Flat cell index in the tensor's TileGrid.
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
  // Views whose strides each clear what the smaller ones reach, the usual case, give the starts
  // in order already: sorting 2^24 of them anyway took seconds.
  if (!std::is_sorted(starts.begin(), starts.end())) std::sort(starts.begin(), starts.end());
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

// Two tiles of a group of tiles sharing a buffer on one rank that share an address: the
// smallest such element offset, and the tiles, as indices into the group (earlier < later).
struct Collision {
  int64_t offset = -1;  // -1: the group's tiles share no address.
  size_t earlier = 0, later = 0;
};

// Merges the tiles' runs in address order (a heap over their sorted starts). Runs of one tile
// are disjoint (CheckSelfOverlap), so the first run that starts before the furthest end seen so
// far gives the smallest shared offset. O(runs * log(tiles)), whatever the number of tiles.
Collision FirstCollision(const std::vector<std::vector<int64_t>>& starts,
                         const std::vector<int64_t>& runs, size_t tiles) {
  using Entry = std::pair<int64_t, size_t>;  // (run start, tile)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
  std::vector<size_t> next(tiles, 0);
  for (size_t k = 0; k < tiles; ++k) {
    if (!starts[k].empty()) heap.emplace(starts[k][0], k);
  }
  int64_t end = std::numeric_limits<int64_t>::min();
  size_t owner = 0;
  while (!heap.empty()) {
    const auto [start, k] = heap.top();
    heap.pop();
    if (start < end) return {start, std::min(owner, k), std::max(owner, k)};
    if (start + runs[k] > end) {
      end = start + runs[k];
      owner = k;
    }
    if (++next[k] < starts[k].size()) heap.emplace(starts[k][next[k]], k);
  }
  return {};
}

// `only_rank` >= 0: checks that rank's tiles only (ValidateForRank).
absl::Status CheckBufferOverlap(const RefitSpec& spec, Side side, const std::string& buffer,
                                const std::vector<size_t>& tensors, int32_t only_rank,
                                GridCache& rank_grids, int64_t& runs_budget) {
  absl::flat_hash_map<int32_t, std::vector<TileInBuffer>> by_rank;
  for (size_t t : tensors) {
    const Layout& l = spec.layout(t, side);
    if (only_rank >= 0) {
      // One tile per tensor at most: the rank's own cell, found by its mesh position.
      const int64_t index = l.mesh.IndexOf(only_rank);
      if (index < 0) continue;
      const TileGrid& grid = rank_grids.Get(l, spec.tensors[t].shape);
      const TileGrid::Cell cell = grid.CellOfIndex(index);
      const Box box = grid.CellBox(cell);
      if (box.empty()) continue;
      by_rank[only_rank].push_back({t, grid.FlatIndex(cell), l.view.offset, TileExtent(l, box)});
      continue;
    }
    const TileGrid grid(l, spec.tensors[t].shape);
    for (int64_t flat = 0; flat < grid.num_cells(); ++flat) {
      const TileGrid::Cell cell = grid.CellAt(flat);
      const Box box = grid.CellBox(cell);
      if (box.empty()) continue;
      const int64_t extent = TileExtent(l, box);  // The same for every replica of the cell.
      const int64_t base = grid.CellBaseIndex(cell);
      for (int64_t j = 0; j < grid.num_replicas(); ++j) {
        by_rank[l.mesh.ranks[base + grid.replica_offset(j)]].push_back(
            {t, flat, l.view.offset, extent});
      }
    }
  }
  // Boxes of the tiles in chaining groups, from their tensors' grids (built once per tensor).
  absl::flat_hash_map<size_t, TileGrid> grids;
  std::vector<Box> boxes;
  auto box_of = [&](const TileInBuffer& tile) {
    auto it = grids.find(tile.tensor);
    if (it == grids.end()) {
      it = grids
               .try_emplace(tile.tensor, spec.layout(tile.tensor, side),
                            spec.tensors[tile.tensor].shape)
               .first;
    }
    return it->second.CellBox(it->second.CellAt(tile.cell));
  };
  std::vector<int32_t> ranks;
  for (const auto& [r, v] : by_rank) ranks.push_back(r);
  std::sort(ranks.begin(), ranks.end());
  // A tile's addresses depend on its tensor's view and its extents only, so ranks holding groups
  // of tiles of the same tensors and extents share one answer.
  absl::flat_hash_map<std::vector<int64_t>, Collision> checked;
  std::vector<std::vector<int64_t>> starts;
  std::vector<int64_t> runs, key;
  for (int32_t rank : ranks) {
    auto& tiles = by_rank[rank];
    std::sort(tiles.begin(), tiles.end(), [](const TileInBuffer& a, const TileInBuffer& b) {
      return a.lo != b.lo ? a.lo < b.lo : a.tensor < b.tensor;
    });
    // Groups: maximal sets of tiles whose address hulls [lo, hi) chain together. Tiles of
    // different groups cannot share an address; within a group, compare runs (interleaved views
    // are legal). Linear in the tiles when nothing interleaves.
    for (size_t first = 0; first < tiles.size();) {
      size_t last = first + 1;
      int64_t hi = tiles[first].hi;
      while (last < tiles.size() && tiles[last].lo < hi) hi = std::max(hi, tiles[last++].hi);
      const size_t n = last - first;
      const TileInBuffer* group = &tiles[first];
      first = last;
      if (n < 2) continue;
      boxes.clear();
      for (size_t k = 0; k < n; ++k) boxes.push_back(box_of(group[k]));
      key.clear();
      for (size_t k = 0; k < n; ++k) {
        key.push_back(static_cast<int64_t>(group[k].tensor));
        for (int d = 0; d < boxes[k].ndim; ++d) key.push_back(boxes[k].extent(d));
      }
      auto it = checked.find(key);
      if (it == checked.end()) {
        int64_t total = 0;
        for (size_t k = 0; k < n; ++k) {
          total =
              SaturatingAdd(total, TileRunCount(spec.layout(group[k].tensor, side), boxes[k]));
        }
        if (total > kMaxExactOverlapCheck || total > runs_budget) {
          return TensorError(
              spec.tensors[group[1].tensor],
              absl::StrFormat(
                  "%s.view may overlap tensor %s in buffer %s on rank %d and is too large to check "
                  "run by run",
                  SideName(side), QuoteForMessage(spec.tensors[group[0].tensor].name),
                  QuoteForMessage(buffer), rank));
        }
        runs_budget -= total;
        if (starts.size() < n) starts.resize(n);
        runs.resize(n);
        for (size_t k = 0; k < n; ++k) {
          runs[k] = TileRuns(spec.layout(group[k].tensor, side), boxes[k], starts[k]);
        }
        it = checked.emplace(key, FirstCollision(starts, runs, n)).first;
      }
      const Collision& c = it->second;
      if (c.offset >= 0) {
        return TensorError(
            spec.tensors[group[c.later].tensor],
            absl::StrFormat(
                "%s.view overlaps tensor %s in buffer %s on rank %d (element offset %d)",
                SideName(side), QuoteForMessage(spec.tensors[group[c.earlier].tensor].name),
                QuoteForMessage(buffer), rank, c.offset));
      }
    }
  }
  return absl::OkStatus();
}

// (Destination rank, source tile) pairs that intersect: the pieces a plan holds for the tensor
// at most. Tiles are products of per-dim intervals, so this is the product over dims of the
// intersecting (source interval, destination interval) pairs, times the destination replicas.
// Saturates at INT64_MAX.
// `src_grids` and `dst_grids` build each grid once per geometry among the last few tensors.
int64_t PieceBound(const TensorSpec& t, GridCache& src_grids, GridCache& dst_grids) {
  const TileGrid& src = src_grids.Get(t.src, t.shape);
  const TileGrid& dst = dst_grids.Get(t.dst, t.shape);
  int64_t pairs = 1;
  for (int d = 0; d < src.ndim(); ++d) {
    // Non-empty intervals of a dim are sorted and disjoint: a merge counts the intersections.
    const auto a = src.intervals(d), b = dst.intervals(d);
    int64_t count = 0;
    size_t i = 0, j = 0;
    while (i < a.size() && j < b.size()) {
      if (a[i].size() == 0) {
        ++i;
        continue;
      }
      if (b[j].size() == 0) {
        ++j;
        continue;
      }
      if (std::max(a[i].lo, b[j].lo) < std::min(a[i].hi, b[j].hi)) ++count;
      if (a[i].hi < b[j].hi)
        ++i;
      else
        ++j;
    }
    pairs = SaturatingMul(pairs, count);
  }
  return SaturatingMul(pairs, dst.num_replicas());
}

absl::Status ValidateTopology(const Topology& topo) {
  if (topo.ranks_per_domain < 0) {
    return absl::InvalidArgumentError("topology.ranks_per_domain is negative");
  }
  if (topo.ranks_per_domain > 0 && !topo.domains.empty()) {
    return absl::InvalidArgumentError(
        "topology gives both domains and ranks_per_domain; give one of them");
  }
  for (auto [key, value] : {std::pair{"nic_gbytes_per_s", topo.nic_gbytes_per_s},
                            std::pair{"nvlink_gbytes_per_s", topo.nvlink_gbytes_per_s}}) {
    if (!BandwidthInRange(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("topology.", key, " ", BandwidthRangeError(value)));
    }
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

absl::Status ValidateImpl(const RefitSpec& spec, int32_t only_rank) {
  if (spec.tensors.empty()) return absl::InvalidArgumentError("the spec has no tensors");
  if (spec.tensors.size() > kMaxTensors) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the spec has %d tensors; at most %d are allowed", spec.tensors.size(), kMaxTensors));
  }
  RESHARD_RETURN_IF_ERROR(ValidateTopology(spec.topology));
  absl::flat_hash_map<std::string_view, size_t> names;
  RankStamp stamp;
  uint32_t epoch = 0;
  GridCache src_grids, dst_grids;  // PieceBound's.
  std::optional<int64_t> total_bytes = 0;  // All tiles on all ranks, both sides.
  int64_t pieces = 0;
  // Buffers per side: name -> tensors, in spec order (the first one sets the element size).
  absl::flat_hash_map<std::string_view, std::vector<size_t>> buffers[2];
  names.reserve(spec.tensors.size());
  for (auto& b : buffers) b.reserve(spec.tensors.size());
  for (size_t i = 0; i < spec.tensors.size(); ++i) {
    const TensorSpec& t = spec.tensors[i];
    if (t.name.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("tensor %d has an empty name", i));
    }
    RESHARD_RETURN_IF_ERROR(CheckName(t, t.name, "name"));
    if (!names.emplace(t.name, i).second) {
      return TensorError(t, "the name is used by two tensors");
    }
    const int ndim = static_cast<int>(t.shape.size());
    if (ndim > kMaxTensorDims) {
      return TensorError(
          t, absl::StrFormat("shape has %d dims; at most %d are supported", ndim, kMaxTensorDims));
    }
    std::optional<int64_t> bytes = DTypeSize(t.dtype);
    for (int d = 0; d < ndim; ++d) {
      if (t.shape[d] < 0) {
        return TensorError(t, absl::StrFormat("shape[%d] is negative (%d)", d, t.shape[d]));
      }
    }
    for (int d = 0; d < ndim; ++d) bytes = CheckedMul(bytes, t.shape[d]);
    if (!bytes || *bytes >= kMaxSpecBytes) {
      return TensorError(t, "shape is too large: a tensor must hold fewer than 2^62 bytes");
    }
    // A lowered spec (quant_spec.h) names its internal buffers; a user's spec may not.
    const bool user_spec = spec.quantized_sources.empty();
    RESHARD_RETURN_IF_ERROR(ValidateLayout(t, t.src, "src", t.src_dtype(), user_spec, stamp, epoch));
    // ValidateQuant builds both sides' grids, which need valid layouts.
    RESHARD_RETURN_IF_ERROR(
        ValidateLayout(t, t.dst, "dst", t.dst_dtype(), user_spec, stamp, epoch));
    RESHARD_RETURN_IF_ERROR(ValidateQuant(t));
    if (t.src_quantized() && !SourceMatchesDestination(t)) {
      // A requantized FP8 source's scales are read by the quantizer alone (no tensor of the
      // lowered spec names them, unlike a matching source's): their view gets the checks of any
      // layout here, as the tensor "<name>.scale".
      const TensorSpec scales = ScaleTensor(t, Side::kSrc);
      RESHARD_RETURN_IF_ERROR(
          ValidateLayout(scales, scales.src, "src", scales.dtype, user_spec, stamp, epoch));
      RESHARD_RETURN_IF_ERROR(CheckSelfOverlap(scales, scales.src, "src"));
    }
    pieces = SaturatingAdd(pieces, PieceBound(t, src_grids, dst_grids));
    if (pieces > kMaxPieces) {
      return TensorError(t, absl::StrFormat("src and dst intersect in more than %d (destination "
                                            "rank, source tile) pairs, counting "
                                            "the tensors before it: the limit of a plan",
                                            kMaxPieces));
    }
    // All tiles of a side together hold the tensor once per replica.
    for (const auto& [l, side] : {std::pair{&t.src, "src"}, std::pair{&t.dst, "dst"}}) {
      std::optional<int64_t> replicas = 1;
      for (int a = 0; a < l->mesh.ndim(); ++a) {
        if (!l->placements[a].is_shard()) replicas = CheckedMul(replicas, l->mesh.shape[a]);
      }
      total_bytes = CheckedAdd(total_bytes, CheckedMul(replicas, *bytes).value_or(kMaxSpecBytes));
      if (!total_bytes || *total_bytes >= kMaxSpecBytes) {
        return TensorError(t, absl::StrFormat("%s brings the tiles of all tensors on all ranks to "
                                              "2^62 bytes or more, the limit of "
                                              "a spec",
                                              side));
      }
    }
    for (Side side : {Side::kSrc, Side::kDst}) {
      const Layout& l = side == Side::kSrc ? t.src : t.dst;
      RESHARD_RETURN_IF_ERROR(CheckSelfOverlap(t, l, SideName(side)));
      const int s = static_cast<int>(side);
      const std::string& buffer = side == Side::kSrc ? t.src_buffer() : t.dst_buffer();
      std::vector<size_t>& users = buffers[s][buffer];
      auto elem = [side](const TensorSpec& u) {
        return DTypeSize(side == Side::kSrc ? u.src_dtype() : u.dst_dtype());
      };
      if (!users.empty() && elem(spec.tensors[users.front()]) != elem(t)) {
        return TensorError(
            t, absl::StrFormat("%s.buffer %s also holds tensor %s whose dtype has a different size",
                               SideName(side), QuoteForMessage(buffer),
                               QuoteForMessage(spec.tensors[users.front()].name)));
      }
      users.push_back(i);
    }
  }
  int64_t runs_budget = kMaxOverlapRunsPerSpec;
  for (Side side : {Side::kSrc, Side::kDst}) {
    // Deterministic order: by first tensor of each buffer.
    std::vector<std::pair<size_t, std::string_view>> order;
    for (const auto& [name, ts] : buffers[static_cast<int>(side)]) {
      if (ts.size() > 1) order.emplace_back(ts.front(), name);
    }
    std::sort(order.begin(), order.end());
    GridCache grids;  // A buffer's tensors mostly repeat a few geometries.
    for (const auto& [first, name] : order) {
      RESHARD_RETURN_IF_ERROR(CheckBufferOverlap(spec, side, std::string(name),
                                                 buffers[static_cast<int>(side)][name], only_rank,
                                                 grids, runs_budget));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Validate(const RefitSpec& spec) { return ValidateImpl(spec, -1); }

absl::Status ValidateForRank(const RefitSpec& spec, int32_t rank) {
  return ValidateImpl(spec, rank);
}

std::string BandwidthRangeError(double gbytes_per_s) {
  return absl::StrCat("is ", gbytes_per_s, "; it must lie in [", kMinGbytesPerS, ", ",
                      kMaxGbytesPerS, "] GB/s");
}

}  // namespace reshard::plan
