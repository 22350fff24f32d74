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

TileGrid::TileGrid(const Layout& layout, const std::vector<int64_t>& shape)
    : mesh_(&layout.mesh) {
  const int mesh_ndim = layout.mesh.ndim();
  mesh_strides_.assign(mesh_ndim, 1);
  for (int a = mesh_ndim - 2; a >= 0; --a) {
    mesh_strides_[a] = mesh_strides_[a + 1] * layout.mesh.shape[a + 1];
  }
  dims_.resize(shape.size());
  dim_axes_.resize(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    dims_[d] = {Interval{0, shape[d]}};
  }
  std::vector<int> replicate_axes;
  for (int a = 0; a < mesh_ndim; ++a) {
    const Placement& p = layout.placements[a];
    if (!p.is_shard()) {
      replicate_axes.push_back(a);
      continue;
    }
    dim_axes_[p.dim].push_back(a);
    const int64_t parts = layout.mesh.shape[a];
    std::vector<Interval> split;
    split.reserve(dims_[p.dim].size() * parts);
    for (const Interval& parent : dims_[p.dim]) {
      for (int64_t i = 0; i < parts; ++i) split.push_back(ChunkInterval(parent, parts, i));
    }
    dims_[p.dim] = std::move(split);
  }
  for (const auto& d : dims_) num_cells_ *= static_cast<int64_t>(d.size());
  base_parts_.resize(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    base_parts_[d].resize(dims_[d].size());
    for (size_t i = 0; i < dims_[d].size(); ++i) {
      int64_t c = static_cast<int64_t>(i), index = 0;
      const auto& axes = dim_axes_[d];
      for (int k = static_cast<int>(axes.size()) - 1; k >= 0; --k) {
        const int64_t size = layout.mesh.shape[axes[k]];
        index += (c % size) * mesh_strides_[axes[k]];
        c /= size;
      }
      base_parts_[d][i] = index;
    }
  }
  replica_offsets_ = {0};
  for (int a : replicate_axes) {
    std::vector<int64_t> next;
    next.reserve(replica_offsets_.size() * layout.mesh.shape[a]);
    for (int64_t base : replica_offsets_) {
      for (int64_t i = 0; i < layout.mesh.shape[a]; ++i) next.push_back(base + i * mesh_strides_[a]);
    }
    replica_offsets_ = std::move(next);
  }
}

Box TileGrid::CellBox(const Cell& cell) const {
  Box b;
  b.ndim = ndim();
  for (int d = 0; d < b.ndim; ++d) {
    b.lo[d] = dims_[d][cell[d]].lo;
    b.hi[d] = dims_[d][cell[d]].hi;
  }
  return b;
}

int64_t TileGrid::CellBaseIndex(const Cell& cell) const {
  int64_t index = 0;
  for (int d = 0; d < ndim(); ++d) index += base_parts_[d][cell[d]];
  return index;
}

TileGrid::Cell TileGrid::CellAt(int64_t flat) const {
  Cell cell{};
  for (int d = ndim() - 1; d >= 0; --d) {
    const int64_t n = static_cast<int64_t>(dims_[d].size());
    cell[d] = flat % n;
    flat /= n;
  }
  return cell;
}

std::optional<TileGrid::Cell> TileGrid::CellOfRank(int32_t rank) const {
  const int64_t index = mesh_->IndexOf(rank);
  if (index < 0) return std::nullopt;
  Cell cell{};
  for (int d = 0; d < ndim(); ++d) {
    int64_t c = 0;
    for (int a : dim_axes_[d]) {
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

}  // namespace reshard::plan
