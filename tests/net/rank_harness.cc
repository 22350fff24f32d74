#include "tests/net/rank_harness.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "src/common/shared_memory.h"
#include "src/rendezvous/tcp_store.h"

extern char** environ;

namespace reshard::testing {

bool RankResult::ok() const {
  if (exit_code != 0 || !parsed_ok) return false;
  const json::Value* v = report.Find("ok");
  return v != nullptr && v->is_bool() && v->as_bool();
}

std::string RankResult::error() const {
  if (parsed_ok) {
    const json::Value* e = report.Find("error");
    if (e != nullptr && e->is_string() && !e->as_string().empty()) return e->as_string();
  }
  return absl::StrCat("exit ", exit_code, " signal ", signal, " stdout: ", stdout_text,
                      " stderr: ", stderr_text.substr(0, 2000));
}

std::string BinPath(const std::string& name) {
  return absl::StrCat(RESHARD_BINARY_DIR, "/bin/", name);
}

std::string Describe(const std::vector<RankResult>& results) {
  std::string out;
  for (const RankResult& r : results) {
    if (!r.ok()) absl::StrAppend(&out, "\n  rank ", r.rank, ": ", r.error());
  }
  return out;
}

absl::StatusOr<std::vector<RankResult>> RunWorld(const WorldLaunch& launch) {
  std::random_device rd;
  const std::string token = absl::StrCat("t", rd(), rd());
  absl::StatusOr<std::unique_ptr<rendezvous::TcpStoreServer>> server =
      rendezvous::TcpStoreServer::Start("127.0.0.1", 0, token);
  if (!server.ok()) return server.status();
  const int port = (*server)->port();

  const int n = launch.world_size;
  std::vector<pid_t> pids(n, -1);
  std::vector<int> out_fd(n, -1), err_fd(n, -1);
  std::vector<RankResult> results(n);
  for (int r = 0; r < n; ++r) {
    results[r].rank = r;
    int out_pipe[2], err_pipe[2];
    if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0) {
      return absl::InternalError("pipe failed");
    }
    std::vector<std::string> argv = {
        launch.program, launch.spec_paths.size() == 1 ? launch.spec_paths[0] : launch.spec_paths[r],
        "--iters", absl::StrCat(launch.iters)};
    argv.insert(argv.end(), launch.extra_args.begin(), launch.extra_args.end());
    std::vector<std::string> env = {
        absl::StrCat("RESHARD_RANK=", r),
        absl::StrCat("RESHARD_WORLD_SIZE=", n),
        absl::StrCat("RESHARD_STORE=127.0.0.1:", port),
        absl::StrCat("RESHARD_STORE_TOKEN=", token),
        absl::StrCat("RESHARD_TIMEOUT_MS=", launch.timeout_ms),
        absl::StrCat("UCX_TLS=", launch.ucx_tls),
        absl::StrCat("UCX_NET_DEVICES=", launch.ucx_net_devices),
        "UCX_WARN_UNUSED_ENV_VARS=n",
    };
    // This process runs the store server's thread, so the child may only make async-signal-safe
    // calls until it execs (a malloc there could wait forever on a lock the server thread held
    // at the fork: ranks hung that way under ASan). Arguments and environment are built here.
    const size_t ours = env.size();
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string entry = *e;
      const std::string name = entry.substr(0, entry.find('=') + 1);
      bool overridden = false;
      for (size_t i = 0; i < ours && !overridden; ++i) overridden = absl::StartsWith(env[i], name);
      if (!overridden) env.push_back(entry);
    }
    std::vector<char*> args, envp;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    const pid_t pid = fork();
    if (pid < 0) return absl::InternalError("fork failed");
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      dup2(out_pipe[1], 1);
      dup2(err_pipe[1], 2);
      execve(args[0], args.data(), envp.data());
      const char* msg = "rank harness: cannot execute the rank program\n";
      ssize_t ignored = write(2, msg, std::strlen(msg));
      (void)ignored;
      _exit(127);
    }
    close(out_pipe[1]);
    close(err_pipe[1]);
    pids[r] = pid;
    out_fd[r] = out_pipe[0];
    err_fd[r] = err_pipe[0];
  }

  absl::Time running_at = absl::Now();
  std::atomic<bool> watcher_done{false};
  std::thread watcher;
  if (launch.on_running) {
    watcher = std::thread([&] {
      auto client =
          rendezvous::TcpStore::Connect("127.0.0.1", port, token, absl::Now() + absl::Seconds(30));
      // Why on_running was not called, for the test's output (a test that needs it fails).
      absl::Status missed = client.status();
      if (client.ok()) {
        // Every rank passed its engine's wire-up barrier (reshard-rank's handle is "rank"), the
        // last step of set-up. Not the first refit's barrier: ranks delete a refit barrier's key
        // once they pass the next one, which fast refits do before this thread reads it.
        for (int r = 0; r < n && missed.ok(); ++r) {
          missed = (*client)
                       ->Get(absl::StrCat("reshard/rank/net/wired/", r), absl::Now() + launch.limit)
                       .status();
        }
        if (missed.ok()) {
          absl::SleepFor(absl::Milliseconds(300));  // Let the refits get going.
          running_at = absl::Now();
          launch.on_running(pids);
        }
      }
      if (!missed.ok()) {
        std::fprintf(stderr, "rank harness: on_running not called: %s\n",
                     missed.ToString().c_str());
      }
      watcher_done = true;
    });
  }

  const absl::Time limit = absl::Now() + launch.limit;
  int open_fds = 2 * n;
  bool killed = false;
  while (open_fds > 0) {
    std::vector<pollfd> fds;
    std::vector<std::pair<int, bool>> owner;
    for (int r = 0; r < n; ++r) {
      if (out_fd[r] >= 0) {
        fds.push_back({out_fd[r], POLLIN, 0});
        owner.push_back({r, true});
      }
      if (err_fd[r] >= 0) {
        fds.push_back({err_fd[r], POLLIN, 0});
        owner.push_back({r, false});
      }
    }
    const int ready = poll(fds.data(), fds.size(), 100);
    if (absl::Now() > limit && !killed) {
      for (pid_t p : pids) kill(p, SIGKILL);
      killed = true;
    }
    if (ready <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      char buf[65536];
      const ssize_t got = read(fds[i].fd, buf, sizeof(buf));
      auto [r, is_out] = owner[i];
      if (got > 0) {
        (is_out ? results[r].stdout_text : results[r].stderr_text).append(buf, got);
        if (!is_out && results[r].stderr_text.size() > (1 << 20))
          results[r].stderr_text.resize(1 << 20);
      } else {
        close(fds[i].fd);
        (is_out ? out_fd[r] : err_fd[r]) = -1;
        --open_fds;
        if (out_fd[r] < 0 && err_fd[r] < 0) {
          results[r].exit_seconds = absl::ToDoubleSeconds(absl::Now() - running_at);
        }
      }
    }
  }
  for (int r = 0; r < n; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (WIFEXITED(status)) results[r].exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) {
      results[r].signal = WTERMSIG(status);
      // A killed rank cannot unlink its shared memory (fan-out buffers, signal boards).
      RemoveSharedObjectsOf(pids[r]);
    }
    std::string line = results[r].stdout_text;
    while (!line.empty() && line.back() == '\n') line.pop_back();
    if (!line.empty() && line.find('\n') == std::string::npos) {
      absl::StatusOr<json::Value> v = json::Parse(line);
      if (v.ok() && v->is_object()) {
        results[r].report = *std::move(v);
        results[r].parsed_ok = true;
      }
    }
  }
  if (watcher.joinable()) watcher.join();
  if (killed) {
    return absl::DeadlineExceededError(absl::StrCat(
        "the world did not finish within ", absl::FormatDuration(launch.limit), Describe(results)));
  }
  return results;
}

}  // namespace reshard::testing
