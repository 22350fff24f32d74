// The one multi-process harness of the test suites: fork one child per rank, run a body in
// each, collect exit codes under a deadline, and clean up after children that were killed.
// Forked children share nothing with the parent but what was set up before the fork, so a
// child must not rely on the parent's UCX or CUDA state (probe CUDA with ProbeCudaDevices,
// which asks a child, so the parent never initialises the runtime before forking).
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace reshard::testing {

struct ForkOptions {
  // A child still running then is killed (SIGKILL) and reported as kHung.
  absl::Duration timeout = absl::Seconds(60);
  // Set in every child before the body runs (UCX_TLS, UCX_NET_DEVICES, ...; DESIGN §5).
  std::vector<std::pair<std::string, std::string>> env;
};

// Exit code reported for a child the harness killed at the deadline.
constexpr int kHung = 255;

// UCX over shared memory between forked children of one host: UCX_TLS, UCX_NET_DEVICES and
// UCX_WARN_UNUSED_ENV_VARS set explicitly. UCX_TLS is posix,sysv,cma,self, or the value of
// RESHARD_TEST_UCX_TLS when set (tools/gpu_check.sh adds cuda_copy,cuda_ipc for a CUDA-aware UCX).
ForkOptions SharedMemoryUcx(absl::Duration timeout = absl::Seconds(60));

// Forks one child per rank in `ranks`, runs `body(rank)` in each (its return value is the
// child's exit code) and waits for all of them. Returns rank -> exit code: the body's value,
// 128 + signal when a child died by a signal, kHung when the harness killed it at the
// deadline. Shared-memory objects of children that did not exit normally are removed.
std::map<int32_t, int> ForkRanks(const std::vector<int32_t>& ranks,
                                 const std::function<int(int32_t)>& body,
                                 const ForkOptions& options = {});

// The ranks 0..n-1.
std::vector<int32_t> Ranks(int n);

// Usable CUDA devices, asked in a forked child (0 with `why` when none: no build support, no
// driver, no device).
int ProbeCudaDevices(std::string* why);

// A fresh directory under TMPDIR (or /tmp) whose name contains `tag`; "" when it cannot be made.
// It is removed, with everything in it, when the process that made it exits normally (forked
// children that exit leave it alone), so the test suites leave nothing behind in /tmp.
std::string ScratchDir(const std::string& tag);

}  // namespace reshard::testing

// Inside a forked rank's function (a variable `rank` in scope): returns 1 from it when `cond`
// is false, printing the condition and an optional message.
#define CHILD_EXPECT(cond, ...)                                                        \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::fprintf(stderr, "rank %d: %s:%d: %s %s\n", rank, __FILE__, __LINE__, #cond, \
                   std::string(__VA_ARGS__).c_str());                                  \
      return 1;                                                                        \
    }                                                                                  \
  } while (0)
