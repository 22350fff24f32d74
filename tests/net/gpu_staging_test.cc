// Device memory through the refit engine: CUDA buffers registered directly when UCX reports
// CUDA memory, otherwise staged through pinned host buffers (the statistics say which, and count
// every staging copy); and delta refits of CUDA sources
// (encoded by the CUDA kernels against a device shadow) into CUDA destinations (applied by the
// kernels, or to a staged buffer's host copy), byte-exact over refits that change 5% of the
// elements, all of them, or none. Skips without a usable GPU (cudaGetDeviceCount error or 0
// devices). Ranks are forked processes over UCX shared memory.
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
#include "src/net/refit_engine.h"
#include "src/net/runtime.h"
#include "src/plan/fill.h"
#include "src/plan/spec_json.h"
#include "src/rendezvous/file_store.h"
#include "tests/testing/multiprocess.h"

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
    // Each rank uses one CUDA buffer (its source or its destination), registered or staged;
    // staged, every refit copies the source to the host or every landed byte to the device.
    const RefitStats& stats = (*engine)->last_stats();
    const uint32_t src = plan->buffer_of(0, plan::Side::kSrc);
    const bool staged = stats.cuda_buffers_staged == 1;
    if (stats.cuda_buffers_registered + stats.cuda_buffers_staged != 1) return 18;
    if (stats.bytes_staged_to_host != (staged && rank < 2 ? bytes[src] : 0)) return 19;
    if (stats.bytes_staged_to_device != (staged && rank >= 2 ? bytes[dst] : 0)) return 20;
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
  auto spec = plan::ParseSpecJson(kSpec);
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
  // kSpec: sources 0 and 1 hold rows [128r, 128r + 128) of the 256 x 384 tensor, destinations 2
  // and 3 columns [192(r - 2), 192(r - 2) + 192), row-major.
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

TEST(GpuStaging, DeltaRefitsOfDeviceBuffersByteExact) {
  std::string why;
  if (testing::ProbeCudaDevices(&why) == 0) GTEST_SKIP() << "no usable GPU: " << why;
  std::random_device rd;
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/reshard-gpu-delta-", getpid(), "-", rd());
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(4), [&](int32_t r) { return DeltaRank(r, dir); },
      testing::SharedMemoryUcx(absl::Seconds(120)));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

}  // namespace
}  // namespace reshard::net
