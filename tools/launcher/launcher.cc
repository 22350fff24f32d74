#include "tools/launcher/launcher.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "src/common/status.h"
#include "reshard/launch.h"

extern char** environ;

namespace reshard::launcher {
namespace {

constexpr char kNetnsDir[] = "/run/netns";
constexpr char kNsPrefix[] = "reshard-";
constexpr size_t kMaxStdout = 1 << 20;
constexpr size_t kStderrTail = 4096;
constexpr char kBridgeAddress[] = "10.251.0.1";

// Self-pipe written by the SIGINT/SIGTERM handler while Wait() runs.
std::atomic<int> g_signal_pipe_write{-1};
std::atomic<int> g_last_signal{0};

void OnSignal(int sig) {
  g_last_signal.store(sig);
  int fd = g_signal_pipe_write.load();
  if (fd >= 0) {
    char b = static_cast<char>(sig);
    ssize_t ignored = write(fd, &b, 1);
    (void)ignored;
  }
}

std::string RandomHex(int bytes) {
  std::string raw(static_cast<size_t>(bytes), '\0');
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  bool filled = false;
  if (fd >= 0) {
    filled = read(fd, raw.data(), raw.size()) == static_cast<ssize_t>(raw.size());
    close(fd);
  }
  if (!filled) {
    // Fall back to time and pid mixing; still unique per launch, not secret-grade.
    uint64_t x = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) ^
                 (static_cast<uint64_t>(getpid()) << 32);
    for (auto& c : raw) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      c = static_cast<char>(x);
    }
  }
  std::string out;
  for (unsigned char c : raw) absl::StrAppend(&out, absl::Hex(c, absl::kZeroPad2));
  return out;
}

// Full path of `name`: itself when it contains '/', else the first executable in PATH (or in
// the sbin directories, where `ip` and `tc` live but a non-login PATH may not reach).
std::string ResolveExecutable(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  std::string path = std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin";
  path += ":/usr/sbin:/sbin:/usr/local/sbin";
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    if (dir.empty()) continue;
    std::string candidate = absl::StrCat(std::string(dir), "/", name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return name;
}

// Close-on-exec pipes for a child's stdout and stderr; on failure nothing is left open.
absl::Status OpenOutputPipes(int out[2], int err[2]) {
  if (pipe2(out, O_CLOEXEC) < 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  if (pipe2(err, O_CLOEXEC) < 0) {
    const int e = errno;
    close(out[0]);
    close(out[1]);
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(e)));
  }
  return absl::OkStatus();
}

// Runs a helper command (ip, tc) without a shell; returns its stdout. The command's stderr
// becomes the error message.
absl::StatusOr<std::string> RunTool(const std::vector<std::string>& argv) {
  std::string exe = ResolveExecutable(argv[0]);
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  int out[2], err[2];
  RESHARD_RETURN_IF_ERROR(OpenOutputPipes(out, err));
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    dup2(out[1], 1);
    dup2(err[1], 2);
    execve(exe.c_str(), cargv.data(), environ);
    _exit(127);
  }
  close(out[1]);
  close(err[1]);
  std::string stdout_text, stderr_text;
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_fds = 2;
  absl::Time deadline = absl::Now() + absl::Seconds(20);
  char buf[4096];
  while (open_fds > 0 && absl::Now() < deadline) {
    if (poll(fds, 2, 200) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      ssize_t n = read(fds[i].fd, buf, sizeof(buf));
      if (n > 0) {
        (i == 0 ? stdout_text : stderr_text).append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& f : fds) {
    if (f.fd >= 0) close(f.fd);
  }
  int status = 0;
  if (open_fds > 0) kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  std::string command = absl::StrJoin(argv, " ");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    while (!stderr_text.empty() && std::isspace(static_cast<unsigned char>(stderr_text.back()))) {
      stderr_text.pop_back();
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127 && stderr_text.empty()) {
      stderr_text = "command not found";
    }
    return absl::InternalError(absl::StrCat("`", command, "` failed: ", stderr_text));
  }
  return stdout_text;
}

absl::Status Tool(const std::vector<std::string>& argv) { return RunTool(argv).status(); }

bool ProcessAlive(pid_t pid) { return kill(pid, 0) == 0 || errno == EPERM; }

// Address of rank r inside the 10.251.0.0/16 test subnet (10.251.0.1 is the bridge).
std::string RankAddress(int rank) {
  int host = rank + 2;
  return absl::StrCat("10.251.", host / 256, ".", host % 256);
}

}  // namespace

std::string RankResult::Describe() const {
  if (killed_by_launcher) return "killed by the launcher";
  if (!exited && term_signal == 0) return "did not finish";
  if (term_signal != 0) {
    return absl::StrCat("killed by signal ", term_signal, " (", strsignal(term_signal), ")");
  }
  return absl::StrCat("exit ", exit_code);
}

bool LaunchResult::ok() const {
  if (deadline_exceeded || interrupted) return false;
  for (const auto& r : ranks) {
    if (!r.ok()) return false;
  }
  return true;
}

absl::StatusOr<double> ParseTcRate(const std::string& rate) {
  size_t i = 0;
  while (i < rate.size() && (std::isdigit(static_cast<unsigned char>(rate[i])) || rate[i] == '.')) {
    ++i;
  }
  double value = 0;
  std::string unit = rate.substr(i);
  for (auto& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  struct Unit {
    const char* name;
    double bits;
  };
  static constexpr Unit kUnits[] = {
      {"bit", 1},          {"kbit", 1e3},         {"mbit", 1e6},          {"gbit", 1e9},
      {"tbit", 1e12},      {"kibit", 1024.0},     {"mibit", 1048576.0},   {"gibit", 1073741824.0},
      {"tibit", 1099511627776.0},                 {"bps", 8},             {"kbps", 8e3},
      {"mbps", 8e6},       {"gbps", 8e9},         {"tbps", 8e12},         {"kibps", 8 * 1024.0},
      {"mibps", 8 * 1048576.0},                   {"gibps", 8 * 1073741824.0},
      {"tibps", 8 * 1099511627776.0}};
  if (i == 0 || !absl::SimpleAtod(rate.substr(0, i), &value) || !(value > 0) ||
      !std::isfinite(value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rate \"", rate, "\" is not a tc rate (a positive number with a unit, e.g. 200mbit)"));
  }
  for (const Unit& u : kUnits) {
    if (unit == u.name) return value * u.bits;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "rate \"", rate, "\" has no tc unit (bit, kbit, mbit, gbit, tbit, or bps, kbps, mbps, ",
      "gbps for bytes per second)"));
}

std::vector<std::string> ListNamespaces() {
  std::vector<std::string> out;
  DIR* dir = opendir(kNetnsDir);
  if (dir == nullptr) return out;
  while (dirent* e = readdir(dir)) {
    std::string name = e->d_name;
    if (name != "." && name != "..") out.push_back(name);
  }
  closedir(dir);
  std::sort(out.begin(), out.end());
  return out;
}

bool CanUseNetns() { return geteuid() == 0; }

int SweepStaleNamespaces() {
  if (!CanUseNetns()) return 0;
  int removed = 0;
  for (const std::string& name : ListNamespaces()) {
    if (name.rfind(kNsPrefix, 0) != 0) continue;
    std::string rest = name.substr(std::strlen(kNsPrefix));
    int64_t owner = 0;
    if (!absl::SimpleAtoi(rest.substr(0, rest.find('-')), &owner) || owner <= 0) continue;
    if (owner == getpid() || ProcessAlive(static_cast<pid_t>(owner))) continue;
    if (auto pids = RunTool({"ip", "netns", "pids", name}); pids.ok()) {
      for (absl::string_view p : absl::StrSplit(*pids, '\n', absl::SkipWhitespace())) {
        int64_t pid = 0;
        if (absl::SimpleAtoi(p, &pid) && pid > 1) kill(static_cast<pid_t>(pid), SIGKILL);
      }
    }
    if (Tool({"ip", "netns", "del", name}).ok()) {
      ++removed;
      std::fprintf(stderr, "reshard launcher: removed namespace %s left by a launcher (pid %lld) "
                   "that no longer runs\n", name.c_str(), static_cast<long long>(owner));
    }
  }
  return removed;
}

Launch::Launch(LaunchOptions options) : options_(std::move(options)) {}

Launch::~Launch() { Cleanup(); }

pid_t Launch::pid(int rank) const {
  return rank >= 0 && rank < static_cast<int>(procs_.size()) ? procs_[rank].pid : -1;
}

std::string Launch::namespace_of(int rank) const {
  return rank >= 0 && rank < static_cast<int>(rank_ns_.size()) ? rank_ns_[rank] : std::string();
}

absl::StatusOr<std::unique_ptr<Launch>> Launch::Start(LaunchOptions options) {
  if (options.argv.empty() || options.argv[0].empty()) {
    return absl::InvalidArgumentError("launch needs a command to run for every rank");
  }
  if (options.world_size < 1 || options.world_size > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("world size ", options.world_size, " is out of range (1..4096)"));
  }
  if (options.transport != "sm" && options.transport != "tcp") {
    return absl::InvalidArgumentError(
        absl::StrCat("transport \"", options.transport, "\" is neither sm nor tcp"));
  }
  if (!options.rate.empty()) {
    RESHARD_RETURN_IF_ERROR(ParseTcRate(options.rate).status());
    if (options.mode != Mode::kNetns) {
      return absl::InvalidArgumentError("a NIC rate needs network-namespace mode");
    }
  }
  if (options.mtu < 1280 || options.mtu > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("MTU ", options.mtu, " is out of range (1280..65535 bytes)"));
  }
  if (options.rank_timeout_ms <= 0) {
    return absl::InvalidArgumentError("rank timeout must be positive");
  }
  std::unique_ptr<Launch> launch(new Launch(std::move(options)));
  launch->start_time_ = absl::Now();
  // Shared memory that ranks of an earlier, killed launch left behind.
  RemoveSharedMemoryOfDeadProcesses();
  launch->prefix_ = absl::StrCat(kNsPrefix, getpid(), "-", RandomHex(3));
  launch->token_ = RandomHex(16);
  launch->mode_ = launch->options_.mode;
  absl::Status s;
  if (launch->mode_ == Mode::kNetns) {
    if (!CanUseNetns()) {
      launch->fallback_reason_ =
          "network namespaces need root; running loopback processes over tcp instead";
    } else {
      SweepStaleNamespaces();
      s = launch->SetUpNetns();
      if (!s.ok() && launch->rank_ns_.empty() && launch->bridge_ns_.empty()) {
        // Could not even create the first namespace: this machine cannot do it.
        launch->fallback_reason_ =
            absl::StrCat("cannot create network namespaces (", std::string(s.message()),
                         "); running loopback processes over tcp instead");
        s = absl::OkStatus();
      }
    }
    if (!launch->fallback_reason_.empty()) {
      launch->mode_ = Mode::kLoopback;
      launch->options_.transport = "tcp";
      launch->options_.rate.clear();
      std::fprintf(stderr, "reshard launcher: %s\n", launch->fallback_reason_.c_str());
    }
  }
  if (s.ok()) s = launch->StartStore();
  if (s.ok()) s = launch->SpawnRanks();
  if (!s.ok()) {
    launch->Cleanup();
    return s;
  }
  return launch;
}

absl::Status Launch::SetUpNetns() {
  const std::string br = absl::StrCat(prefix_, "-br");
  RESHARD_RETURN_IF_ERROR(Tool({"ip", "netns", "add", br}));
  bridge_ns_ = br;
  RESHARD_RETURN_IF_ERROR(Tool({"ip", "-n", br, "link", "set", "lo", "up"}));
  RESHARD_RETURN_IF_ERROR(Tool({"ip", "-n", br, "link", "add", "br0", "type", "bridge"}));
  const std::string mtu = absl::StrCat(options_.mtu);
  RESHARD_RETURN_IF_ERROR(Tool({"ip", "-n", br, "link", "set", "br0", "mtu", mtu}));
  RESHARD_RETURN_IF_ERROR(
      Tool({"ip", "-n", br, "addr", "add", absl::StrCat(kBridgeAddress, "/16"), "dev", "br0"}));
  RESHARD_RETURN_IF_ERROR(Tool({"ip", "-n", br, "link", "set", "br0", "up"}));
  std::vector<std::string> tbf;
  if (!options_.rate.empty()) {
    RESHARD_ASSIGN_OR_RETURN(double bits, ParseTcRate(options_.rate));
    // A bucket of ~2 ms of traffic (at least 64 KiB so a TSO segment passes in one piece) keeps
    // the shaped rate close to the nominal one; 100 ms of queue avoids drops under bursts.
    int64_t burst = std::max<int64_t>(64 * 1024, static_cast<int64_t>(bits / 8 * 0.002));
    tbf = {"root", "tbf", "rate", options_.rate, "burst", absl::StrCat(burst),
           "latency", "100ms"};
  }
  for (int r = 0; r < options_.world_size; ++r) {
    const std::string ns = absl::StrCat(prefix_, "-r", r);
    RESHARD_RETURN_IF_ERROR(Tool({"ip", "netns", "add", ns}));
    rank_ns_.push_back(ns);
    const std::string port = absl::StrCat("b", r);
    RESHARD_RETURN_IF_ERROR(Tool({"ip", "-n", br, "link", "add", port, "type", "veth", "peer",
                                  "name", "veth0", "netns", ns}));
    RESHARD_RETURN_IF_ERROR(Tool({"ip", "-n", br, "link", "set", port, "mtu", mtu}));
    RESHARD_RETURN_IF_ERROR(Tool({"ip", "-n", ns, "link", "set", "veth0", "mtu", mtu}));
    RESHARD_RETURN_IF_ERROR(Tool({"ip", "-n", br, "link", "set", port, "master", "br0"}));
    RESHARD_RETURN_IF_ERROR(Tool({"ip", "-n", br, "link", "set", port, "up"}));
    RESHARD_RETURN_IF_ERROR(Tool({"ip", "-n", ns, "link", "set", "lo", "up"}));
    RESHARD_RETURN_IF_ERROR(
        Tool({"ip", "-n", ns, "addr", "add", RankAddress(r) + "/16", "dev", "veth0"}));
    RESHARD_RETURN_IF_ERROR(Tool({"ip", "-n", ns, "link", "set", "veth0", "up"}));
    // An RDMA NIC has no congestion window to rebuild after the idle gap between two refits;
    // without this every refit would restart TCP slow start through the shaped link.
    RESHARD_RETURN_IF_ERROR(Tool({"ip", "netns", "exec", ns, "sysctl", "-qw",
                                  "net.ipv4.tcp_slow_start_after_idle=0"}));
    if (!tbf.empty()) {
      // Egress of veth0 inside the rank: what the rank sends. Egress of the bridge port: what
      // it receives. Together, one full-duplex NIC per rank.
      std::vector<std::string> out = {"tc", "-n", ns, "qdisc", "add", "dev", "veth0"};
      out.insert(out.end(), tbf.begin(), tbf.end());
      RESHARD_RETURN_IF_ERROR(Tool(out));
      std::vector<std::string> in = {"tc", "-n", br, "qdisc", "add", "dev", port};
      in.insert(in.end(), tbf.begin(), tbf.end());
      RESHARD_RETURN_IF_ERROR(Tool(in));
    }
  }
  return absl::OkStatus();
}

absl::Status Launch::StartStore() {
  if (mode_ == Mode::kLoopback) {
    store_host_ = "127.0.0.1";
    RESHARD_ASSIGN_OR_RETURN(store_, StoreServer::Start(store_host_, 0, token_));
  } else {
    // The listening socket must live in the bridge namespace, the only address every rank
    // namespace can reach. A thread enters it just to create the socket.
    store_host_ = kBridgeAddress;
    absl::StatusOr<std::unique_ptr<StoreServer>> server =
        absl::InternalError("store thread did not run");
    std::string ns_path = absl::StrCat(kNetnsDir, "/", bridge_ns_);
    std::thread t([&] {
      int fd = open(ns_path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0 || setns(fd, CLONE_NEWNET) < 0) {
        server = absl::InternalError(
            absl::StrCat("cannot enter namespace ", bridge_ns_, ": ", std::strerror(errno)));
        if (fd >= 0) close(fd);
        return;
      }
      close(fd);
      server = StoreServer::Start(store_host_, 0, token_);
    });
    t.join();
    RESHARD_ASSIGN_OR_RETURN(store_, std::move(server));
  }
  store_address_ = absl::StrCat(store_host_, ":", store_->port());
  return absl::OkStatus();
}

absl::Status Launch::SpawnRanks() {
  if (mode_ == Mode::kNetns) {
    ucx_tls_ = "tcp";
  } else {
    ucx_tls_ = options_.transport == "sm" ? "sm,self" : "tcp";
  }
  for (const auto& [k, v] : options_.extra_env) {
    if (k == "UCX_TLS") ucx_tls_ = v;
  }
  std::vector<std::string> argv;
  if (mode_ == Mode::kNetns) argv = {ResolveExecutable("ip"), "netns", "exec", ""};
  size_t ns_slot = argv.size() - (argv.empty() ? 0 : 1);
  for (size_t i = 0; i < options_.argv.size(); ++i) {
    argv.push_back(i == 0 && mode_ == Mode::kLoopback ? ResolveExecutable(options_.argv[0])
                                                      : options_.argv[i]);
  }
  procs_.resize(static_cast<size_t>(options_.world_size));
  const pid_t parent = getpid();
  for (int r = 0; r < options_.world_size; ++r) {
    std::vector<std::pair<std::string, std::string>> vars = {
        {"RESHARD_RANK", absl::StrCat(r)},
        {"RESHARD_WORLD_SIZE", absl::StrCat(options_.world_size)},
        {"RESHARD_LOCAL_RANK", absl::StrCat(r)},
        {"RESHARD_STORE", store_address_},
        {"RESHARD_STORE_TOKEN", token_},
        {"RESHARD_TIMEOUT_MS", absl::StrCat(options_.rank_timeout_ms)},
        {"UCX_TLS", ucx_tls_},
        {"UCX_NET_DEVICES", mode_ == Mode::kNetns ? "veth0" : "lo"},
        {"UCX_WARN_UNUSED_ENV_VARS", "n"},
    };
    if (mode_ == Mode::kNetns) vars.push_back({"RESHARD_NETNS", rank_ns_[r]});
    for (const auto& kv : options_.extra_env) {
      auto it = std::find_if(vars.begin(), vars.end(),
                             [&](const auto& v) { return v.first == kv.first; });
      if (it != vars.end()) {
        it->second = kv.second;
      } else {
        vars.push_back(kv);
      }
    }
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      std::string entry = *e;
      std::string name = entry.substr(0, entry.find('='));
      bool overridden = std::any_of(vars.begin(), vars.end(),
                                    [&](const auto& v) { return v.first == name; });
      if (!overridden) env.push_back(entry);
    }
    for (const auto& [k, v] : vars) env.push_back(absl::StrCat(k, "=", v));
    std::vector<std::string> rank_argv = argv;
    if (mode_ == Mode::kNetns) rank_argv[ns_slot] = rank_ns_[r];
    std::vector<char*> cargv, cenv;
    for (auto& a : rank_argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    for (auto& e : env) cenv.push_back(e.data());
    cenv.push_back(nullptr);

    int out[2], err[2];
    RESHARD_RETURN_IF_ERROR(OpenOutputPipes(out, err));
    pid_t pid = fork();
    if (pid < 0) {
      close(out[0]);
      close(out[1]);
      close(err[0]);
      close(err[1]);
      return absl::InternalError(absl::StrCat("fork for rank ", r, ": ", std::strerror(errno)));
    }
    if (pid == 0) {
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(126);
      dup2(out[1], 1);
      dup2(err[1], 2);
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      signal(SIGPIPE, SIG_DFL);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      execve(cargv[0], cargv.data(), cenv.data());
      const char* msg = "reshard launcher: cannot execute the rank program: ";
      ssize_t ignored = write(2, msg, std::strlen(msg));
      ignored = write(2, cargv[mode_ == Mode::kNetns ? ns_slot + 1 : 0],
                      std::strlen(cargv[mode_ == Mode::kNetns ? ns_slot + 1 : 0]));
      ignored = write(2, "\n", 1);
      (void)ignored;
      _exit(127);
    }
    setpgid(pid, pid);
    close(out[1]);
    close(err[1]);
    fcntl(out[0], F_SETFL, O_NONBLOCK);
    fcntl(err[0], F_SETFL, O_NONBLOCK);
    Proc& p = procs_[static_cast<size_t>(r)];
    p.pid = pid;
    p.out_fd = out[0];
    p.err_fd = err[0];
    p.started = absl::Now();
    p.result.rank = r;
    p.result.pid = pid;
  }
  return absl::OkStatus();
}

absl::Status Launch::Kill(int rank, int signal) {
  std::lock_guard<std::mutex> lock(reap_mu_);
  if (rank < 0 || rank >= static_cast<int>(procs_.size()) || procs_[rank].pid <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("no rank ", rank, " in this launch"));
  }
  if (procs_[rank].result.exited || procs_[rank].result.term_signal != 0) {
    return absl::FailedPreconditionError(absl::StrCat("rank ", rank, " has already ended"));
  }
  if (kill(-procs_[rank].pid, signal) < 0 && kill(procs_[rank].pid, signal) < 0) {
    return absl::InternalError(absl::StrCat("kill rank ", rank, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

void Launch::KillAll(int signal) {
  for (Proc& p : procs_) {
    if (p.pid > 0 && !p.result.exited && p.result.term_signal == 0) {
      kill(-p.pid, signal);
      kill(p.pid, signal);
    }
  }
}

absl::StatusOr<LaunchResult> Launch::Wait() {
  LaunchResult result;
  result.mode = mode_;
  result.fallback_reason = fallback_reason_;
  result.ucx_tls = ucx_tls_;

  int sig_pipe[2] = {-1, -1};
  struct sigaction old_int {}, old_term {};
  if (options_.handle_signals && pipe2(sig_pipe, O_CLOEXEC | O_NONBLOCK) == 0) {
    g_last_signal.store(0);
    g_signal_pipe_write.store(sig_pipe[1]);
    struct sigaction sa {};
    sa.sa_handler = OnSignal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
  }

  auto forward = [&](Proc& p, const char* data, size_t n) {
    p.result.stderr_tail.append(data, n);
    if (p.result.stderr_tail.size() > kStderrTail) {
      p.result.stderr_tail.erase(0, p.result.stderr_tail.size() - kStderrTail);
    }
    if (!options_.forward_stderr) return;
    p.err_line.append(data, n);
    size_t nl;
    while ((nl = p.err_line.find('\n')) != std::string::npos) {
      std::fprintf(stderr, "[rank %d] %s\n", p.result.rank, p.err_line.substr(0, nl).c_str());
      p.err_line.erase(0, nl + 1);
    }
  };
  // Reads what is available; closes the fd at EOF.
  auto drain = [&](Proc& p, int* fd, bool is_stdout) {
    char buf[65536];
    while (*fd >= 0) {
      ssize_t n = read(*fd, buf, sizeof(buf));
      if (n > 0) {
        if (is_stdout) {
          size_t room = kMaxStdout - std::min(kMaxStdout, p.result.stdout_text.size());
          p.result.stdout_text.append(buf, std::min(room, static_cast<size_t>(n)));
        } else {
          forward(p, buf, static_cast<size_t>(n));
        }
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      close(*fd);
      *fd = -1;
    }
  };

  const absl::Time deadline = start_time_ + options_.deadline;
  absl::Time failure_deadline = absl::InfiniteFuture();
  absl::Time kill_at = absl::InfiniteFuture();  // SIGKILL after a SIGTERM
  bool terminating = false;
  auto terminate = [&](bool hard) {
    if (hard) {
      KillAll(SIGKILL);
      kill_at = absl::InfiniteFuture();
    } else if (!terminating) {
      KillAll(SIGTERM);
      kill_at = absl::Now() + absl::Seconds(2);
    }
    terminating = true;
    for (Proc& p : procs_) {
      if (!p.result.exited && p.result.term_signal == 0) p.result.killed_by_launcher = true;
    }
  };

  std::vector<pollfd> fds;
  while (true) {
    int running = 0;
    for (Proc& p : procs_) {
      if (p.pid > 0 && !p.result.exited && p.result.term_signal == 0) ++running;
    }
    if (running == 0) break;
    fds.clear();
    if (sig_pipe[0] >= 0) fds.push_back({sig_pipe[0], POLLIN, 0});
    for (Proc& p : procs_) {
      if (p.out_fd >= 0) fds.push_back({p.out_fd, POLLIN, 0});
      if (p.err_fd >= 0) fds.push_back({p.err_fd, POLLIN, 0});
    }
    // Child exits are found by waitpid; a short timeout bounds how late we notice one.
    poll(fds.data(), fds.size(), 10);
    for (Proc& p : procs_) {
      drain(p, &p.out_fd, true);
      drain(p, &p.err_fd, false);
    }
    absl::Time now = absl::Now();
    for (Proc& p : procs_) {
      if (p.pid <= 0 || p.result.exited || p.result.term_signal != 0) continue;
      std::lock_guard<std::mutex> reaping(reap_mu_);
      int status = 0;
      pid_t got = waitpid(p.pid, &status, WNOHANG);
      if (got != p.pid) continue;
      p.result.elapsed = now - p.started;
      if (WIFEXITED(status)) {
        p.result.exited = true;
        p.result.exit_code = WEXITSTATUS(status);
      } else if (WIFSIGNALED(status)) {
        p.result.term_signal = WTERMSIG(status);
      }
      bool failed = !(p.result.exited && p.result.exit_code == 0);
      if (failed && !p.result.killed_by_launcher && result.first_failed_rank < 0) {
        result.first_failed_rank = p.result.rank;
        failure_deadline = now + options_.failure_grace;
      }
    }
    if (sig_pipe[0] >= 0) {
      char b;
      if (read(sig_pipe[0], &b, 1) == 1 && !result.interrupted) {
        result.interrupted = true;
        std::fprintf(stderr, "reshard launcher: %s received, stopping every rank\n",
                     strsignal(g_last_signal.load()));
        terminate(/*hard=*/false);
      }
    }
    if (now >= deadline && !result.deadline_exceeded) {
      result.deadline_exceeded = true;
      std::fprintf(stderr, "reshard launcher: the launch ran past its deadline of %s; "
                   "stopping every rank\n", absl::FormatDuration(options_.deadline).c_str());
      terminate(/*hard=*/false);
    }
    if (now >= failure_deadline) {
      failure_deadline = absl::InfiniteFuture();
      std::fprintf(stderr, "reshard launcher: rank %d failed and the other ranks did not exit "
                   "within %s; killing them\n", result.first_failed_rank,
                   absl::FormatDuration(options_.failure_grace).c_str());
      terminate(/*hard=*/false);
    }
    if (now >= kill_at) terminate(/*hard=*/true);
  }
  // Everything has exited; pick up what is left in the pipes (grandchildren may keep a pipe
  // open, so read only what is there).
  for (Proc& p : procs_) {
    drain(p, &p.out_fd, true);
    drain(p, &p.err_fd, false);
    if (!p.err_line.empty() && options_.forward_stderr) {
      std::fprintf(stderr, "[rank %d] %s\n", p.result.rank, p.err_line.c_str());
      p.err_line.clear();
    }
    size_t end = p.result.stdout_text.size();
    while (end > 0) {
      size_t begin = p.result.stdout_text.rfind('\n', end - 1);
      begin = begin == std::string::npos ? 0 : begin + 1;
      std::string line = p.result.stdout_text.substr(begin, end - begin);
      while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.pop_back();
      if (!line.empty() && line[0] == '{') {
        p.result.json_line = line;
        break;
      }
      end = begin == 0 ? 0 : begin - 1;
    }
    result.ranks.push_back(p.result);
  }
  result.elapsed = absl::Now() - start_time_;

  if (sig_pipe[0] >= 0) {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    g_signal_pipe_write.store(-1);
    close(sig_pipe[0]);
    close(sig_pipe[1]);
  }
  Cleanup();
  return result;
}

void Launch::Cleanup() {
  if (cleaned_up_) return;
  cleaned_up_ = true;
  KillAll(SIGKILL);
  for (Proc& p : procs_) {
    std::lock_guard<std::mutex> reaping(reap_mu_);
    if (p.pid > 0 && !p.result.exited && p.result.term_signal == 0) {
      int status = 0;
      if (waitpid(p.pid, &status, 0) == p.pid) {
        p.result.killed_by_launcher = true;
        if (WIFSIGNALED(status)) p.result.term_signal = WTERMSIG(status);
      }
    }
    // A rank killed by a signal could not unlink its shared-memory buffers and signal boards.
    if (p.pid > 0 && p.result.term_signal != 0) RemoveSharedMemoryOf(p.pid);
    if (p.out_fd >= 0) close(p.out_fd);
    if (p.err_fd >= 0) close(p.err_fd);
    p.out_fd = p.err_fd = -1;
  }
  store_.reset();
  std::vector<std::string> all = rank_ns_;
  if (!bridge_ns_.empty()) all.push_back(bridge_ns_);
  for (const std::string& ns : all) {
    // Deleting a namespace removes its veth end (and so the pair), its bridge and its qdiscs.
    absl::Status s = Tool({"ip", "netns", "del", ns});
    if (!s.ok()) {
      std::fprintf(stderr, "reshard launcher: could not remove namespace %s: %s\n", ns.c_str(),
                   std::string(s.message()).c_str());
    }
  }
  rank_ns_.clear();
  bridge_ns_.clear();
}

absl::StatusOr<LaunchResult> Run(LaunchOptions options) {
  RESHARD_ASSIGN_OR_RETURN(std::unique_ptr<Launch> launch, Launch::Start(std::move(options)));
  return launch->Wait();
}

}  // namespace reshard::launcher
