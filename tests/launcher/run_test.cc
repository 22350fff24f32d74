// End-to-end tests of `reshard run` and `reshard info` (the CLI binary, reshard-rank processes
// and the launcher together), and of a rank killed mid-refit.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "src/common/json.h"
#include "tools/launcher/launcher.h"

namespace reshard {
namespace {

const std::string kBin = std::string(RESHARD_BINARY_DIR) + "/bin/";
const std::string kSpecs = std::string(RESHARD_SOURCE_DIR) + "/examples/specs/";
const std::vector<std::string> kExamples = {"fig1-rows-to-cols.json", "fig3-tp4-to-tp2dp2.json",
                                            "fused-qkv.json", "uneven-nested.json"};

// Every spec in examples/specs (the four above and any added later).
std::vector<std::string> AllExamples() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(kSpecs)) {
    if (e.path().extension() == ".json") out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct Output {
  int exit_code = -1;
  std::string out;
};

// Runs `reshard ARGS` and captures stdout (stderr passes through to the test log).
Output Reshard(const std::string& args) {
  Output o;
  FILE* f = popen((kBin + "reshard " + args).c_str(), "r");
  if (f == nullptr) return o;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) o.out.append(buf, n);
  int status = pclose(f);
  o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return o;
}

json::Value ParseJson(const std::string& text) {
  auto v = json::Parse(text);
  EXPECT_TRUE(v.ok()) << text;
  return v.ok() ? *v : json::Value();
}

void ExpectVerifiedRun(const json::Value& v, int iters, const std::string& what) {
  ASSERT_TRUE(v.is_object()) << what;
  EXPECT_TRUE(v.Find("ok")->as_bool()) << what;
  EXPECT_EQ(v.Find("completed_iters")->as_int(), iters) << what;
  EXPECT_EQ(v.Find("registrations_after_first")->as_int(), 0) << what;
  EXPECT_GT(v.Find("registrations_first")->as_int(), 0) << what;
  EXPECT_FALSE(v.Find("transports")->as_string().empty()) << what;
  EXPECT_TRUE(v.Find("errors")->items().empty()) << what;
  // median_ms and p90_ms summarise iterations 2..N (the first alone when N = 1); p90 is the
  // nearest-rank sample, the ceil(0.9 n)-th smallest, so it is one of iter_ms exactly.
  std::vector<double> steady;
  for (const json::Value& ms : v.Find("iter_ms")->items()) steady.push_back(ms.as_double());
  ASSERT_EQ(steady.size(), static_cast<size_t>(iters)) << what;
  if (steady.size() > 1) steady.erase(steady.begin());
  std::sort(steady.begin(), steady.end());
  ASSERT_NE(v.Find("p90_ms"), nullptr) << what;
  ASSERT_NE(v.Find("p90_landing_ms"), nullptr) << what;
  EXPECT_EQ(v.Find("p90_ms")->as_double(), steady[(9 * steady.size() + 9) / 10 - 1]) << what;
  EXPECT_GE(v.Find("p90_ms")->as_double(), v.Find("median_ms")->as_double()) << what;
  EXPECT_GE(v.Find("p90_landing_ms")->as_double(), v.Find("median_landing_ms")->as_double())
      << what;
}

// Every reshard namespace that appeared since `before` must belong to a launcher that still
// runs (another test's); the `reshard run` processes above have exited, so theirs must be gone.
void ExpectNoLeakedNamespaces(const std::vector<std::string>& before) {
  for (const auto& ns : launcher::ListNamespaces()) {
    if (!absl::StartsWith(ns, "reshard-")) continue;
    if (std::find(before.begin(), before.end(), ns) != before.end()) continue;
    const std::string rest = ns.substr(8);
    const pid_t owner = static_cast<pid_t>(std::atoi(rest.substr(0, rest.find('-')).c_str()));
    EXPECT_EQ(kill(owner, 0), 0) << "namespace " << ns << " outlived its launcher";
  }
}

class RunExamplesTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RunExamplesTest, EveryExampleRefitsByteExactThreeTimes) {
  const std::vector<std::string> examples = AllExamples();
  for (const std::string& spec : kExamples) {
    EXPECT_NE(std::find(examples.begin(), examples.end(), spec), examples.end()) << spec;
  }
  for (const std::string& spec : examples) {
    Output o = Reshard(absl::StrCat("run ", kSpecs, spec, " --iters 3 --transport ", GetParam(),
                                    " --timeout-ms 20000 --deadline-s 120 --json"));
    EXPECT_EQ(o.exit_code, 0) << spec << ": " << o.out;
    json::Value v = ParseJson(o.out);
    ExpectVerifiedRun(v, 3, spec);
    EXPECT_EQ(v.Find("mode")->as_string(), "loopback");
    if (GetParam() == "tcp") {
      EXPECT_TRUE(absl::StrContains(v.Find("transports")->as_string(), "tcp")) << spec;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, RunExamplesTest, ::testing::Values("sm", "tcp"),
                         [](const auto& info) { return info.param; });

TEST(RunTest, InvalidInputExitsWithTwo) {
  EXPECT_EQ(Reshard("run /nonexistent.json --json 2>/dev/null").exit_code, 2);
  EXPECT_EQ(Reshard(absl::StrCat("run ", kSpecs, kExamples[0],
                                 " --transport sm --emulate-nic 200mbit 2>/dev/null"))
                .exit_code,
            2);
  EXPECT_EQ(Reshard(absl::StrCat("run ", kSpecs, kExamples[0], " --emulate-nic fast 2>/dev/null"))
                .exit_code,
            2);
  EXPECT_EQ(Reshard(absl::StrCat("run ", kSpecs, kExamples[0], " --iters 0 2>/dev/null")).exit_code,
            2);
  EXPECT_EQ(Reshard(absl::StrCat("run ", kSpecs, kExamples[0],
                                 " --emulate-nic 200mbit --mtu 500 2>/dev/null"))
                .exit_code,
            2);
  EXPECT_EQ(Reshard(absl::StrCat("run ", kSpecs, kExamples[0], " --mtu 9000 2>/dev/null")).exit_code,
            2);  // Loopback processes: no veth to set.
  // gather_broadcast is a simulated baseline: every rank refuses it as invalid input.
  Output o = Reshard(absl::StrCat("run ", kSpecs, kExamples[0],
                                  " --plan-mode gather_broadcast --json 2>/dev/null"));
  EXPECT_EQ(o.exit_code, 2);
  json::Value v = ParseJson(o.out);
  EXPECT_FALSE(v.Find("ok")->as_bool());
  EXPECT_FALSE(v.Find("errors")->items().empty());
}

TEST(RunTest, NaivePlanAlsoVerifies) {
  Output o = Reshard(absl::StrCat("run ", kSpecs, "fig3-tp4-to-tp2dp2.json --iters 2 ",
                                  "--plan-mode naive --timeout-ms 20000 --json"));
  EXPECT_EQ(o.exit_code, 0) << o.out;
  ExpectVerifiedRun(ParseJson(o.out), 2, "naive");
}

// --delta with --change-fraction (docs/delta.md): every destination verified against exactly the
// changed values, and the last refit sends deltas, far fewer bytes than the plain pieces.
// `reshard run SPEC --iters N --delta --change-fraction 0.05 --json` of an example spec, every
// refit verified; its report.
json::Value VerifiedDeltaRun(const std::string& spec, int iters, const char* what) {
  Output o = Reshard(absl::StrCat("run ", kSpecs, spec, " --iters ", iters,
                                  " --delta --change-fraction 0.05 --timeout-ms 20000 --json"));
  EXPECT_EQ(o.exit_code, 0) << o.out;
  json::Value v = ParseJson(o.out);
  ExpectVerifiedRun(v, iters, what);
  return v;
}

TEST(RunTest, DeltaRefitsVerifyAndSendOnlyTheChanges) {
  json::Value v = VerifiedDeltaRun("fig3-tp4-to-tp2dp2.json", 3, "delta");
  EXPECT_TRUE(v.Find("delta")->as_bool());
  EXPECT_EQ(v.Find("delta_pieces")->as_int(), 4);  // fig3's four network pieces.
  EXPECT_EQ(v.Find("delta_full_pieces")->as_int(), 0);
  EXPECT_EQ(v.Find("delta_plain_bytes")->as_int(), int64_t{8} << 20);
  EXPECT_LT(v.Find("delta_stream_bytes")->as_int(), (int64_t{8} << 20) * 15 / 100);
  // With puts the streams' capacity waits at both ends: send scratch and landing areas.
  EXPECT_GT(v.Find("send_scratch_bytes")->as_int(), int64_t{8} << 20);
  EXPECT_GT(v.Find("landing_area_bytes")->as_int(), int64_t{8} << 20);
  EXPECT_EQ(Reshard(absl::StrCat("run ", kSpecs, kExamples[0],
                                 " --delta --change-fraction 2 2>/dev/null"))
                .exit_code,
            2);
}

// --delta with --change-fraction into quantized destinations (docs/delta.md, "Quantized
// destinations"): the sources change 5% of their elements (real numbers by 1 to 15 ulp, FP8
// sources by their bytes), every FP8 destination and scale is checked against the quantized
// changed values, and far fewer FP8 bytes change than the plain pieces hold. `reshard bench`
// verifies the same in every iteration of every mode, unquantized included.
TEST(RunTest, DeltaRefitsOfQuantizedDestinationsVerifyTheChangedFp8) {
  json::Value v = VerifiedDeltaRun("fp8-quantized.json", 4, "quantized delta");
  EXPECT_GT(v.Find("delta_pieces")->as_int(), 0);
  EXPECT_LT(v.Find("delta_stream_bytes")->as_int(), v.Find("delta_plain_bytes")->as_int() / 5);
  Output bench = Reshard(absl::StrCat("bench ", kSpecs, "fp8-quantized.json --iters 3 --delta ",
                                      "--change-fraction 0.05 --verify all --json"));
  EXPECT_EQ(bench.exit_code, 0) << bench.out;
  json::Value b = ParseJson(bench.out);
  EXPECT_TRUE(b.Find("ok")->as_bool()) << bench.out;
  EXPECT_LT(b.Find("delta_bytes_over_ours")->as_double(), 0.2) << bench.out;
}

// --change-fraction random and --fail-every: refits 4 and 8 fail on purpose (the last rank gives
// up at once, every rank resets), the others each change their own random fraction (epoch 10
// none, epoch 11 all) and are verified byte-exact, the one after each failure a full refit.
TEST(RunTest, RandomFractionsWithFailedAndResetRefitsStayByteExact) {
  Output o = Reshard(absl::StrCat("run ", kSpecs, "fig3-tp4-to-tp2dp2.json --iters 11 --delta ",
                                  "--change-fraction random --fail-every 4 --timeout-ms 20000 ",
                                  "--json"));
  EXPECT_EQ(o.exit_code, 0) << o.out;
  json::Value v = ParseJson(o.out);
  ExpectVerifiedRun(v, 9, "random fractions");
  EXPECT_EQ(v.Find("failed_on_purpose")->as_int(), 2);
  // Which ranks fail those refits is a race (a rank may finish before the abort reaches it).
  EXPECT_LE(v.Find("rank_failures_on_purpose")->as_int(), 2 * 8);
  EXPECT_EQ(v.Find("change_fraction")->as_string(), "random");
  // Refit 11 changes every element: every piece goes plain.
  EXPECT_EQ(v.Find("delta_pieces")->as_int(), 0);
  EXPECT_EQ(v.Find("delta_full_pieces")->as_int(), 4);
  for (const char* bad : {" --fail-every 1", " --change-fraction randomly"}) {
    EXPECT_EQ(Reshard(absl::StrCat("run ", kSpecs, kExamples[0], " --delta", bad, " 2>/dev/null"))
                  .exit_code,
              2)
        << bad;
  }
}

TEST(RunTest, HumanReportNamesTimesBytesRegistrationsAndTransports) {
  Output o = Reshard(absl::StrCat("run ", kSpecs, kExamples[0], " --iters 2 --timeout-ms 20000"));
  EXPECT_EQ(o.exit_code, 0) << o.out;
  for (const char* needle : {"refit time", "median", "p90", "bytes per refit", "registrations",
                             "transports", "stream memory", "verified byte-exact"}) {
    EXPECT_TRUE(absl::StrContains(o.out, needle)) << needle << " missing from:\n" << o.out;
  }
}

// CUDA devices as `reshard info` sees them (0 without a driver, a device or a CUDA build).
int64_t CudaDevices() {
  json::Value v = ParseJson(Reshard("info --json").out);
  const json::Value* cuda = v.is_object() ? v.Find("cuda") : nullptr;
  return cuda != nullptr ? cuda->Find("devices")->as_int() : 0;
}

// --memory: a value other than host or cuda is a usage error; --memory cuda without a usable
// CUDA device exits 3 naming why, before any rank starts. CUDA_VISIBLE_DEVICES="" hides a
// machine's devices, so this runs the same with a GPU or without; RunGpuTest below runs the refit.
TEST(RunTest, MemoryCudaWithoutADeviceExitsWithThreeSayingWhy) {
  Output bad = Reshard(absl::StrCat("run ", kSpecs, kExamples[0], " --memory disk 2>&1"));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_TRUE(absl::StrContains(bad.out, "--memory must be host or cuda, not \"disk\"")) << bad.out;
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string saved = visible != nullptr ? visible : "";
  setenv("CUDA_VISIBLE_DEVICES", "", 1);  // Inherited by the reshard process popen starts.
  Output o = Reshard(absl::StrCat("run ", kSpecs, kExamples[0], " --memory cuda --json 2>&1"));
  if (visible != nullptr) {
    setenv("CUDA_VISIBLE_DEVICES", saved.c_str(), 1);
  } else {
    unsetenv("CUDA_VISIBLE_DEVICES");
  }
  EXPECT_EQ(o.exit_code, 3) << o.out;
  EXPECT_TRUE(absl::StrContains(o.out, "reshard run: --memory cuda needs a usable CUDA device: "))
      << o.out;
}

// --memory cuda on a GPU: every buffer is device memory (all ranks share GPU 0 here), every
// destination byte verified after each refit, each CUDA buffer either registered with UCX or
// staged (the report says which), and the reference cudaMemcpy measured. fig3 (TP4 -> TP2 x DP2)
// copies half of its pieces inside the destination domain: the fan-out layer runs them over
// CUDA IPC.
TEST(RunGpuTest, DeviceBuffersRefitByteExactAndSayRegisteredOrStaged) {
  if (CudaDevices() == 0) GTEST_SKIP() << "no usable CUDA device";
  for (const std::string& spec : {kExamples[0], std::string("fig3-tp4-to-tp2dp2.json")}) {
    Output o = Reshard(absl::StrCat("run ", kSpecs, spec, " --memory cuda --iters 3 ",
                                    "--timeout-ms 60000 --deadline-s 300 --json"));
    EXPECT_EQ(o.exit_code, 0) << spec << ": " << o.out;
    json::Value v = ParseJson(o.out);
    ExpectVerifiedRun(v, 3, spec);
    EXPECT_EQ(v.Find("memory")->as_string(), "cuda") << spec;
    EXPECT_EQ(v.Find("gpus")->items().size(), 1u) << spec;
    EXPECT_GT(v.Find("cuda_buffers_registered")->as_int() + v.Find("cuda_buffers_staged")->as_int(),
              0)
        << spec;
    // Staged buffers are copied through pinned host memory every refit; registered ones never.
    if (v.Find("cuda_buffers_staged")->as_int() == 0) {
      EXPECT_EQ(v.Find("bytes_staged_to_host")->as_int(), 0) << spec;
    } else {
      EXPECT_GT(
          v.Find("bytes_staged_to_host")->as_int() + v.Find("bytes_staged_to_device")->as_int(), 0)
          << spec;
    }
    EXPECT_GT(v.Find("device_copy_ms")->as_double(), 0) << spec;
    if (spec == "fig3-tp4-to-tp2dp2.json") {
      EXPECT_EQ(v.Find("fanout")->as_string(), "cuda_ipc") << o.out;
      EXPECT_GT(v.Find("bytes_fanout")->as_int(), 0) << o.out;
    }
  }
}

TEST(RunNetnsTest, EveryRankRunsAsItsOwnHost) {
  if (!launcher::CanUseNetns()) GTEST_SKIP() << "network namespaces need root";
  const std::vector<std::string> before = launcher::ListNamespaces();
  for (const std::string& spec : {kExamples[0], kExamples[3]}) {
    Output o =
        Reshard(absl::StrCat("run ", kSpecs, spec, " --netns --iters 3 --timeout-ms 20000 --json"));
    EXPECT_EQ(o.exit_code, 0) << o.out;
    json::Value v = ParseJson(o.out);
    ExpectVerifiedRun(v, 3, spec);
    EXPECT_EQ(v.Find("mode")->as_string(), "netns");
    EXPECT_EQ(v.Find("ucx_tls")->as_string(), "tcp");
    EXPECT_TRUE(absl::StrContains(v.Find("transports")->as_string(), "veth0"));
  }
  ExpectNoLeakedNamespaces(before);
}

TEST(RunNetnsTest, EmulatedNicReportsTheLowerBound) {
  if (!launcher::CanUseNetns()) GTEST_SKIP() << "network namespaces need root";
  const std::vector<std::string> before = launcher::ListNamespaces();
  Output o = Reshard(absl::StrCat("run ", kSpecs, "fig3-tp4-to-tp2dp2.json --emulate-nic 1gbit ",
                                  "--mtu 4096 --iters 2 --timeout-ms 20000 --json"));
  ExpectNoLeakedNamespaces(before);
  EXPECT_EQ(o.exit_code, 0) << o.out;
  json::Value v = ParseJson(o.out);
  ExpectVerifiedRun(v, 2, "emulate-nic");
  EXPECT_EQ(v.Find("rate")->as_string(), "1gbit");
  EXPECT_EQ(v.Find("mtu")->as_int(), 4096);
  // The busiest rank's bytes through its 1 Gbit/s NIC.
  EXPECT_NEAR(v.Find("lower_bound_ms")->as_double(),
              v.Find("max_rank_network_bytes")->as_double() * 8 / 1e9 * 1e3, 0.01);
  EXPECT_GT(v.Find("ratio")->as_double(), 0);
}

// `reshard run ARGS` on 100 Mbit/s NICs with active messages and with puts (RESHARD_DELIVERY):
// two refits byte-exact each, and the statistic `stat` (what relays forwarded before their piece
// landed) above 0.
void ExpectRelaysForwardEarly(const std::string& args, const char* stat) {
  for (const char* delivery : {"am", "put"}) {
    SCOPED_TRACE(absl::StrCat(args, " by ", delivery));
    setenv("RESHARD_DELIVERY", delivery, 1);
    Output o = Reshard(
        absl::StrCat("run ", args, " --emulate-nic 100mbit --iters 2 --timeout-ms 20000 --json"));
    unsetenv("RESHARD_DELIVERY");
    EXPECT_EQ(o.exit_code, 0) << o.out;
    json::Value v = ParseJson(o.out);
    ExpectVerifiedRun(v, 2, stat);
    EXPECT_GT(v.Find(stat)->as_int(), 0) << o.out;
  }
}

// Delta relays forward each segment as it is applied, not once the whole piece landed: on
// 100 Mbit/s NICs a 2 MiB relayed piece takes 168 ms to arrive, its segments one every 21 ms, and
// the relays of relays-three-replicas.json forward segments before their piece has landed
// (docs/delta.md, "Relays forward the stream"), with active messages (each segment's message)
// and with puts (RESHARD_DELIVERY=put: the sender's progress after each segment); every refit
// still byte-exact.
TEST(RunNetnsTest, DeltaRelaysForwardSegmentsBeforeTheirPieceLanded) {
  if (!launcher::CanUseNetns()) GTEST_SKIP() << "network namespaces need root";
  const std::vector<std::string> before = launcher::ListNamespaces();
  ExpectRelaysForwardEarly(
      absl::StrCat(kSpecs, "relays-three-replicas.json --delta --change-fraction 1.0"),
      "delta_relay_early_segments");
  ExpectNoLeakedNamespaces(before);
}

// Plain relays forward each run once its bytes are here, not once the whole piece landed
// (docs/data-plane.md, "Relays"): a 4 MiB fp32 tensor, replicated into three domains, relayed
// between them in pieces of 2 MiB, into destinations whose view swaps the two outer dims, so the
// runs land far from region order in the buffer (Landing::LandedPrefix maps them back); a
// tensor into column-major destinations, whose relays travel packed (each run's part of the
// stream gathered as the feed's bytes arrive; pieces of 1 MiB: with puts a piece of two
// progress steps may tell its progress only with its last bytes); and relays-three-replicas.json,
// whose feeds travel packed. With active messages (the data messages say what landed) and with puts
// (RESHARD_DELIVERY=put: the senders' progress messages say it), on 100 Mbit/s NICs, the relays
// forward bytes before their piece landed, and every refit is byte-exact.
TEST(RunNetnsTest, RelaysForwardRunsBeforeTheirPieceLanded) {
  if (!launcher::CanUseNetns()) GTEST_SKIP() << "network namespaces need root";
  // Named per process: other build trees running this test share TempDir().
  const std::string spec =
      absl::StrCat(::testing::TempDir(), "/relays-swapped-view-", getpid(), ".json");
  std::ofstream(spec) << R"json({"topology": {"domains": [[0, 1], [2, 3], [4, 5], [6, 7]]},
    "tensors": [{"name": "p", "dtype": "fp32", "shape": [32, 16, 2048],
      "src": {"mesh": [0, 1], "placements": ["S(0)"]},
      "dst": {"mesh": [[2, 3], [4, 5], [6, 7]], "placements": ["R", "S(0)"],
              "view": {"strides": [2048, 32768, 1]}}}]})json";
  const std::string packed =
      absl::StrCat(::testing::TempDir(), "/relays-column-major-", getpid(), ".json");
  std::ofstream(packed) << R"json({"topology": {"domains": [[0, 1], [2, 3], [4, 5], [6, 7]]},
    "tensors": [{"name": "c", "dtype": "fp32", "shape": [64, 16384],
      "src": {"mesh": [0, 1], "placements": ["S(0)"]},
      "dst": {"mesh": [[2, 3], [4, 5], [6, 7]], "placements": ["R", "S(1)"],
              "view": {"strides": [1, 64]}}}]})json";
  const std::vector<std::string> before = launcher::ListNamespaces();
  ExpectRelaysForwardEarly(spec, "relay_early_bytes");
  ExpectRelaysForwardEarly(packed, "relay_early_bytes");
  ExpectRelaysForwardEarly(kSpecs + "relays-three-replicas.json", "relay_early_bytes");
  ExpectNoLeakedNamespaces(before);
  std::filesystem::remove(spec);
  std::filesystem::remove(packed);
}

TEST(RunTest, InfoDescribesThisMachine) {
  Output o = Reshard("info --json");
  EXPECT_EQ(o.exit_code, 0);
  json::Value v = ParseJson(o.out);
  const json::Value* ucx = v.Find("ucx");
  ASSERT_NE(ucx, nullptr);
  EXPECT_FALSE(ucx->Find("version")->as_string().empty());
  EXPECT_TRUE(absl::StrContains(ucx->Find("library")->as_string(), "libucp"));
  bool host = false, cuda_type = false;
  for (const auto& m : ucx->Find("memory_types")->items()) {
    host |= m.as_string() == "host";
    cuda_type |= m.as_string() == "cuda";
  }
  EXPECT_TRUE(host);
  // Whether GPU buffers are registered or staged follows from the memory types.
  EXPECT_EQ(ucx->Find("cuda_memory")->as_string(), cuda_type ? "registered" : "staged");
  // The UCX loaded is the one this build was compiled against (no warning about an older one).
  const std::string version = ucx->Find("version")->as_string();
  const std::string built = ucx->Find("built_against")->as_string();
  EXPECT_FALSE(built.empty());
  EXPECT_TRUE(absl::StartsWith(version, built + ".")) << version << " vs " << built;
  EXPECT_EQ(ucx->Find("version_warning")->as_string(), "");
  bool tcp = false;
  for (const auto& t : ucx->Find("transports")->items()) tcp |= t.as_string() == "tcp";
  EXPECT_TRUE(tcp);
  const json::Value* cuda = v.Find("cuda");
  EXPECT_TRUE(cuda->Find("devices")->as_int() > 0 || !cuda->Find("why_none")->as_string().empty());
  const json::Value* rdma = v.Find("rdma");
  EXPECT_TRUE(!rdma->Find("nics")->items().empty() || !rdma->Find("why_none")->as_string().empty());
  Output text = Reshard("info");
  EXPECT_TRUE(absl::StrContains(text.out, "RDMA NICs"));
  EXPECT_TRUE(absl::StrContains(text.out, "memory types"));
  EXPECT_TRUE(absl::StrContains(text.out, "CUDA memory"));
  EXPECT_TRUE(absl::StrContains(text.out, "built against"));
}

// A source rank SIGKILLed in the middle of a long series of refits: every other rank must fail
// with its own error (not be killed by the launcher) and the launch must end within 10 s.
void KillOneRankMidRefit(launcher::Mode mode, const std::string& transport = "tcp") {
  launcher::LaunchOptions o;
  o.argv = {kBin + "reshard-rank", kSpecs + "fig1-rows-to-cols.json", "--iters", "1000000"};
  o.world_size = 6;
  o.mode = mode;
  o.transport = transport;
  o.rank_timeout_ms = 4000;
  o.failure_grace = absl::Seconds(20);  // Long: the ranks must end on their own.
  o.deadline = absl::Seconds(60);
  o.forward_stderr = false;
  auto launch = launcher::Launch::Start(o);
  ASSERT_TRUE(launch.ok()) << launch.status();
  absl::SleepFor(absl::Seconds(2));  // Set-up done; refits are running back to back.
  const absl::Time killed = absl::Now();
  ASSERT_TRUE((*launch)->Kill(0, SIGKILL).ok());
  auto result = (*launch)->Wait();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_LT(absl::Now() - killed, absl::Seconds(10));
  EXPECT_FALSE(result->ok());
  // The first failure the launcher reaps, usually rank 0; but a peer that noticed the death can
  // exit and be reaped before the killed process is torn down (seen over netns with ASan ranks
  // on a loaded 2-core machine). The ranks' own outcomes are checked below.
  EXPECT_GE(result->first_failed_rank, 0);
  EXPECT_EQ(result->ranks[0].term_signal, SIGKILL);
  for (int r = 1; r < 6; ++r) {
    const launcher::RankResult& rank = result->ranks[r];
    EXPECT_FALSE(rank.killed_by_launcher) << "rank " << r << " did not notice the failure";
    EXPECT_TRUE(rank.exited && rank.exit_code == 1) << "rank " << r << ": " << rank.Describe();
    auto v = json::Parse(rank.json_line);
    ASSERT_TRUE(v.ok()) << "rank " << r << " printed: " << rank.json_line;
    EXPECT_FALSE(v->Find("ok")->as_bool());
    EXPECT_FALSE(v->Find("error")->as_string().empty());
    EXPECT_GT(v->Find("iter_ms")->items().size(), 0u) << "rank " << r << " never refitted";
  }
}

TEST(RunTest, KilledRankMidRefitFailsEveryOtherRankOverLoopbackTcp) {
  KillOneRankMidRefit(launcher::Mode::kLoopback);
}

// Shared memory has no peer-failure detection in UCX: the survivors fail at their deadline.
TEST(RunTest, KilledRankMidRefitFailsEveryOtherRankOverSharedMemory) {
  KillOneRankMidRefit(launcher::Mode::kLoopback, "sm");
}

TEST(RunNetnsTest, KilledRankMidRefitFailsEveryOtherRank) {
  if (!launcher::CanUseNetns()) GTEST_SKIP() << "network namespaces need root";
  KillOneRankMidRefit(launcher::Mode::kNetns);
}

}  // namespace
}  // namespace reshard
