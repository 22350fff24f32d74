// One fan-out conformance suite, run over every backend behind nvlink::Fanout (tensorpipe
// style): host memory through shared mappings (HostBuffer / SharedBuffer), host memory through
// process_vm_writev, CUDA IPC and NCCL. Every case forks the ranks that hold fan-out edges,
// drives three epochs through the harness (tests/nvlink/fanout_harness.h) and checks every
// destination element, the backend chosen, that mappings are made once per handle, and that
// every planned fan-out piece arrived exactly once per epoch. A backend that cannot run here
// (no CUDA in the build, no device, too few devices) skips with the reason; device cases carry
// the ctest label gpu.
#include <ostream>
#include <string>
#include <tuple>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/nvlink/fanout_harness.h"
#include "tests/testing/multiprocess.h"

#if RESHARD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace reshard::nvlink {
namespace {

using testing::ForkRanks;
using testing::MakeScratchDir;
using testing::PlanFromJson;
using testing::ReadReport;
using testing::RunRank;

using testing::kEightToTp2Dp4;
using testing::kOneToThreeReplicas;
using testing::kTp2ToDp2;
using testing::kTp4ToTp2Dp2;

struct Spec {
  const char* name;
  const char* json;
};
constexpr Spec kSpecs[] = {{"Tp4ToTp2Dp2", kTp4ToTp2Dp2},
                           {"EightToTp2Dp4", kEightToTp2Dp4},
                           {"OneToThreeReplicas", kOneToThreeReplicas},
                           {"Tp2ToDp2", kTp2ToDp2}};

enum class Memory { kSharedHost, kPrivateHost, kCuda };
struct Backend {
  const char* name;      // Test name.
  const char* request;   // FanoutOptions::backend.
  const char* expected;  // Backend the fan-out must report.
  Memory memory;
  int min_devices;  // CUDA devices needed (0: host).
  // GPU backends' options: NCCL staging budget (0: default), every CUDA IPC copy a kernel.
  int64_t gpu_staging_bytes = 0;
  bool cuda_ipc_kernel_only = false;
};
constexpr Backend kBackends[] = {
    {"SharedBuffer", "host", "host", Memory::kSharedHost, 0},
    {"ProcessVmWritev", "host", "host", Memory::kPrivateHost, 0},
    {"AutoHost", "auto", "host", Memory::kSharedHost, 0},
    {"CudaIpc", "cuda_ipc", "cuda_ipc", Memory::kCuda, 1},
    // Every piece through the strided copy kernel instead of the copy engines.
    {"CudaIpcKernel", "cuda_ipc", "cuda_ipc", Memory::kCuda, 1, 0, true},
    {"AutoCuda", "auto", "cuda_ipc", Memory::kCuda, 1},
    {"Nccl", "nccl", "nccl", Memory::kCuda, 2},
    // A 4 KiB staging budget: batches run in several rounds, regions cut into pieces.
    {"NcclSmallStaging", "nccl", "nccl", Memory::kCuda, 2, 4096},
};

// Names in test output instead of the parameters' bytes.
void PrintTo(const Backend& b, std::ostream* os) { *os << b.name; }
void PrintTo(const Spec& s, std::ostream* os) { *os << s.name; }

#if RESHARD_HAVE_CUDA
testing::MemoryOps CudaMemory() {
  testing::MemoryOps m;
  m.kind = MemoryKind::kCuda;
  m.alloc = [](int64_t bytes, std::shared_ptr<void>* holder, const std::string&) -> void* {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
    *holder = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
    return p;
  };
  m.copy_in = [](void* d, const void* s, int64_t n) {
    cudaMemcpy(d, s, n, cudaMemcpyHostToDevice);
  };
  m.copy_out = [](void* d, const void* s, int64_t n) {
    cudaMemcpy(d, s, n, cudaMemcpyDeviceToHost);
  };
  return m;
}
#endif

class FanoutConformance : public ::testing::TestWithParam<std::tuple<Backend, Spec>> {};

TEST_P(FanoutConformance, EveryPieceArrivesOnceByteExactMappedOnce) {
  const Backend& backend = std::get<0>(GetParam());
  const Spec& spec = std::get<1>(GetParam());
  testing::MemoryOps memory;
  [[maybe_unused]] int devices = 0;  // Read only where the build has CUDA.
  if (backend.memory == Memory::kCuda) {
#if RESHARD_HAVE_CUDA
    std::string why;
    devices = reshard::testing::ProbeCudaDevices(&why);
    if (devices == 0) GTEST_SKIP() << "no usable CUDA device: " << why;
    if (devices < backend.min_devices) {
      GTEST_SKIP() << backend.name << " needs " << backend.min_devices
                   << " CUDA devices, this machine has " << devices;
    }
#if !RESHARD_HAVE_NCCL
    if (std::string(backend.request) == "nccl") GTEST_SKIP() << "this build has no NCCL";
#endif
    memory = CudaMemory();
#else
    GTEST_SKIP() << "this build has no CUDA (CUDA was not found at configure time)";
#endif
  } else {
    memory = backend.memory == Memory::kSharedHost ? testing::SharedHostMemory()
                                                   : testing::PrivateHostMemory();
  }

  auto plan = PlanFromJson(spec.json);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_GT(plan->stats().bytes_fanout, 0) << "the schedule emitted no fan-out";
  const std::vector<int32_t> ranks = testing::FanoutRanks(*plan);
  const std::string dir = MakeScratchDir();
  ASSERT_FALSE(dir.empty());
  reshard::testing::ForkOptions fork_options;
  fork_options.timeout = absl::Seconds(backend.memory == Memory::kCuda ? 120 : 60);
  auto codes = ForkRanks(
      ranks,
      [&](int32_t rank) {
#if RESHARD_HAVE_CUDA
        if (devices > 0) {
          const auto index = std::find(ranks.begin(), ranks.end(), rank) - ranks.begin();
          cudaSetDevice(static_cast<int>(index % devices));
        }
#endif
        testing::RankOptions opt;
        opt.epochs = 3;
        opt.backend = backend.request;
        opt.gpu_staging_bytes = backend.gpu_staging_bytes;
        opt.cuda_ipc_kernel_only = backend.cuda_ipc_kernel_only;
        absl::Status s = RunRank(*plan, rank, dir, memory, opt);
        if (!s.ok()) testing::Report(dir, rank, "error=" + std::string(s.message()));
        return s.ok() ? 0 : 1;
      },
      fork_options);
  int64_t incoming = 0, outgoing = 0;
  for (int32_t r : ranks) {
    auto rep = ReadReport(dir, r);
    EXPECT_EQ(codes[r], 0) << "rank " << r << ": " << rep["error"];
    EXPECT_EQ(rep["ok"], "1") << "rank " << r;
    EXPECT_EQ(rep["backend"], backend.expected) << "rank " << r;
    // Mappings are created once per handle: refits 1..3 created none.
    EXPECT_EQ(rep["mappings_create"], rep["mappings_end"]) << "rank " << r;
    int64_t in = 0, out = 0;
    EXPECT_TRUE(absl::SimpleAtoi(rep["incoming"], &in));
    EXPECT_TRUE(absl::SimpleAtoi(rep["outgoing"], &out));
    incoming += in;
    outgoing += out;
    for (int ep = 1; ep <= 3; ++ep) {
      EXPECT_EQ(rep[absl::StrFormat("epoch%d", ep)].rfind(absl::StrFormat("arrivals:%d,", in), 0),
                0u)
          << "rank " << r << " epoch " << ep << ": " << rep[absl::StrFormat("epoch%d", ep)];
    }
  }
  int64_t planned = 0;
  for (const plan::Transfer& tr : plan->transfers()) {
    planned += tr.kind == plan::TransferKind::kFanout;
  }
  EXPECT_EQ(incoming, planned);
  EXPECT_EQ(outgoing, planned);
}

INSTANTIATE_TEST_SUITE_P(Backends, FanoutConformance,
                         ::testing::Combine(::testing::ValuesIn(kBackends),
                                            ::testing::ValuesIn(kSpecs)),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param).name) + "_" +
                                  std::get<1>(info.param).name;
                         });

}  // namespace
}  // namespace reshard::nvlink
