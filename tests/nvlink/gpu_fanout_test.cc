// Device tests of the CUDA IPC and NCCL fan-out backends (label gpu). They skip when this build
// has no CUDA or when no device is visible (cudaGetDeviceCount fails or returns 0); the NCCL test
// also skips with fewer GPUs than ranks in its domain. Every CUDA call happens in forked children:
// the parent never initialises CUDA, so forking stays safe.
#include <gtest/gtest.h>

#include "src/cuda/runtime.h"
#include "src/nvlink/cuda_ipc/factory.h"
#include "tests/nvlink/fanout_harness.h"

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

// Trainer TP4 -> inference TP2 x DP2 in one domain of 4 ranks (one GPU is enough for IPC).
constexpr char kTp4ToTp2Dp2[] = R"json({
  "topology": {"domains": [[0, 1, 2, 3], [4, 5, 6, 7]]},
  "tensors": [
    {"name": "w", "dtype": "bf16", "shape": [64, 256],
     "src": {"mesh": [0, 1, 2, 3], "placements": ["S(1)"]},
     "dst": {"mesh": [[4, 5], [6, 7]], "placements": ["R", "S(1)"]}},
    {"name": "rows", "dtype": "fp32", "shape": [48, 40],
     "src": {"mesh": [0, 1, 2, 3], "placements": ["S(0)"]},
     "dst": {"mesh": [[4, 5], [6, 7]], "placements": ["R", "S(1)"]}}
  ]
})json";

// Two sources -> two replicas in one domain of 2 (NCCL: two GPUs).
constexpr char kTp2ToDp2[] = R"json({
  "topology": {"domains": [[0, 1], [2, 3]]},
  "tensors": [
    {"name": "w", "dtype": "fp32", "shape": [32, 96],
     "src": {"mesh": [0, 1], "placements": ["S(1)"]},
     "dst": {"mesh": [2, 3], "placements": ["R"]}}
  ]
})json";

// Device count seen by a child process (the parent must not initialise CUDA before forking).
int ChildDeviceCount(std::string* why) {
  int fds[2];
  if (pipe(fds) != 0) return 0;
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
  while ((k = read(fds[0], buf, sizeof(buf))) > 0) msg.append(buf, k);
  close(fds[0]);
  waitpid(pid, nullptr, 0);
  const size_t space = msg.find(' ');
  if (why) *why = space == std::string::npos ? msg : msg.substr(space + 1);
  return atoi(msg.c_str());
}

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

void RunGpuCase(const char* json, const std::string& backend, const std::string& expected,
                int min_devices) {
  std::string why;
  const int devices = ChildDeviceCount(&why);
  if (devices == 0) GTEST_SKIP() << "no CUDA device: " << why;
  auto plan = PlanFromJson(json);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::vector<int32_t> ranks = testing::FanoutRanks(*plan);
  if (devices < min_devices) {
    GTEST_SKIP() << backend << " needs " << min_devices << " GPUs, this machine has " << devices;
  }
  const std::string dir = MakeScratchDir();
  auto codes = ForkRanks(
      ranks,
      [&](int32_t rank) {
        const int index =
            static_cast<int>(std::find(ranks.begin(), ranks.end(), rank) - ranks.begin());
        cudaSetDevice(index % devices);
        testing::RankOptions opt;
        opt.backend = backend;
        opt.epochs = 3;
        absl::Status s = RunRank(*plan, rank, dir, CudaMemory(), opt);
        if (!s.ok()) testing::Report(dir, rank, "error=" + std::string(s.message()));
        return s.ok() ? 0 : 1;
      },
      absl::Seconds(120));
  for (int32_t r : ranks) {
    auto rep = ReadReport(dir, r);
    EXPECT_EQ(codes[r], 0) << "rank " << r << ": " << rep["error"];
    EXPECT_EQ(rep["ok"], "1") << "rank " << r;
    EXPECT_EQ(rep["backend"], expected);
    EXPECT_EQ(rep["mappings_create"], rep["mappings_end"]) << "rank " << r;
  }
}
#endif

TEST(GpuFanout, CudaIpcBetweenProcessesByteExact) {
#if RESHARD_HAVE_CUDA
  RunGpuCase(kTp4ToTp2Dp2, "cuda_ipc", "cuda_ipc", 1);
#else
  GTEST_SKIP() << "this build has no CUDA";
#endif
}

TEST(GpuFanout, AutoPicksCudaIpcForDeviceMemory) {
#if RESHARD_HAVE_CUDA
  RunGpuCase(kTp2ToDp2, "auto", "cuda_ipc", 1);
#else
  GTEST_SKIP() << "this build has no CUDA";
#endif
}

TEST(GpuFanout, NcclGroupedSendRecvByteExact) {
#if RESHARD_HAVE_CUDA && RESHARD_HAVE_NCCL
  RunGpuCase(kTp2ToDp2, "nccl", "nccl", 2);
#else
  GTEST_SKIP() << "this build has no NCCL";
#endif
}

}  // namespace
}  // namespace reshard::nvlink
