#include "src/common/fault.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "src/common/log.h"

namespace reshard::common {
namespace {

constexpr FaultStage kStages[] = {FaultStage::kSetup, FaultStage::kWired,   FaultStage::kGrant,
                                  FaultStage::kPuts,  FaultStage::kSignals, FaultStage::kFanout,
                                  FaultStage::kBetween};
constexpr FaultAction kActions[] = {FaultAction::kKill, FaultAction::kStop, FaultAction::kExit};

FaultSpec g_spec;
std::atomic<bool> g_fired{false};

bool ArmFromEnvironment() {
  const char* env = std::getenv("RESHARD_FAULT_INJECT");
  if (env == nullptr || *env == '\0') return false;
  absl::StatusOr<FaultSpec> spec = ParseFaultSpec(env);
  if (!spec.ok()) {
    RESHARD_LOG(kError, "RESHARD_FAULT_INJECT: %s; no fault is injected",
                std::string(spec.status().message()));
    return false;
  }
  g_spec = *spec;
  return true;
}

}  // namespace

namespace fault_internal {

bool armed = ArmFromEnvironment();

void Hit(FaultStage stage, int32_t rank, uint64_t epoch) {
  if (!FaultMatches(g_spec, stage, rank, epoch) || g_fired.exchange(true)) return;
  const std::string line = absl::StrFormat(
      "reshard[%d] fault injection: rank %d, stage %s, epoch %d: %s at_unix_ns=%d\n",
      static_cast<int>(getpid()), rank, FaultStageName(stage), epoch,
      FaultActionName(g_spec.action), absl::ToUnixNanos(absl::Now()));
  (void)!write(STDERR_FILENO, line.data(), line.size());
  switch (g_spec.action) {
    case FaultAction::kKill:
      raise(SIGKILL);
      break;
    case FaultAction::kStop:
      raise(SIGSTOP);
      break;
    case FaultAction::kExit:
      _exit(kFaultExitCode);
  }
}

}  // namespace fault_internal

const char* FaultStageName(FaultStage stage) {
  switch (stage) {
    case FaultStage::kSetup:
      return "setup";
    case FaultStage::kWired:
      return "wired";
    case FaultStage::kGrant:
      return "grant";
    case FaultStage::kPuts:
      return "puts";
    case FaultStage::kSignals:
      return "signals";
    case FaultStage::kFanout:
      return "fanout";
    case FaultStage::kBetween:
      return "between";
  }
  return "?";
}

const char* FaultActionName(FaultAction action) {
  switch (action) {
    case FaultAction::kKill:
      return "kill";
    case FaultAction::kStop:
      return "stop";
    case FaultAction::kExit:
      return "exit";
  }
  return "?";
}

absl::StatusOr<FaultSpec> ParseFaultSpec(const std::string& text) {
  const std::vector<std::string> parts = absl::StrSplit(text, ':');
  if (parts.size() < 2 || parts.size() > 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", text, "\" is not <stage>:<action>[:<rank>[:<epoch>]]"));
  }
  FaultSpec spec;
  bool stage_ok = false, action_ok = false;
  for (FaultStage s : kStages) {
    if (parts[0] != FaultStageName(s)) continue;
    spec.stage = s;
    stage_ok = true;
  }
  for (FaultAction a : kActions) {
    if (parts[1] != FaultActionName(a)) continue;
    spec.action = a;
    action_ok = true;
  }
  if (!stage_ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown stage \"", parts[0], "\" (setup, wired, grant, puts, signals, fanout, between)"));
  }
  if (!action_ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown action \"", parts[1], "\" (kill, stop, exit)"));
  }
  if (parts.size() > 2 && (!absl::SimpleAtoi(parts[2], &spec.rank) || spec.rank < 0)) {
    return absl::InvalidArgumentError(absl::StrCat("rank \"", parts[2], "\" is not a rank"));
  }
  if (parts.size() > 3 && !absl::SimpleAtoi(parts[3], &spec.epoch)) {
    return absl::InvalidArgumentError(absl::StrCat("epoch \"", parts[3], "\" is not an epoch"));
  }
  return spec;
}

bool FaultMatches(const FaultSpec& spec, FaultStage stage, int32_t rank, uint64_t epoch) {
  return spec.stage == stage && (spec.rank < 0 || spec.rank == rank) && epoch >= spec.epoch;
}

}  // namespace reshard::common
