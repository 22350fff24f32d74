// Device memory through the refit engine: the world of tests/net/device_world.h on a GPU (CUDA
// buffers registered or staged as UCX allows; the statistics say which and count every staging
// copy, and a ring far smaller than the sources forces many batches and slot reuse; the same
// world runs with devices emulated in every build, StagedEmulation.TheGpuWorld*); and
// delta refits of CUDA sources (encoded by the CUDA kernels against a device shadow) into CUDA
// destinations (applied by the kernels, or to a staged buffer's host copy), byte-exact over refits
// that change 5% of the elements, all of them, or none, and through relays that forward the
// streams (or send the plain piece from device memory). Skips without a usable GPU
// (cudaGetDeviceCount error or 0 devices). Ranks are forked processes over UCX shared memory.
#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
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
#include "tests/plan/spec_text.h"
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

// One rank of `plan` for delta refits over cudaMalloc'd buffers (not freed: the rank exits),
// with its store in `dir` and its runtime.
struct DeltaGpuRank {
  std::vector<int64_t> bytes;
  std::vector<BufferView> buffers;
  std::unique_ptr<FileStore> store;
  std::shared_ptr<Runtime> runtime;
  std::unique_ptr<RefitEngine> engine;
};

// 0, or the exit code of the failing step (11 cudaMalloc, 12 store or runtime, 13 the engine).
int OpenDeltaGpuRank(const plan::Plan& plan, int rank, const std::string& dir, DeltaGpuRank* out) {
  out->bytes = plan.BufferBytes(rank);
  for (size_t b = 0; b < out->bytes.size(); ++b) {
    void* device = nullptr;
    if (out->bytes[b] > 0 && cudaMalloc(&device, out->bytes[b]) != cudaSuccess) return 11;
    out->buffers.push_back(BufferView{device, out->bytes[b], MemoryKind::kCuda});
  }
  auto store = FileStore::Open(dir);
  if (!store.ok()) return 12;
  auto runtime = Runtime::Create();
  if (!runtime.ok()) return 12;
  out->store = *std::move(store);
  out->runtime = *std::move(runtime);
  RefitEngineOptions options;
  options.delta = true;
  auto engine = RefitEngine::Create(plan, rank, *out->store, out->runtime, out->buffers, options);
  if (!engine.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, std::string(engine.status().message()).c_str());
    return 13;
  }
  out->engine = *std::move(engine);
  return 0;
}

int DeltaRank(int rank, const std::string& dir) {
  auto spec = plan::ParseSpecJson(kDeviceSpec);
  auto plan = plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*spec));
  if (!plan.ok()) return 10;
  DeltaGpuRank g;
  if (const int failed = OpenDeltaGpuRank(*plan, rank, dir, &g); failed != 0) return failed;
  const std::vector<BufferView>& buffers = g.buffers;
  RefitEngine* engine = g.engine.get();
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
    if (!engine->Execute(absl::Now() + absl::Seconds(20)).ok()) return 15;
    const RefitStats& stats = engine->last_stats();
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
  (void)engine->Shutdown(absl::Now() + absl::Seconds(10));
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
  const std::string dir = testing::ScratchDir(absl::StrCat("gpu-", tag));
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

// Relays out of device buffers forward the runs their feed brought before that piece landed,
// byte-exact (device_world::RelayWorldRank): staged, or registered with a CUDA-aware UCX.
TEST(GpuStaging, RelaysStreamOutOfDeviceBuffersByteExact) {
  RunOnGpu(8, "relays", [](int32_t r, const std::string& dir) {
    return device_world::RelayWorldRank(r, dir, RefitEngineOptions::Delivery::kPut);
  });
}

// Delta refits through relays (docs/delta.md, "Relays forward the stream") between CUDA buffers:
// the 8 ranks of kRelaySpec (fp32 a and b, 512 x 2048, relays between three destination domains,
// relays of relays among them). Element k of tensor t in epoch e: a hash of (t, k) and of the
// number of epochs up to e that changed it (1 and 6 change all, 5 none, the others about 2%).
// After epoch 2 one of the relays' receivers (T) resets alone and after epoch 3 its relay (R),
// so in epoch 3 R sends T its pieces plain, read from its device buffer (with a CUDA-aware UCX;
// from the staged host copy otherwise), and in epoch 4 forwards plain streams. Byte-exact on
// every rank after every epoch; deltas sent and applied by every rank in epochs 2 and 5.
uint32_t RelayValue(size_t tensor, int64_t k, uint64_t epoch) {
  uint64_t version = 0;
  for (uint64_t e = 1; e <= epoch; ++e) {
    const uint64_t h = (static_cast<uint64_t>(k) * 0x9E3779B97F4A7C15ull) ^
                       (e * 0xC2B2AE3D27D4EB4Full) ^ (tensor * 0x165667B19E3779F9ull);
    version += e == 1 || e == 6 || (e != 5 && (h >> 40) % 50 == 0);
  }
  return static_cast<uint32_t>((static_cast<uint64_t>(k) * 2654435761ull) ^ (version * 40503u) ^
                               (tensor << 28));
}

int DeltaRelayRank(int rank, const std::string& dir) {
  auto spec = plan::ParseSpecJson(plan::kRelaySpec);
  if (!spec.ok()) return 10;
  auto plan = plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*spec));
  if (!plan.ok()) return 10;
  const plan::RefitSpec& s = plan->spec();
  // R: the first rank that relays to two ranks or more, T the first of them; what every rank
  // sends and receives as delta streams.
  std::map<int32_t, std::set<int32_t>> targets;
  int64_t sends = 0, receives = 0, r_to_t = 0;
  for (const plan::Transfer& t : plan->transfers()) {
    if (plan::IsRelay(t)) targets[t.from_rank].insert(t.to_rank);
  }
  int32_t relay_from = -1, relay_to = -1;
  for (const auto& [from, to] : targets) {
    if (to.size() >= 2 && relay_from < 0) {
      relay_from = from;
      relay_to = *to.begin();
    }
  }
  if (relay_from < 0) return 10;
  for (const plan::Transfer& t : plan->transfers()) {
    if (plan::DeltaElemBytes(*plan, t) == 0) continue;
    sends += t.from_rank == rank;
    receives += t.to_rank == rank;
    r_to_t += t.from_rank == relay_from && t.to_rank == relay_to;
  }
  DeltaGpuRank g;
  if (const int failed = OpenDeltaGpuRank(*plan, rank, dir, &g); failed != 0) return failed;
  const std::vector<int64_t>& bytes = g.bytes;
  const std::vector<BufferView>& buffers = g.buffers;
  RefitEngine* engine = g.engine.get();
  for (uint64_t epoch = 1; epoch <= 6; ++epoch) {
    for (size_t t = 0; t < s.tensors.size(); ++t) {
      const uint32_t src = plan->buffer_of(t, plan::Side::kSrc);
      if (bytes[src] == 0) continue;
      std::vector<uint32_t> image(static_cast<size_t>(bytes[src] / 4), 0);
      plan::ForEachTile(s, t, plan::Side::kSrc, [&](int32_t holder, const plan::Box& box) {
        if (holder != rank) return;
        plan::ForEachElement(s.tensors[t].src, s.tensors[t].shape, box,
                             [&](int64_t offset, int64_t global) {
                               image[static_cast<size_t>(offset)] = RelayValue(t, global, epoch);
                             });
      });
      if (!cuda::CudaCopy(buffers[src].data, image.data(), image.size() * 4).ok()) return 14;
    }
    const absl::Status refit = engine->Execute(absl::Now() + absl::Seconds(20));
    if (!refit.ok()) {
      std::fprintf(stderr, "rank %d epoch %d: %s\n", rank, static_cast<int>(epoch),
                   refit.ToString().c_str());
      return 15;
    }
    for (size_t t = 0; t < s.tensors.size(); ++t) {
      const uint32_t dst = plan->buffer_of(t, plan::Side::kDst);
      if (bytes[dst] == 0) continue;
      std::vector<uint32_t> got(static_cast<size_t>(bytes[dst] / 4));
      if (!cuda::CudaCopy(got.data(), buffers[dst].data, got.size() * 4).ok()) return 16;
      int64_t wrong = 0;
      plan::ForEachTile(s, t, plan::Side::kDst, [&](int32_t holder, const plan::Box& box) {
        if (holder != rank) return;
        plan::ForEachElement(
            s.tensors[t].dst, s.tensors[t].shape, box, [&](int64_t offset, int64_t global) {
              wrong += got[static_cast<size_t>(offset)] != RelayValue(t, global, epoch);
            });
      });
      if (wrong != 0) {
        std::fprintf(stderr, "rank %d epoch %d: %lld wrong elements of tensor %zu\n", rank,
                     static_cast<int>(epoch), static_cast<long long>(wrong), t);
        return 17;
      }
    }
    const RefitStats& st = engine->last_stats();
    bool expected = true;
    if (epoch == 2 || epoch == 5) {
      expected = st.delta_pieces == sends && st.deltas_applied == receives;
    }
    if (epoch == 3 && rank == relay_from) {
      expected = st.delta_full_receiver_version == r_to_t && st.delta_pieces == sends - r_to_t;
    }
    if (epoch == 4 && rank == relay_from) {
      expected = st.delta_pieces == 0 && st.delta_full_no_base == sends;
    }
    if (!expected) {
      std::fprintf(stderr,
                   "rank %d epoch %d: %lld delta, %lld no base, %lld receiver version, %lld not "
                   "smaller, %lld applied (sends %lld, receives %lld)\n",
                   rank, static_cast<int>(epoch), static_cast<long long>(st.delta_pieces),
                   static_cast<long long>(st.delta_full_no_base),
                   static_cast<long long>(st.delta_full_receiver_version),
                   static_cast<long long>(st.delta_full_not_smaller),
                   static_cast<long long>(st.deltas_applied), static_cast<long long>(sends),
                   static_cast<long long>(receives));
      return 18;
    }
    if ((epoch == 2 && rank == relay_to) || (epoch == 3 && rank == relay_from)) {
      engine->Reset();
    }
  }
  (void)engine->Shutdown(absl::Now() + absl::Seconds(10));
  return 0;
}

TEST(GpuStaging, DeltaRelaysOfDeviceBuffersByteExact) { RunOnGpu(8, "relays", DeltaRelayRank); }

}  // namespace
}  // namespace reshard::net
