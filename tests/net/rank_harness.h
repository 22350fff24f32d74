// A fork/exec harness for multi-process refit tests and benchmarks: runs one `reshard-rank`
// (or any program following its contract) per rank against an in-process TcpStoreServer, with
// an explicit UCX_TLS, UCX_NET_DEVICES and timeout, and collects each rank's exit status and
// its one line of JSON.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "src/common/json.h"

namespace reshard::testing {

struct WorldLaunch {
  std::string program;                  // Path of reshard-rank.
  std::vector<std::string> spec_paths;  // One per rank, or one for every rank.
  int world_size = 0;
  int iters = 3;
  std::vector<std::string> extra_args;        // e.g. {"--plan-mode", "naive"}
  std::string ucx_tls = "sm,self";            // Always set explicitly.
  std::string ucx_net_devices = "all";        // Always set explicitly.
  int timeout_ms = 20000;                     // RESHARD_TIMEOUT_MS.
  absl::Duration limit = absl::Seconds(120);  // Every rank is SIGKILLed after this.
  // Called once every rank finished wiring up (set-up is done, the refits are about to start or
  // running), 300 ms later, with the ranks' pids; may kill one.
  std::function<void(const std::vector<pid_t>&)> on_running;
};

struct RankResult {
  int rank = 0;
  int exit_code = -1;  // -1 when killed by a signal.
  int signal = 0;
  std::string stdout_text;
  std::string stderr_text;
  double exit_seconds = 0;  // From on_running (or launch) to exit.
  // Parsed stdout (valid when parsed_ok).
  bool parsed_ok = false;
  json::Value report;
  bool ok() const;  // exit 0 and "ok": true.
  std::string error() const;
};

// Runs the world and returns one result per rank. Errors only for harness failures (fork, store).
[[nodiscard]] absl::StatusOr<std::vector<RankResult>> RunWorld(const WorldLaunch& launch);

// Path of a built program in <build>/bin.
std::string BinPath(const std::string& name);

// A short description of failed ranks for test messages.
std::string Describe(const std::vector<RankResult>& results);

}  // namespace reshard::testing
