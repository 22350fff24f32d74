// The refit engine's staging of CUDA buffers, on machines without a GPU: with devices emulated
// on the host (cuda::EmulateDevicesOnHost, src/cuda/runtime.h) the "device" buffers are host
// memory marked MemoryKind::kCuda and UCX cannot register them. Sources go through a 64 KiB
// staging ring whose batches the kernels' arithmetic packs on the host, late (at the first poll
// of the slot's event, which completes only at the next); destinations are written by the engine
// from its landing rounds, the landing area or data messages, on a copy queue whose copies run
// as late; delta refits (no delta kernels here) stage sources whole and apply to destinations'
// host copies. The paths GpuStaging runs on a device run here with put delivery and active
// messages, byte-exact over several refits, with packed streams and plain runs, an aborted
// epoch, and the statistics that count every staging copy. Ranks are forked processes over UCX
// shared memory.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "src/cuda/batch_plan.h"
#include "src/cuda/runtime.h"
#include "src/net/landing.h"
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

// Two tensors split rows -> columns between ranks {0, 1} and {2, 3}: "w" with runs of 1 KiB
// (packed streams, below the default pack_below_run_bytes), "v" with runs of 8 KiB (plain
// runs); and "e", whose destination rank 3 receives from both sources and rank 2 nothing.
constexpr char kSpec[] = R"json({"tensors": [
  {"name": "w", "dtype": "bf16", "shape": [512, 1024],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}},
  {"name": "v", "dtype": "fp32", "shape": [64, 4096],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}},
  {"name": "e", "dtype": "fp32", "shape": [32, 96],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [3], "placements": ["R"]}}]})json";

constexpr int64_t kRingBytes = 64 << 10;  // Two slots of 32 KiB.

void Say(int rank, const std::string& what) {
  std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
}

struct World {
  RefitEngineOptions::Delivery delivery = RefitEngineOptions::Delivery::kPut;
  bool delta = false;
  int64_t landing_bytes = 0;  // RefitEngineOptions::stage_landing_bytes (0: the default).
  // An epoch that rank 3 aborts while its rounds are under way (0: none): every rank that fails
  // it resets, and the next refits are byte-exact again.
  uint64_t abort_epoch = 0;
  // The emulated devices stand for a CUDA-aware UCX: every buffer is registered, none staged.
  bool registered = false;
  // Landing rounds copied out by the copy engines, one 2-D copy per slab, instead of one
  // scatter-kernel launch each (RefitEngineOptions::scatter_rounds_by_kernel = false).
  bool slab_copies = false;
  int64_t round_bytes = 0;  // RefitEngineOptions::stage_round_bytes (0: the default).
};

// A rank's plan of `spec_json` and its buffers: host memory marked CUDA (the devices emulated,
// standing for a CUDA-aware UCX when `registered`), and its store and runtime.
struct EmulatedRank {
  std::unique_ptr<plan::Plan> plan;
  std::vector<int64_t> bytes;
  std::vector<std::vector<uint8_t>> memory;
  std::vector<BufferView> buffers;
  int64_t src_bytes = 0, dst_bytes = 0;
  std::unique_ptr<rendezvous::Store> store;
  std::shared_ptr<Runtime> runtime;
};

// 0, or the exit code of the failing step.
int SetUpEmulatedRank(int rank, const std::string& dir, const char* spec_json, bool registered,
                      EmulatedRank* out) {
  cuda::EmulateDevicesOnHost(true, registered);
  auto spec = plan::ParseSpecJson(spec_json);
  if (!spec.ok()) return 10;
  auto plan = plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*spec));
  if (!plan.ok()) return 10;
  out->plan = std::make_unique<plan::Plan>(*std::move(plan));
  out->bytes = out->plan->BufferBytes(rank);
  out->memory.resize(out->bytes.size());
  for (size_t b = 0; b < out->bytes.size(); ++b) {
    out->memory[b].assign(static_cast<size_t>(out->bytes[b]), 0xA5);
    out->buffers.push_back(BufferView{out->memory[b].data(), out->bytes[b], MemoryKind::kCuda});
    (out->plan->buffers()[b].side == plan::Side::kSrc ? out->src_bytes : out->dst_bytes) +=
        out->bytes[b];
  }
  auto store = FileStore::Open(dir);
  auto runtime = Runtime::Create();
  if (!store.ok() || !runtime.ok()) return 12;
  out->store = *std::move(store);
  out->runtime = *std::move(runtime);
  return 0;
}

// Verifies tensor `t`'s destination tiles of this rank against `values` (0, or 17 after saying
// what differs), then poisons the buffer: the next refit must write every byte again.
int VerifyAndPoison(EmulatedRank& e, int rank, uint32_t t, uint64_t values, uint64_t epoch) {
  const plan::RefitSpec& s = e.plan->spec();
  const uint32_t dst = e.plan->buffer_of(t, plan::Side::kDst);
  if (e.bytes[dst] == 0) return 0;
  absl::Status verified;
  plan::ForEachTile(s, t, plan::Side::kDst, [&](int32_t r, const plan::Box& box) {
    if (r == rank && verified.ok()) {
      verified = plan::VerifyTile(s, t, box, values, rank, e.memory[dst].data());
    }
  });
  if (!verified.ok()) {
    Say(rank, absl::StrCat("epoch ", epoch, ": ", verified.message()));
    return 17;
  }
  std::memset(e.memory[dst].data(), 0x5A, e.memory[dst].size());
  return 0;
}

// One rank: host buffers marked CUDA, four refits, each verified.
int Rank(int rank, const std::string& dir, const World& world) {
  const bool delta = world.delta;
  EmulatedRank e;
  if (int failed = SetUpEmulatedRank(rank, dir, kSpec, world.registered, &e); failed != 0) {
    return failed;
  }
  const plan::Plan* plan = e.plan.get();
  const plan::RefitSpec& s = plan->spec();
  const std::vector<int64_t>& bytes = e.bytes;
  std::vector<std::vector<uint8_t>>& memory = e.memory;
  const int64_t src_bytes = e.src_bytes, dst_bytes = e.dst_bytes;
  RefitEngineOptions options;
  options.delivery = world.delivery;
  options.delta = delta;
  if (world.landing_bytes > 0) options.stage_landing_bytes = world.landing_bytes;
  if (world.round_bytes > 0) options.stage_round_bytes = world.round_bytes;
  options.scatter_rounds_by_kernel = !world.slab_copies;
  // A staging ring far smaller than the sources: many batches, every slot reused.
  options.stage_ring_bytes = kRingBytes;
  const bool puts = world.delivery == RefitEngineOptions::Delivery::kPut;
  auto engine = RefitEngine::Create(*plan, rank, *e.store, e.runtime, e.buffers, options);
  if (!engine.ok()) {
    Say(rank, std::string(engine.status().message()));
    return 13;
  }
  const auto tensors = static_cast<uint32_t>(s.tensors.size());
  for (uint64_t epoch = 1; epoch <= 4; ++epoch) {
    // Delta refits: epoch 3 sends the same values as epoch 2 (every segment a delta of nothing).
    const uint64_t values = delta && epoch == 3 ? 2 : epoch;
    for (uint32_t t = 0; t < tensors; ++t) {
      const uint32_t b = plan->buffer_of(t, plan::Side::kSrc);
      if (bytes[b] == 0) continue;
      plan::ForEachTile(s, t, plan::Side::kSrc, [&](int32_t r, const plan::Box& box) {
        if (r == rank) plan::FillTile(s, t, plan::Side::kSrc, box, values, memory[b].data());
      });
    }
    if (epoch == world.abort_epoch) {
      absl::Status failed;
      if (rank == 3) {
        if (!(*engine)->Start(epoch).ok()) return 30;
        std::vector<uint32_t> landed;
        bool progressed = false;
        // Some rounds copied out (of 34), most still to come.
        const absl::Time until = absl::Now() + absl::Seconds(10);
        while ((*engine)->last_stats().stage_landing_rounds < 4 && absl::Now() < until) {
          (void)(*engine)->Progress(&landed, &progressed);
        }
        if ((*engine)->last_stats().stage_landing_rounds < 4) return 32;
        (*engine)->Abort(epoch, absl::AbortedError("a test aborts it"));
        failed = (*engine)->Wait(absl::Now() + absl::Seconds(30));
        if (failed.ok()) return 31;
      } else {
        failed = (*engine)->Execute(absl::Now() + absl::Seconds(30));
      }
      // A rank that finished its part keeps it (rank 2 may); the others start again.
      if (!failed.ok()) (*engine)->Reset();
      continue;
    }
    absl::Status done = (*engine)->Execute(absl::Now() + absl::Seconds(30));
    if (!done.ok()) {
      Say(rank, absl::StrCat("epoch ", epoch, ": ", done.message()));
      return 15;
    }
    // Every buffer is staged. Sources are packed batch by batch into the staging ring (delta
    // refits, which need the GPU delta encode emulated devices lack, copy them whole to host
    // copies). Every destination byte is moved to the device by the engine: a destination keeps
    // a full-size host copy only for delta streams; otherwise, with puts, its plain pieces came
    // through the landing rounds' area (within its budget; many rounds when it is small), each
    // round scattered to the device by one kernel launch reading the area through its mapping.
    const RefitStats& st = (*engine)->last_stats();
    const bool source = rank < 2;
    const bool ring = source && !delta;
    const bool rounds = !source && puts && !delta;
    const int64_t budget = world.landing_bytes > 0 ? world.landing_bytes : int64_t{256} << 20;
    const int64_t copies = ring ? 0 : source ? src_bytes : delta ? dst_bytes : 0;
    // Small rounds: a small area or small stage_round_bytes.
    const bool small = world.landing_bytes > 0 || world.round_bytes > 0;
    const int64_t least_rounds = !rounds ? 0 : small ? 16 : 2;
    if (world.registered) {
      // A CUDA-aware UCX: every buffer registered, nothing staged. The strided pieces, plain
      // ("v", runs of 8 KiB) and packed ("w", runs of 1 KiB), are packed into the device ring
      // (its slots hold 4 runs of "v") and land in the receivers' device round areas, each
      // round scattered by one kernel launch (emulated: late, on the copy queue): a ring
      // part leaves as one put per round it touches, not one per run, and no stream passes
      // through host memory. "e" is contiguous: put as before. Active messages (no puts, no
      // rounds) carry them all as data messages.
      const int64_t v_bytes = bytes[plan->buffer_of(1, plan::Side::kSrc)];
      const int64_t w_bytes = bytes[plan->buffer_of(0, plan::Side::kSrc)];
      // Every put but the one of "e" carries a whole ring part (8 KiB, a slot) or a whole
      // round when rounds are smaller: never one run of 1 KiB.
      const int64_t slot = cuda::SlotBytes(kRingBytes, cuda::kStageRingSlots);
      const int64_t put_bytes =
          std::min<int64_t>(slot, world.round_bytes > 0 ? world.round_bytes : slot);
      const int64_t least_rounds = small ? 16 : 2;
      const bool ok =
          st.cuda_buffers_registered == (rank == 2 ? 2 : 3) && st.cuda_buffers_staged == 0 &&
          st.bytes_staged_to_host == 0 && st.bytes_staged_to_device == 0 &&
          st.stage_copy_bytes == 0 &&
          (!puts ? st.stage_ring_bytes == 0 && st.bytes_ring_packed == 0 &&
                       st.stage_landing_bytes == 0 && st.stage_landing_rounds == 0
           : source
               ? st.stage_ring_bytes == kRingBytes && st.bytes_ring_packed == v_bytes + w_bytes &&
                     st.stage_ring_batches >= (v_bytes + w_bytes) / kRingBytes * 2 &&
                     st.stage_landing_bytes == 0 && st.puts <= (v_bytes + w_bytes) / put_bytes + 1
               : st.stage_ring_bytes == 0 && st.stage_landing_bytes > 0 &&
                     st.stage_landing_bytes <= budget && st.stage_landing_rounds >= least_rounds &&
                     st.stage_round_scatters == (world.slab_copies ? 0 : st.stage_landing_rounds));
      if (!ok) {
        Say(rank,
            absl::StrCat("epoch ", epoch, ": ", st.cuda_buffers_registered, " registered, ",
                         st.cuda_buffers_staged, " staged, ", st.bytes_staged_to_host,
                         " bytes to the host, ", st.bytes_staged_to_device,
                         " to the device, copies of ", st.stage_copy_bytes, " bytes, ring ",
                         st.stage_ring_bytes, " in ", st.stage_ring_batches, " batches, ",
                         st.bytes_ring_packed, " bytes packed, ", st.puts, " puts, landing area ",
                         st.stage_landing_bytes, " bytes in ", st.stage_landing_rounds, " rounds, ",
                         st.stage_round_scatters, " scattered by the kernel (sources ", src_bytes,
                         ", destinations ", dst_bytes, ")"));
        return 18;
      }
    } else if (st.cuda_buffers_registered != 0 || st.cuda_buffers_staged != (rank == 2 ? 2 : 3) ||
               st.bytes_staged_to_host != (source ? src_bytes : 0) ||
               st.bytes_staged_to_device != (source ? 0 : dst_bytes) ||
               st.stage_copy_bytes != copies || st.stage_ring_bytes != (ring ? kRingBytes : 0) ||
               st.bytes_ring_packed != (ring ? src_bytes : 0) ||
               st.stage_ring_batches < (ring ? 2 * src_bytes / kRingBytes : 0) ||
               (st.stage_landing_bytes > 0) != rounds || st.stage_landing_bytes > budget ||
               st.stage_landing_rounds < least_rounds ||
               (!rounds && st.stage_landing_rounds != 0) ||
               st.stage_round_scatters != (world.slab_copies ? 0 : st.stage_landing_rounds)) {
      Say(rank,
          absl::StrCat(
              "epoch ", epoch, ": ", st.cuda_buffers_registered, " registered, ",
              st.cuda_buffers_staged, " staged, ", st.bytes_staged_to_host, " bytes to the host, ",
              st.bytes_staged_to_device, " to the device, copies of ", st.stage_copy_bytes,
              " bytes, ring ", st.stage_ring_bytes, " in ", st.stage_ring_batches, " batches, ",
              st.bytes_ring_packed, " bytes packed, landing area ", st.stage_landing_bytes,
              " bytes in ", st.stage_landing_rounds, " rounds, ", st.stage_round_scatters,
              " scattered by the kernel (sources ", src_bytes, ", destinations ", dst_bytes, ")"));
      return 18;
    }
    // Data messages into device memory the engine writes (every destination of an
    // active-message world but the delta ones, whose streams land in host copies) are copied
    // into the pinned bounce area and moved to the device on the copy queue, every one of them.
    const bool bounce = !puts && !source && !delta;
    const int64_t bounce_bytes = Landing::kBounceSlots * wire::kAmChunkBytes;
    if (st.stage_bounce_bytes != (bounce ? bounce_bytes : 0) ||
        st.bounced_data_messages != (bounce ? st.data_messages_received : 0) ||
        (bounce && st.data_messages_received < dst_bytes / wire::kAmChunkBytes)) {
      Say(rank, absl::StrCat("epoch ", epoch, ": bounce area ", st.stage_bounce_bytes, " bytes, ",
                             st.bounced_data_messages, " of ", st.data_messages_received,
                             " data messages through it (", st.bounce_waits,
                             " waited; destinations ", dst_bytes, " bytes)"));
      return 20;
    }
    // (Epochs 2 and 4 change every element: those travel plain.)
    if (delta && !source && epoch == 3 && st.deltas_applied == 0) {
      Say(rank, absl::StrCat("epoch ", epoch, ": no delta applied"));
      return 19;
    }
    for (uint32_t t = 0; t < tensors; ++t) {
      if (int failed = VerifyAndPoison(e, rank, t, values, epoch); failed != 0) return failed;
    }
  }
  (void)(*engine)->Shutdown(absl::Now() + absl::Seconds(10));
  return 0;
}

void RunWorld(const World& world, const std::string& tag) {
  const std::string dir = testing::ScratchDir(tag);
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(4), [&](int32_t r) { return Rank(r, dir, world); },
      testing::SharedMemoryUcx(absl::Seconds(90)));
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

constexpr auto kPut = RefitEngineOptions::Delivery::kPut;
constexpr auto kAm = RefitEngineOptions::Delivery::kActiveMessage;

TEST(StagedEmulation, PutDeliveryLandsInOneRoundPerSenderByteExact) {
  RunWorld(World{kPut, false, 0}, "staged-put");
}

// 64 KiB of landing area for 262 KiB from each of two senders: rounds of 16 KiB, each half
// reused eight times per refit, runs of 8 KiB and a 6 KiB piece cut at round ends.
TEST(StagedEmulation, PutDeliveryThroughASmallLandingAreaInManyRoundsByteExact) {
  RunWorld(World{kPut, false, 64 << 10}, "staged-put-rounds");
}

// The same with every round copied out slab by slab instead of by the scatter kernel.
TEST(StagedEmulation, PutDeliveryThroughASmallLandingAreaBySlabCopiesByteExact) {
  World world{kPut, false, 64 << 10};
  world.slab_copies = true;
  RunWorld(world, "staged-put-slabs");
}

TEST(StagedEmulation, AnEpochAbortedInTheMiddleOfItsRoundsIsFollowedByByteExactRefits) {
  RunWorld(World{kPut, false, 64 << 10, /*abort_epoch=*/2}, "staged-put-abort");
  // With rounds of 4 KiB in eight places per sender, several rounds in flight.
  World world{kPut, false, 64 << 10, /*abort_epoch=*/2};
  world.round_bytes = 4 << 10;
  RunWorld(world, "staged-put-abort-places");
}

// The default area holds everything, but rounds of at most 16 KiB (stage_round_bytes): 17
// rounds per sender, each in its own place, all granted with the epoch and copied out one by
// one as they land, signals possibly overtaking one another.
TEST(StagedEmulation, PutDeliveryInSmallRoundsAllInFlightByteExact) {
  World world{kPut, false, 0};
  world.round_bytes = 16 << 10;
  RunWorld(world, "staged-put-all-in-flight");
}

// 64 KiB of area with rounds of 4 KiB: eight places per sender, each reused eight times.
TEST(StagedEmulation, PutDeliveryThroughManyPlacesReusedInTurnByteExact) {
  World world{kPut, false, 64 << 10};
  world.round_bytes = 4 << 10;
  RunWorld(world, "staged-put-places");
}

TEST(StagedEmulation, ActiveMessagesCopyIntoDirectDestinationsByteExact) {
  RunWorld(World{kAm, false, 0}, "staged-am");
}

// A CUDA-aware UCX (emulated): registered sources and destinations, the strided pieces through
// the device ring and the receivers' device round areas.
TEST(StagedEmulation, RegisteredDeviceMemoryTakesStridedPiecesInRoundsByteExact) {
  World world{kPut, false, 0};
  world.registered = true;
  RunWorld(world, "registered-put");
}

// The same through 64 KiB of round area per receiver: ring parts cut at round ends.
TEST(StagedEmulation, RegisteredDeviceMemoryThroughASmallRoundAreaByteExact) {
  World world{kPut, false, 64 << 10};
  world.registered = true;
  RunWorld(world, "registered-put-rounds");
}

// Rounds of 16 KiB (stage_round_bytes), all in flight: ring parts cut at round ends.
TEST(StagedEmulation, RegisteredDeviceMemoryInSmallRoundsAllInFlightByteExact) {
  World world{kPut, false, 0};
  world.registered = true;
  world.round_bytes = 16 << 10;
  RunWorld(world, "registered-put-all-in-flight");
}

TEST(StagedEmulation, RegisteredDeviceMemoryThroughASmallRoundAreaBySlabCopiesByteExact) {
  World world{kPut, false, 64 << 10};
  world.registered = world.slab_copies = true;
  RunWorld(world, "registered-put-slabs");
}

TEST(StagedEmulation, RegisteredDeviceMemoryOverActiveMessagesByteExact) {
  World world{kAm, false, 0};
  world.registered = true;
  RunWorld(world, "registered-am");
}

// Runs `rank_main(rank, dir)` in `ranks` forked ranks over UCX shared memory with devices
// emulated on the host (standing for a CUDA-aware UCX when `registered`), each expected to
// exit 0.
void RunEmulated(int ranks, bool registered, const std::string& tag,
                 const std::function<int(int32_t, const std::string&)>& rank_main) {
  const std::string dir = testing::ScratchDir(tag);
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(ranks),
      [&](int32_t r) {
        cuda::EmulateDevicesOnHost(true, registered);
        return rank_main(r, dir);
      },
      testing::SharedMemoryUcx(absl::Seconds(90)));
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

// Ranks that are trainers and inference ranks at once (device_world::kLocalSpec): the local
// piece is one strided-copy launch on the copy queue (emulated: run late, at the event's first
// poll) instead of one copy per run, with registered device memory and staged alike: a staged
// rank packs only the piece to the other rank into its staging ring, and the local one never
// leaves the device. GpuStaging runs the same ranks on a GPU.
void RunLocalWorld(bool registered, const std::string& tag,
                   device_world::HostSide host_side = device_world::HostSide::kNone) {
  RunEmulated(2, registered, tag, [&](int32_t r, const std::string& dir) {
    return device_world::LocalWorldRank(r, dir, host_side);
  });
}

TEST(StagedEmulation, RegisteredDeviceMemoryCopiesALocalPieceInOneLaunchByteExact) {
  RunLocalWorld(/*registered=*/true, "registered-local");
}

// Host memory on one side: the local piece slab by slab on the copy queue (from a staged
// source into host memory: through its staging ring).
TEST(StagedEmulation, LocalPiecesWithHostMemoryOnOneSideCopySlabBySlabByteExact) {
  using device_world::HostSide;
  RunLocalWorld(/*registered=*/false, "staged-local-host-src", HostSide::kSources);
  RunLocalWorld(/*registered=*/true, "registered-local-host-src", HostSide::kSources);
  RunLocalWorld(/*registered=*/false, "staged-local-host-dst", HostSide::kDestinations);
  RunLocalWorld(/*registered=*/true, "registered-local-host-dst", HostSide::kDestinations);
}

TEST(StagedEmulation, StagedLocalPiecesCopyInOneLaunchByteExact) {
  RunLocalWorld(/*registered=*/false, "staged-local");
}

// GpuStaging's world (tests/net/device_world.h) with devices emulated, staged and registered:
// what a GPU session will check, checked here first.
void RunGpuWorld(bool registered, bool ring, const std::string& tag,
                 RefitEngineOptions::Delivery delivery = RefitEngineOptions::Delivery::kAuto) {
  RunEmulated(4, registered, tag, [&](int32_t r, const std::string& dir) {
    return ring ? device_world::DeviceWorldRank(r, dir, device_world::kDeviceRingSpec,
                                                int64_t{64} << 10, delivery)
                : device_world::DeviceWorldRank(r, dir, device_world::kDeviceSpec, 0, delivery);
  });
}

TEST(StagedEmulation, TheGpuWorldStagedByteExact) {
  RunGpuWorld(false, false, "gpu-world-staged");
  RunGpuWorld(false, true, "gpu-world-staged-ring");
}

TEST(StagedEmulation, TheGpuWorldRegisteredByteExact) {
  RunGpuWorld(true, false, "gpu-world-registered");
  RunGpuWorld(true, true, "gpu-world-registered-ring");
}

// Active messages into the destinations (a tcp cluster without RDMA): every data message
// through the pinned bounce area onto the copy queue, staged and registered.
TEST(StagedEmulation, TheGpuWorldOverActiveMessagesByteExact) {
  RunGpuWorld(false, false, "gpu-world-staged-am", kAm);
  RunGpuWorld(true, false, "gpu-world-registered-am", kAm);
}

// Relays out of CUDA destinations forward the runs their feed brought before that piece landed
// (device_world::RelayWorldRank): staged and registered (landing rounds with puts, the bounce
// area with data messages), with puts and with data messages.
void RunRelayWorld(bool registered, RefitEngineOptions::Delivery delivery, const std::string& tag) {
  RunEmulated(8, registered, tag, [&](int32_t r, const std::string& dir) {
    return device_world::RelayWorldRank(r, dir, delivery);
  });
}

TEST(StagedEmulation, RelaysStreamOutOfStagedDestinationsByteExact) {
  RunRelayWorld(false, kPut, "relays-staged");
  RunRelayWorld(false, kAm, "relays-staged-am");
}

TEST(StagedEmulation, RelaysStreamOutOfRegisteredDestinationsByteExact) {
  RunRelayWorld(true, kPut, "relays-registered");
  RunRelayWorld(true, kAm, "relays-registered-am");
}

TEST(StagedEmulation, DeltaRefitsApplyToStagedCopiesByteExact) {
  RunWorld(World{kPut, true, 0}, "staged-delta");
}

TEST(StagedEmulation, DeltaRefitsOverActiveMessagesByteExact) {
  RunWorld(World{kAm, true, 0}, "staged-delta-am");
}

}  // namespace
}  // namespace reshard::net
