// The world of GpuStaging (tests/net/gpu_staging_test.cc): four ranks, rows -> columns between
// CUDA buffers, three refits each verified, and every staging statistic checked against what
// the engine must do with them: registered directly when UCX reports CUDA memory (strided
// pieces packed by the GPU into a device staging ring and put into the receivers' device round
// areas, scattered there by one kernel launch per round), otherwise staged (sources packed by
// the GPU into the staging ring, destinations written by the engine from its landing area and
// bounded landing rounds). Device memory comes from cuda::AllocDevice, so the same rank runs on
// a GPU and, with devices emulated on the host (staged or registered), in every build
// (StagedEmulation.TheGpuWorld*): the expectations a GPU session checks are checked on every
// machine first. The same holds for the other worlds here: local copies (LocalWorldRank) and
// relays that stream out of device buffers (RelayWorldRank).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "src/cuda/runtime.h"
#include "src/cuda/staging_ring.h"
#include "src/net/landing.h"
#include "src/net/refit_engine.h"
#include "src/net/runtime.h"
#include "src/plan/fill.h"
#include "src/plan/spec_json.h"
#include "src/rendezvous/file_store.h"

namespace reshard::net::device_world {

inline constexpr char kDeviceSpec[] =
    R"json({"tensors": [{"name": "w", "dtype": "bf16", "shape": [256, 384],
  "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}}]})json";

// Two tensors split rows -> columns: "w" with runs of 1 KiB (packed streams), "v" with runs of
// 8 KiB (puts straight from the staging ring); 512 KiB of sources per rank.
inline constexpr char kDeviceRingSpec[] = R"json({"tensors": [
  {"name": "w", "dtype": "bf16", "shape": [512, 1024],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}},
  {"name": "v", "dtype": "fp32", "shape": [64, 4096],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}}]})json";

// Two ranks that train and serve at once: "l" moves rows -> columns inside each rank (a
// strided local piece of 128 rows of 256 bytes) and to the other rank (as large).
inline constexpr char kLocalSpec[] = R"json({"tensors": [
  {"name": "l", "dtype": "bf16", "shape": [256, 512],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [0, 1], "placements": ["S(1)"]}}]})json";

// One rank of a world of device buffers: its plan, device buffers (cuda::AllocDevice) with
// host mirrors to fill and verify them (the buffers of the `host_side`, if any, are the host
// mirrors themselves: host memory), and its engine.
enum class HostSide { kNone, kSources, kDestinations };

struct DeviceRank {
  int rank = 0;
  std::unique_ptr<plan::Plan> plan;
  std::vector<int64_t> bytes;
  std::vector<std::vector<uint8_t>> host;
  std::vector<BufferView> buffers;
  std::unique_ptr<rendezvous::FileStore> store;
  std::shared_ptr<Runtime> runtime;
  std::unique_ptr<RefitEngine> engine;
  int64_t src_bytes = 0, dst_bytes = 0;  // This rank's, all tensors.

  // 0, or the exit code of the step that failed.
  int SetUp(int r, const std::string& dir, const char* spec_json, const RefitEngineOptions& options,
            HostSide host_side = HostSide::kNone) {
    rank = r;
    auto spec = plan::ParseSpecJson(spec_json);
    if (!spec.ok()) return 10;
    auto built = plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*spec));
    if (!built.ok()) return 10;
    plan = std::make_unique<plan::Plan>(*std::move(built));
    bytes = plan->BufferBytes(rank);
    host.resize(bytes.size());
    for (size_t b = 0; b < bytes.size(); ++b) {
      host[b].assign(bytes[b], 0xA5);
      const bool source = plan->buffers()[b].side == plan::Side::kSrc;
      if (host_side == (source ? HostSide::kSources : HostSide::kDestinations)) {
        buffers.push_back(
            BufferView{bytes[b] > 0 ? host[b].data() : nullptr, bytes[b], MemoryKind::kHost});
        (source ? src_bytes : dst_bytes) += bytes[b];
        continue;
      }
      void* device = nullptr;
      if (bytes[b] > 0) {
        absl::StatusOr<void*> allocated = cuda::AllocDevice(static_cast<size_t>(bytes[b]));
        if (!allocated.ok()) return 11;
        device = *allocated;
      }
      buffers.push_back(BufferView{device, bytes[b], MemoryKind::kCuda});
      (plan->buffers()[b].side == plan::Side::kSrc ? src_bytes : dst_bytes) += bytes[b];
    }
    auto opened = rendezvous::FileStore::Open(dir);
    if (!opened.ok()) return 12;
    store = *std::move(opened);
    auto created = Runtime::Create();
    if (!created.ok()) return 12;
    runtime = *std::move(created);
    auto made = RefitEngine::Create(*plan, rank, *store, runtime, buffers, options);
    if (!made.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, std::string(made.status().message()).c_str());
      return 13;
    }
    engine = *std::move(made);
    return 0;
  }

  uint32_t tensors() const { return static_cast<uint32_t>(plan->spec().tensors.size()); }

  // This rank's source tiles of `epoch`, copied to the device.
  int FillSources(uint64_t epoch) {
    const plan::RefitSpec& s = plan->spec();
    for (uint32_t t = 0; t < tensors(); ++t) {
      const uint32_t b = plan->buffer_of(t, plan::Side::kSrc);
      if (bytes[b] == 0) continue;
      std::fill(host[b].begin(), host[b].end(), 0xA5);
      plan::ForEachTile(s, t, plan::Side::kSrc, [&](int32_t r, const plan::Box& box) {
        if (r == rank) plan::FillTile(s, t, plan::Side::kSrc, box, epoch, host[b].data());
      });
      if (buffers[b].kind == MemoryKind::kCuda &&
          !cuda::CudaCopy(buffers[b].data, host[b].data(), bytes[b]).ok()) {
        return 14;
      }
    }
    return 0;
  }

  // Every destination element of `epoch`, read back from the device.
  int VerifyDestinations(uint64_t epoch) {
    const plan::RefitSpec& s = plan->spec();
    for (uint32_t t = 0; t < tensors(); ++t) {
      const uint32_t dst = plan->buffer_of(t, plan::Side::kDst);
      if (bytes[dst] == 0) continue;
      if (buffers[dst].kind == MemoryKind::kCuda &&
          !cuda::CudaCopy(host[dst].data(), buffers[dst].data, bytes[dst]).ok()) {
        return 16;
      }
      absl::Status st;
      plan::ForEachTile(s, t, plan::Side::kDst, [&](int32_t r, const plan::Box& box) {
        if (r == rank && st.ok()) st = plan::VerifyTile(s, t, box, epoch, rank, host[dst].data());
      });
      if (!st.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, std::string(st.message()).c_str());
        return 17;
      }
    }
    return 0;
  }
};

// `ring_bytes`: RefitEngineOptions::stage_ring_bytes (0: the default); `delivery`:
// RefitEngineOptions::delivery.
inline int DeviceWorldRank(
    int rank, const std::string& dir, const char* spec_json = kDeviceSpec, int64_t ring_bytes = 0,
    RefitEngineOptions::Delivery delivery = RefitEngineOptions::Delivery::kAuto) {
  DeviceRank d;
  RefitEngineOptions options;
  if (ring_bytes > 0) options.stage_ring_bytes = ring_bytes;
  options.delivery = delivery;
  if (int failed = d.SetUp(rank, dir, spec_json, options); failed != 0) return failed;
  const uint32_t tensors = d.tensors();
  const int64_t src_bytes = d.src_bytes, dst_bytes = d.dst_bytes;
  for (uint64_t epoch = 1; epoch <= 3; ++epoch) {
    if (int failed = d.FillSources(epoch); failed != 0) return failed;
    if (!d.engine->Execute(absl::Now() + absl::Seconds(20)).ok()) return 15;
    // Each rank uses CUDA buffers of one side (sources or destinations), registered or staged;
    // staged, every refit packs each source piece into the staging ring, or copies every landed
    // byte to the device.
    const RefitStats& stats = d.engine->last_stats();
    const bool staged = stats.cuda_buffers_staged > 0;
    if (stats.cuda_buffers_registered + stats.cuda_buffers_staged != tensors) return 18;
    if (stats.bytes_staged_to_host != (staged && rank < 2 ? src_bytes : 0)) return 19;
    if (stats.bytes_staged_to_device != (staged && rank >= 2 ? dst_bytes : 0)) return 20;
    // No full-size pinned copies: ring sources have none, and staged destinations are written
    // by the engine, their plain pieces through the landing rounds' area (put delivery) within
    // its budget.
    if (stats.stage_copy_bytes != 0) return 22;
    // Landing rounds: staged destinations take every piece into a pinned area, registered
    // ones (a CUDA-aware UCX) every strided piece, packed streams included (both specs' pieces
    // are strided), into device memory; either way each round is scattered to the destinations
    // by one kernel launch (from the pinned area through its mapping).
    const bool puts = std::string(d.engine->delivery()) == "put";
    const bool rounds = rank >= 2 && puts;
    const bool kernels = cuda::PackKernelsBuilt() || cuda::DevicesEmulatedOnHost();
    if ((stats.stage_landing_bytes > 0) != rounds || stats.stage_landing_bytes > (256 << 20) ||
        (rounds && stats.stage_landing_rounds < 2) ||
        stats.stage_round_scatters != (rounds && kernels ? stats.stage_landing_rounds : 0)) {
      std::fprintf(stderr, "rank %d: landing area of %lld bytes, %lld rounds, %lld scattered\n",
                   rank, static_cast<long long>(stats.stage_landing_bytes),
                   static_cast<long long>(stats.stage_landing_rounds),
                   static_cast<long long>(stats.stage_round_scatters));
      return 23;
    }
    // Active messages: every data message into the destinations (device memory the engine
    // writes, registered or staged) went through the pinned bounce area onto the copy queue.
    const bool bounce = rank >= 2 && !puts;
    if (stats.stage_bounce_bytes != (bounce ? Landing::kBounceSlots * wire::kAmChunkBytes : 0) ||
        stats.bounced_data_messages != (bounce ? stats.data_messages_received : 0) ||
        (bounce && stats.data_messages_received == 0)) {
      std::fprintf(stderr, "rank %d: bounce area of %lld bytes, %lld of %lld data messages\n", rank,
                   static_cast<long long>(stats.stage_bounce_bytes),
                   static_cast<long long>(stats.bounced_data_messages),
                   static_cast<long long>(stats.data_messages_received));
      return 24;
    }
    // The ring: its memory within the budget, every source byte packed once (rows -> columns:
    // each source sends its whole tile in strided pieces), pinned when staged, in device memory
    // when registered (put delivery only), in several batches when the budget is small.
    const bool ring = rank < 2 && (staged || puts);
    const int64_t budget = ring_bytes > 0 ? ring_bytes : int64_t{256} << 20;
    const int64_t packed = ring ? src_bytes : 0;
    if (stats.bytes_ring_packed != packed || (stats.stage_ring_bytes > 0) != ring ||
        stats.stage_ring_bytes > budget ||
        (ring && ring_bytes > 0 && stats.stage_ring_batches < 2 * packed / budget)) {
      std::fprintf(stderr, "rank %d: ring of %lld bytes, %lld batches packed %lld bytes\n", rank,
                   static_cast<long long>(stats.stage_ring_bytes),
                   static_cast<long long>(stats.stage_ring_batches),
                   static_cast<long long>(stats.bytes_ring_packed));
      return 21;
    }
    if (int failed = d.VerifyDestinations(epoch); failed != 0) return failed;
  }
  (void)d.engine->Shutdown(absl::Now() + absl::Seconds(10));
  return 0;
}

// A rank of kLocalSpec's two: its local piece between two device buffers is one strided-copy
// launch, registered (a CUDA-aware UCX) and staged alike; staged, only the piece to the other
// rank is packed into the staging ring, and both pieces count as moved to the device. With
// host memory on one side (`host_side`) the local piece is copied slab by slab on the copy
// queue, except from a staged source, whose staging ring packs it.
inline int LocalWorldRank(int rank, const std::string& dir, HostSide host_side = HostSide::kNone) {
  DeviceRank d;
  RefitEngineOptions options;
  if (int failed = d.SetUp(rank, dir, kLocalSpec, options, host_side); failed != 0) {
    return failed;
  }
  const int64_t local = 256 * 512 * 2 / 4;
  for (uint64_t epoch = 1; epoch <= 3; ++epoch) {
    if (int failed = d.FillSources(epoch); failed != 0) return failed;
    absl::Status done = d.engine->Execute(absl::Now() + absl::Seconds(20));
    if (!done.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, std::string(done.message()).c_str());
      return 15;
    }
    const RefitStats& st = d.engine->last_stats();
    const bool staged = st.cuda_buffers_staged > 0;
    const bool kernels = cuda::PackKernelsBuilt() || cuda::DevicesEmulatedOnHost();
    const bool puts = std::string(d.engine->delivery()) == "put";
    // Device to device: one launch. From a staged source into host memory: through the ring
    // with the piece to the other rank. From a registered one into host memory: slab by slab,
    // synchronously (a rank without CUDA destinations has no copy queue). From host memory
    // into device memory (or device to device without the kernels): slab by slab on the copy
    // queue.
    const bool launch = kernels && host_side == HostSide::kNone;
    const bool ring_local = kernels && staged && host_side == HostSide::kDestinations;
    const int64_t packed = !kernels || !(staged || puts) || host_side == HostSide::kSources ? 0
                           : ring_local ? 2 * local
                                        : local;
    if (st.bytes_local != local || st.local_copy_launches != (launch ? 1 : 0) ||
        st.local_slab_copies != (host_side == HostSide::kSources ||
                                         (!kernels && !ring_local && host_side == HostSide::kNone)
                                     ? 1
                                     : 0) ||
        st.bytes_ring_packed != packed ||
        st.bytes_staged_to_device !=
            (staged && host_side != HostSide::kDestinations ? 2 * local : 0)) {
      std::fprintf(stderr,
                   "rank %d: epoch %llu: %lld local bytes in %lld launches and %lld slab-copied "
                   "pieces, %lld bytes packed into the ring, %lld moved to the device\n",
                   rank, static_cast<unsigned long long>(epoch),
                   static_cast<long long>(st.bytes_local),
                   static_cast<long long>(st.local_copy_launches),
                   static_cast<long long>(st.local_slab_copies),
                   static_cast<long long>(st.bytes_ring_packed),
                   static_cast<long long>(st.bytes_staged_to_device));
      return 18;
    }
    if (int failed = d.VerifyDestinations(epoch); failed != 0) return failed;
  }
  (void)d.engine->Shutdown(absl::Now() + absl::Seconds(10));
  return 0;
}

// Four tensors relayed through three destination domains of two ranks, relays of relays among
// them, from sources 0 and 1: "a" in packed streams (runs of 4 KiB) whose relays are
// contiguous, "c" in contiguous pieces, "s" in plain runs of 16 KiB, "p" in packed streams of
// runs of 512 bytes, its relays too; pieces of 1 MiB.
inline constexpr char kRelaySpec[] =
    R"json({"topology": {"domains": [[0, 1], [2, 3], [4, 5], [6, 7]]}, "tensors": [
  {"name": "a", "dtype": "fp32", "shape": [512, 2048], "src": {"mesh": [0, 1], "placements": ["S(0)"]},
   "dst": {"mesh": [[2, 3], [4, 5], [6, 7]], "placements": ["R", "S(1)"]}},
  {"name": "c", "dtype": "fp32", "shape": [1024, 512], "src": {"mesh": [0, 1], "placements": ["S(0)"]},
   "dst": {"mesh": [[2, 3], [4, 5], [6, 7]], "placements": ["R", "S(0)"]}},
  {"name": "s", "dtype": "fp32", "shape": [128, 8192], "src": {"mesh": [0, 1], "placements": ["S(0)"]},
   "dst": {"mesh": [[2, 3], [4, 5], [6, 7]], "placements": ["R", "S(1)"]}},
  {"name": "p", "dtype": "fp32", "shape": [4096, 256], "src": {"mesh": [0, 1], "placements": ["S(0)"]},
   "dst": {"mesh": [[2, 3], [4, 5], [6, 7]], "placements": ["R", "S(1)"]}}]})json";

// A rank of kRelaySpec's eight (docs/data-plane.md, "Relays"): relays forward the runs their
// feed brought out of CUDA destinations before that piece landed. Staged (UCX cannot register
// CUDA memory), a relay reads the pinned copy its feed lands in, and the sources' pieces, read
// through their staging ring, tell their progress; registered (a CUDA-aware UCX), a strided
// feed lands in rounds of 256 KiB (four or five per piece), each in place once its scatter
// completed, a contiguous or relayed one by puts, in place once its sender's progress came, and
// a relayed packed stream ("p"'s relays of relays) in place once its part that a progress
// message announced was unpacked on the copy queue; with data messages, once a message's copy
// from the bounce area completed.
// The two sources post at a paced rate (a millisecond between progress rounds), so a relay sees
// each piece arrive in steps. Three refits, each byte-exact, destinations poisoned in between;
// every rank that relays forwarded bytes before their piece landed, and, registered, every rank
// that takes a strided piece from a source took landing rounds.
inline int RelayWorldRank(int rank, const std::string& dir, RefitEngineOptions::Delivery delivery) {
  DeviceRank d;
  RefitEngineOptions options;
  options.delivery = delivery;
  // The default 8 MiB would hold a source's whole stream to a rank here in one round, which a
  // relay then waits for whole.
  options.stage_round_bytes = 256 << 10;
  if (int failed = d.SetUp(rank, dir, kRelaySpec, options); failed != 0) return failed;
  int64_t relays = 0, strided = 0;
  for (const plan::Transfer& t : d.plan->transfers()) {
    relays += t.from_rank == rank && plan::IsRelay(t);
    strided += t.to_rank == rank && t.after < 0 && d.plan->region(t.region).num_runs() > 1;
  }
  const bool source = rank < 2;
  int64_t early = 0;
  for (uint64_t epoch = 1; epoch <= 3; ++epoch) {
    if (int failed = d.FillSources(epoch); failed != 0) return failed;
    absl::Status done;
    if (source) {
      done = d.engine->Start(epoch);
      std::vector<uint32_t> landed;
      const absl::Time until = absl::Now() + absl::Seconds(60);
      while (done.ok() && d.engine->in_epoch() && absl::Now() < until) {
        done = d.engine->Progress(&landed);
        absl::SleepFor(absl::Milliseconds(1));
      }
      if (done.ok()) done = d.engine->Wait(absl::Now() + absl::Seconds(60));
    } else {
      done = d.engine->Execute(absl::Now() + absl::Seconds(60));
    }
    if (!done.ok()) {
      std::fprintf(stderr, "rank %d: epoch %llu: %s\n", rank,
                   static_cast<unsigned long long>(epoch), std::string(done.message()).c_str());
      return 15;
    }
    const RefitStats& st = d.engine->last_stats();
    const bool registered = d.runtime->supports_cuda_memory();
    if ((registered ? st.cuda_buffers_staged : st.cuda_buffers_registered) != 0 ||
        (registered && strided > 0 && std::string(d.engine->delivery()) == "put" &&
         st.stage_landing_rounds == 0)) {
      std::fprintf(stderr, "rank %d: %lld CUDA buffers registered, %lld staged, %lld rounds\n",
                   rank, static_cast<long long>(st.cuda_buffers_registered),
                   static_cast<long long>(st.cuda_buffers_staged),
                   static_cast<long long>(st.stage_landing_rounds));
      return 18;
    }
    early += st.relay_early_bytes;
    if (int failed = d.VerifyDestinations(epoch); failed != 0) return failed;
    // The next refit must write every destination byte again.
    for (uint32_t t = 0; t < d.tensors(); ++t) {
      const uint32_t b = d.plan->buffer_of(t, plan::Side::kDst);
      if (d.bytes[b] == 0) continue;
      std::fill(d.host[b].begin(), d.host[b].end(), 0x5A);
      if (!cuda::CudaCopy(d.buffers[b].data, d.host[b].data(), d.bytes[b]).ok()) return 14;
    }
  }
  std::printf("rank %d: %lld relays, %lld bytes forwarded before their piece landed\n", rank,
              static_cast<long long>(relays), static_cast<long long>(early));
  if (relays == 0 ? early != 0 : early == 0) {
    std::fprintf(stderr, "rank %d relays %lld pieces and forwarded %lld bytes before they landed\n",
                 rank, static_cast<long long>(relays), static_cast<long long>(early));
    return 25;
  }
  (void)d.engine->Shutdown(absl::Now() + absl::Seconds(10));
  return 0;
}

}  // namespace reshard::net::device_world
