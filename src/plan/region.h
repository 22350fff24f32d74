// A region: one box of a tensor expressed as memory on both ends of a copy.
//
// The innermost `run_bytes` are contiguous on both sides; `ndims` outer dims (outermost first)
// repeat the run with their own byte strides on each side. Dims are merged wherever both sides
// stay contiguous, so a fully contiguous piece has ndims == 0 and a row-by-row piece has one
// outer dim. A region is never expanded per element.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "src/plan/spec.h"
#include "src/plan/tiling.h"

namespace reshard::plan {

struct RegionDim {
  int64_t count = 0;
  int64_t from_stride = 0;  // Bytes.
  int64_t to_stride = 0;    // Bytes.
};

struct Region {
  int64_t from_offset = 0;  // Bytes from the start of the sending buffer.
  int64_t to_offset = 0;    // Bytes from the start of the receiving buffer.
  int64_t run_bytes = 0;    // Contiguous bytes per run.
  int64_t bytes = 0;        // Total bytes.
  uint32_t dims_begin = 0;  // Index of the outermost dim in the plan's dim pool.
  uint8_t ndims = 0;        // Number of outer dims.

  int64_t num_runs() const { return run_bytes == 0 ? 0 : bytes / run_bytes; }
};

// Where a tile lives in its buffer: tile origin in global coordinates, element offset and
// element strides of the tile's view.
struct TileAddress {
  Box tile;
  int64_t offset = 0;
  std::array<int64_t, kMaxTensorDims> strides{};
};

TileAddress MakeTileAddress(const Layout& layout, const Box& tile);

// Builds the region that copies `box` (inside both tiles) from `from` to `to`; outer dims are
// appended to `dim_pool`.
Region MakeRegion(const Box& box, const TileAddress& from, const TileAddress& to, int elem_bytes,
                  std::vector<RegionDim>& dim_pool);

// What statistics need of the region MakeRegion(box, from, to, elem_bytes, ...) would build
// (its bytes, run length and number of outer dims), without its offsets or dims: the planner
// counts every region of the world plan but builds only those a rank's share keeps.
struct RegionShape {
  int64_t bytes = 0;
  int64_t run_bytes = 0;
  int ndims = 0;
  int64_t runs = 0;  // bytes / run_bytes (0 when empty), divided once: counted per transfer.
  int64_t num_runs() const { return runs; }
};
RegionShape ShapeOfRegion(const Box& box, const TileAddress& from, const TileAddress& to,
                          int elem_bytes);

// Steps the run index `idx` (outer dims, innermost last) and the run's offsets on both sides to
// the next run of `r`; false after the last.
inline bool NextRun(const Region& r, const RegionDim* dims, std::array<int64_t, kMaxTensorDims>& idx,
                    int64_t& from, int64_t& to) {
  for (int k = r.ndims - 1; k >= 0; --k) {
    from += dims[k].from_stride;
    to += dims[k].to_stride;
    if (++idx[k] < dims[k].count) return true;
    from -= dims[k].from_stride * dims[k].count;
    to -= dims[k].to_stride * dims[k].count;
    idx[k] = 0;
  }
  return false;
}

// Calls fn(from_byte_offset, to_byte_offset, bytes) for every contiguous run, in order.
template <typename Fn>
void ForEachRun(const Region& r, const RegionDim* dims, Fn&& fn) {
  if (r.bytes == 0) return;
  if (r.ndims == 0) {
    fn(r.from_offset, r.to_offset, r.run_bytes);
    return;
  }
  std::array<int64_t, kMaxTensorDims> idx{};
  int64_t from = r.from_offset, to = r.to_offset;
  do {
    fn(from, to, r.run_bytes);
  } while (NextRun(r, dims, idx, from, to));
}

// Bytes [begin, end) of the region's packed stream (its runs back to back), in order, as 2-D
// slabs for copy engines:
// fn(from, to, width, rows, from_pitch, to_pitch) stands for `rows` pieces of `width` bytes, the
// i-th at from + i * from_pitch and to + i * to_pitch. A slab is either part of one run
// (rows = 1, pitches 0) or whole consecutive runs along the innermost outer dim, so a range
// costs about runs / count[innermost] calls instead of one per run.
template <typename Fn>
void ForEachSlab(const Region& r, const RegionDim* dims, int64_t begin, int64_t end, Fn&& fn) {
  begin = begin < 0 ? 0 : begin;
  end = end > r.bytes ? r.bytes : end;
  if (begin >= end) return;
  if (r.ndims == 0) {
    fn(r.from_offset + begin, r.to_offset + begin, end - begin, int64_t{1}, int64_t{0},
       int64_t{0});
    return;
  }
  std::array<int64_t, kMaxTensorDims> idx{};
  int64_t from = r.from_offset, to = r.to_offset;
  int64_t rest = begin / r.run_bytes;
  int64_t pos = rest * r.run_bytes;  // Packed offset of the current run.
  for (int k = r.ndims - 1; k >= 0 && rest != 0; --k) {
    idx[k] = rest % dims[k].count;
    rest /= dims[k].count;
    from += idx[k] * dims[k].from_stride;
    to += idx[k] * dims[k].to_stride;
  }
  const RegionDim& inner = dims[r.ndims - 1];
  const int in = r.ndims - 1;
  while (true) {
    const int64_t lo = begin > pos ? begin : pos;
    const int64_t hi = end < pos + r.run_bytes ? end : pos + r.run_bytes;
    int64_t rows = 1;
    if (lo != pos || hi != pos + r.run_bytes) {
      fn(from + (lo - pos), to + (lo - pos), hi - lo, int64_t{1}, int64_t{0}, int64_t{0});
    } else {
      // Whole runs from here to the end of the innermost dim, or up to `end`.
      const int64_t left = inner.count - idx[in], fit = (end - pos) / r.run_bytes;
      rows = left < fit ? left : fit;
      fn(from, to, r.run_bytes, rows, inner.from_stride, inner.to_stride);
      idx[in] += rows - 1;
      from += (rows - 1) * inner.from_stride;
      to += (rows - 1) * inner.to_stride;
    }
    pos += rows * r.run_bytes;
    if (pos >= end || !NextRun(r, dims, idx, from, to)) return;
  }
}

// Calls fn(from_byte_offset, to_byte_offset, bytes) for the parts of the runs that hold bytes
// [begin, end) of the region's packed stream (its runs back to back, in order), cut to that
// range, in order: ForEachSlab's slabs row by row. Starts at the run holding `begin` (found by
// division, not by walking the runs before it), so covering a region range by range costs its
// runs once in all.
template <typename Fn>
void ForEachRunIn(const Region& r, const RegionDim* dims, int64_t begin, int64_t end, Fn&& fn) {
  ForEachSlab(r, dims, begin, end,
              [&](int64_t from, int64_t to, int64_t width, int64_t rows, int64_t from_pitch,
                  int64_t to_pitch) {
                for (int64_t i = 0; i < rows; ++i) fn(from + i * from_pitch, to + i * to_pitch, width);
              });
}

}  // namespace reshard::plan
