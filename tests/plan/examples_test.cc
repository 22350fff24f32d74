// Every example spec plans and verifies in process.
#include <filesystem>

#include <gtest/gtest.h>

#include "src/plan/executor.h"
#include "src/plan/spec_json.h"

namespace reshard::plan {
namespace {

TEST(ExamplesTest, EveryExampleSpecPlansAndVerifies) {
  int count = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::filesystem::path(RESHARD_SOURCE_DIR) / "examples" /
                                           "specs")) {
    if (entry.path().extension() != ".json") continue;
    SCOPED_TRACE(entry.path().string());
    auto spec = LoadSpecFile(entry.path().string());
    ASSERT_TRUE(spec.ok()) << spec.status();
    auto plan = BuildPlan(std::make_shared<const RefitSpec>(*std::move(spec)));
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_GT(plan->stats().pieces, 0);
    EXPECT_TRUE(VerifyPlanInProcess(*plan, int64_t{1} << 30).ok());
    ++count;
  }
  EXPECT_GE(count, 4);
}

}  // namespace
}  // namespace reshard::plan
