// The RESHARD_FAULT_INJECT grammar and matching (src/common/fault.h). The points themselves are
// exercised across processes by tests/api/fault_injection_test.cc.
#include "src/common/fault.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace reshard::common {
namespace {

TEST(FaultSpecTest, ParsesStageActionRankAndEpoch) {
  auto spec = ParseFaultSpec("puts:stop:1:3");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->stage, FaultStage::kPuts);
  EXPECT_EQ(spec->action, FaultAction::kStop);
  EXPECT_EQ(spec->rank, 1);
  EXPECT_EQ(spec->epoch, 3u);
  spec = ParseFaultSpec("between:exit");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->stage, FaultStage::kBetween);
  EXPECT_EQ(spec->action, FaultAction::kExit);
  EXPECT_EQ(spec->rank, -1);
  EXPECT_EQ(spec->epoch, 0u);
  for (FaultStage s : {FaultStage::kSetup, FaultStage::kWired, FaultStage::kGrant, FaultStage::kPuts,
                       FaultStage::kSignals, FaultStage::kFanout, FaultStage::kBetween}) {
    auto parsed = ParseFaultSpec(std::string(FaultStageName(s)) + ":kill");
    ASSERT_TRUE(parsed.ok()) << FaultStageName(s);
    EXPECT_EQ(parsed->stage, s);
  }
}

TEST(FaultSpecTest, RejectsMalformedValuesNamingThePart) {
  for (const char* bad : {"", "puts", "puts:kill:1:2:3", "put:kill", "puts:crash", "puts:kill:x",
                          "puts:kill:-1", "puts:kill:1:two"}) {
    auto spec = ParseFaultSpec(bad);
    EXPECT_FALSE(spec.ok()) << bad;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(ParseFaultSpec("put:kill").status().message().find("unknown stage \"put\""),
            absl::string_view::npos);
  EXPECT_NE(ParseFaultSpec("puts:crash").status().message().find("unknown action \"crash\""),
            absl::string_view::npos);
}

TEST(FaultSpecTest, MatchesStageRankAndEpochFromOn) {
  const FaultSpec spec = *ParseFaultSpec("grant:kill:2:3");
  EXPECT_FALSE(FaultMatches(spec, FaultStage::kPuts, 2, 3));
  EXPECT_FALSE(FaultMatches(spec, FaultStage::kGrant, 1, 3));
  EXPECT_FALSE(FaultMatches(spec, FaultStage::kGrant, 2, 2));
  EXPECT_TRUE(FaultMatches(spec, FaultStage::kGrant, 2, 3));
  EXPECT_TRUE(FaultMatches(spec, FaultStage::kGrant, 2, 7));
  const FaultSpec any = *ParseFaultSpec("setup:stop");
  EXPECT_TRUE(FaultMatches(any, FaultStage::kSetup, 0, 0));
  EXPECT_TRUE(FaultMatches(any, FaultStage::kSetup, 5, 0));
}

// This test binary runs without RESHARD_FAULT_INJECT: every point is a no-op.
TEST(FaultSpecTest, UnsetInjectsNothing) {
  if (std::getenv("RESHARD_FAULT_INJECT") != nullptr) GTEST_SKIP() << "RESHARD_FAULT_INJECT set";
  EXPECT_FALSE(fault_internal::armed);
  FaultPoint(FaultStage::kSetup, 0, 0);
  FaultPoint(FaultStage::kBetween, 0, 1);
}

}  // namespace
}  // namespace reshard::common
