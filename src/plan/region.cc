#include "src/plan/region.h"

namespace reshard::plan {

TileAddress MakeTileAddress(const Layout& layout, const Box& tile) {
  TileAddress a;
  a.tile = tile;
  a.offset = layout.view.offset;
  TileStrides(layout, tile, a.strides);
  return a;
}

Region MakeRegion(const Box& box, const TileAddress& from, const TileAddress& to, int elem_bytes,
                  std::vector<RegionDim>& dim_pool) {
  Region r;
  int64_t from_elem = from.offset;
  int64_t to_elem = to.offset;
  // Dims with extent > 1, outermost first, strides in elements.
  struct Dim {
    int64_t count, fs, ts;
  };
  std::array<Dim, kMaxTensorDims> dims;
  int n = 0;
  int64_t elements = 1;
  for (int d = 0; d < box.ndim; ++d) {
    from_elem += (box.lo[d] - from.tile.lo[d]) * from.strides[d];
    to_elem += (box.lo[d] - to.tile.lo[d]) * to.strides[d];
    const int64_t e = box.extent(d);
    elements *= e;
    if (e > 1) dims[n++] = {e, from.strides[d], to.strides[d]};
  }
  r.from_offset = from_elem * elem_bytes;
  r.to_offset = to_elem * elem_bytes;
  r.bytes = elements * elem_bytes;
  r.dims_begin = static_cast<uint32_t>(dim_pool.size());
  if (elements == 0) {
    r.run_bytes = 0;
    return r;
  }
  // Grow the contiguous run from the innermost dim outwards while both sides stay contiguous.
  int64_t run = 1;
  int k = n - 1;
  while (k >= 0 && dims[k].fs == run && dims[k].ts == run) {
    run *= dims[k].count;
    --k;
  }
  r.run_bytes = run * elem_bytes;
  // Remaining dims (0..k) become outer dims; merge neighbours that nest exactly on both sides.
  std::array<Dim, kMaxTensorDims> outer;
  int m = 0;
  for (int i = 0; i <= k; ++i) {
    if (m > 0) {
      Dim& prev = outer[m - 1];
      if (prev.fs == dims[i].fs * dims[i].count && prev.ts == dims[i].ts * dims[i].count) {
        prev.count *= dims[i].count;
        prev.fs = dims[i].fs;
        prev.ts = dims[i].ts;
        continue;
      }
    }
    outer[m++] = dims[i];
  }
  r.ndims = static_cast<uint8_t>(m);
  for (int i = 0; i < m; ++i) {
    dim_pool.push_back({outer[i].count, outer[i].fs * elem_bytes, outer[i].ts * elem_bytes});
  }
  return r;
}

}  // namespace reshard::plan
