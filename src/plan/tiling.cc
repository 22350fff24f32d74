#include "src/plan/tiling.h"

#include <algorithm>

#include "src/common/checked.h"
#include "src/common/status.h"

namespace reshard::plan {

Interval ChunkInterval(Interval whole, int64_t parts, int64_t i) {
  const int64_t n = whole.size();
  const int64_t c = CeilDiv(n, parts);
  return {whole.lo + std::min(i * c, n), whole.lo + std::min((i + 1) * c, n)};
}

namespace {

// Piece `i` of a torch.chunk of `m` positions into `parts` (DTensor's fill_empty_tensor_to_shards
// pads torch.chunk's list with empty chunks up to `parts`): [start, start + size). i * c stays
// below m + parts, so nothing wraps.
struct Piece {
  int64_t start = 0;
  int64_t size = 0;
};
Piece ChunkPiece(int64_t m, int64_t parts, int64_t i) {
  const int64_t c = CeilDiv(m, parts);
  const int64_t start = std::min(i * c, m);
  return {start, std::min(c, m - start)};
}

// The mesh axes that shard dim d of `l`, outermost first; returns how many.
int AxesOfDim(const Layout& l, int d, std::array<int8_t, kMaxMeshDims>& axes) {
  int k = 0;
  for (int a = 0; a < l.mesh.ndim(); ++a) {
    if (l.placements[a].is_shard() && l.placements[a].dim == d) axes[k++] = static_cast<int8_t>(a);
  }
  return k;
}

}  // namespace

DimShare::DimShare(int64_t n, absl::Span<const ShardStep> steps)
    : num_steps_(static_cast<int>(steps.size())) {
  len_[0] = n;
  for (int k = 0; k < num_steps_; ++k) {
    const ShardStep& s = steps[k];
    steps_[k] = s;
    const int64_t len = len_[k];
    // k torch.chunks of c1 positions: f full ones, then one of r < c1 (if r > 0), then empty
    // ones; rank `index` keeps its piece of each.
    const int64_t c1 = CeilDiv(len, s.split_factor);
    if (c1 == 0) {
      len_[k + 1] = 0;
      continue;
    }
    const int64_t f = len / c1;
    len_[k + 1] = f * ChunkPiece(c1, s.parts, s.index).size +
                  ChunkPiece(len - f * c1, s.parts, s.index).size;
  }
}

int64_t DimShare::At(int64_t p) const {
  // Back through the steps: the position in the list before each step.
  for (int k = num_steps_ - 1; k >= 0; --k) {
    const ShardStep& s = steps_[k];
    const int64_t len = len_[k];
    const int64_t c1 = CeilDiv(len, s.split_factor);
    const int64_t f = len / c1;
    const Piece full = ChunkPiece(c1, s.parts, s.index);
    if (p < f * full.size) {
      p = (p / full.size) * c1 + full.start + p % full.size;
    } else {
      p = f * c1 + ChunkPiece(len - f * c1, s.parts, s.index).start + (p - f * full.size);
    }
  }
  return p;
}

int64_t NumShards(const Layout& l, int d) {
  int64_t shards = 1;
  for (int a = 0; a < l.mesh.ndim(); ++a) {
    if (l.placements[a].is_shard() && l.placements[a].dim == d) shards *= l.mesh.shape[a];
  }
  return shards;
}

int ShardSteps(const Layout& l, int d, int64_t shard, std::array<ShardStep, kMaxMeshDims>& steps) {
  std::array<int8_t, kMaxMeshDims> axes;
  const int k = AxesOfDim(l, d, axes);
  for (int j = k - 1; j >= 0; --j) {
    const int a = axes[j];
    const int64_t n = l.mesh.shape[a];
    steps[j] = ShardStep{n, l.placements[a].split_factor, shard % n};
    shard /= n;
  }
  return k;
}

Interval DimShare::RunAt(int64_t p, int64_t* end_position) const {
  // At(q) - q does not decrease (the list increases), and is constant exactly on a run.
  const int64_t gap = At(p) - p;
  int64_t lo = 0, hi = p;  // First position of the run: in [lo, hi].
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (At(mid) - mid == gap) hi = mid; else lo = mid + 1;
  }
  const int64_t first = lo;
  lo = p + 1;
  hi = size();  // First position after the run: in [lo, hi].
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (At(mid) - mid == gap) lo = mid + 1; else hi = mid;
  }
  *end_position = lo;
  return {At(first), At(lo - 1) + 1};
}

bool TileGrid::SameGeometry(const Layout& layout, const std::vector<int64_t>& shape) const {
  if (static_cast<int>(shape.size()) != ndim_ || layout.mesh.ndim() != mesh_ndim_ ||
      static_cast<int>(layout.placements.size()) != mesh_ndim_) {
    return false;
  }
  for (int d = 0; d < ndim_; ++d) {
    if (shape[d] != dim_size_[d]) return false;
  }
  for (int a = 0; a < mesh_ndim_; ++a) {
    const Placement& p = layout.placements[a];
    if (layout.mesh.shape[a] != mesh_shape_[a] || (p.is_shard() ? p.dim : -1) != axis_dim_[a] ||
        (p.is_shard() ? p.split_factor : 1) != axis_split_[a]) {
      return false;
    }
  }
  return true;
}

TileGrid::TileGrid(const Layout& layout, const std::vector<int64_t>& shape)
    : mesh_(&layout.mesh), ndim_(static_cast<int>(shape.size())) {
  const Mesh& mesh = layout.mesh;
  const int mesh_ndim = mesh.ndim();
  if (mesh_ndim > 0) mesh_strides_[mesh_ndim - 1] = 1;
  for (int a = mesh_ndim - 2; a >= 0; --a) mesh_strides_[a] = mesh_strides_[a + 1] * mesh.shape[a + 1];
  // Intervals per dim: the product of the sizes of the axes sharding it.
  std::array<int64_t, kMaxTensorDims> parts;
  parts.fill(1);
  int64_t replicas = 1;
  mesh_ndim_ = mesh_ndim;
  uint32_t strided_dims = 0;  // Bit d: a strided shard splits dim d.
  for (int a = 0; a < mesh_ndim; ++a) {
    const Placement& p = layout.placements[a];
    mesh_shape_[a] = mesh.shape[a];
    axis_dim_[a] = static_cast<int8_t>(p.is_shard() ? p.dim : -1);
    axis_split_[a] = p.is_shard() ? p.split_factor : 1;
    if (p.is_strided()) strided_dims |= 1u << p.dim;
    if (p.is_shard()) {
      parts[p.dim] *= mesh.shape[a];
      dim_axes_[p.dim][num_dim_axes_[p.dim]++] = static_cast<int8_t>(a);
    } else {
      replicas *= mesh.shape[a];
    }
  }
  for (int d = 0; d < ndim_; ++d) {
    dim_size_[d] = shape[d];
    dim_begin_[d + 1] = dim_begin_[d] + parts[d];
    num_cells_ *= parts[d];
  }
  intervals_.resize(dim_begin_[ndim_]);
  base_parts_.resize(dim_begin_[ndim_]);
  shard_begin_.fill(-1);
  for (int d = 0; d < ndim_; ++d) {
    if (strided_dims & (1u << d)) {
      BuildStridedDim(layout, d, parts[d]);
      continue;
    }
    // Nested torch.chunk splits, in place: each split writes child i*k+j >= i, so expanding
    // from the back never overwrites a parent that is still to be read.
    Interval* seg = intervals_.data() + dim_begin_[d];
    seg[0] = Interval{0, shape[d]};
    int64_t count = 1;
    for (int k = 0; k < num_dim_axes_[d]; ++k) {
      const int64_t n = mesh.shape[dim_axes_[d][k]];
      for (int64_t i = count - 1; i >= 0; --i) {
        const Interval parent = seg[i];
        for (int64_t j = n - 1; j >= 0; --j) seg[i * n + j] = ChunkInterval(parent, n, j);
      }
      count *= n;
    }
    for (int64_t i = 0; i < parts[d]; ++i) {
      int64_t c = i, index = 0;
      for (int k = num_dim_axes_[d] - 1; k >= 0; --k) {
        const int a = dim_axes_[d][k];
        index += (c % mesh.shape[a]) * mesh_strides_[a];
        c /= mesh.shape[a];
      }
      base_parts_[dim_begin_[d] + i] = index;
    }
  }
  // Replica offsets over the replicate axes, row-major, expanded in place the same way.
  replica_offsets_.resize(replicas);
  replica_offsets_[0] = 0;
  int64_t count = 1;
  for (int a = 0; a < mesh_ndim; ++a) {
    if (layout.placements[a].is_shard()) continue;
    const int64_t n = mesh.shape[a];
    for (int64_t i = count - 1; i >= 0; --i) {
      const int64_t base = replica_offsets_[i];
      for (int64_t j = n - 1; j >= 0; --j) replica_offsets_[i * n + j] = base + j * mesh_strides_[a];
    }
    count *= n;
  }
}

void TileGrid::BuildStridedDim(const Layout& layout, int d, int64_t parts) {
  const int64_t n = dim_size_[d];
  const int k = num_dim_axes_[d];
  // Each shard's range, in shard order, then sorted by start; empty shards last, as [n, n)
  // (non-empty ranges partition [0, n), so every one starts below n).
  absl::InlinedVector<Interval, kInline> by_shard(parts);
  absl::InlinedVector<int64_t, kInline> order(parts);
  std::array<ShardStep, kMaxMeshDims> steps;
  for (int64_t s = 0; s < parts; ++s) {
    int64_t c = s;
    for (int j = k - 1; j >= 0; --j) {
      const int a = dim_axes_[d][j];
      steps[j] = ShardStep{mesh_->shape[a], layout.placements[a].split_factor, c % mesh_->shape[a]};
      c /= mesh_->shape[a];
    }
    const DimShare share(n, absl::MakeConstSpan(steps.data(), k));
    const int64_t size = share.size();
    if (size == 0) {
      by_shard[s] = Interval{n, n};
    } else {
      const int64_t first = share.At(0);
      RESHARD_CHECK_MSG(share.At(size - 1) - first + 1 == size,
                        "a strided shard gives a rank a non-contiguous range; Validate rejects it");
      by_shard[s] = Interval{first, first + size};
    }
    order[s] = s;
  }
  std::sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
    return by_shard[x].lo != by_shard[y].lo ? by_shard[x].lo < by_shard[y].lo : x < y;
  });
  shard_begin_[d] = static_cast<int64_t>(cell_of_shard_.size());
  cell_of_shard_.resize(cell_of_shard_.size() + parts);
  Interval* seg = intervals_.data() + dim_begin_[d];
  int64_t* base = base_parts_.data() + dim_begin_[d];
  for (int64_t i = 0; i < parts; ++i) {
    const int64_t s = order[i];
    seg[i] = by_shard[s];
    int64_t c = s, index = 0;
    for (int j = k - 1; j >= 0; --j) {
      const int a = dim_axes_[d][j];
      index += (c % mesh_->shape[a]) * mesh_strides_[a];
      c /= mesh_->shape[a];
    }
    base[i] = index;
    cell_of_shard_[shard_begin_[d] + s] = i;
  }
}

TileGrid::Cell TileGrid::CellAt(int64_t flat) const {
  Cell cell{};
  for (int d = ndim_ - 1; d >= 0; --d) {
    const int64_t n = dim_begin_[d + 1] - dim_begin_[d];
    cell[d] = flat % n;
    flat /= n;
  }
  return cell;
}

std::optional<TileGrid::Cell> TileGrid::CellOfRank(int32_t rank) const {
  const int64_t index = mesh_->IndexOf(rank);
  if (index < 0) return std::nullopt;
  return CellOfIndex(index);
}

TileGrid::Cell TileGrid::CellOfIndex(int64_t index) const {
  Cell cell{};
  for (int d = 0; d < ndim_; ++d) {
    int64_t c = 0;
    for (int k = 0; k < num_dim_axes_[d]; ++k) {
      const int a = dim_axes_[d][k];
      const int64_t coord = (index / mesh_strides_[a]) % mesh_->shape[a];
      c = c * mesh_->shape[a] + coord;
    }
    cell[d] = CellIndexOfShard(d, c);
  }
  return cell;
}

void TileStrides(const Layout& layout, const Box& tile, std::array<int64_t, kMaxTensorDims>& out) {
  if (!layout.view.strides.empty()) {
    for (int d = 0; d < tile.ndim; ++d) out[d] = layout.view.strides[d];
    return;
  }
  int64_t stride = 1;
  for (int d = tile.ndim - 1; d >= 0; --d) {
    out[d] = stride;
    stride *= std::max<int64_t>(tile.extent(d), 0);
  }
}

int64_t TileExtent(const Layout& layout, const Box& tile) {
  if (tile.empty()) return 0;
  std::array<int64_t, kMaxTensorDims> strides;
  TileStrides(layout, tile, strides);
  int64_t last = layout.view.offset;
  for (int d = 0; d < tile.ndim; ++d) last += (tile.extent(d) - 1) * strides[d];
  return last + 1;
}

Box LargestTile(const Layout& l, const std::vector<int64_t>& shape) {
  Box b;
  b.ndim = static_cast<int>(shape.size());
  for (int d = 0; d < b.ndim; ++d) b.hi[d] = shape[d];
  uint32_t strided_dims = 0;
  for (int a = 0; a < l.mesh.ndim(); ++a) {
    const Placement& p = l.placements[a];
    if (p.is_strided()) strided_dims |= 1u << p.dim;
    if (p.is_shard()) b.hi[p.dim] = ChunkInterval({0, b.hi[p.dim]}, l.mesh.shape[a], 0).size();
  }
  for (int d = 0; strided_dims != 0 && d < b.ndim; ++d) {
    if (!(strided_dims & (1u << d))) continue;
    const int64_t shards = NumShards(l, d);
    std::array<ShardStep, kMaxMeshDims> steps;
    int64_t longest = 0;
    for (int64_t s = 0; s < shards; ++s) {
      const int k = ShardSteps(l, d, s, steps);
      longest = std::max(longest, DimShare(shape[d], absl::MakeConstSpan(steps.data(), k)).size());
    }
    b.hi[d] = longest;
  }
  return b;
}

}  // namespace reshard::plan
