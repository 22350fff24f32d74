#include "tests/testing/multiprocess.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/common/shared_memory.h"
#include "src/cuda/runtime.h"

namespace reshard::testing {

ForkOptions SharedMemoryUcx(absl::Duration timeout) {
  ForkOptions options;
  options.timeout = timeout;
  // RESHARD_TEST_UCX_TLS replaces the transports, e.g. to add cuda_copy,cuda_ipc when the build's
  // UCX is CUDA-aware (tools/gpu_check.sh): device buffers are then registered, not staged.
  const char* tls = std::getenv("RESHARD_TEST_UCX_TLS");
  options.env = {{"UCX_TLS", tls != nullptr && *tls != '\0' ? tls : "posix,sysv,cma,self"},
                 {"UCX_NET_DEVICES", "all"},
                 {"UCX_WARN_UNUSED_ENV_VARS", "n"}};
  return options;
}

std::vector<int32_t> Ranks(int n) {
  std::vector<int32_t> ranks(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) ranks[r] = r;
  return ranks;
}

std::map<int32_t, int> ForkRanks(const std::vector<int32_t>& ranks,
                                 const std::function<int(int32_t)>& body,
                                 const ForkOptions& options) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::map<pid_t, int32_t> children;
  std::map<int32_t, int> codes;
  for (int32_t r : ranks) {
    const pid_t pid = fork();
    if (pid == 0) {
      for (const auto& [name, value] : options.env) setenv(name.c_str(), value.c_str(), 1);
      const int code = body(r);
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
    if (pid < 0) {
      codes[r] = kHung;
      continue;
    }
    children[pid] = r;
  }
  const absl::Time deadline = absl::Now() + options.timeout;
  while (!children.empty()) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      auto it = children.find(pid);
      if (it == children.end()) continue;
      codes[it->second] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      if (!WIFEXITED(status)) RemoveSharedObjectsOf(pid);
      children.erase(it);
      continue;
    }
    if (absl::Now() > deadline) {
      for (const auto& [p, r] : children) {
        kill(p, SIGKILL);
        waitpid(p, nullptr, 0);
        RemoveSharedObjectsOf(p);
        codes[r] = kHung;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return codes;
}

int ProbeCudaDevices(std::string* why) {
  int fds[2];
  if (pipe(fds) != 0) {
    if (why != nullptr) *why = "pipe failed";
    return 0;
  }
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    std::string reason;
    const int n = cuda::CudaDeviceCount(&reason);
    const std::string msg = absl::StrFormat("%d %s", n, reason);
    (void)!write(fds[1], msg.data(), msg.size());
    _exit(0);
  }
  close(fds[1]);
  std::string msg;
  char buf[512];
  ssize_t k;
  while ((k = read(fds[0], buf, sizeof(buf))) > 0) msg.append(buf, static_cast<size_t>(k));
  close(fds[0]);
  if (pid > 0) waitpid(pid, nullptr, 0);
  const size_t space = msg.find(' ');
  if (why != nullptr) *why = space == std::string::npos ? msg : msg.substr(space + 1);
  return std::atoi(msg.c_str());
}

namespace {

// The scratch directories this process made, removed at its exit by the process that made them.
struct ScratchDirs {
  pid_t owner = 0;
  std::vector<std::string> paths;
};

ScratchDirs& Scratch() {
  static ScratchDirs* dirs = new ScratchDirs;  // Never destroyed: read by the atexit handler.
  return *dirs;
}

void RemoveScratchDirs() {
  ScratchDirs& dirs = Scratch();
  if (dirs.owner != getpid()) return;
  for (const std::string& path : dirs.paths) {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
}

}  // namespace

std::string ScratchDir(const std::string& tag) {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/reshard-", tag, "-XXXXXX");
  if (mkdtemp(templ.data()) == nullptr) return "";
  ScratchDirs& dirs = Scratch();
  if (dirs.owner != getpid()) {  // The first directory of this process (a child's included).
    dirs.owner = getpid();
    dirs.paths.clear();
    std::atexit(RemoveScratchDirs);
  }
  dirs.paths.push_back(templ);
  return templ;
}

}  // namespace reshard::testing
