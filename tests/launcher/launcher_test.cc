// Tests for the local launcher: loopback processes (label multiproc) and one network namespace
// per rank with emulated NICs (label netns; skipped when not root).
#include "tools/launcher/launcher.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "src/common/json.h"

namespace reshard::launcher {
namespace {

const std::string kProbe = std::string(RESHARD_BINARY_DIR) + "/bin/launcher_probe";

LaunchOptions ProbeOptions(int world, std::vector<std::string> args = {}) {
  LaunchOptions o;
  o.argv = {kProbe};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.world_size = world;
  o.deadline = absl::Seconds(60);
  o.rank_timeout_ms = 20000;
  o.forward_stderr = false;
  return o;
}

json::Value ParseLine(const RankResult& r) {
  auto v = json::Parse(r.json_line);
  EXPECT_TRUE(v.ok()) << "rank " << r.rank << " printed \"" << r.json_line << "\": " << v.status();
  return v.ok() ? *v : json::Value();
}

std::string Field(const json::Value& v, const char* key) {
  const json::Value* f = v.Find(key);
  return f && f->is_string() ? f->as_string() : "";
}

bool NoNamespaceWithPrefix(const std::string& prefix) {
  for (const auto& ns : ListNamespaces()) {
    if (absl::StartsWith(ns, prefix)) return false;
  }
  return true;
}

std::string Tc(const std::vector<std::string>& args) {
  std::string cmd = "tc";
  for (const auto& a : args) absl::StrAppend(&cmd, " ", a);
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) return out;
  char buf[512];
  while (fgets(buf, sizeof(buf), f)) out += buf;
  pclose(f);
  return out;
}

TEST(LauncherTest, LoopbackSmRanksGetIdentityStoreAndTransport) {
  auto result = launcher::Run(ProbeOptions(4));
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->ok());
  EXPECT_EQ(result->mode, Mode::kLoopback);
  EXPECT_EQ(result->ucx_tls, "sm,self");
  ASSERT_EQ(result->ranks.size(), 4u);
  std::set<std::string> tokens;
  for (const RankResult& r : result->ranks) {
    json::Value v = ParseLine(r);
    EXPECT_EQ(v.Find("rank")->as_int(), r.rank);
    EXPECT_EQ(v.Find("world")->as_int(), 4);
    EXPECT_EQ(Field(v, "exchange"), "ok");
    EXPECT_EQ(Field(v, "ucx_tls"), "sm,self");
    EXPECT_EQ(Field(v, "timeout_ms"), "20000");
    EXPECT_EQ(Field(v, "local_rank"), absl::StrCat(r.rank));
    EXPECT_TRUE(absl::StartsWith(Field(v, "store"), "127.0.0.1:"));
    EXPECT_GE(Field(v, "token").size(), 32u);
    tokens.insert(Field(v, "token"));
    EXPECT_TRUE(absl::StrContains(r.stdout_text, "starting up"));
    EXPECT_TRUE(absl::StrContains(r.stderr_tail, "done"));
  }
  EXPECT_EQ(tokens.size(), 1u);
  // A new launch gets a new token.
  auto again = launcher::Run(ProbeOptions(1));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(tokens.count(Field(ParseLine(again->ranks[0]), "token")), 0u);
}

TEST(LauncherTest, LoopbackTcpUsesTheLoopbackDevice) {
  LaunchOptions o = ProbeOptions(2);
  o.transport = "tcp";
  auto result = launcher::Run(o);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->ok());
  for (const RankResult& r : result->ranks) {
    json::Value v = ParseLine(r);
    EXPECT_EQ(Field(v, "ucx_tls"), "tcp");
    EXPECT_EQ(Field(v, "ucx_net_devices"), "lo");
  }
}

TEST(LauncherTest, FailingRankEndsTheLaunchAndTheOthersAreKilledAfterTheGrace) {
  LaunchOptions o = ProbeOptions(3, {"--fail-rank", "1", "--hang"});
  o.failure_grace = absl::Milliseconds(500);
  absl::Time start = absl::Now();
  auto result = launcher::Run(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->ok());
  EXPECT_EQ(result->first_failed_rank, 1);
  EXPECT_EQ(result->ranks[1].exit_code, 3);
  EXPECT_FALSE(result->ranks[1].killed_by_launcher);
  EXPECT_TRUE(result->ranks[0].killed_by_launcher);
  EXPECT_TRUE(result->ranks[2].killed_by_launcher);
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  for (const RankResult& r : result->ranks) {
    EXPECT_FALSE(r.json_line.empty());
    EXPECT_NE(kill(r.pid, 0), 0) << "rank " << r.rank << " still runs";
  }
}

TEST(LauncherTest, DeadlineKillsEveryRank) {
  LaunchOptions o = ProbeOptions(2, {"--hang"});
  o.deadline = absl::Seconds(1);
  auto result = launcher::Run(o);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->deadline_exceeded);
  EXPECT_FALSE(result->ok());
  for (const RankResult& r : result->ranks) {
    EXPECT_TRUE(r.killed_by_launcher);
    EXPECT_NE(kill(r.pid, 0), 0);
  }
}

TEST(LauncherTest, KillingOneRankIsReportedAsItsSignal) {
  LaunchOptions o = ProbeOptions(3, {"--hang-rank", "2"});
  o.failure_grace = absl::Seconds(5);
  auto launch = Launch::Start(o);
  ASSERT_TRUE(launch.ok()) << launch.status();
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE((*launch)->Kill(2, SIGKILL).ok());
  auto result = (*launch)->Wait();
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->first_failed_rank, 2);
  EXPECT_EQ(result->ranks[2].term_signal, SIGKILL);
  EXPECT_TRUE(result->ranks[0].ok());
  EXPECT_TRUE(result->ranks[1].ok());
  EXPECT_EQ(result->ranks[2].Describe(), "killed by signal 9 (Killed)");
}

// Kill() from another thread while Wait() runs, as the fault-injection harness does, until the
// rank has been reaped. ThreadSanitizer (scripts/sanitizers.sh) found Kill() reading a rank's
// state while Wait() reaped it.
TEST(LauncherTest, KillFromAnotherThreadWhileWaitRuns) {
  LaunchOptions o = ProbeOptions(3, {"--hang-rank", "2"});
  o.failure_grace = absl::Seconds(5);
  auto launch = Launch::Start(o);
  ASSERT_TRUE(launch.ok()) << launch.status();
  std::thread killer([&] {
    absl::SleepFor(absl::Milliseconds(300));
    absl::Status first = (*launch)->Kill(2, SIGKILL);
    EXPECT_TRUE(first.ok()) << first;
    // Until Wait() has reaped the rank; after that Kill() says it has already ended.
    absl::Status s;
    while ((s = (*launch)->Kill(2, SIGKILL)).ok()) absl::SleepFor(absl::Microseconds(100));
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  });
  auto result = (*launch)->Wait();
  killer.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->ranks[2].term_signal, SIGKILL);
  EXPECT_TRUE(result->ranks[0].ok());
  EXPECT_TRUE(result->ranks[1].ok());
}

TEST(LauncherTest, SigtermStopsTheLaunch) {
  LaunchOptions o = ProbeOptions(2, {"--hang"});
  o.handle_signals = true;
  auto launch = Launch::Start(o);
  ASSERT_TRUE(launch.ok()) << launch.status();
  std::thread signaller([] {
    absl::SleepFor(absl::Milliseconds(300));
    kill(getpid(), SIGTERM);
  });
  auto result = (*launch)->Wait();
  signaller.join();
  ASSERT_TRUE(result.ok());
  EXPECT_TRUE(result->interrupted);
  for (const RankResult& r : result->ranks) EXPECT_NE(kill(r.pid, 0), 0);
}

TEST(LauncherTest, MissingProgramFailsEveryRankClearly) {
  LaunchOptions o = ProbeOptions(2);
  o.argv = {"/nonexistent/reshard-rank"};
  o.forward_stderr = false;
  auto result = launcher::Run(o);
  ASSERT_TRUE(result.ok());
  EXPECT_FALSE(result->ok());
  EXPECT_EQ(result->ranks[0].exit_code, 127);
  EXPECT_TRUE(absl::StrContains(result->ranks[0].stderr_tail, "cannot execute"));
}

TEST(LauncherTest, RejectsBadOptions) {
  LaunchOptions o = ProbeOptions(0);
  EXPECT_TRUE(absl::IsInvalidArgument(Launch::Start(o).status()));
  o = ProbeOptions(2);
  o.transport = "ib";
  EXPECT_TRUE(absl::IsInvalidArgument(Launch::Start(o).status()));
  o = ProbeOptions(2);
  o.rate = "200mbit";  // rate without netns
  EXPECT_TRUE(absl::IsInvalidArgument(Launch::Start(o).status()));
  o.mode = Mode::kNetns;
  o.rate = "fast";
  EXPECT_TRUE(absl::IsInvalidArgument(Launch::Start(o).status()));
}

TEST(LauncherTest, ParsesTcRates) {
  EXPECT_DOUBLE_EQ(*ParseTcRate("200mbit"), 200e6);
  EXPECT_DOUBLE_EQ(*ParseTcRate("1gbit"), 1e9);
  EXPECT_DOUBLE_EQ(*ParseTcRate("1.5Gbit"), 1.5e9);
  EXPECT_DOUBLE_EQ(*ParseTcRate("100mbps"), 800e6);
  EXPECT_DOUBLE_EQ(*ParseTcRate("1mibit"), 1048576.0);
  EXPECT_FALSE(ParseTcRate("200").ok());
  EXPECT_FALSE(ParseTcRate("mbit").ok());
  EXPECT_FALSE(ParseTcRate("0mbit").ok());
  EXPECT_FALSE(ParseTcRate("200 furlongs").ok());
}

TEST(LauncherTest, NetnsFallsBackToLoopbackWithoutRoot) {
  // A child that drops root must still run the launch, over loopback tcp, and say why.
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) _exit(10);
    LaunchOptions o = ProbeOptions(2);
    o.mode = Mode::kNetns;
    auto result = launcher::Run(o);
    if (!result.ok()) _exit(11);
    if (result->mode != Mode::kLoopback || result->fallback_reason.empty()) _exit(12);
    if (result->ucx_tls != "tcp") _exit(13);
    if (!result->ok()) _exit(14);
    _exit(0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 14) {
    GTEST_SKIP() << "the unprivileged user cannot run the probe from this build directory";
  }
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

class NetnsLauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CanUseNetns()) GTEST_SKIP() << "network namespaces need root";
  }
};

TEST_F(NetnsLauncherTest, EveryRankHasItsOwnNamespaceAndReachesTheStore) {
  LaunchOptions o = ProbeOptions(3);
  o.mode = Mode::kNetns;
  auto launch = Launch::Start(o);
  ASSERT_TRUE(launch.ok()) << launch.status();
  ASSERT_EQ((*launch)->mode(), Mode::kNetns);
  const std::string prefix = (*launch)->name_prefix();
  EXPECT_FALSE(NoNamespaceWithPrefix(prefix));
  auto result = (*launch)->Wait();
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(result->ok());
  EXPECT_EQ(result->ucx_tls, "tcp");
  char own_ns[256] = {0};
  ASSERT_GT(readlink("/proc/self/ns/net", own_ns, sizeof(own_ns) - 1), 0);
  std::set<std::string> namespaces;
  for (const RankResult& r : result->ranks) {
    json::Value v = ParseLine(r);
    EXPECT_EQ(Field(v, "exchange"), "ok");
    EXPECT_EQ(Field(v, "ucx_tls"), "tcp");
    EXPECT_EQ(Field(v, "ucx_net_devices"), "veth0");
    EXPECT_TRUE(absl::StartsWith(Field(v, "store"), "10.251.0.1:"));
    EXPECT_TRUE(absl::StrContains(Field(v, "addrs"), absl::StrCat("veth0=10.251.0.", r.rank + 2)))
        << Field(v, "addrs");
    EXPECT_NE(Field(v, "netns"), own_ns);
    EXPECT_EQ(Field(v, "slow_start_after_idle"), "0");
    namespaces.insert(Field(v, "netns"));
  }
  EXPECT_EQ(namespaces.size(), 3u);
  EXPECT_TRUE(NoNamespaceWithPrefix(prefix));
}

// Names of the links in the root namespace.
std::string RootLinks() {
  std::string out;
  FILE* f = popen("ip -o link show | awk -F': ' '{print $2}' | sort", "r");
  if (!f) return out;
  char buf[512];
  while (fgets(buf, sizeof(buf), f)) out += buf;
  pclose(f);
  return out;
}

TEST_F(NetnsLauncherTest, RateIsAppliedInBothDirectionsAndEverythingIsRemoved) {
  const std::string root_links = RootLinks();
  LaunchOptions o = ProbeOptions(2, {"--hang"});
  o.mode = Mode::kNetns;
  o.rate = "200mbit";
  o.failure_grace = absl::Milliseconds(300);
  auto launch = Launch::Start(o);
  ASSERT_TRUE(launch.ok()) << launch.status();
  const std::string prefix = (*launch)->name_prefix();
  EXPECT_EQ(RootLinks(), root_links) << "the launch configured links in the root namespace";
  for (int r = 0; r < 2; ++r) {
    std::string out = Tc({"-n", (*launch)->namespace_of(r), "qdisc", "show", "dev", "veth0"});
    EXPECT_TRUE(absl::StrContains(out, "tbf")) << out;
    EXPECT_TRUE(absl::StrContains(out, "rate 200Mbit")) << out;
    std::string in = Tc({"-n", prefix + "-br", "qdisc", "show", "dev", absl::StrCat("b", r)});
    EXPECT_TRUE(absl::StrContains(in, "rate 200Mbit")) << in;
  }
  ASSERT_TRUE((*launch)->Kill(0, SIGKILL).ok());
  auto result = (*launch)->Wait();
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->first_failed_rank, 0);
  EXPECT_TRUE(NoNamespaceWithPrefix(prefix));
  // Every link lived inside the launch's namespaces; the root namespace never changed.
  EXPECT_EQ(RootLinks(), root_links);
}

TEST_F(NetnsLauncherTest, DestroyingALaunchRemovesItsNamespaces) {
  LaunchOptions o = ProbeOptions(2, {"--hang"});
  o.mode = Mode::kNetns;
  std::string prefix;
  pid_t rank_pid;
  {
    auto launch = Launch::Start(o);
    ASSERT_TRUE(launch.ok()) << launch.status();
    prefix = (*launch)->name_prefix();
    rank_pid = (*launch)->pid(0);
    EXPECT_FALSE(NoNamespaceWithPrefix(prefix));
  }
  EXPECT_TRUE(NoNamespaceWithPrefix(prefix));
  EXPECT_NE(kill(rank_pid, 0), 0);
}

TEST_F(NetnsLauncherTest, SweepRemovesNamespacesOfDeadLaunchers) {
  pid_t dead = fork();
  ASSERT_GE(dead, 0);
  if (dead == 0) _exit(0);
  waitpid(dead, nullptr, 0);
  const std::string name = absl::StrCat("reshard-", dead, "-dead-r0");
  ASSERT_EQ(std::system(absl::StrCat("ip netns add ", name).c_str()), 0);
  EXPECT_FALSE(NoNamespaceWithPrefix(name));
  EXPECT_GE(SweepStaleNamespaces(), 1);
  EXPECT_TRUE(NoNamespaceWithPrefix(name));
}

}  // namespace
}  // namespace reshard::launcher
