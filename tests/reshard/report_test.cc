// The statistics `reshard run` and `reshard bench` report: the median and the nearest-rank p90.
#include "tools/reshard/report.h"

#include <gtest/gtest.h>

#include <vector>

namespace reshard::cli {
namespace {

// 1, 2, ..., n, rotated and reversed so that it is not sorted (the helpers sort a copy).
std::vector<double> Scrambled(int n) {
  std::vector<double> v;
  for (int i = n - 1; i >= 0; --i) v.push_back(static_cast<double>((i + n / 2) % n + 1));
  return v;
}

TEST(ReportTest, MedianIsTheMiddleSampleOrTheMeanOfTheTwoMiddleOnes) {
  EXPECT_EQ(Median({}), 0);
  EXPECT_EQ(Median({4}), 4);
  EXPECT_EQ(Median({9, 1, 5}), 5);
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(Median(Scrambled(19)), 10);
}

TEST(ReportTest, P90IsTheNearestRankSample) {
  EXPECT_EQ(NearestRankPercentile({}, 90), 0);
  EXPECT_EQ(NearestRankPercentile({42}, 90), 42);
  // Fewer than 10 samples: ceil(0.9 n) = n, the largest.
  EXPECT_EQ(NearestRankPercentile({3, 1, 2}, 90), 3);
  EXPECT_EQ(NearestRankPercentile(Scrambled(9), 90), 9);
  // 10 samples: the 9th smallest (0.9 * 10 is exactly 9, no rounding up to 10).
  EXPECT_EQ(NearestRankPercentile(Scrambled(10), 90), 9);
  EXPECT_EQ(NearestRankPercentile(Scrambled(11), 90), 10);  // ceil(9.9)
  // 20 iterations of `reshard run` report iterations 2..20: ceil(17.1) = the 18th of 19.
  EXPECT_EQ(NearestRankPercentile(Scrambled(19), 90), 18);
  EXPECT_EQ(NearestRankPercentile(Scrambled(20), 90), 18);
  EXPECT_EQ(NearestRankPercentile(Scrambled(100), 90), 90);
  // Never interpolated: one of the samples even when they are far apart.
  EXPECT_EQ(NearestRankPercentile({10, 10, 10, 10, 10, 10, 10, 10, 10, 1000}, 90), 10);
  EXPECT_EQ(NearestRankPercentile({10, 10, 10, 10, 10, 10, 10, 10, 1000, 1000}, 90), 1000);
  EXPECT_EQ(NearestRankPercentile({7, 7, 7, 1}, 90), 7);
}

TEST(ReportTest, OtherPercentilesUseTheSameRule) {
  EXPECT_EQ(NearestRankPercentile(Scrambled(4), 50), 2);  // The lower middle, not 2.5.
  EXPECT_EQ(NearestRankPercentile(Scrambled(5), 50), 3);
  EXPECT_EQ(NearestRankPercentile(Scrambled(7), 100), 7);
  EXPECT_EQ(NearestRankPercentile(Scrambled(7), 1), 1);
}

}  // namespace
}  // namespace reshard::cli
