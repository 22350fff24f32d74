// Exact overlap between the tiles of two layouts of one tensor.
//
// For every non-empty destination cell, finds the source cells whose boxes intersect it, per
// dim by binary search over the sorted source intervals, so the cost is proportional to the
// pieces produced, not to the product of tile counts. The pieces of one destination cell are
// disjoint and cover it exactly (source tiles partition the tensor).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
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

// A piece of ForEachPiece with what the planning passes read of it.
struct CachedPiece {
  Box piece, dst_box, src_box;
  int64_t dst_flat = 0;  // The destination cell, row-major (TileGrid::CellAt).
  int64_t dst_base = 0;  // TileGrid::CellBaseIndex of the destination and source cells.
  int64_t src_base = 0;
  int64_t elements = 0;  // piece.NumElements().
};

// ForEachPiece's pieces, in its order, for the last few pairs of grid geometries. The pieces of
// a tensor depend only on the geometry of its two grids (mesh shapes, placements, shape), and a
// model's tensors repeat a handful (an expert's three projections, layer after layer): a
// whole-model planning pass enumerates each geometry once instead of once per tensor. Keys are
// GridCache::last_key() of one source and one destination GridCache, always the same two.
class PieceCache {
 public:
  absl::Span<const CachedPiece> Get(const TileGrid& src, uint64_t src_key, const TileGrid& dst,
                                    uint64_t dst_key) {
    for (Entry& e : entries_) {
      if (e.src_key == src_key && e.dst_key == dst_key) {
        last_ = &e;
        return e.pieces;
      }
    }
    Entry& e = entries_[next_++ % entries_.size()];
    last_ = &e;
    e.src_key = src_key;
    e.dst_key = dst_key;
    e.pieces.clear();
    e.nonempty_dst_cells = 0;
    for (int64_t flat = 0; flat < dst.num_cells(); ++flat) {
      if (!dst.CellBox(dst.CellAt(flat)).empty()) ++e.nonempty_dst_cells;
    }
    ForEachPiece(src, dst,
                 [&](const TileGrid::Cell& dcell, const Box& dbox, const TileGrid::Cell& scell,
                     const Box& sbox, const Box& piece) {
                   e.pieces.push_back(CachedPiece{piece, dbox, sbox, dst.FlatIndex(dcell),
                                                  dst.CellBaseIndex(dcell),
                                                  src.CellBaseIndex(scell), piece.NumElements()});
                 });
    return e.pieces;
  }
  // The destination grid's non-empty cells, of the pair the last Get returned.
  int64_t nonempty_dst_cells() const { return last_->nonempty_dst_cells; }

 private:
  struct Entry {
    uint64_t src_key = 0, dst_key = 0;  // 0: empty.
    std::vector<CachedPiece> pieces;
    int64_t nonempty_dst_cells = 0;
  };
  std::array<Entry, 4> entries_;
  size_t next_ = 0;
  const Entry* last_ = nullptr;
};

}  // namespace reshard::plan
