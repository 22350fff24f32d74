// Launches the N processes of a refit world on this machine, like torchrun for one node, and
// optionally turns the machine into an emulated cluster: every rank in its own network namespace
// with its own emulated NIC.
//
// Each rank runs the same command line with this environment (on top of the launcher's own):
//   RESHARD_RANK, RESHARD_WORLD_SIZE       identity in the world
//   RESHARD_LOCAL_RANK                     the rank's index on this machine: its rank, since the
//                                          launcher starts every rank here (in kNetns too, whose
//                                          emulated hosts share this machine's devices)
//   RESHARD_STORE=host:port                the TcpStoreServer the launcher runs for this launch
//   RESHARD_STORE_TOKEN                    a random secret, new for every launch
//   RESHARD_TIMEOUT_MS                     deadline for every wait inside the rank
//   UCX_TLS, UCX_NET_DEVICES               the transports of the mode (below)
//
// Modes:
//   kLoopback  plain processes. transport "sm": UCX_TLS=sm,self (shared memory; cma/posix/sysv),
//              "tcp": UCX_TLS=tcp, UCX_NET_DEVICES=lo. The store listens on 127.0.0.1.
//   kNetns     (root only) every rank in its own network namespace `<prefix>-r<R>` with a veth
//              `veth0` (10.251.x.y/16) into a bridge that lives in a namespace `<prefix>-br`
//              (10.251.0.1, where the store listens); UCX_TLS=tcp, UCX_NET_DEVICES=veth0. With
//              `rate` set, a `tc tbf` qdisc limits both directions of each rank's veth, so each
//              rank has its own NIC of that speed. TCP slow start after idle is off in every
//              rank namespace. Nothing is configured in the root namespace.
//              Without root, or when namespaces cannot be created, it falls back to kLoopback
//              with UCX_TLS=tcp and says so on stderr (and in LaunchResult::fallback_reason).
//
// Cleanup: processes, namespaces, links and qdiscs go away on every exit path: normal end, a
// failing rank (the others get `failure_grace` to report, then are killed), the launch deadline,
// SIGINT/SIGTERM (when `handle_signals`), and destruction of the Launch. Each rank dies with the
// launcher (PR_SET_PDEATHSIG). Namespace names carry the launcher's pid
// (`reshard-<pid>-<tag>-...`); Start() sweeps namespaces left by launchers that no longer run.
//
// Thread model: a Launch is thread-compatible; Kill() may be called from another thread while
// Wait() runs.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "reshard/launch.h"

namespace reshard::launcher {

enum class Mode { kLoopback, kNetns };

inline constexpr int kDefaultNetnsMtu = 9000;

struct LaunchOptions {
  // argv of every rank; argv[0] is a path or a name looked up in PATH.
  std::vector<std::string> argv;
  int world_size = 1;
  Mode mode = Mode::kLoopback;
  // "sm" or "tcp" in kLoopback; kNetns always uses tcp.
  std::string transport = "sm";
  // kNetns only: per-rank NIC rate in tc notation ("200mbit", "1gbit"); empty = unlimited.
  std::string rate;
  // kNetns only: the MTU of every veth and of the bridge. Jumbo frames by default: the emulated
  // NIC stands for an RDMA NIC (4 KiB InfiniBand MTU, 9000-byte RoCE), whose per-packet headers
  // cost under 1% of the wire, where TCP/IP in 1500-byte frames costs 4.5%, which the rate and
  // the emulated lower bound (payload bytes / rate) would otherwise silently charge to reshard.
  int mtu = kDefaultNetnsMtu;
  // The whole launch is killed when it runs longer than this.
  absl::Duration deadline = absl::Minutes(5);
  // RESHARD_TIMEOUT_MS given to each rank.
  int64_t rank_timeout_ms = 30000;
  // After the first rank fails, the others get this long to exit on their own.
  absl::Duration failure_grace = absl::Seconds(15);
  // Extra environment for every rank; overrides the launcher's variables of the same name.
  std::vector<std::pair<std::string, std::string>> extra_env;
  // Forward each rank's stderr to ours, each line prefixed with "[rank R] ".
  bool forward_stderr = true;
  // Install SIGINT/SIGTERM handlers for the duration of Wait() (the CLI sets this).
  bool handle_signals = false;
};

struct RankResult {
  int rank = 0;
  pid_t pid = -1;
  bool exited = false;      // false: still running when the launch ended, killed by us
  int exit_code = -1;       // when the process exited normally
  int term_signal = 0;      // when a signal ended it
  bool killed_by_launcher = false;
  std::string stdout_text;  // everything it printed on stdout (first 1 MiB)
  std::string json_line;    // its last stdout line that starts with '{' (empty if none)
  std::string stderr_tail;  // the last 4 KiB of its stderr
  absl::Duration elapsed;

  bool ok() const { return exited && exit_code == 0; }
  // "exit 0", "exit 1", "killed by signal 9 (Killed)", "killed by the launcher".
  std::string Describe() const;
};

struct LaunchResult {
  std::vector<RankResult> ranks;
  Mode mode = Mode::kLoopback;  // the mode that actually ran
  std::string fallback_reason;  // why kNetns fell back to kLoopback (empty when it did not)
  std::string ucx_tls;          // UCX_TLS the ranks got
  bool deadline_exceeded = false;
  bool interrupted = false;  // SIGINT/SIGTERM
  int first_failed_rank = -1;
  absl::Duration elapsed;

  bool ok() const;
};

class Launch {
 public:
  // Validates the options, sweeps stale namespaces, sets up the network (kNetns), starts the
  // store server and forks every rank. InvalidArgument for bad options; Internal/Unavailable
  // when set-up fails (everything created so far is removed).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<Launch>> Start(LaunchOptions options);

  // Kills whatever still runs and removes the namespaces.
  ~Launch();
  Launch(const Launch&) = delete;
  Launch& operator=(const Launch&) = delete;

  // Waits for every rank (see the failure policy above) and returns their results. Cleans up
  // before returning. Call once.
  [[nodiscard]] absl::StatusOr<LaunchResult> Wait();

  // Sends `signal` to rank `rank`'s process group (for fault-injection tests).
  [[nodiscard]] absl::Status Kill(int rank, int signal);

  pid_t pid(int rank) const;
  Mode mode() const { return mode_; }
  // The store address the ranks got, and the network namespace of `rank` (empty in kLoopback).
  const std::string& store_address() const { return store_address_; }
  std::string namespace_of(int rank) const;
  const std::string& name_prefix() const { return prefix_; }

 private:
  explicit Launch(LaunchOptions options);
  absl::Status SetUpNetns();
  absl::Status StartStore();
  absl::Status SpawnRanks();
  void KillAll(int signal);
  void Cleanup();

  struct Proc {
    pid_t pid = -1;
    int out_fd = -1;
    int err_fd = -1;
    RankResult result;
    std::string err_line;  // partial stderr line not yet forwarded
    absl::Time started;
  };

  LaunchOptions options_;
  Mode mode_ = Mode::kLoopback;
  std::string fallback_reason_;
  std::string prefix_;
  std::string bridge_ns_;
  std::vector<std::string> rank_ns_;
  std::string store_host_;
  std::string store_address_;
  std::string token_;
  std::string ucx_tls_;
  std::unique_ptr<StoreServer> store_;
  std::vector<Proc> procs_;
  // Held while Wait() or Cleanup() reaps a rank (writing its result's exited / term_signal) and
  // while Kill() reads them and signals: Kill() runs on other threads, and never signals a pid
  // that was already reaped. A std::mutex, which ThreadSanitizer sees (docs/testing.md).
  std::mutex reap_mu_;
  absl::Time start_time_;
  bool cleaned_up_ = false;
};

// Start + Wait.
[[nodiscard]] absl::StatusOr<LaunchResult> Run(LaunchOptions options);

// Parses a tc rate ("200mbit", "1gbit", "1.5gbit", "100mbps" = megabytes/s, "800kbit", "1000bit")
// into bits per second. InvalidArgument names the text when it is not one.
[[nodiscard]] absl::StatusOr<double> ParseTcRate(const std::string& rate);

// Removes namespaces named `reshard-<pid>-...` whose launcher pid no longer runs (killing any
// process left inside). Returns how many it removed.
int SweepStaleNamespaces();

// Network namespaces that currently exist (from /run/netns).
std::vector<std::string> ListNamespaces();

// True when this process may create network namespaces (root).
bool CanUseNetns();

}  // namespace reshard::launcher
