// Device memory through the refit engine: CUDA buffers registered directly when UCX reports
// CUDA memory, otherwise staged through pinned host buffers. Skips without a usable GPU
// (cudaGetDeviceCount error or 0 devices). Ranks are forked processes over UCX shared memory.
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "src/cuda/runtime.h"
#include "src/rendezvous/file_store.h"
#include "src/net/refit_engine.h"
#include "tests/testing/multiprocess.h"
#include "src/net/runtime.h"
#include "src/plan/fill.h"
#include "src/plan/spec_json.h"

namespace reshard::net {
namespace {

using rendezvous::FileStore;

constexpr char kSpec[] = R"json({"tensors": [{"name": "w", "dtype": "bf16", "shape": [256, 384],
  "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}}]})json";

int Rank(int rank, const std::string& dir) {
  auto spec = plan::ParseSpecJson(kSpec);
  auto plan = plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*spec));
  if (!plan.ok()) return 10;
  const std::vector<int64_t> bytes = plan->BufferBytes(rank);
  std::vector<std::vector<uint8_t>> host(bytes.size());
  std::vector<BufferView> buffers;
  for (size_t b = 0; b < bytes.size(); ++b) {
    host[b].assign(bytes[b], 0xA5);
    void* device = nullptr;
    if (bytes[b] > 0 && cudaMalloc(&device, bytes[b]) != cudaSuccess) return 11;
    buffers.push_back(BufferView{device, bytes[b], MemoryKind::kCuda});
  }
  const plan::RefitSpec& s = plan->spec();
  auto store = FileStore::Open(dir);
  if (!store.ok()) return 12;
  auto runtime = Runtime::Create();
  if (!runtime.ok()) return 12;
  auto engine = RefitEngine::Create(*plan, rank, **store, *runtime, buffers);
  if (!engine.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(engine.status().message()).c_str());
    return 13;
  }
  for (uint64_t epoch = 1; epoch <= 3; ++epoch) {
    for (size_t b = 0; b < bytes.size(); ++b) {
      if (bytes[b] == 0) continue;
      std::fill(host[b].begin(), host[b].end(), 0xA5);
      if (plan->buffers()[b].side == plan::Side::kSrc) {
        plan::ForEachTile(s, 0, plan::Side::kSrc, [&](int32_t r, const plan::Box& box) {
          if (r == rank) plan::FillTile(s, 0, plan::Side::kSrc, box, epoch, host[b].data());
        });
      }
      if (!cuda::CudaCopy(buffers[b].data, host[b].data(), bytes[b]).ok()) return 14;
    }
    if (!(*engine)->Execute(absl::Now() + absl::Seconds(20)).ok()) return 15;
    const uint32_t dst = plan->buffer_of(0, plan::Side::kDst);
    if (bytes[dst] > 0) {
      if (!cuda::CudaCopy(host[dst].data(), buffers[dst].data, bytes[dst]).ok()) return 16;
      absl::Status st;
      plan::ForEachTile(s, 0, plan::Side::kDst, [&](int32_t r, const plan::Box& box) {
        if (r == rank && st.ok()) st = plan::VerifyTile(s, 0, box, epoch, rank, host[dst].data());
      });
      if (!st.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, std::string(st.message()).c_str());
        return 17;
      }
    }
  }
  (void)(*engine)->Shutdown(absl::Now() + absl::Seconds(10));
  return 0;
}

TEST(GpuStaging, DeviceBuffersRefitByteExact) {
  // Probed in a child: the CUDA runtime must not be initialised before the ranks fork.
  std::string why;
  if (testing::ProbeCudaDevices(&why) == 0) GTEST_SKIP() << "no usable GPU: " << why;
  std::random_device rd;
  const std::string dir = absl::StrCat(::testing::TempDir(), "/reshard-gpu-", getpid(), "-", rd());
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(4), [&](int32_t r) { return Rank(r, dir); },
      testing::SharedMemoryUcx(absl::Seconds(120)));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

}  // namespace
}  // namespace reshard::net
