// Regions: a contiguous inner run plus outer dims, merged wherever both sides stay contiguous.
#include "src/plan/region.h"

#include <algorithm>
#include <random>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

namespace reshard::plan {
namespace {

Box MakeBox(std::vector<int64_t> lo, std::vector<int64_t> hi) {
  Box b;
  b.ndim = static_cast<int>(lo.size());
  for (int d = 0; d < b.ndim; ++d) {
    b.lo[d] = lo[d];
    b.hi[d] = hi[d];
  }
  return b;
}

// A tile `tile` laid out row-major, or with explicit element strides and offset.
TileAddress Address(const Box& tile, std::vector<int64_t> strides = {}, int64_t offset = 0) {
  Layout l;
  l.view.offset = offset;
  l.view.strides = std::move(strides);
  return MakeTileAddress(l, tile);
}

using ByteRun = std::tuple<int64_t, int64_t, int64_t>;

std::vector<ByteRun> Runs(const Region& r, const std::vector<RegionDim>& pool) {
  std::vector<ByteRun> runs;
  ForEachRun(r, pool.data() + r.dims_begin,
             [&](int64_t f, int64_t t, int64_t n) { runs.emplace_back(f, t, n); });
  return runs;
}

TEST(RegionTest, FullyContiguousPieceHasNoOuterDims) {
  // Rows [2, 4) of an 8x8 fp32 matrix: contiguous in a full-matrix source and in a row tile.
  std::vector<RegionDim> pool;
  const Box piece = MakeBox({2, 0}, {4, 8});
  const Region r = MakeRegion(piece, Address(MakeBox({0, 0}, {8, 8})),
                              Address(MakeBox({2, 0}, {4, 8})), 4, pool);
  EXPECT_EQ(r.ndims, 0);
  EXPECT_EQ(r.run_bytes, 64);
  EXPECT_EQ(r.bytes, 64);
  EXPECT_EQ(r.from_offset, 2 * 8 * 4);
  EXPECT_EQ(r.to_offset, 0);
  EXPECT_EQ(r.num_runs(), 1);
  EXPECT_TRUE(pool.empty());
  EXPECT_EQ(Runs(r, pool), (std::vector<ByteRun>{{64, 0, 64}}));
}

TEST(RegionTest, RowsToColumnsGiveOneOuterDim) {
  // DESIGN fig. 1: rows [0, 4) on a trainer, columns [2, 4) on an inference rank: a 4x2 block,
  // 2 elements per run, 4 runs.
  std::vector<RegionDim> pool;
  const Box piece = MakeBox({0, 2}, {4, 4});
  const Region r = MakeRegion(piece, Address(MakeBox({0, 0}, {4, 8})),
                              Address(MakeBox({0, 2}, {8, 4})), 2, pool);
  EXPECT_EQ(r.ndims, 1);
  EXPECT_EQ(r.run_bytes, 4);
  EXPECT_EQ(r.bytes, 16);
  EXPECT_EQ(r.num_runs(), 4);
  ASSERT_EQ(pool.size(), 1u);
  EXPECT_EQ(pool[0].count, 4);
  EXPECT_EQ(pool[0].from_stride, 16);
  EXPECT_EQ(pool[0].to_stride, 4);
  EXPECT_EQ(Runs(r, pool), (std::vector<ByteRun>{{4, 0, 4}, {20, 4, 4}, {36, 8, 4}, {52, 12, 4}}));
}

TEST(RegionTest, ThreeDimsMergeIntoOneOuterDimWhenTheyNestOnBothSides) {
  // Source tile [2, 3, 8], destination tile [2, 3, 4] (columns [0, 4)): the two outer dims nest
  // exactly on both sides (24 = 3 * 8 and 12 = 3 * 4), so they merge into one of count 6.
  std::vector<RegionDim> pool;
  const Box piece = MakeBox({0, 0, 0}, {2, 3, 4});
  const Region r = MakeRegion(piece, Address(MakeBox({0, 0, 0}, {2, 3, 8})),
                              Address(MakeBox({0, 0, 0}, {2, 3, 4})), 1, pool);
  EXPECT_EQ(r.ndims, 1);
  EXPECT_EQ(r.run_bytes, 4);
  ASSERT_EQ(pool.size(), 1u);
  EXPECT_EQ(pool[0].count, 6);
  EXPECT_EQ(pool[0].from_stride, 8);
  EXPECT_EQ(pool[0].to_stride, 4);
}

TEST(RegionTest, ThreeDimsFullyContiguousMergeToARun) {
  // Expert stack [E, out, in]: experts [2, 4) of a whole-stack source into an expert tile.
  std::vector<RegionDim> pool;
  const Box piece = MakeBox({2, 0, 0}, {4, 3, 5});
  const Region r = MakeRegion(piece, Address(MakeBox({0, 0, 0}, {8, 3, 5})),
                              Address(MakeBox({2, 0, 0}, {4, 3, 5})), 2, pool);
  EXPECT_EQ(r.ndims, 0);
  EXPECT_EQ(r.run_bytes, 2 * 3 * 5 * 2);
  EXPECT_EQ(r.from_offset, 2 * 15 * 2);
}

TEST(RegionTest, PaddedViewKeepsOuterDimsThatDoNotNest) {
  // Destination rows padded to 6 elements, middle dim padded too: no merge of the outer dims.
  std::vector<RegionDim> pool;
  const Box piece = MakeBox({0, 0, 0}, {2, 3, 4});
  const Region r = MakeRegion(piece, Address(MakeBox({0, 0, 0}, {2, 3, 4})),
                              Address(MakeBox({0, 0, 0}, {2, 3, 4}), {20, 6, 1}, 3), 4, pool);
  EXPECT_EQ(r.ndims, 2);
  EXPECT_EQ(r.run_bytes, 16);
  EXPECT_EQ(r.to_offset, 12);
  ASSERT_EQ(pool.size(), 2u);
  EXPECT_EQ(pool[0].count, 2);
  EXPECT_EQ(pool[0].from_stride, 48);
  EXPECT_EQ(pool[0].to_stride, 80);
  EXPECT_EQ(pool[1].count, 3);
  EXPECT_EQ(pool[1].from_stride, 16);
  EXPECT_EQ(pool[1].to_stride, 24);
  EXPECT_EQ(r.num_runs(), 6);
  EXPECT_EQ(Runs(r, pool).size(), 6u);
  EXPECT_EQ(std::get<1>(Runs(r, pool)[4]), 12 + 80 + 24);
}

TEST(RegionTest, ColumnMajorViewRunsOneElement) {
  std::vector<RegionDim> pool;
  const Box piece = MakeBox({0, 0}, {3, 2});
  const Region r = MakeRegion(piece, Address(MakeBox({0, 0}, {3, 2})),
                              Address(MakeBox({0, 0}, {3, 2}), {1, 3}), 8, pool);
  EXPECT_EQ(r.run_bytes, 8);
  EXPECT_EQ(r.num_runs(), 6);
  EXPECT_EQ(r.ndims, 2);
  const auto runs = Runs(r, pool);
  ASSERT_EQ(runs.size(), 6u);
  EXPECT_EQ(runs[1], (ByteRun{8, 24, 8}));   // Element (0, 1).
  EXPECT_EQ(runs[2], (ByteRun{16, 8, 8}));   // Element (1, 0).
}

TEST(RegionTest, UnitDimsAreDroppedAndEmptyBoxesCopyNothing) {
  std::vector<RegionDim> pool;
  // One column of a [4, 1, 5] tile into a [4, 1, 1] tile: the unit dim disappears.
  const Region r = MakeRegion(MakeBox({0, 0, 2}, {4, 1, 3}), Address(MakeBox({0, 0, 0}, {4, 1, 5})),
                              Address(MakeBox({0, 0, 2}, {4, 1, 3})), 4, pool);
  EXPECT_EQ(r.ndims, 1);
  EXPECT_EQ(r.run_bytes, 4);
  EXPECT_EQ(pool.back().count, 4);
  EXPECT_EQ(pool.back().from_stride, 20);
  EXPECT_EQ(pool.back().to_stride, 4);
  const size_t before = pool.size();
  const Region empty = MakeRegion(MakeBox({1, 0}, {1, 4}), Address(MakeBox({0, 0}, {4, 4})),
                                  Address(MakeBox({0, 0}, {4, 4})), 4, pool);
  EXPECT_EQ(empty.bytes, 0);
  EXPECT_EQ(empty.num_runs(), 0);
  EXPECT_EQ(pool.size(), before);
  EXPECT_TRUE(Runs(empty, pool).empty());
  // A scalar: one element, one run.
  const Region scalar = MakeRegion(Box{}, Address(Box{}, {}, 7), Address(Box{}, {}, 2), 2, pool);
  EXPECT_EQ(Runs(scalar, pool), (std::vector<ByteRun>{{14, 4, 2}}));
}

// ForEachRunIn over a byte range of the packed stream gives exactly the parts of ForEachRun's
// runs that hold those bytes, and ForEachSlab the same as 2-D slabs, for random pieces of random 1-4-D tiles with transposed views and
// random ranges (empty, inside one run, across many, past the end).
TEST(RegionTest, RunsAndSlabsInARangeAreTheRunsCutToIt) {
  std::mt19937_64 rng(7);
  auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  int checked = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const int nd = static_cast<int>(pick(1, 4));
    std::vector<int64_t> shape(nd), lo(nd), hi(nd);
    for (int d = 0; d < nd; ++d) {
      shape[d] = pick(1, 9);
      lo[d] = pick(0, shape[d] - 1);
      hi[d] = pick(lo[d] + 1, shape[d]);
    }
    // The source tile is the whole tensor, row-major; the destination tile is the piece,
    // column-major (strides reversed), so both sides are strided in general.
    std::vector<int64_t> col_major(nd);
    int64_t stride = 1;
    for (int d = 0; d < nd; ++d) {
      col_major[d] = stride;
      stride *= hi[d] - lo[d];
    }
    std::vector<RegionDim> pool;
    const Box piece = MakeBox(lo, hi);
    const Region r =
        MakeRegion(piece, Address(MakeBox(std::vector<int64_t>(nd, 0), shape)),
                   Address(piece, col_major), static_cast<int>(pick(0, 1) ? 4 : 2), pool);
    const std::vector<ByteRun> all = Runs(r, pool);
    for (int range = 0; range < 8; ++range) {
      const int64_t begin = pick(-2, r.bytes + 2), end = pick(begin - 1, r.bytes + 4);
      std::vector<ByteRun> want, got;
      int64_t pos = 0;
      for (const auto& [f, t, n] : all) {
        const int64_t a = std::max(pos, begin), b = std::min(pos + n, end);
        if (a < b) want.emplace_back(f + (a - pos), t + (a - pos), b - a);
        pos += n;
      }
      ForEachRunIn(r, pool.data() + r.dims_begin, begin, end,
                   [&](int64_t f, int64_t t, int64_t n) { got.emplace_back(f, t, n); });
      ASSERT_EQ(got, want) << "trial " << trial << ", bytes [" << begin << ", " << end << ")";
      // The same bytes as slabs, expanded row by row; never more slabs than runs, and whole
      // runs of the innermost dim share one slab.
      std::vector<ByteRun> rows;
      int64_t slabs = 0;
      ForEachSlab(r, pool.data() + r.dims_begin, begin, end,
                  [&](int64_t f, int64_t t, int64_t w, int64_t n, int64_t fp, int64_t tp) {
                    ++slabs;
                    ASSERT_GE(n, 1);
                    if (n > 1) {
                      ASSERT_EQ(w, r.run_bytes);
                    }
                    for (int64_t i = 0; i < n; ++i) rows.emplace_back(f + i * fp, t + i * tp, w);
                  });
      ASSERT_EQ(rows, want) << "slabs, trial " << trial;
      EXPECT_LE(slabs, static_cast<int64_t>(want.size()));
      if (r.ndims > 0) {
        const int64_t inner = pool[r.dims_begin + r.ndims - 1].count;
        EXPECT_LE(slabs, static_cast<int64_t>(want.size()) / inner + 4) << "trial " << trial;
      }
      checked += !want.empty();
    }
  }
  EXPECT_GT(checked, 1000);
}

}  // namespace
}  // namespace reshard::plan
