// `reshard run` with fan-out end to end: real reshard-rank processes, the UCX engine for the
// network stage and the host fan-out backend inside each domain. Byte-exact on every rank for
// 3 refits, the network carries each piece once per domain (bytes_network equals the schedule's
// plan), the fan-out carries the rest, nothing is registered after the first refit.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "src/common/json.h"
#include "src/plan/plan.h"
#include "src/plan/spec_json.h"

namespace reshard {
namespace {

struct RunResult {
  int exit_code = -1;
  std::string out;
};

RunResult RunCommand(const std::string& command) {
  RunResult r;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  const int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string SpecPath(const std::string& name) {
  return absl::StrCat(RESHARD_SOURCE_DIR, "/tests/nvlink/specs/", name);
}

plan::PlanStats PlannedStats(const std::string& spec_path) {
  auto spec = plan::LoadSpecFile(spec_path);
  EXPECT_TRUE(spec.ok()) << spec.status();
  auto plan = plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*std::move(spec)));
  EXPECT_TRUE(plan.ok()) << plan.status();
  return plan->stats();
}

void ExpectFanoutRun(const std::string& spec, const std::string& extra) {
  const std::string path = SpecPath(spec);
  const plan::PlanStats planned = PlannedStats(path);
  ASSERT_GT(planned.bytes_fanout, 0);
  const RunResult r = RunCommand(absl::StrCat(
      RESHARD_BINARY_DIR, "/bin/reshard run ", path,
      " --iters 3 --json --timeout-ms 20000 --deadline-s 120 ", extra, " 2>/dev/null"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto v = json::Parse(r.out);
  ASSERT_TRUE(v.ok()) << v.status() << ": " << r.out;
  auto num = [&](const char* key) {
    const json::Value* f = v->Find(key);
    return f != nullptr && f->is_number() ? static_cast<int64_t>(f->as_double()) : -1;
  };
  const json::Value* ok = v->Find("ok");
  ASSERT_TRUE(ok != nullptr && ok->is_bool() && ok->as_bool()) << r.out;
  EXPECT_EQ(num("completed_iters"), 3) << r.out;
  const json::Value* fanout = v->Find("fanout");
  ASSERT_TRUE(fanout != nullptr && fanout->is_string()) << r.out;
  EXPECT_EQ(fanout->as_string(), "host") << r.out;
  // Each piece crossed the network once per domain; the rest moved inside the domains.
  EXPECT_EQ(num("bytes_network"), planned.bytes_network) << r.out;
  EXPECT_EQ(num("bytes_fanout"), planned.bytes_fanout) << r.out;
  EXPECT_EQ(num("registrations_after_first"), 0) << r.out;
  if (extra.find("--emulate-nic") != std::string::npos) {
    const json::Value* mode = v->Find("mode");
    ASSERT_TRUE(mode != nullptr && mode->is_string()) << r.out;
    EXPECT_EQ(mode->as_string(), "netns") << r.out;
  }
}

#ifndef RESHARD_NETNS_TESTS

TEST(RunFanout, Tp4ToTp2Dp2OneDomainOverSharedMemory) {
  ExpectFanoutRun("tp4-to-tp2dp2.json", "--transport sm");
}

TEST(RunFanout, EightTrainersToTp2Dp4TwoDomainsOverTcp) {
  ExpectFanoutRun("eight-to-tp2dp4.json", "--transport tcp");
}

TEST(RunFanout, EngineFanoutPutsEverythingOverTheNetwork) {
  // The comparison point: with --fanout engine the same plan's fan-out copies travel as
  // network puts, so the network carries both stages.
  const std::string path = SpecPath("tp4-to-tp2dp2.json");
  const plan::PlanStats planned = PlannedStats(path);
  const RunResult r =
      RunCommand(absl::StrCat(RESHARD_BINARY_DIR, "/bin/reshard run ", path,
                              " --iters 2 --json --fanout engine --timeout-ms 20000 "
                              "--deadline-s 120 2>/dev/null"));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto v = json::Parse(r.out);
  ASSERT_TRUE(v.ok()) << r.out;
  const json::Value* bytes = v->Find("bytes_network");
  ASSERT_TRUE(bytes != nullptr && bytes->is_number());
  EXPECT_EQ(static_cast<int64_t>(bytes->as_double()), planned.bytes_network + planned.bytes_fanout);
}

#else  // Built as nvlink_run_fanout_netns_test (label netns).

// Every rank in its own network namespace with a rate-limited veth NIC; the ranks of a domain
// still share the host's memory, so the fan-out stays on shared memory.
TEST(RunFanoutNetns, EightTrainersToTp2Dp4WithEmulatedNics) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  ExpectFanoutRun("eight-to-tp2dp4.json", "--emulate-nic 400mbit");
}

TEST(RunFanoutNetns, Tp4ToTp2Dp2WithEmulatedNics) {
  if (geteuid() != 0) GTEST_SKIP() << "network namespaces need root";
  ExpectFanoutRun("tp4-to-tp2dp2.json", "--emulate-nic 400mbit");
}

#endif

}  // namespace
}  // namespace reshard
