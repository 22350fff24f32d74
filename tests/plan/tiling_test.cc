// Tiles follow DTensor: torch.chunk splits (ceil chunks, trailing shards smaller or empty),
// nested in mesh-axis order when several axes shard one dim, replicas over R axes; a shard
// empty along a dim sits at [n, n) there (n: the dim's global size), as in torch.
#include "src/plan/tiling.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "src/plan/executor.h"
#include "src/plan/plan.h"
#include "src/plan/spec_json.h"

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

// Expected boxes derived from torch's rule, torch/distributed/tensor/_utils.py
// `_compute_local_shape_and_global_offset`: per mesh axis in order, Shard(d) splits the current
// local size of d with `Shard.local_shard_size_and_offset` (torch.chunk: chunk c = ceil(m / k),
// shard i is [i * c, min((i + 1) * c, m)), possibly empty) and composes the offset with the
// parent's; a zero-sized shard gets the global offset `global_shape[d]`, and keeps it under
// further splits (its local size is 0). Unsharded dims are at offset 0. Ranks are mesh indices.
struct DTensorCase {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<int64_t> mesh;
  std::vector<Placement> placements;
  std::vector<std::vector<int64_t>> offset;  // Per rank: torch's global_offset.
  std::vector<std::vector<int64_t>> local;   // Per rank: torch's local_shape.
};

std::vector<DTensorCase> DTensorCases() {
  const Placement R = Placement::Replicate();
  const Placement S0 = Placement::Shard(0), S1 = Placement::Shard(1);
  return {
      // The issue's case: 3 -> 2 | 1 -> 1 | 1 and 1 | 0 -> each 1 | 0; every empty one at 3.
      {"S0S0S0_3_over_2x2x2", {3}, {2, 2, 2}, {S0, S0, S0},
       {{0}, {3}, {1}, {3}, {2}, {3}, {3}, {3}},
       {{1}, {0}, {1}, {0}, {1}, {0}, {0}, {0}}},
      // Outer shards non-empty (1 | 1), inner ones over 4 mostly empty: at 2, not at 1 or 2.
      {"S0S0_2_over_2x4_outer_nonempty_inner_empty", {2}, {2, 4}, {S0, S0},
       {{0}, {2}, {2}, {2}, {1}, {2}, {2}, {2}},
       {{1}, {0}, {0}, {0}, {1}, {0}, {0}, {0}}},
      // Uneven 2-D: 4 rows -> 2 | 2 -> each over 3: 1, 1, 0. The empty middle one is at 4.
      {"S0S0_4x6_over_2x3", {4, 6}, {2, 3}, {S0, S0},
       {{0, 0}, {1, 0}, {4, 0}, {2, 0}, {3, 0}, {4, 0}},
       {{1, 6}, {1, 6}, {0, 6}, {1, 6}, {1, 6}, {0, 6}}},
      // Uneven 2-D: 7 rows -> 4 | 3 -> over 3: 2, 2, 0 | 1, 1, 1; columns over axis 0.
      {"S1S0S0_7x2_over_2x2x3", {7, 2}, {2, 2, 3}, {S1, S0, S0},
       {{0, 0}, {2, 0}, {7, 0}, {4, 0}, {5, 0}, {6, 0},
        {0, 1}, {2, 1}, {7, 1}, {4, 1}, {5, 1}, {6, 1}},
       {{2, 1}, {2, 1}, {0, 1}, {1, 1}, {1, 1}, {1, 1},
        {2, 1}, {2, 1}, {0, 1}, {1, 1}, {1, 1}, {1, 1}}},
      // Both dims nested or empty: columns 2 -> 1, 1, 0 -> 1 | 0 each; rows 1 -> 1 | 0. A tile
      // empty along one dim keeps its offset along the other.
      {"S1S0S1_1x2_over_3x2x2", {1, 2}, {3, 2, 2}, {S1, S0, S1},
       {{0, 0}, {0, 2}, {1, 0}, {1, 2}, {0, 1}, {0, 2}, {1, 1}, {1, 2},
        {0, 2}, {0, 2}, {1, 2}, {1, 2}},
       {{1, 1}, {1, 0}, {0, 1}, {0, 0}, {1, 1}, {1, 0}, {0, 1}, {0, 0},
        {1, 0}, {1, 0}, {0, 0}, {0, 0}}},
      // A replicate axis between the two that shard dim 0.
      {"S0RS0_3_over_2x2x2", {3}, {2, 2, 2}, {S0, R, S0},
       {{0}, {1}, {0}, {1}, {2}, {3}, {2}, {3}},
       {{1}, {1}, {1}, {1}, {1}, {0}, {1}, {0}}},
      // Uneven without empty shards: unchanged.
      {"S0RS1_5x3_over_2x2x2", {5, 3}, {2, 2, 2}, {S0, R, S1},
       {{0, 0}, {0, 2}, {0, 0}, {0, 2}, {3, 0}, {3, 2}, {3, 0}, {3, 2}},
       {{3, 2}, {3, 1}, {3, 2}, {3, 1}, {2, 2}, {2, 1}, {2, 2}, {2, 1}}},
      // A zero-sized dim: every offset along it is 0 (its global size).
      {"S1_0x5_over_3", {0, 5}, {3}, {S1},
       {{0, 0}, {0, 2}, {0, 4}},
       {{0, 2}, {0, 2}, {0, 1}}},
  };
}

TEST(TileGridTest, TilesMatchDTensorLocalShapeAndGlobalOffsetExactly) {
  for (const DTensorCase& c : DTensorCases()) {
    SCOPED_TRACE(c.name);
    std::vector<int32_t> ranks;
    int64_t size = 1;
    for (int64_t n : c.mesh) size *= n;
    for (int32_t r = 0; r < size; ++r) ranks.push_back(r);
    ASSERT_EQ(static_cast<int64_t>(c.offset.size()), size);
    ASSERT_EQ(static_cast<int64_t>(c.local.size()), size);
    const Layout l = MakeLayout(c.mesh, ranks, c.placements);
    RefitSpec spec;
    TensorSpec t;
    t.name = "t";
    t.shape = c.shape;
    t.src = l;
    t.dst = l;
    spec.tensors.push_back(t);
    std::map<int32_t, Box> tiles;
    ForEachTile(spec, 0, Side::kSrc, [&](int32_t rank, const Box& box) { tiles[rank] = box; });
    ASSERT_EQ(static_cast<int64_t>(tiles.size()), size);
    const TileGrid grid(l, c.shape);
    for (int32_t r = 0; r < size; ++r) {
      const Box& box = tiles.at(r);
      const Box cell_box = grid.CellBox(*grid.CellOfRank(r));
      ASSERT_EQ(box.ndim, static_cast<int>(c.shape.size()));
      for (int d = 0; d < box.ndim; ++d) {
        EXPECT_EQ(box.lo[d], c.offset[r][d]) << "rank " << r << " dim " << d;
        EXPECT_EQ(box.extent(d), c.local[r][d]) << "rank " << r << " dim " << d;
        EXPECT_EQ(cell_box.lo[d], box.lo[d]) << "rank " << r << " dim " << d;
        EXPECT_EQ(cell_box.hi[d], box.hi[d]) << "rank " << r << " dim " << d;
      }
    }
    // The intervals stay sorted and non-overlapping: overlap.h binary-searches them.
    for (int d = 0; d < grid.ndim(); ++d) {
      const auto iv = grid.intervals(d);
      for (size_t i = 0; i < iv.size(); ++i) {
        EXPECT_LE(iv[i].lo, iv[i].hi) << "dim " << d << " interval " << i;
        if (i > 0) {
          EXPECT_LE(iv[i - 1].hi, iv[i].lo) << "dim " << d << " interval " << i;
        }
      }
    }
  }
}

// Empty tiles at [n, n) move nothing and need no buffer; plans between layouts with nested
// empty shards (on both sides, inside the span of other tiles) still move every element.
TEST(TileGridTest, EmptyTilesAtTheGlobalSizeMoveNothingAndPlansStayExact) {
  auto parsed = ParseSpecJson(R"js({"tensors": [
    {"name": "a", "dtype": "fp32", "shape": [3],
     "src": {"mesh": [[[0, 1], [2, 3]], [[4, 5], [6, 7]]], "placements": ["S(0)", "S(0)", "S(0)"]},
     "dst": {"mesh": [8, 9, 10, 11], "placements": ["S(0)"]}},
    {"name": "b", "dtype": "bf16", "shape": [4, 6],
     "src": {"mesh": [[0, 1, 2], [3, 4, 5]], "placements": ["S(0)", "S(0)"]},
     "dst": {"mesh": [[6, 7], [8, 9], [10, 11]], "placements": ["S(1)", "S(0)"]}},
    {"name": "c", "dtype": "fp32", "shape": [7, 2],
     "src": {"mesh": [[[0, 1, 2], [3, 4, 5]], [[6, 7, 8], [9, 10, 11]]],
             "placements": ["S(1)", "S(0)", "S(0)"]},
     "dst": {"mesh": [[[11, 10], [9, 8]], [[7, 6], [5, 4]]],
             "placements": ["S(0)", "R", "S(0)"]}}]})js");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto spec = std::make_shared<const RefitSpec>(*std::move(parsed));
  ASSERT_TRUE(Validate(*spec).ok());
  auto plan = BuildPlan(spec);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(VerifyPlanInProcess(*plan, 1 << 20).ok());
  // Tensor a: ranks 1 and 3 hold empty tiles at [3, 3) and need no bytes for it.
  for (int32_t rank : {1, 3, 5, 6, 7}) {
    EXPECT_EQ(plan->BufferBytes(rank)[plan->buffer_of(0, Side::kSrc)], 0) << rank;
  }
  for (int32_t rank : {0, 2, 4}) {
    EXPECT_EQ(plan->BufferBytes(rank)[plan->buffer_of(0, Side::kSrc)], 4) << rank;
  }
  // Every destination element arrives from exactly one transfer: bytes moved == bytes held.
  int64_t moved = 0;
  for (const Transfer& tr : plan->transfers()) {
    if (tr.to_side == Side::kDst) moved += plan->region(tr.region).bytes;
  }
  int64_t held = 0;
  for (size_t t = 0; t < spec->tensors.size(); ++t) {
    ForEachTile(*spec, t, Side::kDst, [&](int32_t, const Box& box) {
      held += box.NumElements() * DTypeSize(spec->tensors[t].dtype);
    });
  }
  EXPECT_EQ(moved, held);
}

// GridCache hands out the grid of each layout in turn, building one only for a geometry (mesh
// shape, placements, tensor shape) it has not kept; either way the grid equals one built
// afresh: same cells, boxes, and holders from the layout's own mesh.
TEST(GridCacheTest, EqualsAFreshGridForEveryLayoutInTurn) {
  const std::vector<int64_t> shape_a = {10, 6}, shape_b = {10, 7};
  const std::vector<std::pair<Layout, const std::vector<int64_t>*>> sequence = {
      {MakeLayout({2, 2}, {0, 1, 2, 3}, {Placement::Shard(0), Placement::Replicate()}), &shape_a},
      // Same geometry, other ranks: the grid is reused, the holders are the new mesh's.
      {MakeLayout({2, 2}, {7, 5, 6, 4}, {Placement::Shard(0), Placement::Replicate()}), &shape_a},
      // Other placements, other tensor shape, other mesh shape, other mesh ndim: rebuilt.
      {MakeLayout({2, 2}, {7, 5, 6, 4}, {Placement::Shard(1), Placement::Replicate()}), &shape_a},
      {MakeLayout({2, 2}, {7, 5, 6, 4}, {Placement::Shard(1), Placement::Replicate()}), &shape_b},
      {MakeLayout({4, 1}, {7, 5, 6, 4}, {Placement::Shard(1), Placement::Replicate()}), &shape_b},
      {MakeLayout({4}, {7, 5, 6, 4}, {Placement::Shard(1)}), &shape_b},
      {MakeLayout({4}, {3, 2, 1, 0}, {Placement::Shard(1)}), &shape_b},
      // Geometries seen before, alternating (an expert's projections): found among the last few.
      {MakeLayout({2, 2}, {9, 8, 11, 10}, {Placement::Shard(1), Placement::Replicate()}), &shape_b},
      {MakeLayout({4}, {0, 1, 2, 3}, {Placement::Shard(1)}), &shape_b},
      {MakeLayout({2, 2}, {1, 0, 3, 2}, {Placement::Shard(1), Placement::Replicate()}), &shape_b},
      // A strided shard is other geometry than S(d) over the same axes, whatever its split
      // factor; the same strided geometry over other ranks is reused.
      {MakeLayout({2, 2}, {0, 1, 2, 3}, {Placement::Shard(1), Placement::Shard(1)}), &shape_b},
      {MakeLayout({2, 2}, {0, 1, 2, 3}, {Placement::StridedShard(1, 2), Placement::Shard(1)}),
       &shape_b},
      {MakeLayout({2, 2}, {3, 2, 1, 0}, {Placement::StridedShard(1, 2), Placement::Shard(1)}),
       &shape_b},
      {MakeLayout({2, 3}, {5, 4, 3, 2, 1, 0},
                  {Placement::StridedShard(1, 3), Placement::Shard(1)}),
       &shape_b},
  };
  GridCache cache;
  for (size_t i = 0; i < sequence.size(); ++i) {
    SCOPED_TRACE(i);
    const auto& [layout, shape] = sequence[i];
    const TileGrid& cached = cache.Get(layout, *shape);
    const TileGrid fresh(layout, *shape);
    EXPECT_TRUE(cached.SameGeometry(layout, *shape));
    EXPECT_EQ(&cached.mesh(), &layout.mesh);
    ASSERT_EQ(cached.num_cells(), fresh.num_cells());
    ASSERT_EQ(cached.num_replicas(), fresh.num_replicas());
    for (int64_t flat = 0; flat < fresh.num_cells(); ++flat) {
      const TileGrid::Cell cell = fresh.CellAt(flat);
      EXPECT_EQ(cached.CellAt(flat), cell);
      const Box a = cached.CellBox(cell), b = fresh.CellBox(cell);
      EXPECT_EQ(a.lo, b.lo);
      EXPECT_EQ(a.hi, b.hi);
      for (int64_t j = 0; j < fresh.num_replicas(); ++j) {
        EXPECT_EQ(cached.Holder(cell, j), fresh.Holder(cell, j));
      }
    }
    if (i > 0) {
      const auto& [previous, previous_shape] = sequence[i - 1];
      const bool same = previous.mesh.shape == layout.mesh.shape &&
                        previous.placements == layout.placements && *previous_shape == *shape;
      EXPECT_EQ(TileGrid(previous, *previous_shape).SameGeometry(layout, *shape), same);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Strided shards: torch's _StridedShard, which FSDP2 + TP trainers produce. Expected tiles are
// torch 2.15's _compute_local_shape_and_global_offset (tests/plan/check_torch_tiles.py compares
// hundreds of random layouts with torch itself).

Placement SS(int d, int64_t k) { return Placement::StridedShard(d, k); }

// Every cell's box against rank -> [lo, hi) of dim 0, through CellOfRank, Holder and
// CellBaseIndex, and the intervals sorted and non-overlapping (overlap.h binary-searches them).
void ExpectDim0(const Layout& l, const std::vector<int64_t>& shape,
                const std::map<int32_t, std::pair<int64_t, int64_t>>& expected) {
  EXPECT_EQ(Dim0Tiles(l, shape), expected);
  const TileGrid grid(l, shape);
  for (const auto& [rank, range] : expected) {
    const auto cell = grid.CellOfRank(rank);
    ASSERT_TRUE(cell.has_value()) << rank;
    const Box box = grid.CellBox(*cell);
    EXPECT_EQ(box.lo[0], range.first) << rank;
    EXPECT_EQ(box.hi[0], range.second) << rank;
    bool held = false;
    for (int64_t j = 0; j < grid.num_replicas(); ++j) held = held || grid.Holder(*cell, j) == rank;
    EXPECT_TRUE(held) << rank;
  }
  const auto iv = grid.intervals(0);
  for (size_t i = 1; i < iv.size(); ++i) {
    EXPECT_LE(iv[i - 1].hi, iv[i].lo) << i;
    EXPECT_LE(iv[i].lo, iv[i].hi) << i;
  }
}

TEST(StridedShardTest, Fsdp2TpExampleOfTorchsDocstring) {
  // torch's _StridedShard docstring: 8 x 8 on mesh [[0, 1], [2, 3]] (dp, tp), placements
  // (_StridedShard(0, split_factor=2), Shard(0)): TP's chunks first, then FSDP's within them.
  const Layout l = MakeLayout({2, 2}, {0, 1, 2, 3}, {SS(0, 2), Placement::Shard(0)});
  ExpectDim0(l, {8, 8}, {{0, {0, 2}}, {1, {4, 6}}, {2, {2, 4}}, {3, {6, 8}}});
  // Plain S(0), S(0) over the same mesh nests the other way.
  ExpectDim0(MakeLayout({2, 2}, {0, 1, 2, 3}, {Placement::Shard(0), Placement::Shard(0)}), {8, 8},
             {{0, {0, 2}}, {1, {2, 4}}, {2, {4, 6}}, {3, {6, 8}}});
  const TileGrid grid(l, {8, 8});
  // Cells are in row order; the base index table maps them back to mesh positions.
  EXPECT_EQ(grid.Holder(grid.CellAt(0), 0), 0);
  EXPECT_EQ(grid.Holder(grid.CellAt(1), 0), 2);
  EXPECT_EQ(grid.Holder(grid.CellAt(2), 0), 1);
  EXPECT_EQ(grid.Holder(grid.CellAt(3), 0), 3);
  EXPECT_EQ(grid.CellIndexOfShard(0, 1), 2);  // Shard (dp 0, tp 1) holds rows [4, 6).
  EXPECT_EQ(grid.CellIndexOfShard(1, 0), 0);  // Dim 1 is not sharded.
  const Box largest = LargestTile(l, {8, 8});
  EXPECT_EQ(largest.extent(0), 2);
  EXPECT_EQ(largest.extent(1), 8);
}

TEST(StridedShardTest, UnevenFsdp2TpFollowsTorchNotTheRightToLeftSplit) {
  // 10 rows, dp 2 x tp 3, _S(0, 3) then S(0): tp's chunks [0, 4) [4, 8) [8, 10), dp's halves.
  ExpectDim0(MakeLayout({2, 3}, {0, 1, 2, 3, 4, 5}, {SS(0, 3), Placement::Shard(0)}), {10},
             {{0, {0, 2}}, {1, {4, 6}}, {2, {8, 9}}, {3, {2, 4}}, {4, {6, 8}}, {5, {9, 10}}});
  // 7 rows, dp 3 x tp 2: torch gives rank (2, 0) row 6 and (2, 1) nothing (its global offset is
  // 7), where sharding tp first would give (2, 0) nothing and (2, 1) row 6.
  ExpectDim0(MakeLayout({3, 2}, {0, 1, 2, 3, 4, 5}, {SS(0, 2), Placement::Shard(0)}), {7},
             {{0, {0, 2}}, {1, {4, 5}}, {2, {2, 4}}, {3, {5, 6}}, {4, {6, 7}}, {5, {7, 7}}});
  // Replicas over an R axis hold the same strided cell.
  ExpectDim0(MakeLayout({2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7},
                        {SS(0, 2), Placement::Replicate(), Placement::Shard(0)}),
             {8}, {{0, {0, 2}}, {1, {4, 6}}, {2, {0, 2}}, {3, {4, 6}},
                   {4, {2, 4}}, {5, {6, 8}}, {6, {2, 4}}, {7, {6, 8}}});
}

TEST(StridedShardTest, LargestTileIsTheLongestShardNotTheFirst) {
  // [S(0), _S(0, 3), S(0)] over 2 x 2 x 2, 7 rows (torch): sizes 1 1 1 1 2 1 0 0 by mesh
  // position; the first shard's is 1, so "first of the first" would size buffers too small.
  const Layout l =
      MakeLayout({2, 2, 2}, {0, 1, 2, 3, 4, 5, 6, 7},
                 {Placement::Shard(0), SS(0, 3), Placement::Shard(0)});
  ExpectDim0(l, {7}, {{0, {0, 1}}, {1, {2, 3}}, {2, {1, 2}}, {3, {3, 4}},
                      {4, {4, 6}}, {5, {6, 7}}, {6, {7, 7}}, {7, {7, 7}}});
  EXPECT_EQ(LargestTile(l, {7}).extent(0), 2);
}

TEST(StridedShardTest, DimShareIsArithmeticOnDimsOfTwoToTheSixtyTwo) {
  // No list of indices or runs: a dim of 2^62 - 3 elements under FSDP2 + TP over 256 x 8.
  const int64_t n = (int64_t{1} << 62) - 3;
  const ShardStep steps[] = {{256, 8, 255}, {8, 1, 7}};
  const DimShare share(n, steps);
  // tp chunk 7 of ceil(n / 8) = 2^59: [7 * 2^59, n), 2^59 - 3 long; dp piece 255 of it.
  const int64_t tp_chunk = int64_t{1} << 59, last = n - 7 * tp_chunk;
  const int64_t c = (last + 255) / 256;
  EXPECT_EQ(share.size(), last - 255 * c);
  EXPECT_EQ(share.At(0), 7 * tp_chunk + 255 * c);
  EXPECT_EQ(share.At(share.size() - 1), n - 1);
  EXPECT_TRUE(share.Contiguous());
  // _S(0, 3) over 2 alone on 8 rows: chunks [0, 3) [3, 6) [6, 8), so rank 0 holds [0, 2),
  // [3, 5) and [6, 7).
  const ShardStep alone[] = {{2, 3, 0}};
  const DimShare split(8, alone);
  EXPECT_EQ(split.size(), 5);
  EXPECT_FALSE(split.Contiguous());
  int64_t end = 0;
  const Interval run = split.RunAt(0, &end);
  EXPECT_EQ(run.lo, 0);
  EXPECT_EQ(run.hi, 2);
  EXPECT_EQ(end, 2);
  const Interval next = split.RunAt(end, &end);
  EXPECT_EQ(next.lo, 3);
  EXPECT_EQ(next.hi, 5);
  EXPECT_EQ(end, 4);
  // Whole grids over such dims build from the same arithmetic.
  const TileGrid grid(MakeLayout({4, 2}, {0, 1, 2, 3, 4, 5, 6, 7}, {SS(0, 2), Placement::Shard(0)}),
                      {n});
  int64_t covered = 0;
  for (const Interval& iv : grid.intervals(0)) covered += iv.size();
  EXPECT_EQ(covered, n);
}

// FSDP2 + TP trainer -> TP inference, byte-exact through the in-process executor: every
// destination element holds the hash of (tensor, global index) its source tile sent.
TEST(StridedShardTest, Fsdp2TpToTpRefitsByteExactInProcess) {
  auto parsed = ParseSpecJson(R"js({"tensors": [
    {"name": "even", "dtype": "bf16", "shape": [12, 12],
     "src": {"mesh": [[0, 1], [2, 3], [4, 5]], "placements": ["_S(0, 2)", "S(0)"]},
     "dst": {"mesh": [[6, 7], [8, 9]], "placements": ["R", "S(0)"]}},
    {"name": "uneven", "dtype": "fp32", "shape": [10, 6],
     "src": {"mesh": [[0, 1, 2], [3, 4, 5]], "placements": ["_S(0, 3)", "S(0)"]},
     "dst": {"mesh": [6, 7, 8, 9], "placements": ["S(1)"]}},
    {"name": "empty_shard", "dtype": "fp16", "shape": [7, 5],
     "src": {"mesh": [[0, 1], [2, 3], [4, 5]], "placements": ["_S(0,2)", "S(0)"]},
     "dst": {"mesh": [[6, 7], [8, 9]], "placements": ["S(1)", "S(0)"]}}]})js");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto spec = std::make_shared<const RefitSpec>(*std::move(parsed));
  ASSERT_TRUE(Validate(*spec).ok()) << Validate(*spec);
  EXPECT_EQ(spec->tensors[2].src.placements[0], SS(0, 2));
  for (PlanOptions::Schedule schedule :
       {PlanOptions::Schedule::kDomainAware, PlanOptions::Schedule::kPointToPoint}) {
    PlanOptions options;
    options.schedule = schedule;
    auto plan = BuildPlan(spec, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_TRUE(VerifyPlanInProcess(*plan, 1 << 20).ok());
    int64_t moved = 0, held = 0;
    for (const Transfer& tr : plan->transfers()) {
      if (tr.to_side == Side::kDst) moved += plan->region(tr.region).bytes;
    }
    for (size_t t = 0; t < spec->tensors.size(); ++t) {
      ForEachTile(*spec, t, Side::kDst, [&](int32_t, const Box& box) {
        held += box.NumElements() * DTypeSize(spec->tensors[t].dtype);
      });
    }
    EXPECT_EQ(moved, held);
    // Source rank 5 (dp 2, tp 1) of "empty_shard" holds nothing and sends nothing of it.
    for (const Transfer& tr : plan->transfers()) {
      EXPECT_FALSE(tr.tensor == 2 && tr.from_rank == 5 && tr.from_side == Side::kSrc);
    }
    EXPECT_EQ(plan->BufferBytes(5)[plan->buffer_of(2, Side::kSrc)], 0);
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
