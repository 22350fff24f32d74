#include "tests/api/fault_harness.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace reshard::fault {
namespace {

int64_t NowNs() { return absl::ToUnixNanos(absl::Now()); }

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// State letter of /proc/<pid>/stat ('R', 'S', 'T', 'Z', ...); 0 when the process is gone.
char ProcessState(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text;
  if (pid <= 0 || !std::getline(in, text)) return 0;
  const size_t close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() ? text[close + 2] : 0;
}

// The value after `key=` in `line` (up to the next space), or "".
std::string Field(const std::string& line, const std::string& key) {
  const size_t at = line.find(" " + key + "=");
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size() + 2;
  if (key == "msg") return line.substr(begin);
  const size_t end = line.find(' ', begin);
  return line.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

void Parse(RankOutcome& r) {
  for (absl::string_view view : absl::StrSplit(r.result.stdout_text, '\n', absl::SkipEmpty())) {
    const std::string line(view);
    const std::vector<std::string> words = absl::StrSplit(line, ' ');
    if (line == "SETUP OK") r.setup_ok = true;
    if (absl::StartsWith(line, "WRONG")) r.wrong = true;
    if (absl::StartsWith(line, "DONE")) r.done = true;
    if (absl::StartsWith(line, "END ")) (void)absl::SimpleAtoi(Field(line, "at"), &r.end_at_ns);
    int step = 0;
    if (words.size() >= 3 && words[0] == "STEP" && words[2] == "OK" &&
        absl::SimpleAtoi(words[1], &step)) {
      r.verified_steps.push_back(step);
    }
    if (words.size() >= 2 && (words[1] == "FAIL" || (words.size() >= 3 && words[2] == "FAIL"))) {
      Failure f;
      f.what = words[1] == "FAIL" ? words[0] : words[0] + " " + words[1];
      if (words[1] != "FAIL") (void)absl::SimpleAtoi(words[1], &f.step);
      f.code = Field(line, "code");
      (void)absl::SimpleAtoi(Field(line, "at"), &f.at_ns);
      f.message = Field(line, "msg");
      r.failures.push_back(std::move(f));
    }
  }
  for (absl::string_view view : absl::StrSplit(r.result.stderr_tail, '\n')) {
    if (!absl::StrContains(view, "fault injection: rank")) continue;
    (void)absl::SimpleAtoi(Field(std::string(view), "at_unix_ns"), &r.fault_at_ns);
  }
}

std::string RandomToken() {
  std::random_device rd;
  return absl::StrCat(absl::Hex(rd(), absl::kZeroPad8), absl::Hex(rd(), absl::kZeroPad8),
                      absl::Hex(rd(), absl::kZeroPad8), absl::Hex(rd(), absl::kZeroPad8));
}

// A store served by a separate process (fault_peer --serve-store), so it can be killed.
class StoreProcess {
 public:
  ~StoreProcess() { Kill(); }

  absl::Status Start(const std::string& peer, const std::string& token) {
    int out[2];
    if (pipe(out) != 0) return absl::InternalError("pipe failed");
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      dup2(out[1], STDOUT_FILENO);
      close(out[0]);
      close(out[1]);
      execl(peer.c_str(), peer.c_str(), "--serve-store", token.c_str(), nullptr);
      _exit(127);
    }
    close(out[1]);
    if (pid_ < 0) {
      close(out[0]);
      return absl::InternalError("fork failed");
    }
    std::string text;
    char buf[64];
    ssize_t n;
    while (text.find('\n') == std::string::npos && (n = read(out[0], buf, sizeof(buf))) > 0) {
      text.append(buf, static_cast<size_t>(n));
    }
    close(out[0]);
    if (!absl::StartsWith(text, "STORE ") ||
        !absl::SimpleAtoi(absl::StripSuffix(text.substr(6), "\n"), &port_)) {
      return absl::InternalError(absl::StrCat("the store process printed \"", text, "\""));
    }
    return absl::OkStatus();
  }

  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  int port() const { return port_; }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

}  // namespace

std::string DefaultPeer() {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return (self.parent_path() / "fault_peer").string();
}

double Outcome::DetectionSeconds(int rank) const {
  const RankOutcome& r = ranks[static_cast<size_t>(rank)];
  if (fault_at_ns < 0 || r.failures.empty() || r.failures.front().at_ns < 0) return -1;
  return static_cast<double>(r.failures.front().at_ns - fault_at_ns) * 1e-9;
}

std::string Outcome::Describe() const {
  std::ostringstream out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const RankOutcome& r = ranks[i];
    out << "--- rank " << i << ": " << r.result.Describe()
        << (r.result.killed_by_launcher ? " (by the launcher)" : "") << "\n"
        << r.result.stdout_text << "--- stderr tail:\n"
        << r.result.stderr_tail << "\n";
  }
  if (!external_error.empty()) out << "external fault: " << external_error << "\n";
  return out.str();
}

absl::StatusOr<Outcome> RunScenario(const Scenario& s) {
  const std::string peer = s.peer.empty() ? DefaultPeer() : s.peer;
  const char* tmp = std::getenv("TMPDIR");
  std::string dir =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/reshard-fault-XXXXXX");
  if (mkdtemp(dir.data()) == nullptr) return absl::InternalError("mkdtemp failed");
  struct RemoveDir {
    std::string path;
    ~RemoveDir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } remove_dir{dir};

  launcher::LaunchOptions o;
  o.argv = {peer, "--spec", s.spec, "--events", dir};
  o.argv.insert(o.argv.end(), s.peer_args.begin(), s.peer_args.end());
  o.world_size = s.world_size;
  o.mode = s.mode;
  o.transport = s.transport;
  o.deadline = s.deadline;
  o.rank_timeout_ms = 20000;
  o.failure_grace = s.failure_grace;  // Long: every rank must end on its own.
  o.forward_stderr = false;
  o.extra_env.push_back({"UCX_WARN_UNUSED_ENV_VARS", "n"});
  if (!s.inject.empty()) o.extra_env.push_back({"RESHARD_FAULT_INJECT", s.inject});
  StoreProcess store;
  const std::string go_file = dir + "/go";
  if (s.external == Scenario::External::kKillStore) {
    if (s.mode != launcher::Mode::kLoopback) {
      return absl::InvalidArgumentError("the store process serves loopback launches only");
    }
    const std::string token = RandomToken();
    if (absl::Status st = store.Start(peer, token); !st.ok()) return st;
    o.extra_env.push_back({"RESHARD_STORE", absl::StrCat("127.0.0.1:", store.port())});
    o.extra_env.push_back({"RESHARD_STORE_TOKEN", token});
    if (s.go_after_store_kill) {
      o.argv.push_back("--go-file");
      o.argv.push_back(go_file);
    }
  }

  absl::StatusOr<std::unique_ptr<launcher::Launch>> started = launcher::Launch::Start(o);
  if (!started.ok()) return started.status();
  launcher::Launch& launch = **started;
  Outcome outcome;
  std::atomic<bool> finished{false};
  std::atomic<int64_t> external_ns{-1}, stopped_ns{-1};
  std::string external_error;
  bool external_applied = false;

  auto rank_failed = [&](int r) {
    const char state = ProcessState(launch.pid(r));
    return state == 0 || state == 'Z' || Exists(absl::StrCat(dir, "/failed.", r));
  };
  auto survivors_failed = [&]() {
    for (int r = 0; r < s.world_size; ++r) {
      if (r != s.faulted_rank && !rank_failed(r)) return false;
    }
    return true;
  };
  auto all_ready = [&]() {
    for (int r = 0; r < s.world_size; ++r) {
      if (!Exists(absl::StrCat(dir, "/ready.", r))) return false;
    }
    return true;
  };
  // Applies the external fault once every rank is ready, and handles a stopped rank.
  std::thread helper([&]() {
    bool stop_handled = false;
    while (!finished.load()) {
      if (s.external != Scenario::External::kNone && !external_applied && all_ready()) {
        external_applied = true;
        switch (s.external) {
          case Scenario::External::kKillRank:
          case Scenario::External::kStopRank: {
            absl::Status st = launch.Kill(
                s.faulted_rank, s.external == Scenario::External::kKillRank ? SIGKILL : SIGSTOP);
            if (!st.ok()) external_error = st.ToString();
            break;
          }
          case Scenario::External::kKillStore:
            store.Kill();
            if (s.go_after_store_kill) {
              std::ofstream(go_file).flush();
            }
            break;
          case Scenario::External::kLinkDown: {
            const std::string cmd = absl::StrCat(
                "ip netns exec ", launch.namespace_of(s.faulted_rank), " ip link set veth0 down");
            if (launch.namespace_of(s.faulted_rank).empty() || std::system(cmd.c_str()) != 0) {
              external_error = absl::StrCat("\"", cmd, "\" failed");
            }
            break;
          }
          case Scenario::External::kNone:
            break;
        }
        external_ns.store(NowNs());
      }
      const pid_t faulted = s.faulted_rank >= 0 ? launch.pid(s.faulted_rank) : -1;
      if (stopped_ns.load() < 0 && ProcessState(faulted) == 'T') stopped_ns.store(NowNs());
      if (stopped_ns.load() >= 0 && !stop_handled) {
        switch (s.stopped) {
          case Scenario::Stopped::kKillAfterSurvivorsFail:
            if (survivors_failed()) {
              (void)launch.Kill(s.faulted_rank, SIGKILL);
              stop_handled = true;
            }
            break;
          case Scenario::Stopped::kResumeAfterSurvivorsFail:
            if (survivors_failed()) {
              (void)launch.Kill(s.faulted_rank, SIGCONT);
              stop_handled = true;
            }
            break;
          case Scenario::Stopped::kResumeAfterRankFails:
            if (rank_failed(s.resume_after_failure_of)) {
              (void)launch.Kill(s.faulted_rank, SIGCONT);
              stop_handled = true;
            }
            break;
          case Scenario::Stopped::kResumeAfter:
            if (NowNs() - stopped_ns.load() >= absl::ToInt64Nanoseconds(s.resume_after)) {
              (void)launch.Kill(s.faulted_rank, SIGCONT);
              stop_handled = true;
            }
            break;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  absl::StatusOr<launcher::LaunchResult> result = launch.Wait();
  finished.store(true);
  helper.join();
  if (!result.ok()) return result.status();

  outcome.launch = *result;
  outcome.external_applied = external_applied;
  outcome.external_error = external_error;
  outcome.stopped_at_ns = stopped_ns.load();
  for (const launcher::RankResult& rr : result->ranks) {
    RankOutcome r;
    r.result = rr;
    Parse(r);
    outcome.ranks.push_back(std::move(r));
  }
  if (s.external != Scenario::External::kNone) {
    outcome.fault_at_ns = external_ns.load();
  } else if (s.faulted_rank >= 0 && s.faulted_rank < static_cast<int>(outcome.ranks.size())) {
    outcome.fault_at_ns = outcome.ranks[static_cast<size_t>(s.faulted_rank)].fault_at_ns;
  }
  return outcome;
}

}  // namespace reshard::fault
