#include "src/plan/dependencies.h"

#include <vector>

#include "gtest/gtest.h"

namespace reshard::plan {
namespace {

std::vector<uint32_t> V(absl::Span<const uint32_t> s) { return {s.begin(), s.end()}; }

TEST(DependencyIndexTest, InitialAndWaitingItemsKeepTheirOrder) {
  DependencyIndex index;
  index.Add(-1, 0);
  index.Add(7, 1);
  index.Add(3, 2);
  index.Add(7, 3);
  index.Add(-1, 4);
  index.Finish();
  EXPECT_EQ(V(index.initial()), (std::vector<uint32_t>{0, 4}));
  EXPECT_EQ(V(index.WaitingOn(7)), (std::vector<uint32_t>{1, 3}));
  EXPECT_EQ(V(index.WaitingOn(3)), (std::vector<uint32_t>{2}));
  EXPECT_TRUE(index.WaitingOn(4).empty());
  EXPECT_TRUE(index.WaitingOn(100).empty());
}

TEST(DependencyIndexTest, EmptyIndexAnswersEmpty) {
  DependencyIndex index;
  index.Finish();
  EXPECT_TRUE(index.initial().empty());
  EXPECT_TRUE(index.WaitingOn(0).empty());
}

}  // namespace
}  // namespace reshard::plan
