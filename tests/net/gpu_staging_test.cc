// Device memory through the refit engine: CUDA buffers registered directly when UCX reports
// CUDA memory (strided pieces packed by the GPU into a device staging ring and put into the
// receivers' device round areas), otherwise staged (sources packed by the GPU into the staging
// ring, destinations written by the engine from its bounded landing rounds; the statistics say
// which, and count every
// staging copy, and a ring far smaller than the sources forces many batches and slot reuse); and
// delta refits of CUDA sources (encoded by the CUDA kernels against a device shadow) into CUDA
// destinations (applied by the kernels, or to a staged buffer's host copy), byte-exact over refits
// that change 5% of the elements, all of them, or none. Skips without a usable GPU
// (cudaGetDeviceCount error or 0 devices). Ranks are forked processes over UCX shared memory.
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
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
#include "tests/testing/multiprocess.h"

namespace reshard::net {
namespace {

using rendezvous::FileStore;

constexpr char kSpec[] = R"json({"tensors": [{"name": "w", "dtype": "bf16", "shape": [256, 384],
  "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}}]})json";

// Two tensors split rows -> columns: "w" with runs of 1 KiB (packed streams), "v" with runs of
// 8 KiB (puts straight from the staging ring); 512 KiB of sources per rank.
constexpr char kRingSpec[] = R"json({"tensors": [
  {"name": "w", "dtype": "bf16", "shape": [512, 1024],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}},
  {"name": "v", "dtype": "fp32", "shape": [64, 4096],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}}]})json";

// `ring_bytes`: RefitEngineOptions::stage_ring_bytes (0: the default).
int Rank(int rank, const std::string& dir, const char* spec_json = kSpec, int64_t ring_bytes = 0) {
  auto spec = plan::ParseSpecJson(spec_json);
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
  RefitEngineOptions options;
  if (ring_bytes > 0) options.stage_ring_bytes = ring_bytes;
  auto engine = RefitEngine::Create(*plan, rank, **store, *runtime, buffers, options);
  if (!engine.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(engine.status().message()).c_str());
    return 13;
  }
  const uint32_t tensors = static_cast<uint32_t>(s.tensors.size());
  int64_t src_bytes = 0, dst_bytes = 0;  // This rank's, all tensors.
  for (size_t b = 0; b < bytes.size(); ++b) {
    (plan->buffers()[b].side == plan::Side::kSrc ? src_bytes : dst_bytes) += bytes[b];
  }
  for (uint64_t epoch = 1; epoch <= 3; ++epoch) {
    for (uint32_t t = 0; t < tensors; ++t) {
      const uint32_t b = plan->buffer_of(t, plan::Side::kSrc);
      if (bytes[b] == 0) continue;
      std::fill(host[b].begin(), host[b].end(), 0xA5);
      plan::ForEachTile(s, t, plan::Side::kSrc, [&](int32_t r, const plan::Box& box) {
        if (r == rank) plan::FillTile(s, t, plan::Side::kSrc, box, epoch, host[b].data());
      });
      if (!cuda::CudaCopy(buffers[b].data, host[b].data(), bytes[b]).ok()) return 14;
    }
    if (!(*engine)->Execute(absl::Now() + absl::Seconds(20)).ok()) return 15;
    // Each rank uses CUDA buffers of one side (sources or destinations), registered or staged;
    // staged, every refit packs each source piece into the staging ring, or copies every landed
    // byte to the device.
    const RefitStats& stats = (*engine)->last_stats();
    const bool staged = stats.cuda_buffers_staged > 0;
    if (stats.cuda_buffers_registered + stats.cuda_buffers_staged != tensors) return 18;
    if (stats.bytes_staged_to_host != (staged && rank < 2 ? src_bytes : 0)) return 19;
    if (stats.bytes_staged_to_device != (staged && rank >= 2 ? dst_bytes : 0)) return 20;
    // No full-size pinned copies: ring sources have none, and staged destinations are written
    // by the engine, their plain pieces through the landing rounds' area (put delivery) within
    // its budget.
    if (stats.stage_copy_bytes != 0) return 22;
    // Registered (a CUDA-aware UCX), the strided plain pieces ("v" of kRingSpec, runs of 8 KiB)
    // also travel in rounds, into device memory, packed by the sender into a device ring.
    const bool puts = std::string((*engine)->delivery()) == "put";
    const bool strided = puts && tensors == 2;
    const bool rounds = rank >= 2 && puts && (staged || strided);
    if ((stats.stage_landing_bytes > 0) != rounds || stats.stage_landing_bytes > (256 << 20) ||
        (rounds && stats.stage_landing_rounds < 2)) {
      return 23;
    }
    // The ring: its pinned memory within the budget, every source byte packed once (rows ->
    // columns: each source sends its whole tile), in several batches when the budget is small.
    const bool ring = rank < 2 && (staged || strided);
    const int64_t budget = ring_bytes > 0 ? ring_bytes : int64_t{256} << 20;
    const int64_t packed = staged ? stats.bytes_staged_to_host
                                  : (ring ? bytes[plan->buffer_of(1, plan::Side::kSrc)] : 0);
    if (stats.bytes_ring_packed != packed || (stats.stage_ring_bytes > 0) != ring ||
        stats.stage_ring_bytes > budget ||
        (ring && ring_bytes > 0 && stats.stage_ring_batches < 2 * packed / budget)) {
      std::fprintf(stderr, "rank %d: ring of %lld bytes, %lld batches packed %lld bytes\n", rank,
                   static_cast<long long>(stats.stage_ring_bytes),
                   static_cast<long long>(stats.stage_ring_batches),
                   static_cast<long long>(stats.bytes_ring_packed));
      return 21;
    }
    for (uint32_t t = 0; t < tensors; ++t) {
      const uint32_t dst = plan->buffer_of(t, plan::Side::kDst);
      if (bytes[dst] == 0) continue;
      if (!cuda::CudaCopy(host[dst].data(), buffers[dst].data, bytes[dst]).ok()) return 16;
      absl::Status st;
      plan::ForEachTile(s, t, plan::Side::kDst, [&](int32_t r, const plan::Box& box) {
        if (r == rank && st.ok()) st = plan::VerifyTile(s, t, box, epoch, rank, host[dst].data());
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

// A staged refit whose staging ring (64 KiB: two slots of 32 KiB, runs cut at 32 KiB) is far
// smaller than the 512 KiB each source sends: many batches, every slot reused several times per
// refit, packed streams and plain runs both read from the ring; byte-exact over three refits.
TEST(GpuStaging, StagingRingRowsToColumnsInManyBatchesByteExact) {
  std::string why;
  if (testing::ProbeCudaDevices(&why) == 0) GTEST_SKIP() << "no usable GPU: " << why;
  std::random_device rd;
  const std::string dir =
      absl::StrCat(::testing::TempDir(), "/reshard-gpu-ring-", getpid(), "-", rd());
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(4), [&](int32_t r) { return Rank(r, dir, kRingSpec, int64_t{64} << 10); },
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
