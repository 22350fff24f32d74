#include "src/common/log.h"

#include "gtest/gtest.h"
#include "src/common/idle.h"

namespace reshard::log {
namespace {

TEST(LogTest, ParsesEveryAcceptedSpelling) {
  Level level = kWarning;
  const std::pair<const char*, Level> cases[] = {
      {"error", kError}, {"WARNING", kWarning}, {"warn", kWarning}, {"info", kInfo},
      {"debug", kDebug}, {"0", kError},         {"3", kDebug}};
  for (const auto& [text, want] : cases) {
    ASSERT_TRUE(ParseLevel(text, &level)) << text;
    EXPECT_EQ(level, want) << text;
  }
  for (const char* bad : {"", "verbose", "4", "-1", "2x"}) {
    EXPECT_FALSE(ParseLevel(bad, &level)) << bad;
  }
}

TEST(LogTest, BelowTheThresholdArgumentsAreNotEvaluated) {
  // The default threshold (RESHARD_LOG_LEVEL unset in tests) is warning: debug is off.
  int evaluated = 0;
  RESHARD_LOG(kDebug, "%d", ++evaluated);
  EXPECT_EQ(evaluated, Enabled(kDebug) ? 1 : 0);
}

TEST(IdlePolicyTest, SpinsThenYieldsAndBusyResets) {
  IdlePolicy idle;
  for (int i = 0; i < 3 * IdlePolicy::kSpinRounds; ++i) idle.Idle();  // Must not block.
  idle.Busy();
  idle.Round(true);
  idle.Round(false);
  SUCCEED();
}

}  // namespace
}  // namespace reshard::log
