// Device memory through the refit engine: the world of tests/net/device_world.h on a GPU (CUDA
// buffers registered or staged as UCX allows; the statistics say which and count every staging
// copy, and a ring far smaller than the sources forces many batches and slot reuse; the same
// world runs with devices emulated in every build, StagedEmulation.TheGpuWorld*); and
// delta refits of CUDA sources (encoded by the CUDA kernels against a device shadow) into CUDA
// destinations (applied by the kernels, or to a staged buffer's host copy), byte-exact over refits
// that change 5% of the elements, all of them, or none. Skips without a usable GPU
// (cudaGetDeviceCount error or 0 devices). Ranks are forked processes over UCX shared memory.
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "src/cuda/runtime.h"
#include "src/net/refit_engine.h"
#include "src/net/runtime.h"
#include "src/plan/fill.h"
#include "src/plan/spec_json.h"
#include "src/rendezvous/file_store.h"
#include "tests/net/device_world.h"
#include "tests/testing/multiprocess.h"

namespace reshard::net {
namespace {

using rendezvous::FileStore;

using device_world::DeviceWorldRank;
using device_world::kDeviceRingSpec;
using device_world::kDeviceSpec;

// Delta refits: the global 256 x 384 bf16 tensor of epoch e, element k: its bits follow the
// number of epochs up to e that changed it (epoch 1 sets all; epoch 3 changes all; epoch 5
// none; the others about 5%).
uint16_t DeltaValue(int64_t k, uint64_t epoch) {
  uint64_t version = 0;
  for (uint64_t e = 1; e <= epoch; ++e) {
    const uint64_t h =
        (static_cast<uint64_t>(k) * 0x9E3779B97F4A7C15ull) ^ (e * 0xC2B2AE3D27D4EB4Full);
    const bool changed = e == 1 || e == 3 || (e != 5 && (h >> 40) % 20 == 0);
    version += changed;
  }
  return static_cast<uint16_t>((static_cast<uint64_t>(k) * 2654435761ull) ^ (version * 40503u));
}

int DeltaRank(int rank, const std::string& dir) {
  auto spec = plan::ParseSpecJson(kDeviceSpec);
  auto plan = plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*spec));
  if (!plan.ok()) return 10;
  const std::vector<int64_t> bytes = plan->BufferBytes(rank);
  std::vector<BufferView> buffers;
  for (size_t b = 0; b < bytes.size(); ++b) {
    void* device = nullptr;
    if (bytes[b] > 0 && cudaMalloc(&device, bytes[b]) != cudaSuccess) return 11;
    buffers.push_back(BufferView{device, bytes[b], MemoryKind::kCuda});
  }
  auto store = FileStore::Open(dir);
  if (!store.ok()) return 12;
  auto runtime = Runtime::Create();
  if (!runtime.ok()) return 12;
  RefitEngineOptions options;
  options.delta = true;
  auto engine = RefitEngine::Create(*plan, rank, **store, *runtime, buffers, options);
  if (!engine.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(engine.status().message()).c_str());
    return 13;
  }
  // kDeviceSpec: sources 0 and 1 hold rows [128r, 128r + 128) of the 256 x 384 tensor, destinations
  // 2 and 3 columns [192(r - 2), 192(r - 2) + 192), row-major.
  const uint32_t src = plan->buffer_of(0, plan::Side::kSrc);
  const uint32_t dst = plan->buffer_of(0, plan::Side::kDst);
  int64_t deltas = 0;
  for (uint64_t epoch = 1; epoch <= 6; ++epoch) {
    if (rank < 2) {
      std::vector<uint16_t> tile(128 * 384);
      for (int64_t i = 0; i < 128; ++i) {
        for (int64_t j = 0; j < 384; ++j)
          tile[i * 384 + j] = DeltaValue((rank * 128 + i) * 384 + j, epoch);
      }
      if (!cuda::CudaCopy(buffers[src].data, tile.data(), tile.size() * 2).ok()) return 14;
    }
    if (!(*engine)->Execute(absl::Now() + absl::Seconds(20)).ok()) return 15;
    const RefitStats& stats = (*engine)->last_stats();
    deltas += rank < 2 ? stats.delta_pieces : stats.deltas_applied;
    // Pieces encoded on the GPU (a build with the kernels) keep no host shadow, and go through
    // the pipeline's pinned slots.
    if (rank < 2 && stats.delta_device_shadow_bytes > 0 &&
        (stats.delta_device_shadow_bytes != stats.delta_shadow_bytes ||
         stats.delta_pinned_bytes <= 0)) {
      std::fprintf(stderr, "rank %d: shadow %lld bytes, %lld on the device, pinned %lld\n", rank,
                   static_cast<long long>(stats.delta_shadow_bytes),
                   static_cast<long long>(stats.delta_device_shadow_bytes),
                   static_cast<long long>(stats.delta_pinned_bytes));
      return 19;
    }
    if (rank >= 2) {
      std::vector<uint16_t> got(256 * 192);
      if (!cuda::CudaCopy(got.data(), buffers[dst].data, got.size() * 2).ok()) return 16;
      for (int64_t i = 0; i < 256; ++i) {
        for (int64_t j = 0; j < 192; ++j) {
          const int64_t k = i * 384 + (rank - 2) * 192 + j;
          if (got[i * 192 + j] != DeltaValue(k, epoch)) {
            std::fprintf(stderr, "rank %d epoch %d: element (%d, %d) is %04x, not %04x\n", rank,
                         static_cast<int>(epoch), static_cast<int>(i), static_cast<int>(k % 384),
                         got[i * 192 + j], DeltaValue(k, epoch));
            return 17;
          }
        }
      }
    }
  }
  (void)(*engine)->Shutdown(absl::Now() + absl::Seconds(10));
  // Epochs 2, 4, 5 and 6 send and apply deltas (epoch 1 has no base; epoch 3 changed all).
  if (deltas == 0) {
    std::fprintf(stderr, "rank %d: no delta was %s\n", rank, rank < 2 ? "sent" : "applied");
    return 18;
  }
  return 0;
}

// Runs `rank_main(rank, dir)` in `ranks` forked ranks over UCX shared memory, each expected to
// exit 0; skips the test without a usable GPU (probed in a child: the CUDA runtime must not be
// initialised before the ranks fork).
void RunOnGpu(int ranks, const std::string& tag,
              const std::function<int(int32_t, const std::string&)>& rank_main) {
  std::string why;
  if (testing::ProbeCudaDevices(&why) == 0) GTEST_SKIP() << "no usable GPU: " << why;
  std::random_device rd;
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/reshard-gpu-", tag, "-", getpid(), "-", rd());
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(ranks), [&](int32_t r) { return rank_main(r, dir); },
      testing::SharedMemoryUcx(absl::Seconds(120)));
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

TEST(GpuStaging, DeviceBuffersRefitByteExact) {
  RunOnGpu(4, "world", [](int32_t r, const std::string& dir) { return DeviceWorldRank(r, dir); });
}

// A staged refit whose staging ring (64 KiB: eight slots of 8 KiB, runs cut at 8 KiB) is far
// smaller than the 512 KiB each source sends: many batches, every slot reused several times per
// refit, packed streams and plain runs both read from the ring; byte-exact over three refits.
TEST(GpuStaging, StagingRingRowsToColumnsInManyBatchesByteExact) {
  RunOnGpu(4, "ring", [](int32_t r, const std::string& dir) {
    return DeviceWorldRank(r, dir, kDeviceRingSpec, int64_t{64} << 10);
  });
}

// Two ranks that train and serve at once: each one's strided local piece is one strided-copy
// launch between its device buffers, registered or staged (device_world::LocalWorldRank).
TEST(GpuStaging, LocalPiecesCopyInOneLaunchByteExact) {
  RunOnGpu(2, "local",
           [](int32_t r, const std::string& dir) { return device_world::LocalWorldRank(r, dir); });
}

// The same ranks with host memory on one side: each local piece slab by slab on the copy
// queue (from a staged source into host memory: through its staging ring).
TEST(GpuStaging, LocalPiecesWithHostMemoryOnOneSideCopySlabBySlabByteExact) {
  for (device_world::HostSide side :
       {device_world::HostSide::kSources, device_world::HostSide::kDestinations}) {
    RunOnGpu(2, "local-host", [side](int32_t r, const std::string& dir) {
      return device_world::LocalWorldRank(r, dir, side);
    });
  }
}

// Active-message delivery (as over tcp without RDMA): each data message into the device
// destinations is copied into a pinned bounce slot and moved to the device on the copy queue,
// never by a synchronous copy; byte-exact over three refits.
TEST(GpuStaging, ActiveMessagesIntoDeviceBuffersByteExact) {
  RunOnGpu(4, "am", [](int32_t r, const std::string& dir) {
    return DeviceWorldRank(r, dir, device_world::kDeviceSpec, 0,
                           RefitEngineOptions::Delivery::kActiveMessage);
  });
}

TEST(GpuStaging, DeltaRefitsOfDeviceBuffersByteExact) { RunOnGpu(4, "delta", DeltaRank); }

}  // namespace
}  // namespace reshard::net
