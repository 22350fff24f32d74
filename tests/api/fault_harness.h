// One fault scenario, end to end: launches the ranks of tests/api/fault_peer.cc through the local
// launcher, injects one fault (the library's RESHARD_FAULT_INJECT hook, or from outside: kill or
// stop a rank, kill the store, take a rank's link down) and collects what every rank reported.
// Shared by the fault-injection suite (fault_injection_test.cc) and bench/fault_bench.cc.
//
// Times are wall-clock nanoseconds since the Unix epoch, comparable across the processes of this
// machine (network namespaces share the clock): the fault's time is the hook's stderr line, or
// the moment the harness's own action returned.
//
// Thread-compatible; RunScenario blocks until every rank ended (bounded by Scenario::deadline).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tools/launcher/launcher.h"

namespace reshard::fault {

struct Scenario {
  // fault_peer --spec: "pair" (2 ranks), "fanout" or "star" (3 ranks).
  std::string spec = "pair";
  int world_size = 2;
  launcher::Mode mode = launcher::Mode::kLoopback;
  std::string transport = "sm";  // kLoopback: "sm" or "tcp" (the launcher sets UCX_TLS etc.).
  int faulted_rank = 1;  // -1: none (the store is the fault); every other rank is a survivor.
  // RESHARD_FAULT_INJECT for every rank (its value names the rank that faults); "" for none.
  std::string inject;
  // More fault_peer arguments (--steps, --deadline-ms, --barrier, --reset, ...).
  std::vector<std::string> peer_args;

  // A fault from outside, applied once every rank verified its first refit.
  enum class External { kNone, kKillRank, kStopRank, kKillStore, kLinkDown };
  External external = External::kNone;
  // kKillStore: the ranks meet through a store served by a separate process, which is killed;
  // with `go_after_store_kill` the ranks wait after their first refit until it is dead.
  bool go_after_store_kill = false;

  // The faulted rank once it is stopped (SIGSTOP by the hook or kStopRank):
  //   kKillAfterSurvivorsFail    SIGKILL once every other rank failed or ended;
  //   kResumeAfterSurvivorsFail  SIGCONT then (a transient stall);
  //   kResumeAfter               SIGCONT `resume_after` after it stopped;
  //   kResumeAfterRankFails      SIGCONT once rank `resume_after_failure_of` failed or ended.
  enum class Stopped {
    kKillAfterSurvivorsFail,
    kResumeAfterSurvivorsFail,
    kResumeAfter,
    kResumeAfterRankFails
  };
  Stopped stopped = Stopped::kKillAfterSurvivorsFail;
  absl::Duration resume_after = absl::Milliseconds(500);
  int resume_after_failure_of = 0;

  absl::Duration deadline = absl::Seconds(60);  // The whole launch.
  // After the first rank ends with a failure, the others get this long to end on their own
  // before the launcher kills them (RankResult::killed_by_launcher).
  absl::Duration failure_grace = absl::Seconds(20);
  std::string peer;  // The fault_peer binary; default: next to this program.
};

// A failure a rank reported: "SETUP", "STEP <n>" or "BARRIER <n>".
struct Failure {
  std::string what;
  int step = 0;      // 0 for SETUP.
  std::string code;  // absl::StatusCodeToString: "UNAVAILABLE", "DEADLINE_EXCEEDED", ...
  int64_t at_ns = -1;
  std::string message;
};

struct RankOutcome {
  launcher::RankResult result;
  bool setup_ok = false;
  std::vector<int> verified_steps;  // STEP <n> OK, each verified byte-exact by the rank.
  std::vector<Failure> failures;    // In order.
  bool wrong = false;               // A refit returned OK with a wrong element (WRONG line).
  int64_t fault_at_ns = -1;         // This rank's fault-injection line, if it faulted.
  bool done = false;                // Printed DONE (ended on its own after its last step).
  int64_t end_at_ns = -1;           // After its handle and communicator were destroyed.
};

struct Outcome {
  std::vector<RankOutcome> ranks;
  launcher::LaunchResult launch;
  int64_t fault_at_ns = -1;    // The fault: the hook's line, or the harness's action.
  int64_t stopped_at_ns = -1;  // When the harness saw the faulted rank stopped.
  bool external_applied = false;
  std::string external_error;  // Why the external fault could not be applied.

  // Seconds from the fault to `rank`'s first failure; < 0 when either is unknown.
  double DetectionSeconds(int rank) const;
  // Every rank: how it ended, its stdout and the tail of its stderr.
  std::string Describe() const;
};

[[nodiscard]] absl::StatusOr<Outcome> RunScenario(const Scenario& scenario);

// The fault_peer binary next to the running program.
std::string DefaultPeer();

}  // namespace reshard::fault
