// Tiles follow DTensor: torch.chunk splits (ceil chunks, trailing shards smaller or empty),
// nested in mesh-axis order when several axes shard one dim, replicas over R axes.
#include "src/plan/tiling.h"

#include <map>
#include <vector>

#include <gtest/gtest.h>

#include "src/plan/plan.h"

namespace reshard::plan {
namespace {

std::vector<int64_t> ChunkSizes(int64_t n, int64_t parts) {
  std::vector<int64_t> sizes;
  int64_t next = 0;
  for (int64_t i = 0; i < parts; ++i) {
    const Interval iv = ChunkInterval({0, n}, parts, i);
    EXPECT_EQ(iv.lo, std::min(next, n)) << "chunk " << i << " of " << n << " over " << parts;
    next = iv.hi;
    sizes.push_back(iv.size());
  }
  EXPECT_EQ(next, n);
  return sizes;
}

TEST(ChunkIntervalTest, SplitsLikeTorchChunk) {
  EXPECT_EQ(ChunkSizes(10, 4), (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_EQ(ChunkSizes(2, 4), (std::vector<int64_t>{1, 1, 0, 0}));
  EXPECT_EQ(ChunkSizes(8, 4), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(ChunkSizes(7, 3), (std::vector<int64_t>{3, 3, 1}));
  EXPECT_EQ(ChunkSizes(0, 3), (std::vector<int64_t>{0, 0, 0}));
  EXPECT_EQ(ChunkSizes(5, 1), (std::vector<int64_t>{5}));
  // torch.chunk(9, 4): chunk 3 -> 3, 3, 3, and the fourth shard is empty.
  EXPECT_EQ(ChunkSizes(9, 4), (std::vector<int64_t>{3, 3, 3, 0}));
  // An interval that does not start at 0 (a nested split) is offset by its start.
  const Interval iv = ChunkInterval({5, 10}, 2, 1);
  EXPECT_EQ(iv.lo, 8);
  EXPECT_EQ(iv.hi, 10);
}

Layout MakeLayout(std::vector<int64_t> mesh_shape, std::vector<int32_t> ranks,
                  std::vector<Placement> placements) {
  Layout l;
  l.mesh.shape = std::move(mesh_shape);
  l.mesh.ranks = std::move(ranks);
  l.placements = std::move(placements);
  return l;
}

// rank -> (lo, hi) along dim 0, through the public ForEachTile.
std::map<int32_t, std::pair<int64_t, int64_t>> Dim0Tiles(const Layout& l,
                                                         std::vector<int64_t> shape) {
  RefitSpec spec;
  TensorSpec t;
  t.name = "t";
  t.shape = std::move(shape);
  t.src = l;
  t.dst = l;
  spec.tensors.push_back(t);
  std::map<int32_t, std::pair<int64_t, int64_t>> out;
  ForEachTile(spec, 0, Side::kSrc, [&](int32_t rank, const Box& box) {
    EXPECT_EQ(out.count(rank), 0u) << "rank " << rank << " visited twice";
    out[rank] = {box.lo[0], box.hi[0]};
  });
  return out;
}

TEST(TileGridTest, NestedShardsSplitInMeshAxisOrder) {
  // DESIGN §2: 10 rows over a 2x2 mesh, both axes S(0): first 5 | 5, then each 3 | 2.
  const Layout l = MakeLayout({2, 2}, {0, 1, 2, 3}, {Placement::Shard(0), Placement::Shard(0)});
  TileGrid grid(l, {10});
  ASSERT_EQ(grid.intervals(0).size(), 4u);
  const std::pair<int64_t, int64_t> expected[] = {{0, 3}, {3, 5}, {5, 8}, {8, 10}};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(grid.intervals(0)[i].lo, expected[i].first) << i;
    EXPECT_EQ(grid.intervals(0)[i].hi, expected[i].second) << i;
  }
  EXPECT_EQ(grid.num_cells(), 4);
  EXPECT_EQ(grid.num_replicas(), 1);
  const auto tiles = Dim0Tiles(l, {10});
  EXPECT_EQ(tiles.at(0), (std::pair<int64_t, int64_t>{0, 3}));
  EXPECT_EQ(tiles.at(1), (std::pair<int64_t, int64_t>{3, 5}));
  EXPECT_EQ(tiles.at(2), (std::pair<int64_t, int64_t>{5, 8}));
  EXPECT_EQ(tiles.at(3), (std::pair<int64_t, int64_t>{8, 10}));
}

TEST(TileGridTest, NestedShardsWithEmptyTrailingShards) {
  // 3 rows over 2x2 nested: 2 | 1, then 1 | 1 and 1 | 0.
  const Layout l = MakeLayout({2, 2}, {0, 1, 2, 3}, {Placement::Shard(0), Placement::Shard(0)});
  const auto tiles = Dim0Tiles(l, {3, 4});
  EXPECT_EQ(tiles.at(0), (std::pair<int64_t, int64_t>{0, 1}));
  EXPECT_EQ(tiles.at(1), (std::pair<int64_t, int64_t>{1, 2}));
  EXPECT_EQ(tiles.at(2), (std::pair<int64_t, int64_t>{2, 3}));
  EXPECT_EQ(tiles.at(3), (std::pair<int64_t, int64_t>{3, 3}));
}

TEST(TileGridTest, PermutedRankListsMapCoordinatesNotRankNumbers) {
  const Layout l = MakeLayout({4}, {7, 2, 9, 0}, {Placement::Shard(0)});
  const auto tiles = Dim0Tiles(l, {10});
  EXPECT_EQ(tiles.at(7), (std::pair<int64_t, int64_t>{0, 3}));
  EXPECT_EQ(tiles.at(2), (std::pair<int64_t, int64_t>{3, 6}));
  EXPECT_EQ(tiles.at(9), (std::pair<int64_t, int64_t>{6, 9}));
  EXPECT_EQ(tiles.at(0), (std::pair<int64_t, int64_t>{9, 10}));
  TileGrid grid(l, {10});
  ASSERT_TRUE(grid.CellOfRank(9).has_value());
  EXPECT_EQ((*grid.CellOfRank(9))[0], 2);
  EXPECT_FALSE(grid.CellOfRank(5).has_value());
}

TEST(TileGridTest, ReplicateAxesGiveEveryCellTheSameHolders) {
  // [dp=2, tp=3] with R over dp: cell k is held by (0, k) and (1, k).
  const Layout l = MakeLayout({2, 3}, {10, 11, 12, 13, 14, 15},
                              {Placement::Replicate(), Placement::Shard(1)});
  TileGrid grid(l, {4, 9});
  EXPECT_EQ(grid.num_cells(), 3);
  EXPECT_EQ(grid.num_replicas(), 2);
  for (int64_t k = 0; k < 3; ++k) {
    const TileGrid::Cell cell = grid.CellAt(k);
    EXPECT_EQ(grid.Holder(cell, 0), 10 + k);
    EXPECT_EQ(grid.Holder(cell, 1), 13 + k);
    const Box box = grid.CellBox(cell);
    EXPECT_EQ(box.lo[0], 0);
    EXPECT_EQ(box.hi[0], 4);
    EXPECT_EQ(box.lo[1], 3 * k);
    EXPECT_EQ(box.hi[1], 3 * k + 3);
    EXPECT_EQ(*grid.CellOfRank(static_cast<int32_t>(13 + k)), cell);
  }
}

TEST(TileGridTest, InnerMeshAxisShardingOuterDimStillNestsInMeshAxisOrder) {
  // Axis 0 shards dim 1, axis 1 shards dim 0: rank (i, j) holds rows chunk j, columns chunk i.
  const Layout l = MakeLayout({2, 2}, {0, 1, 2, 3}, {Placement::Shard(1), Placement::Shard(0)});
  RefitSpec spec;
  TensorSpec t;
  t.name = "t";
  t.shape = {4, 6};
  t.src = l;
  t.dst = l;
  spec.tensors.push_back(t);
  std::map<int32_t, Box> tiles;
  ForEachTile(spec, 0, Side::kSrc, [&](int32_t rank, const Box& box) { tiles[rank] = box; });
  EXPECT_EQ(tiles[1].lo[0], 2);  // Rank 1 = (0, 1): rows [2, 4), columns [0, 3).
  EXPECT_EQ(tiles[1].lo[1], 0);
  EXPECT_EQ(tiles[2].lo[0], 0);  // Rank 2 = (1, 0): rows [0, 2), columns [3, 6).
  EXPECT_EQ(tiles[2].lo[1], 3);
  EXPECT_EQ(tiles[2].hi[1], 6);
}

TEST(TileGridTest, ScalarTensorIsHeldWholeByEveryRank) {
  const Layout l = MakeLayout({2, 2}, {3, 1, 2, 0}, {Placement::Replicate(), Placement::Replicate()});
  TileGrid grid(l, {});
  EXPECT_EQ(grid.num_cells(), 1);
  EXPECT_EQ(grid.num_replicas(), 4);
  const Box box = grid.CellBox(grid.CellAt(0));
  EXPECT_EQ(box.ndim, 0);
  EXPECT_FALSE(box.empty());
  EXPECT_EQ(box.NumElements(), 1);
}

TEST(TileGridTest, ZeroSizedDimGivesEmptyTiles) {
  const Layout l = MakeLayout({3}, {0, 1, 2}, {Placement::Shard(1)});
  TileGrid grid(l, {0, 5});
  for (int64_t k = 0; k < grid.num_cells(); ++k) {
    EXPECT_TRUE(grid.CellBox(grid.CellAt(k)).empty());
    EXPECT_EQ(grid.CellBox(grid.CellAt(k)).NumElements(), 0);
  }
}

TEST(TileStridesTest, RowMajorPerTileOrTheViewsStrides) {
  Layout l = MakeLayout({2}, {0, 1}, {Placement::Shard(1)});
  Box tile;
  tile.ndim = 3;
  tile.lo = {0, 2, 0};
  tile.hi = {2, 5, 4};
  std::array<int64_t, kMaxTensorDims> s{};
  TileStrides(l, tile, s);
  EXPECT_EQ(s[0], 12);
  EXPECT_EQ(s[1], 4);
  EXPECT_EQ(s[2], 1);
  EXPECT_EQ(TileExtent(l, tile), 24);
  l.view.offset = 5;
  l.view.strides = {1, 2, 6};  // Column-major with padding.
  TileStrides(l, tile, s);
  EXPECT_EQ(s[0], 1);
  EXPECT_EQ(s[2], 6);
  EXPECT_EQ(TileExtent(l, tile), 5 + 1 * 1 + 2 * 2 + 3 * 6 + 1);
  Box empty = tile;
  empty.hi[1] = empty.lo[1];
  EXPECT_EQ(TileExtent(l, empty), 0);
}

}  // namespace
}  // namespace reshard::plan
