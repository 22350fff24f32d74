// The fault-injection suite (docs/reliability.md): a rank killed or stopped at each stage of a
// refit, the store killed, a link taken down, a transient stall followed by Reset(). Every
// survivor must fail with the documented code, naming the lost rank, well before a generous
// bound (bench/fault_bench.cc measures the real times), and no refit may return OK unless its
// destination is byte-exact (fault_peer verifies every element of every refit that returned OK).
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "src/common/fault.h"
#include "tests/api/fault_harness.h"

namespace reshard::fault {
namespace {

// Generous on purpose: tests never fail on speed. Measured times are in docs/reliability.md.
constexpr double kBoundSeconds = 10;
constexpr int kFaultEpoch = 2;  // Refit 1 verifies first, so set-up and a refit are known good.

std::string Peer() { return std::string(RESHARD_BINARY_DIR) + "/bin/fault_peer"; }

std::string TransportName(const ::testing::TestParamInfo<std::string>& info) { return info.param; }

bool Contains(const std::vector<int>& v, int x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// --- The matrix: stage x action x transport, through the library's RESHARD_FAULT_INJECT hook.

struct MatrixCase {
  std::string stage;
  std::string action;  // "kill", "stop" or "exit"
  std::string transport;
};

void PrintTo(const MatrixCase& c, std::ostream* os) {
  *os << c.stage << " " << c.action << " over " << c.transport;
}

std::string CaseName(const ::testing::TestParamInfo<MatrixCase>& info) {
  return absl::StrCat(info.param.stage, "_", info.param.action, "_", info.param.transport);
}

// Rank 1 faults in refit 2 (or during set-up). Survivors: Unavailable for a killed rank (its
// loss is detected), DeadlineExceeded for a stopped one (only the deadline can tell); the message
// names rank 1; no refit after the fault returns OK; every OK refit was byte-exact; the survivor
// then exits with status 1 on its own (its handle and communicator torn down).
// Over shared memory, a survivor that creates its endpoint after the peer died during set-up
// gets "ucp_ep_create: Shared memory error": Unavailable like every other lost peer (it used to
// be Internal, about 1 trial in 5).
void CheckMatrixCase(const MatrixCase& c) {
  const bool stop = c.action == "stop";
  const bool setup = c.stage == "setup";
  Scenario s;
  s.peer = Peer();
  s.spec = c.stage == "fanout" ? "fanout" : "pair";
  s.world_size = c.stage == "fanout" ? 3 : 2;
  s.transport = c.transport;
  s.inject = setup ? absl::StrCat("setup:", c.action, ":1")
                   : absl::StrCat(c.stage, ":", c.action, ":1:", kFaultEpoch);
  // A killed rank must be noticed by loss detection, well before these deadlines; a stopped
  // rank only by the deadline, kept short.
  const std::string deadline_ms = stop ? "2000" : "20000";
  const std::string setup_ms = stop && setup ? "3000" : "20000";
  s.peer_args = {"--steps", "20", "--deadline-ms", deadline_ms, "--setup-timeout-ms", setup_ms};
  auto outcome = RunScenario(s);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  const Outcome& o = *outcome;
  SCOPED_TRACE(o.Describe());
  ASSERT_GE(o.fault_at_ns, 0) << "the fault was never injected";
  const RankOutcome& faulted = o.ranks[1];
  if (c.action == "exit") {
    EXPECT_TRUE(faulted.result.exited && faulted.result.exit_code == common::kFaultExitCode)
        << faulted.result.Describe();
  } else {
    EXPECT_EQ(faulted.result.term_signal, SIGKILL);  // By the hook, or by the harness once stopped.
  }
  EXPECT_FALSE(faulted.wrong);
  for (int step : faulted.verified_steps) EXPECT_LT(step, kFaultEpoch);
  if (stop) {
    EXPECT_GE(o.stopped_at_ns, 0);
  }

  for (int r = 0; r < s.world_size; ++r) {
    if (r == 1) continue;
    SCOPED_TRACE(absl::StrCat("survivor rank ", r));
    const RankOutcome& rank = o.ranks[r];
    EXPECT_FALSE(rank.result.killed_by_launcher) << "it did not notice the fault";
    EXPECT_FALSE(rank.wrong) << "a refit returned OK with a wrong destination";
    // Then it ends on its own, its handle and communicator torn down (requests a lost or
    // stopped peer never completed are kept until exit, never destroyed under UCX).
    EXPECT_TRUE(rank.result.exited && rank.result.exit_code == 1) << rank.result.Describe();
    EXPECT_GE(rank.end_at_ns, 0) << "its handle and communicator were not torn down";
    ASSERT_FALSE(rank.failures.empty()) << "no failure reported";
    const Failure& f = rank.failures.front();
    if (stop) {
      // Its own deadline, or a peer's deadline relayed by that peer's abort.
      EXPECT_TRUE(f.code == "DEADLINE_EXCEEDED" ||
                  (f.code == "UNAVAILABLE" && absl::StrContains(f.message, "deadline")))
          << f.code << ": " << f.message;
    } else {
      EXPECT_EQ(f.code, "UNAVAILABLE") << f.message;
    }
    EXPECT_TRUE(absl::StrContains(f.message, "rank 1")) << f.message;
    const double detection = o.DetectionSeconds(r);
    EXPECT_GE(detection, 0);
    EXPECT_LT(detection, kBoundSeconds);
    std::fprintf(stderr, "%s %s over %s: rank %d failed %.3f s after the fault: %s: %s\n",
                 c.stage.c_str(), c.action.c_str(), c.transport.c_str(), r, detection,
                 f.code.c_str(), f.message.c_str());
    if (setup) {
      EXPECT_EQ(f.what, "SETUP");
      EXPECT_TRUE(rank.verified_steps.empty());
      continue;
    }
    // Every refit from the fault epoch on needs rank 1 (as a source, a destination or a fan-out
    // peer) except, on the pure source rank 0 of the fan-out spec, refit 2 itself; and rank 1's
    // last data message may already have landed when it dies at "signals" over tcp.
    for (int step : rank.verified_steps) EXPECT_LE(step, kFaultEpoch);
    const bool may_finish_fault_epoch =
        (s.spec == "fanout" && r == 0) || (c.stage == "signals" && c.transport == "tcp");
    if (!may_finish_fault_epoch) {
      EXPECT_FALSE(Contains(rank.verified_steps, kFaultEpoch));
    }
    EXPECT_TRUE(f.step == kFaultEpoch || f.step == kFaultEpoch + 1) << f.what;
  }
}

std::vector<MatrixCase> AllCases() {
  std::vector<MatrixCase> cases;
  for (const char* transport : {"sm", "tcp"}) {
    for (const char* stage : {"setup", "grant", "puts", "signals", "fanout", "between"}) {
      cases.push_back({stage, "kill", transport});
    }
    // A clean exit (no destructors) is a loss like a kill.
    cases.push_back({"grant", "exit", transport});
    // A stopped rank is caught by deadlines alone, whatever the stage: set-up, one stage of the
    // refit, and the fan-out layer.
    for (const char* stage : {"setup", "puts", "fanout"})
      cases.push_back({stage, "stop", transport});
  }
  return cases;
}

class FaultMatrixTest : public ::testing::TestWithParam<MatrixCase> {};

TEST_P(FaultMatrixTest, SurvivorsFailWithTheDocumentedError) { CheckMatrixCase(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Stages, FaultMatrixTest, ::testing::ValuesIn(AllCases()), CaseName);

// --- Transient faults: a stall shorter than the deadline, and Reset() after a failed refit.

class FaultTransientTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FaultTransientTest, StallShorterThanTheDeadlineIsHarmless) {
  Scenario s;
  s.peer = Peer();
  s.transport = GetParam();
  s.inject = absl::StrCat("puts:stop:1:", kFaultEpoch);
  s.stopped = Scenario::Stopped::kResumeAfter;
  s.resume_after = absl::Milliseconds(500);
  s.peer_args = {"--steps", "4", "--deadline-ms", "20000"};
  auto outcome = RunScenario(s);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  SCOPED_TRACE(outcome->Describe());
  EXPECT_GE(outcome->stopped_at_ns, 0) << "rank 1 never stopped";
  for (const RankOutcome& rank : outcome->ranks) {
    EXPECT_TRUE(rank.result.ok()) << rank.result.Describe();
    EXPECT_TRUE(rank.failures.empty());
    EXPECT_EQ(rank.verified_steps, (std::vector<int>{1, 2, 3, 4}));
  }
}

// Rank 1 stops while granting refit 2, longer than rank 0's deadline: rank 0 fails with
// DeadlineExceeded naming rank 1; rank 1, resumed, fails refit 2 too (rank 0's abort or its own
// deadline). Both Reset() and the next refits verify byte-exact.
TEST_P(FaultTransientTest, ResetAfterAFailedRefitRecoversByteExact) {
  Scenario s;
  s.peer = Peer();
  s.transport = GetParam();
  s.inject = absl::StrCat("grant:stop:1:", kFaultEpoch);
  s.stopped = Scenario::Stopped::kResumeAfterSurvivorsFail;
  s.peer_args = {"--steps", "5", "--deadline-ms", "2000", "--reset"};
  auto outcome = RunScenario(s);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  SCOPED_TRACE(outcome->Describe());
  EXPECT_GE(outcome->stopped_at_ns, 0) << "rank 1 never stopped";
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const RankOutcome& rank = outcome->ranks[r];
    EXPECT_TRUE(rank.result.ok()) << rank.result.Describe();
    EXPECT_FALSE(rank.wrong);
    ASSERT_EQ(rank.failures.size(), 1u);
    EXPECT_EQ(rank.failures[0].what, absl::StrCat("STEP ", kFaultEpoch));
    if (r == 0) {
      EXPECT_EQ(rank.failures[0].code, "DEADLINE_EXCEEDED");
      EXPECT_TRUE(absl::StrContains(rank.failures[0].message, "rank 1"));
    } else {
      EXPECT_TRUE(rank.failures[0].code == "UNAVAILABLE" ||
                  rank.failures[0].code == "DEADLINE_EXCEEDED")
          << rank.failures[0].code;
    }
    EXPECT_EQ(rank.verified_steps, (std::vector<int>{1, 3, 4, 5}));
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, FaultTransientTest, ::testing::Values("sm", "tcp"),
                         TransportName);

// A peer's abort that reaches a rank still setting up fails that rank's first refit, not its
// set-up. "star": ranks 0 and 2 both send to rank 1 and are not peers of each other. Rank 2
// stops after the hello exchange, before the barrier that ends wire-up ("wired"), so rank 1
// waits in that barrier while rank 0, whose only peer (rank 1) has arrived, is done: rank 0's
// first refit misses its 1 s deadline (rank 1 cannot grant yet) and rank 0 aborts it to rank 1,
// which is still setting up. Rank 2 resumes once rank 0 failed. Every rank then sets up, fails
// refit 1 (rank 0 by its deadline, rank 1 by rank 0's abort, rank 2 by rank 1's abort or its
// deadline) and, after Reset(), verifies refits 2 and 3 byte-exact. Set-up used to fail on rank
// 1 with rank 0's abort.
TEST(FaultSetUpTest, AbortReachingARankInSetUpFailsItsFirstRefitOnly) {
  Scenario s;
  s.peer = Peer();
  s.spec = "star";
  s.world_size = 3;
  s.faulted_rank = 2;
  s.inject = "wired:stop:2";
  s.stopped = Scenario::Stopped::kResumeAfterRankFails;
  s.resume_after_failure_of = 0;
  s.peer_args = {"--steps",           "3",     "--first-deadline-ms", "1000", "--deadline-ms",
                 "20000",             "--setup-timeout-ms", "30000", "--reset"};
  auto outcome = RunScenario(s);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  SCOPED_TRACE(outcome->Describe());
  EXPECT_GE(outcome->stopped_at_ns, 0) << "rank 2 never stopped";
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const RankOutcome& rank = outcome->ranks[r];
    EXPECT_TRUE(rank.result.ok()) << rank.result.Describe();
    EXPECT_FALSE(rank.wrong);
    ASSERT_EQ(rank.failures.size(), 1u);
    EXPECT_EQ(rank.failures[0].what, "STEP 1");
    if (r == 0) {
      EXPECT_EQ(rank.failures[0].code, "DEADLINE_EXCEEDED");
    } else if (r == 1) {
      // The abort that arrived during set-up, naming the first refit and rank 0's error.
      EXPECT_EQ(rank.failures[0].code, "UNAVAILABLE");
      EXPECT_TRUE(absl::StrContains(rank.failures[0].message, "rank 1, refit epoch 1: peer"))
          << rank.failures[0].message;
    }
    EXPECT_EQ(rank.verified_steps, (std::vector<int>{2, 3}));
  }
}

// --- The store killed mid-job (served by its own process here).

class FaultStoreTest : public ::testing::TestWithParam<std::string> {};

// Barrier is the one call after set-up that needs the store: it fails with Unavailable at once.
TEST_P(FaultStoreTest, KilledStoreFailsTheNextBarrierWithUnavailable) {
  Scenario s;
  s.peer = Peer();
  s.transport = GetParam();
  s.faulted_rank = -1;
  s.external = Scenario::External::kKillStore;
  s.go_after_store_kill = true;
  s.peer_args = {"--steps", "20", "--deadline-ms", "20000", "--barrier"};
  auto outcome = RunScenario(s);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  SCOPED_TRACE(outcome->Describe());
  ASSERT_TRUE(outcome->external_applied);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const RankOutcome& rank = outcome->ranks[r];
    EXPECT_FALSE(rank.result.killed_by_launcher);
    EXPECT_TRUE(rank.result.exited && rank.result.exit_code == 1) << rank.result.Describe();
    ASSERT_FALSE(rank.failures.empty());
    EXPECT_EQ(rank.failures[0].what, "BARRIER 1");
    EXPECT_EQ(rank.failures[0].code, "UNAVAILABLE") << rank.failures[0].message;
    EXPECT_LT(outcome->DetectionSeconds(r), kBoundSeconds);
    std::fprintf(stderr, "store killed: rank %d failed %.3f s after it: %s: %s\n", r,
                 outcome->DetectionSeconds(r), rank.failures[0].code.c_str(),
                 rank.failures[0].message.c_str());
    ASSERT_GE(rank.end_at_ns, 0);
    EXPECT_LT((rank.end_at_ns - outcome->fault_at_ns) * 1e-9, kBoundSeconds) << "slow teardown";
  }
}

// Refits of a live handle never touch the store: they go on, and the handle and communicator
// are destroyed promptly without it.
TEST_P(FaultStoreTest, KilledStoreDoesNotStopRefitsOfLiveHandles) {
  Scenario s;
  s.peer = Peer();
  s.transport = GetParam();
  s.faulted_rank = -1;
  s.external = Scenario::External::kKillStore;
  s.go_after_store_kill = true;
  s.peer_args = {"--steps", "10", "--deadline-ms", "20000"};
  auto outcome = RunScenario(s);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  SCOPED_TRACE(outcome->Describe());
  ASSERT_TRUE(outcome->external_applied);
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const RankOutcome& rank = outcome->ranks[r];
    EXPECT_TRUE(rank.result.ok()) << rank.result.Describe();
    EXPECT_EQ(rank.verified_steps.size(), 10u);
    ASSERT_GE(rank.end_at_ns, 0);
    EXPECT_LT((rank.end_at_ns - outcome->fault_at_ns) * 1e-9, kBoundSeconds) << "slow teardown";
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, FaultStoreTest, ::testing::Values("sm", "tcp"), TransportName);

// --- A link taken down mid-refit (label netns: each rank in its own namespace, tcp).

// Rank 1's veth goes down mid-refit: both ranks fail at their 2 s deadline naming the other, then
// end on their own; `teardown_bound` (seconds from the failure to the end of the handle and
// communicator destructors), when > 0, is asserted too.
void CheckLinkDown(double teardown_bound) {
  if (!launcher::CanUseNetns()) GTEST_SKIP() << "network namespaces need root";
  Scenario s;
  s.peer = Peer();
  s.mode = launcher::Mode::kNetns;
  s.transport = "tcp";
  s.external = Scenario::External::kLinkDown;
  s.peer_args = {"--steps", "1000000", "--deadline-ms", "2000"};
  s.failure_grace = absl::Seconds(45);  // A slow teardown shows as such, not as a kill.
  auto outcome = RunScenario(s);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  SCOPED_TRACE(outcome->Describe());
  ASSERT_TRUE(outcome->external_applied);
  ASSERT_TRUE(outcome->external_error.empty()) << outcome->external_error;
  for (int r = 0; r < 2; ++r) {
    SCOPED_TRACE(absl::StrCat("rank ", r));
    const RankOutcome& rank = outcome->ranks[r];
    EXPECT_FALSE(rank.result.killed_by_launcher) << "it did not end on its own";
    EXPECT_TRUE(rank.result.exited && rank.result.exit_code == 1) << rank.result.Describe();
    EXPECT_FALSE(rank.wrong);
    ASSERT_FALSE(rank.failures.empty());
    const Failure& f = rank.failures.front();
    EXPECT_TRUE(f.code == "DEADLINE_EXCEEDED" || f.code == "UNAVAILABLE") << f.code;
    EXPECT_TRUE(absl::StrContains(f.message, absl::StrCat("rank ", 1 - r))) << f.message;
    EXPECT_GE(outcome->DetectionSeconds(r), 0);
    EXPECT_LT(outcome->DetectionSeconds(r), kBoundSeconds);
    ASSERT_GE(rank.end_at_ns, 0);
    const double teardown = (rank.end_at_ns - f.at_ns) * 1e-9;
    if (teardown_bound > 0) {
      EXPECT_LT(teardown, teardown_bound) << "slow teardown";
    }
    std::fprintf(stderr, "link down: rank %d failed %.3f s after it (%s: %s), ended %.3f s later\n",
                 r, outcome->DetectionSeconds(r), f.code.c_str(), f.message.c_str(), teardown);
  }
}

TEST(FaultNetnsTest, LinkDownMidRefitFailsEveryRankWithinItsDeadline) { CheckLinkDown(0); }

// ... and the rank cut off from the store tears down within the documented bound: the handle's
// shutdown and the communicator's exit wait each min(RESHARD_TIMEOUT_MS = 20 s here, 10 s); a
// failed handle only arrives at its closing barrier, for at most 1 s.
TEST(FaultNetnsTest, LinkDownRankTearsDownWithinTheExitBound) { CheckLinkDown(12.0); }

}  // namespace
}  // namespace reshard::fault
