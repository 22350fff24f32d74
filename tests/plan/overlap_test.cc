// Exact overlap: the pieces of every destination tile are disjoint, cover it, come from the
// source tile that holds them, and are found without scanning non-intersecting tiles.
#include "src/plan/overlap.h"

#include <algorithm>
#include <vector>

#include <gtest/gtest.h>

namespace reshard::plan {
namespace {

Layout MakeLayout(std::vector<int64_t> mesh_shape, std::vector<Placement> placements) {
  Layout l;
  l.mesh.shape = std::move(mesh_shape);
  int64_t n = 1;
  for (int64_t s : l.mesh.shape) n *= s;
  for (int32_t r = 0; r < n; ++r) l.mesh.ranks.push_back(r);
  l.placements = std::move(placements);
  return l;
}

TEST(OverlappingIntervalsTest, FindsTheIntersectingRangeIncludingEmptyShards) {
  // 10 over 4 nested under 2 -> [0,3) [3,5) | [5,8) [8,10); and 2 over 4 -> [0,1) [1,2) [2,2) [2,2).
  const std::vector<Interval> v = {{0, 3}, {3, 5}, {5, 8}, {8, 10}};
  EXPECT_EQ(OverlappingIntervals(v, 0, 10), (std::pair<int64_t, int64_t>{0, 4}));
  EXPECT_EQ(OverlappingIntervals(v, 3, 5), (std::pair<int64_t, int64_t>{1, 2}));
  EXPECT_EQ(OverlappingIntervals(v, 4, 6), (std::pair<int64_t, int64_t>{1, 3}));
  EXPECT_EQ(OverlappingIntervals(v, 9, 10), (std::pair<int64_t, int64_t>{3, 4}));
  const std::vector<Interval> e = {{0, 1}, {1, 2}, {2, 2}, {2, 2}};
  auto [f, l] = OverlappingIntervals(e, 1, 2);
  EXPECT_EQ(f, 1);
  EXPECT_EQ(l, 2);
}

struct Piece {
  TileGrid::Cell dcell, scell;
  Box dbox, sbox, piece;
};

std::vector<Piece> Pieces(const TileGrid& src, const TileGrid& dst) {
  std::vector<Piece> out;
  ForEachPiece(src, dst,
               [&](const TileGrid::Cell& dc, const Box& db, const TileGrid::Cell& sc,
                   const Box& sb, const Box& p) { out.push_back({dc, sc, db, sb, p}); });
  return out;
}

bool Inside(const Box& inner, const Box& outer) {
  for (int d = 0; d < inner.ndim; ++d) {
    if (inner.lo[d] < outer.lo[d] || inner.hi[d] > outer.hi[d]) return false;
  }
  return true;
}

TEST(ForEachPieceTest, RowsToColumnsGiveOneBlockPerTrainerAndInferenceRank) {
  const std::vector<int64_t> shape = {8, 8};
  const Layout src = MakeLayout({2}, {Placement::Shard(0)});
  const Layout dst = MakeLayout({4}, {Placement::Shard(1)});
  TileGrid s(src, shape), d(dst, shape);
  const auto pieces = Pieces(s, d);
  ASSERT_EQ(pieces.size(), 8u);
  int64_t elements = 0;
  for (const Piece& p : pieces) {
    EXPECT_EQ(p.piece.extent(0), 4);
    EXPECT_EQ(p.piece.extent(1), 2);
    EXPECT_TRUE(Inside(p.piece, p.sbox));
    EXPECT_TRUE(Inside(p.piece, p.dbox));
    elements += p.piece.NumElements();
  }
  EXPECT_EQ(elements, 64);
  // Destination cells come in order, each with its sources in order.
  EXPECT_EQ(pieces[0].dcell[1], 0);
  EXPECT_EQ(pieces[0].scell[0], 0);
  EXPECT_EQ(pieces[1].scell[0], 1);
  EXPECT_EQ(pieces[2].dcell[1], 1);
}

TEST(ForEachPieceTest, IdenticalLayoutsGiveOnePiecePerTile) {
  const std::vector<int64_t> shape = {10, 7, 3};
  const Layout l = MakeLayout({2, 3}, {Placement::Shard(0), Placement::Shard(1)});
  TileGrid s(l, shape), d(l, shape);
  const auto pieces = Pieces(s, d);
  EXPECT_EQ(pieces.size(), 6u);
  for (const Piece& p : pieces) EXPECT_EQ(p.dcell, p.scell);
}

// Brute force: pieces equal every non-empty pairwise intersection, and per destination cell they
// are disjoint and cover it.
TEST(ForEachPieceTest, MatchesBruteForceOnUnevenNestedLayouts) {
  const std::vector<int64_t> shape = {10, 7, 5};
  const Layout src = MakeLayout({2, 2, 3}, {Placement::Shard(0), Placement::Shard(0),
                                            Placement::Shard(2)});
  const Layout dst = MakeLayout({3, 4}, {Placement::Shard(1), Placement::Shard(0)});
  TileGrid s(src, shape), d(dst, shape);
  const auto pieces = Pieces(s, d);
  int64_t expected = 0;
  for (int64_t dc = 0; dc < d.num_cells(); ++dc) {
    const Box db = d.CellBox(d.CellAt(dc));
    std::vector<int> covered(10 * 7 * 5, 0);
    for (int64_t sc = 0; sc < s.num_cells(); ++sc) {
      const Box sb = s.CellBox(s.CellAt(sc));
      bool empty = db.empty() || sb.empty();
      for (int k = 0; k < 3; ++k) {
        empty = empty || std::max(db.lo[k], sb.lo[k]) >= std::min(db.hi[k], sb.hi[k]);
      }
      expected += !empty;
    }
    for (const Piece& p : pieces) {
      if (p.dcell != d.CellAt(dc)) continue;
      EXPECT_TRUE(Inside(p.piece, p.sbox));
      EXPECT_TRUE(Inside(p.piece, db));
      EXPECT_FALSE(p.piece.empty());
      for (int64_t i = p.piece.lo[0]; i < p.piece.hi[0]; ++i) {
        for (int64_t j = p.piece.lo[1]; j < p.piece.hi[1]; ++j) {
          for (int64_t k = p.piece.lo[2]; k < p.piece.hi[2]; ++k) ++covered[(i * 7 + j) * 5 + k];
        }
      }
    }
    for (int64_t i = 0; i < 10; ++i) {
      for (int64_t j = 0; j < 7; ++j) {
        for (int64_t k = 0; k < 5; ++k) {
          const bool inside = i >= db.lo[0] && i < db.hi[0] && j >= db.lo[1] && j < db.hi[1] &&
                              k >= db.lo[2] && k < db.hi[2];
          ASSERT_EQ(covered[(i * 7 + j) * 5 + k], inside ? 1 : 0) << i << "," << j << "," << k;
        }
      }
    }
  }
  EXPECT_EQ(static_cast<int64_t>(pieces.size()), expected);
}

bool SameBox(const Box& a, const Box& b) {
  return a.ndim == b.ndim && std::equal(a.lo.begin(), a.lo.begin() + a.ndim, b.lo.begin()) &&
         std::equal(a.hi.begin(), a.hi.begin() + a.ndim, b.hi.begin());
}

// The planning passes read a tensor's pieces from PieceCache, keyed by the two GridCaches'
// geometries: what it returns must be ForEachPiece's pieces of the grids given, in its order,
// whichever geometries came before (more than either cache holds, revisited out of order, and
// the same geometry over another mesh of ranks).
TEST(PieceCacheTest, EveryGeometryGetsForEachPiecesPiecesInOrder) {
  const std::vector<int64_t> shape = {10, 7, 5};
  std::vector<Layout> layouts = {
      MakeLayout({2, 2, 3}, {Placement::Shard(0), Placement::Shard(0), Placement::Shard(2)}),
      MakeLayout({3, 4}, {Placement::Shard(1), Placement::Shard(0)}),
      MakeLayout({4}, {Placement::Shard(1)}),
      MakeLayout({2, 2}, {Placement::Replicate(), Placement::Shard(2)}),
      MakeLayout({6}, {Placement::Shard(0)}),
      MakeLayout({1}, {Placement::Replicate()}),
  };
  Layout renamed = layouts[1];  // Same geometry, other ranks.
  for (int32_t& r : renamed.mesh.ranks) r += 100;
  layouts.push_back(renamed);
  GridCache src_grids, dst_grids;
  PieceCache cache;
  int checked = 0;
  for (int round = 0; round < 3; ++round) {
    for (size_t i = 0; i < layouts.size(); ++i) {
      for (size_t j = 0; j < layouts.size(); ++j) {
        const size_t si = (i * 5 + round) % layouts.size(), dj = (j * 3 + 2 * round) % layouts.size();
        const TileGrid& src = src_grids.Get(layouts[si], shape);
        const TileGrid& dst = dst_grids.Get(layouts[dj], shape);
        const std::vector<Piece> expected = Pieces(src, dst);
        int64_t nonempty = 0;
        for (int64_t c = 0; c < dst.num_cells(); ++c) nonempty += !dst.CellBox(dst.CellAt(c)).empty();
        const absl::Span<const CachedPiece> got =
            cache.Get(src, src_grids.last_key(), dst, dst_grids.last_key());
        ASSERT_EQ(got.size(), expected.size()) << si << " -> " << dj;
        EXPECT_EQ(cache.nonempty_dst_cells(), nonempty);
        for (size_t k = 0; k < got.size(); ++k) {
          const Piece& e = expected[k];
          int64_t flat = 0;
          for (int d = 0; d < dst.ndim(); ++d) {
            flat = flat * static_cast<int64_t>(dst.intervals(d).size()) + e.dcell[d];
          }
          ASSERT_TRUE(SameBox(got[k].piece, e.piece)) << si << " -> " << dj << " piece " << k;
          ASSERT_TRUE(SameBox(got[k].dst_box, e.dbox));
          ASSERT_TRUE(SameBox(got[k].src_box, e.sbox));
          ASSERT_EQ(got[k].dst_flat, flat);
          ASSERT_EQ(got[k].dst_base, dst.CellBaseIndex(e.dcell));
          ASSERT_EQ(got[k].src_base, src.CellBaseIndex(e.scell));
          ASSERT_EQ(got[k].elements, e.piece.NumElements());
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

TEST(ForEachPieceTest, EmptyDestinationTilesGetNoPieces) {
  // 2 rows over 4 destination ranks: ranks 2 and 3 hold nothing.
  const std::vector<int64_t> shape = {2, 3};
  const Layout src = MakeLayout({1}, {Placement::Replicate()});
  const Layout dst = MakeLayout({4}, {Placement::Shard(0)});
  TileGrid s(src, shape), d(dst, shape);
  const auto pieces = Pieces(s, d);
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].dcell[0], 0);
  EXPECT_EQ(pieces[1].dcell[0], 1);
}

TEST(ForEachPieceTest, ScalarsGiveOnePiece) {
  const Layout src = MakeLayout({3}, {Placement::Replicate()});
  const Layout dst = MakeLayout({2, 2}, {Placement::Replicate(), Placement::Replicate()});
  TileGrid s(src, {}), d(dst, {});
  const auto pieces = Pieces(s, d);
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].piece.NumElements(), 1);
}

}  // namespace
}  // namespace reshard::plan
