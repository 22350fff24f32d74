// Multi-process refits: one reshard-rank process per rank over UCX shared memory and tcp, on the
// example specs and on random specs, plus failure cases (a rank killed mid-refit). Every launch
// sets UCX_TLS, UCX_NET_DEVICES and RESHARD_TIMEOUT_MS explicitly.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "src/plan/plan.h"
#include "src/plan/spec_json.h"
#include "tests/net/rank_harness.h"
#include "tests/testing/multiprocess.h"

namespace reshard::testing {
namespace {

struct Transport {
  const char* name;
  const char* tls;
  const char* devices;
};
constexpr Transport kSm{"sm", "posix,sysv,cma,self", "all"};
constexpr Transport kTcp{"tcp", "tcp", "lo"};

// Every example spec; a test over them fails (instead of passing vacuously) when none is found.
std::vector<std::string> ExampleSpecs() {
  const std::string dir = std::string(RESHARD_SOURCE_DIR) + "/examples/specs";
  std::vector<std::string> paths;
  std::error_code error;
  for (const auto& e : std::filesystem::directory_iterator(dir, error)) {
    if (e.path().extension() == ".json") paths.push_back(e.path().string());
  }
  std::sort(paths.begin(), paths.end());
  EXPECT_FALSE(paths.empty()) << "no example spec (*.json) found in " << dir
                              << (error ? ": " + error.message() : "");
  return paths;
}

// Writes `text` to `name` in this process's scratch directory (removed when it exits) and
// returns its path. Never a fixed name in TempDir(): concurrent tests (ctest -j, other build
// trees) share it, and one rewriting a spec while another's ranks read it fails the readers with
// "unexpected end of input".
std::string WriteSpec(const std::string& name, const std::string& text) {
  static const std::string dir = testing::ScratchDir("multiproc");
  const std::string path = absl::StrCat(dir, "/", name);
  std::ofstream(path) << text;
  return path;
}

// A world of reshard-rank processes over `transport`; `specs` per rank (one: every rank).
WorldLaunch RankWorld(std::vector<std::string> specs, int world_size, int iters,
                      const Transport& transport, int timeout_ms) {
  WorldLaunch launch;
  launch.program = BinPath("reshard-rank");
  launch.spec_paths = std::move(specs);
  launch.world_size = world_size;
  launch.iters = iters;
  launch.ucx_tls = transport.tls;
  launch.ucx_net_devices = transport.devices;
  launch.timeout_ms = timeout_ms;
  launch.limit = absl::Seconds(60);
  return launch;
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
    // kFanout copies arrive through the intra-domain fan-out layer (reshard-rank --fanout auto,
    // the default), not over the network.
    if (t.from_rank != t.to_rank && t.kind != plan::TransferKind::kFanout) {
      out[t.to_rank].bytes_in += plan->region(t.region).bytes;
    }
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
  WorldLaunch launch = RankWorld({spec_path}, WorldOf(spec_path), 3, transport, 20000);
  launch.extra_args = {"--plan-mode", mode};
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
      if (!transports.empty()) {
        EXPECT_NE(transports.find("tcp/lo"), std::string::npos) << transports;
      }
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

// A random spec (world <= 8): 1-3 tensors of 1-3 dims, meshes over random rank subsets in random
// order (1-D or 2-D), random R/S(d) placements (nested sharding included), random dtypes and
// domain grouping. Returns "" when the draw is not a valid spec (the caller draws again).
std::string RandomSpec(std::mt19937& rng) {
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int world = uniform(2, 8);
  static constexpr const char* kDtypes[] = {"u8", "i16", "fp16", "bf16", "fp32", "i64", "fp64"};
  auto mesh = [&](int ndim_tensor, std::string& placements) {
    std::vector<int> ranks(world);
    for (int i = 0; i < world; ++i) ranks[i] = i;
    std::shuffle(ranks.begin(), ranks.end(), rng);
    const int k = uniform(1, world);
    ranks.resize(k);
    std::string text;
    int axes = 1;
    if (k % 2 == 0 && k >= 4 && uniform(0, 1) == 1) {
      axes = 2;
      text = "[";
      for (int a = 0; a < 2; ++a) {
        absl::StrAppend(&text, a ? ", [" : "[");
        for (int b = 0; b < k / 2; ++b)
          absl::StrAppend(&text, b ? ", " : "", ranks[a * (k / 2) + b]);
        absl::StrAppend(&text, "]");
      }
      absl::StrAppend(&text, "]");
    } else {
      text = "[";
      for (int i = 0; i < k; ++i) absl::StrAppend(&text, i ? ", " : "", ranks[i]);
      absl::StrAppend(&text, "]");
    }
    placements = "[";
    for (int a = 0; a < axes; ++a) {
      const int d = uniform(-1, ndim_tensor - 1);
      absl::StrAppend(&placements, a ? ", " : "", d < 0 ? "\"R\"" : absl::StrCat("\"S(", d, ")\""));
    }
    absl::StrAppend(&placements, "]");
    return text;
  };
  std::string tensors;
  const int n = uniform(1, 3);
  for (int t = 0; t < n; ++t) {
    const int nd = uniform(1, 3);
    std::string shape = "[";
    for (int d = 0; d < nd; ++d)
      absl::StrAppend(&shape, d ? ", " : "", uniform(1, nd == 1 ? 300 : 24));
    absl::StrAppend(&shape, "]");
    std::string src_pl, dst_pl;
    const std::string src_mesh = mesh(nd, src_pl);
    const std::string dst_mesh = mesh(nd, dst_pl);
    absl::StrAppend(&tensors, t ? ",\n" : "", "{\"name\": \"t", t, "\", \"dtype\": \"",
                    kDtypes[uniform(0, 6)], "\", \"shape\": ", shape,
                    ", \"src\": {\"mesh\": ", src_mesh, ", \"placements\": ", src_pl,
                    "}, \"dst\": {\"mesh\": ", dst_mesh, ", \"placements\": ", dst_pl, "}}");
  }
  const int grouping = uniform(0, 2);
  std::string topology =
      grouping == 0 ? ""
                    : absl::StrCat("\"topology\": {\"ranks_per_domain\": ", grouping * 2, "},\n");
  const std::string text = absl::StrCat("{", topology, "\"tensors\": [", tensors, "]}");
  return plan::ParseSpecJson(text).ok() ? text : "";
}

std::vector<std::string> WriteRandomSpecs(int count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> paths;
  while (static_cast<int>(paths.size()) < count) {
    const std::string text = RandomSpec(rng);
    if (text.empty()) continue;
    paths.push_back(WriteSpec(absl::StrCat("spec", seed, "-", paths.size(), ".json"), text));
  }
  return paths;
}

TEST(MultiprocRefit, FiftyRandomSpecsOverSharedMemory) {
  for (const std::string& path : WriteRandomSpecs(50, 20261129)) RunAndCheck(path, kSm, "ours");
}

TEST(MultiprocRefit, FiftyRandomSpecsOverTcp) {
  for (const std::string& path : WriteRandomSpecs(50, 4242)) RunAndCheck(path, kTcp, "ours");
}

// A rank SIGKILLed in the middle of a long run of refits: every other rank must report an
// error (not hang, not pass) within 10 s (measured: tens of ms). Over tcp UCX reports the lost
// peer; over shared memory (no UCX peer error handling) the engine watches same-host peers'
// processes.
void KilledRankFailsEveryOtherRank(const Transport& transport) {
  const std::string path = WriteSpec("kill.json", R"json({"tensors": [
    {"name": "w", "dtype": "fp32", "shape": [512, 512],
     "src": {"mesh": [0, 1], "placements": ["S(0)"]},
     "dst": {"mesh": [2, 3], "placements": ["S(1)"]}}]})json");
  WorldLaunch launch = RankWorld({path}, 4, 1000000, transport, 8000);
  bool killed = false;
  launch.on_running = [&](const std::vector<pid_t>& pids) { killed = kill(pids[0], SIGKILL) == 0; };
  auto results = RunWorld(launch);
  ASSERT_TRUE(results.ok()) << results.status();
  // The harness says on stderr why it did not call on_running; every rank's end follows.
  ASSERT_TRUE(killed) << "no rank was killed:" << Describe(*results);
  EXPECT_EQ((*results)[0].signal, SIGKILL);
  for (int r = 1; r < 4; ++r) {
    const RankResult& res = (*results)[r];
    EXPECT_EQ(res.exit_code, 1) << "rank " << r << ": " << res.error();
    ASSERT_TRUE(res.parsed_ok) << res.stdout_text;
    EXPECT_FALSE(res.report.Find("ok")->as_bool());
    EXPECT_FALSE(res.error().empty());
    EXPECT_LT(res.exit_seconds, 10.0) << "rank " << r << ": " << res.error();
    std::fprintf(stderr, "%s: rank %d failed after %.2f s: %s\n", transport.name, r,
                 res.exit_seconds, res.error().c_str());
  }
}

TEST(MultiprocRefit, KilledRankFailsEveryOtherRankOverTcp) { KilledRankFailsEveryOtherRank(kTcp); }

TEST(MultiprocRefit, KilledRankFailsEveryOtherRankOverSharedMemory) {
  KilledRankFailsEveryOtherRank(kSm);
}

// Two ranks given different specs (same world size): every rank fails before any refit.
TEST(MultiprocRefit, MismatchedSpecsFailEveryRank) {
  const std::string a = WriteSpec(
      "mismatch-a.json", R"json({"tensors": [{"name": "w", "dtype": "fp32", "shape": [8, 8],
     "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}}]})json");
  const std::string b = WriteSpec(
      "mismatch-b.json", R"json({"tensors": [{"name": "w", "dtype": "fp32", "shape": [8, 8],
     "src": {"mesh": [0, 1], "placements": ["S(1)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}}]})json");
  WorldLaunch launch = RankWorld({a, b, a, a}, 4, 3, kTcp, 10000);
  auto results = RunWorld(launch);
  ASSERT_TRUE(results.ok()) << results.status();
  for (const RankResult& r : *results) {
    EXPECT_EQ(r.exit_code, 1) << "rank " << r.rank << ": " << r.error();
    EXPECT_NE(r.error().find("fingerprint mismatch"), std::string::npos) << r.error();
    ASSERT_TRUE(r.parsed_ok);
    EXPECT_TRUE(r.report.Find("iter_ms")->items().empty());
  }
}

// The same with domains: the fan-out layer would map domain peers, so the fingerprints must be
// compared before it is built, or mismatched ranks would time out in its set-up instead of
// failing with the fingerprint error.
TEST(MultiprocRefit, MismatchedSpecsWithDomainsFailEveryRankWithTheFingerprintError) {
  const std::string a =
      WriteSpec("mismatch-domains-a.json", R"json({"topology": {"domains": [[0, 1], [2, 3, 4, 5]]},
     "tensors": [{"name": "w", "dtype": "fp32", "shape": [8, 8],
     "src": {"mesh": [0, 1], "placements": ["S(0)"]},
     "dst": {"mesh": [[2, 3], [4, 5]], "placements": ["R", "S(1)"]}}]})json");
  const std::string b =
      WriteSpec("mismatch-domains-b.json", R"json({"topology": {"domains": [[0, 1], [2, 3, 4, 5]]},
     "tensors": [{"name": "w", "dtype": "fp32", "shape": [8, 8],
     "src": {"mesh": [0, 1], "placements": ["S(1)"]},
     "dst": {"mesh": [[2, 3], [4, 5]], "placements": ["R", "S(1)"]}}]})json");
  WorldLaunch launch = RankWorld({a, a, a, b, a, a}, 6, 2, kSm, 20000);
  const absl::Time start = absl::Now();
  auto results = RunWorld(launch);
  ASSERT_TRUE(results.ok()) << results.status();
  for (const RankResult& r : *results) {
    EXPECT_EQ(r.exit_code, 1) << "rank " << r.rank << ": " << r.error();
    EXPECT_NE(r.error().find("fingerprint mismatch"), std::string::npos)
        << "rank " << r.rank << ": " << r.error();
  }
  // Well before the 20 s set-up deadline: nobody waited for a peer that would never come.
  EXPECT_LT(absl::Now() - start, absl::Seconds(15));
}

}  // namespace
}  // namespace reshard::testing
