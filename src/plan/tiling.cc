#include "src/plan/tiling.h"

#include <algorithm>

#include "src/common/checked.h"
#include "src/common/status.h"

namespace reshard::plan {

int64_t Box::NumElements() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= extent(d);
  return n;
}

bool Box::empty() const {
  for (int d = 0; d < ndim; ++d) {
    if (hi[d] <= lo[d]) return true;
  }
  return false;
}

Interval ChunkInterval(Interval whole, int64_t parts, int64_t i) {
  const int64_t n = whole.size();
  const int64_t c = CeilDiv(n, parts);
  return {whole.lo + std::min(i * c, n), whole.lo + std::min((i + 1) * c, n)};
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
    if (layout.mesh.shape[a] != mesh_shape_[a] || (p.is_shard() ? p.dim : -1) != axis_dim_[a]) {
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
  for (int a = 0; a < mesh_ndim; ++a) {
    const Placement& p = layout.placements[a];
    mesh_shape_[a] = mesh.shape[a];
    axis_dim_[a] = static_cast<int8_t>(p.is_shard() ? p.dim : -1);
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
  for (int d = 0; d < ndim_; ++d) {
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
  Cell cell{};
  for (int d = 0; d < ndim_; ++d) {
    int64_t c = 0;
    for (int k = 0; k < num_dim_axes_[d]; ++k) {
      const int a = dim_axes_[d][k];
      const int64_t coord = (index / mesh_strides_[a]) % mesh_->shape[a];
      c = c * mesh_->shape[a] + coord;
    }
    cell[d] = c;
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
  for (int a = 0; a < l.mesh.ndim(); ++a) {
    const Placement& p = l.placements[a];
    if (p.is_shard()) b.hi[p.dim] = ChunkInterval({0, b.hi[p.dim]}, l.mesh.shape[a], 0).size();
  }
  return b;
}

}  // namespace reshard::plan
