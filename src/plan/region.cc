#include "src/plan/region.h"

namespace reshard::plan {

TileAddress MakeTileAddress(const Layout& layout, const Box& tile) {
  TileAddress a;
  a.tile = tile;
  a.offset = layout.view.offset;
  TileStrides(layout, tile, a.strides);
  return a;
}

namespace {

// Dims with extent > 1 as element strides on both sides, outermost first.
struct Dim {
  int64_t count, fs, ts;
};

// The run and outer dims of copying `box` from `from` to `to`: the contiguous run grows from the
// innermost dim outwards while both sides stay contiguous; the remaining dims become outer dims,
// neighbours that nest exactly on both sides merged. Returns the run in elements (0 when the box
// is empty); `outer[0..*m)` are the outer dims. `from_elem`/`to_elem` get the element offsets.
int64_t RunAndOuterDims(const Box& box, const TileAddress& from, const TileAddress& to,
                        std::array<Dim, kMaxTensorDims>& outer, int* m, int64_t* elements,
                        int64_t* from_elem, int64_t* to_elem) {
  *from_elem = from.offset;
  *to_elem = to.offset;
  std::array<Dim, kMaxTensorDims> dims;
  int n = 0;
  *elements = 1;
  for (int d = 0; d < box.ndim; ++d) {
    *from_elem += (box.lo[d] - from.tile.lo[d]) * from.strides[d];
    *to_elem += (box.lo[d] - to.tile.lo[d]) * to.strides[d];
    const int64_t e = box.extent(d);
    *elements *= e;
    if (e > 1) dims[n++] = {e, from.strides[d], to.strides[d]};
  }
  *m = 0;
  if (*elements == 0) return 0;
  int64_t run = 1;
  int k = n - 1;
  while (k >= 0 && dims[k].fs == run && dims[k].ts == run) {
    run *= dims[k].count;
    --k;
  }
  for (int i = 0; i <= k; ++i) {
    if (*m > 0) {
      Dim& prev = outer[*m - 1];
      if (prev.fs == dims[i].fs * dims[i].count && prev.ts == dims[i].ts * dims[i].count) {
        prev.count *= dims[i].count;
        prev.fs = dims[i].fs;
        prev.ts = dims[i].ts;
        continue;
      }
    }
    outer[(*m)++] = dims[i];
  }
  return run;
}

}  // namespace

Region MakeRegion(const Box& box, const TileAddress& from, const TileAddress& to, int elem_bytes,
                  std::vector<RegionDim>& dim_pool) {
  std::array<Dim, kMaxTensorDims> outer;
  int m = 0;
  int64_t elements = 0, from_elem = 0, to_elem = 0;
  const int64_t run = RunAndOuterDims(box, from, to, outer, &m, &elements, &from_elem, &to_elem);
  Region r;
  r.from_offset = from_elem * elem_bytes;
  r.to_offset = to_elem * elem_bytes;
  r.bytes = elements * elem_bytes;
  r.dims_begin = static_cast<uint32_t>(dim_pool.size());
  r.run_bytes = run * elem_bytes;
  r.ndims = static_cast<uint8_t>(m);
  for (int i = 0; i < m; ++i) {
    dim_pool.push_back({outer[i].count, outer[i].fs * elem_bytes, outer[i].ts * elem_bytes});
  }
  return r;
}

RegionShape ShapeOfRegion(const Box& box, const TileAddress& from, const TileAddress& to,
                          int elem_bytes) {
  std::array<Dim, kMaxTensorDims> outer;
  int m = 0;
  int64_t elements = 0, from_elem = 0, to_elem = 0;
  const int64_t run = RunAndOuterDims(box, from, to, outer, &m, &elements, &from_elem, &to_elem);
  RegionShape shape{elements * elem_bytes, run * elem_bytes, m};
  shape.runs = shape.run_bytes == 0 ? 0 : shape.bytes / shape.run_bytes;
  return shape;
}

}  // namespace reshard::plan
