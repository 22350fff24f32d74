// Exact overlap between the tiles of two layouts of one tensor.
//
// For every non-empty destination cell, finds the source cells whose boxes intersect it, per
// dim by binary search over the sorted source intervals, so the cost is proportional to the
// pieces produced, not to the product of tile counts. The pieces of one destination cell are
// disjoint and cover it exactly (source tiles partition the tensor).
#pragma once

#include <algorithm>
#include <array>

#include "src/plan/tiling.h"

namespace reshard::plan {

// Range [first, last) of interval indices in `v` (sorted, non-overlapping) that may intersect
// [lo, hi). Empty intervals inside the range are possible; callers skip empty boxes.
inline std::pair<int64_t, int64_t> OverlappingIntervals(absl::Span<const Interval> v, int64_t lo,
                                                        int64_t hi) {
  auto first = std::partition_point(v.begin(), v.end(), [&](const Interval& s) { return s.hi <= lo; });
  auto last = std::partition_point(first, v.end(), [&](const Interval& s) { return s.lo < hi; });
  return {first - v.begin(), last - v.begin()};
}

// fn(dst_cell, dst_box, src_cell, src_box, piece_box) for every non-empty intersection.
template <typename Fn>
void ForEachPiece(const TileGrid& src, const TileGrid& dst, Fn&& fn) {
  const int nd = dst.ndim();
  for (int64_t flat = 0; flat < dst.num_cells(); ++flat) {
    const TileGrid::Cell dcell = dst.CellAt(flat);
    const Box dbox = dst.CellBox(dcell);
    if (dbox.empty()) continue;
    std::array<int64_t, kMaxTensorDims> first{}, last{};
    bool none = false;
    for (int d = 0; d < nd; ++d) {
      auto [f, l] = OverlappingIntervals(src.intervals(d), dbox.lo[d], dbox.hi[d]);
      first[d] = f;
      last[d] = l;
      if (f >= l) none = true;
    }
    if (none) continue;
    TileGrid::Cell scell{};
    for (int d = 0; d < nd; ++d) scell[d] = first[d];
    while (true) {
      Box sbox = src.CellBox(scell);
      Box piece = dbox;
      bool empty = false;
      for (int d = 0; d < nd; ++d) {
        piece.lo[d] = std::max(dbox.lo[d], sbox.lo[d]);
        piece.hi[d] = std::min(dbox.hi[d], sbox.hi[d]);
        if (piece.hi[d] <= piece.lo[d]) empty = true;
      }
      if (!empty) fn(dcell, dbox, scell, sbox, piece);
      int d = nd - 1;
      while (d >= 0) {
        if (++scell[d] < last[d]) break;
        scell[d] = first[d];
        --d;
      }
      if (d < 0) break;
    }
  }
}

}  // namespace reshard::plan
