// Fault injection at the stages of a refit: a test facility for the fault-injection suite
// (tests/api/fault_injection_test.cc) and bench (bench/fault_bench.cc), documented in
// docs/reliability.md. Not a feature: the product never sets it.
//
//   RESHARD_FAULT_INJECT=<stage>:<action>[:<rank>[:<epoch>]]
//
//   stage   setup    a handle's wire-up: the record is published and the endpoints exist, the
//                    hello exchange has not started (src/net/wireup.cc)
//           wired    a handle's wire-up: every hello was exchanged, the rank has not yet arrived
//                    at the barrier among its peers (src/net/wireup.cc)
//           grant    a destination is about to grant an epoch to a source (peer_link.cc)
//           puts     the first put (or data message) of the epoch was just posted (delivery.cc)
//           signals  put delivery: a batch's flush completed, its completion signal is about to
//                    go (peer_link.cc); active-message delivery, which has no signals: the
//                    last data message of the epoch to a peer was just posted (delivery.cc)
//           fanout   a piece is about to be forwarded to a domain peer (src/nvlink/fanout.cc)
//           between  a refit is about to start (RefitHandle::Start, src/api/refit.cc): epoch E
//                    is between refits E-1 and E
//   action  kill     SIGKILL this process
//           stop     SIGSTOP this process (it resumes on SIGCONT and carries on)
//           exit     _exit(kFaultExitCode) without running destructors
//   rank    only this rank faults (default: any rank of the process)
//   epoch   the first time the point is reached at this epoch or later (default 0: the first
//           time at all; set-up points report epoch 0)
//
// Read once, when the library is loaded (a process forked later inherits its parent's
// reading). Fires at most once per process. Just before acting it writes one line to stderr,
//   reshard[<pid>] fault injection: rank R, stage S, epoch E: <action> at_unix_ns=<ns>
// so a harness can time detection from the moment of the fault. A malformed value is reported
// once (RESHARD_LOG error) and injects nothing. Unset, FaultPoint costs one load and one
// predicted branch.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace reshard::common {

enum class FaultStage : uint8_t { kSetup, kWired, kGrant, kPuts, kSignals, kFanout, kBetween };
enum class FaultAction : uint8_t { kKill, kStop, kExit };

// Exit status of the `exit` action.
constexpr int kFaultExitCode = 86;

struct FaultSpec {
  FaultStage stage = FaultStage::kSetup;
  FaultAction action = FaultAction::kKill;
  int32_t rank = -1;   // -1: any.
  uint64_t epoch = 0;  // Fires at the first point at this epoch or later.
};

const char* FaultStageName(FaultStage stage);
const char* FaultActionName(FaultAction action);

// Parses a RESHARD_FAULT_INJECT value; InvalidArgument naming the bad part.
[[nodiscard]] absl::StatusOr<FaultSpec> ParseFaultSpec(const std::string& text);

// Whether `spec` fires at this point (the stage, rank and epoch filters; not the once-only rule).
bool FaultMatches(const FaultSpec& spec, FaultStage stage, int32_t rank, uint64_t epoch);

namespace fault_internal {
// Set once at load time, when RESHARD_FAULT_INJECT parses. Hidden: read PC-relative, not
// through the GOT, inside libreshard (every FaultPoint is there).
extern bool armed __attribute__((visibility("hidden")));
void Hit(FaultStage stage, int32_t rank, uint64_t epoch);
}  // namespace fault_internal

// A stage boundary of rank `rank` in refit `epoch` (0 during set-up).
inline void FaultPoint(FaultStage stage, int32_t rank, uint64_t epoch) {
  if (__builtin_expect(fault_internal::armed, false)) fault_internal::Hit(stage, rank, epoch);
}

}  // namespace reshard::common
