// Tiles: which box of the global tensor each rank of a layout holds.
//
// A layout's tiles form a grid. Along each tensor dim, the mesh axes that shard it (in mesh-axis
// order) split the dim into nested torch.chunk intervals; a grid *cell* picks one interval per
// dim. The ranks that hold a cell (its *holders*) differ only in their coordinates along the
// replicate axes, so every cell has the same number of holders.
//
// A dim that a strided shard `_S(d, k)` splits follows the general left-to-right rule instead
// (spec.h, Placement; DimShare below): a rank's indices are an increasing list, which Validate
// requires to be one contiguous range per rank (reshard holds one box per rank). Its intervals
// are then no longer in the order of the shards' mesh coordinates, so the grid sorts them and
// maps shard -> cell (CellOfRank) and cell -> base index (CellBaseIndex) through tables.
//
// Empty tiles follow DTensor exactly: torch's compute_local_shape_and_global_offset gives a
// shard that is empty along a dim the global offset `global_shape[dim]` there (an empty nested
// chunk is not clamped to its parent's end), so CellBox returns [n, n) for such a dim.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "src/plan/spec.h"

namespace reshard::plan {

struct Interval {
  int64_t lo = 0;
  int64_t hi = 0;  // Exclusive. lo == hi is an empty shard.
  int64_t size() const { return hi - lo; }
};

// An N-D box [lo, hi) of a tensor with at most kMaxTensorDims dims.
struct Box {
  int ndim = 0;
  std::array<int64_t, kMaxTensorDims> lo{};
  std::array<int64_t, kMaxTensorDims> hi{};

  int64_t extent(int d) const { return hi[d] - lo[d]; }
  // Inline: planning calls both for every piece of the world, several times.
  int64_t NumElements() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= extent(d);
    return n;
  }
  bool empty() const {
    for (int d = 0; d < ndim; ++d) {
      if (hi[d] <= lo[d]) return true;
    }
    return false;
  }
};

// `torch.chunk`-style split of [lo, hi) into `parts` intervals; the i-th is returned.
Interval ChunkInterval(Interval whole, int64_t parts, int64_t i);

// One mesh axis sharding a dim, seen from one rank: the axis has `parts` ranks, the rank sits at
// `index` on it, and the placement's split factor is `split_factor` (1: S(d)).
struct ShardStep {
  int64_t parts = 1;
  int64_t split_factor = 1;
  int64_t index = 0;
};

// The global indices one rank holds along a dim of `n` elements after the placements sharding
// it, applied left to right (DTensor's _compute_local_shape_and_global_offset): an increasing
// list of size() indices, the p-th at At(p). Each step is torch.chunk arithmetic on the list's
// positions (a split into k chunks has at most three chunk lengths: full, one partial, empty),
// so At is O(steps) and nothing is ever materialised per element or per run: dims reach 2^62
// elements. Exact for n and split factors below 2^62 and axes of at most kMaxWorldSize ranks.
class DimShare {
 public:
  DimShare(int64_t n, absl::Span<const ShardStep> steps);
  int64_t size() const { return len_[num_steps_]; }
  // The global index of the p-th index held, p in [0, size()).
  int64_t At(int64_t p) const;
  // Whether the indices form one range [At(0), At(0) + size()) (or none).
  bool Contiguous() const { return size() == 0 || At(size() - 1) - At(0) + 1 == size(); }
  // The maximal range of consecutive indices that holds the p-th (for error messages) and the
  // position just after it: O(steps * log(size)).
  Interval RunAt(int64_t p, int64_t* end_position) const;

 private:
  int num_steps_ = 0;
  std::array<ShardStep, kMaxMeshDims> steps_{};
  std::array<int64_t, kMaxMeshDims + 1> len_{};  // The list's length before each step.
};

// The composite shards of dim d under `l`: the product of the sizes of the mesh axes sharding
// it. A composite shard numbers their coordinates row-major, outermost axis first.
int64_t NumShards(const Layout& l, int d);
// The steps (DimShare) of composite shard `shard` of dim d under `l`; returns how many.
int ShardSteps(const Layout& l, int d, int64_t shard, std::array<ShardStep, kMaxMeshDims>& steps);

class TileGrid {
 public:
  // `layout` must be valid for `shape` (see Validate). Keeps a pointer to layout.mesh.
  // Construction allocates nothing for grids of up to kInline intervals and replicas:
  // planning builds several grids per tensor.
  TileGrid(const Layout& layout, const std::vector<int64_t>& shape);

  int ndim() const { return ndim_; }
  // Intervals along tensor dim d, sorted and non-overlapping for binary search (overlap.h). On
  // a dim that only S(d) shards, interval i is composite shard i (row-major over the mesh
  // coordinates of the axes sharding d): the nested torch.chunk splits, an empty interval where
  // its chunk would start (e.g. [1, 1) inside [0, 2)). On a dim that a strided shard splits,
  // they are the shards' ranges sorted by start, the empty ones last as [n, n) (CellIndexOfShard
  // maps). CellBox, not this, gives a tile's DTensor box, where an empty dim is [n, n).
  absl::Span<const Interval> intervals(int d) const {
    return absl::Span<const Interval>(intervals_.data() + dim_begin_[d],
                                      dim_begin_[d + 1] - dim_begin_[d]);
  }
  int64_t num_cells() const { return num_cells_; }
  int64_t num_replicas() const { return static_cast<int64_t>(replica_offsets_.size()); }

  // Cells are addressed by one composite index per tensor dim.
  using Cell = std::array<int64_t, kMaxTensorDims>;
  // The cell's tile as DTensor has it: per dim the cell's interval, or [n, n) when that interval
  // is empty (n: the dim's global size), as torch's compute_local_shape_and_global_offset.
  Box CellBox(const Cell& cell) const;
  // Index into mesh.ranks of the first holder of `cell`; holder j is at that + replica_offset(j).
  int64_t CellBaseIndex(const Cell& cell) const;
  int64_t replica_offset(int64_t j) const { return replica_offsets_[j]; }
  // Every replica offset: for loops over the holders of many cells (a span reads the inline
  // storage's flag once, not per holder).
  absl::Span<const int64_t> replica_offsets() const { return replica_offsets_; }
  int32_t Holder(const Cell& cell, int64_t j) const {
    return mesh_->ranks[CellBaseIndex(cell) + replica_offsets_[j]];
  }
  // Decomposes a flat cell number (row-major over dims) into a cell.
  Cell CellAt(int64_t flat) const;
  // The flat cell number of `cell` (row-major over dims): CellAt's inverse.
  int64_t FlatIndex(const Cell& cell) const {
    int64_t f = 0;
    for (int d = 0; d < ndim_; ++d) f = f * (dim_begin_[d + 1] - dim_begin_[d]) + cell[d];
    return f;
  }
  // The interval index along dim d of composite shard `shard` (row-major over the coordinates
  // of the mesh axes sharding d, outermost first): `shard` itself unless a strided shard
  // reorders the dim.
  int64_t CellIndexOfShard(int d, int64_t shard) const {
    return shard_begin_[d] < 0 ? shard : cell_of_shard_[shard_begin_[d] + shard];
  }
  // The cell held by `rank`, or nullopt when the rank is not in the mesh.
  std::optional<Cell> CellOfRank(int32_t rank) const;
  // The cell held by mesh.ranks[index], index in [0, mesh size).
  Cell CellOfIndex(int64_t index) const;
  // Mesh coordinates -> rank index helpers.
  const Mesh& mesh() const { return *mesh_; }

  // Whether this grid is also the grid of `layout` over `shape`: the grid depends on the mesh's
  // shape, the placements and the tensor's shape, not on which ranks the mesh names.
  bool SameGeometry(const Layout& layout, const std::vector<int64_t>& shape) const;
  // Makes this the grid of `layout`, which must have SameGeometry (another mesh of the same
  // shape). Keeps a pointer to layout.mesh.
  void Rebind(const Layout& layout) { mesh_ = &layout.mesh; }

 private:
  // Intervals, base parts and the shard -> cell table of a dim that a strided shard splits.
  void BuildStridedDim(const Layout& layout, int d, int64_t parts);

  const Mesh* mesh_;
  int ndim_ = 0;
  // The geometry SameGeometry compares: mesh shape and, per mesh axis, the sharded dim or -1
  // and the split factor.
  int mesh_ndim_ = 0;
  std::array<int64_t, kMaxMeshDims> mesh_shape_{};
  std::array<int8_t, kMaxMeshDims> axis_dim_{};
  std::array<int64_t, kMaxMeshDims> axis_split_{};
  static constexpr size_t kInline = 16;
  // Every dim's intervals, concatenated: dim d is [dim_begin_[d], dim_begin_[d + 1]).
  absl::InlinedVector<Interval, kInline> intervals_;
  // Parallel to intervals_: the interval's part of a cell's base index into mesh.ranks, so
  // CellBaseIndex (called per piece and per holder) is a sum of lookups, not divisions.
  absl::InlinedVector<int64_t, kInline> base_parts_;
  std::array<int64_t, kMaxTensorDims + 1> dim_begin_{};
  std::array<int64_t, kMaxTensorDims> dim_size_{};  // The global shape.
  // Mesh axes sharding each dim, outermost first.
  std::array<std::array<int8_t, kMaxMeshDims>, kMaxTensorDims> dim_axes_{};
  std::array<int8_t, kMaxTensorDims> num_dim_axes_{};
  std::array<int64_t, kMaxMeshDims> mesh_strides_{};  // Row-major strides of the mesh.
  // Over replicate axes, row-major.
  absl::InlinedVector<int64_t, kInline> replica_offsets_;
  // Dims a strided shard reorders: cell_of_shard_[shard_begin_[d] + shard] is the shard's
  // interval index; shard_begin_[d] < 0 on every other dim (the identity).
  std::array<int64_t, kMaxTensorDims> shard_begin_{};
  absl::InlinedVector<int64_t, kInline> cell_of_shard_;
  int64_t num_cells_ = 1;
};

// The grids of a run of layouts, each built once per geometry (mesh shape, placements, tensor
// shape) among the last few: a model's tensors come in runs that repeat a handful of geometries
// (an expert's gate, up and down projections, then the next expert's), and a planning pass
// needs two grids per tensor. A returned grid stays valid until the next Get; the layout given
// must outlive its use.
class GridCache {
 public:
  const TileGrid& Get(const Layout& layout, const std::vector<int64_t>& shape) {
    for (Slot& slot : slots_) {
      if (slot.grid.has_value() && slot.grid->SameGeometry(layout, shape)) {
        slot.grid->Rebind(layout);
        last_key_ = slot.key;
        return *slot.grid;
      }
    }
    Slot& slot = slots_[next_++ % slots_.size()];
    slot.grid.emplace(layout, shape);
    slot.key = last_key_ = next_;
    return *slot.grid;
  }
  // The geometry of the grid the last Get returned: equal keys of one cache are one geometry
  // (PieceCache keys its pieces by them). Never 0.
  uint64_t last_key() const { return last_key_; }

 private:
  struct Slot {
    std::optional<TileGrid> grid;
    uint64_t key = 0;
  };
  std::array<Slot, 4> slots_;
  uint64_t next_ = 0, last_key_ = 0;
};

// Inline: overlap and scheduling call these once per piece.
inline Box TileGrid::CellBox(const Cell& cell) const {
  Box b;
  b.ndim = ndim_;
  for (int d = 0; d < ndim_; ++d) {
    const Interval& iv = intervals_[dim_begin_[d] + cell[d]];
    // DTensor: a shard empty along d starts at the dim's global size.
    const bool empty = iv.hi == iv.lo;
    b.lo[d] = empty ? dim_size_[d] : iv.lo;
    b.hi[d] = empty ? dim_size_[d] : iv.hi;
  }
  return b;
}

inline int64_t TileGrid::CellBaseIndex(const Cell& cell) const {
  int64_t index = 0;
  for (int d = 0; d < ndim_; ++d) index += base_parts_[dim_begin_[d] + cell[d]];
  return index;
}

// The tile of the largest shape in a layout: per dim the longest interval. A view that is
// injective on it is injective on every tile, since every tile's local box is inside it, and its
// extent bounds every tile's. torch.chunk's first part is its longest (ceil(n / parts), or all
// of n), and a longer parent's first part is no shorter, so on a dim only S(d) shards the
// longest nested interval is the first of the first: O(axes), no grid (validation runs this for
// every tensor and side). A strided shard breaks the second half (a longer list can give a
// shorter first piece: 8 -> 4 but 9 -> 3 under _S(d, 4) over 3 ranks), so a dim it splits takes
// the maximum over its shards, O(shards * axes).
Box LargestTile(const Layout& l, const std::vector<int64_t>& shape);

// Resolved element strides of a tile with local shape `tile_shape` under `layout`'s view.
void TileStrides(const Layout& layout, const Box& tile, std::array<int64_t, kMaxTensorDims>& out);

// The largest element offset (exclusive) a tile of `layout` touches: the buffer extent it needs.
int64_t TileExtent(const Layout& layout, const Box& tile);

}  // namespace reshard::plan
