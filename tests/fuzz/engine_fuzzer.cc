// Fuzzes the refit engine's message handlers (src/net/runtime.cc Runtime::Dispatch, the one
// decoder of incoming active messages, and the RefitEngine handlers behind it: grant, hello,
// completion, data, abort) with messages injected into a live refit.
//
// Set-up (LLVMFuzzerInitialize, once): sixteen worlds of 4 ranks; the first eight over one small
// plan (fp32 [64, 48]
// rows -> columns and bf16 [16, 32] back, both travelling packed, the second into a destination
// view with holes; fp32 [64, 128] rows -> replicated, unpacked). World 0 delivers by active
// messages (the receiver writes what data messages say), world 1 by puts (the receiver unpacks
// what completion signals name). World 2 delivers by puts into CUDA buffers that UCX cannot
// register, with devices emulated on the host (cuda::EmulateDevicesOnHost): sources through an
// 8 KiB staging ring, every piece into a destination through 32 KiB of landing rounds (rounds
// of 4 KiB, stage_round_bytes: five per sender in four places, so four in flight and one
// granted back), each round drained when its landing round message (id 16) arrives and its
// place granted back (id 17). World 3 delivers by active messages into such buffers: each
// data message goes through the receiver's pinned bounce area onto its (emulated) copy queue,
// whose copies run late, at the first poll of an event after them. Worlds 4-7 are worlds 0-3
// with delta refits (docs/delta.md): every network piece travels as a delta stream, sources
// change a fraction of their elements per epoch (none, some or all, by the epoch), destinations
// keep what the last refit wrote, and the epochs after a clean one send deltas (set-up checks
// it); worlds 6 and 7 stage their sources whole (emulated devices have no delta kernels). Worlds
// 8-11 are worlds 4-7 on another plan, kRelaySpec: rank 0 sends each piece once and the
// destination domains (one rank each) relay it on, relays of relays among them, so relays
// forward the delta streams they received (docs/delta.md, "Relays forward the stream"). Worlds
// 12-15 are worlds 0-3 on kStreamRelaySpec, kRelaySpec's relays of relays plus a 320 KiB tensor
// relayed in two data messages (or two progress steps: wire::kProgressAm) into destinations
// whose view swaps its outer dims, so plain relays forward runs as their feed's bytes land
// (docs/data-plane.md, "Relays"). Every
// rank has its own net::Runtime (its own UCX worker, over shared memory:
// UCX_TLS=self,posix,sysv,cma and UCX_NET_DEVICES=all, set here) and is created on its own
// thread over a FileStore in a fresh private temporary directory (removed once the engines are
// wired up); then this thread drives all of them. Every buffer lies between guard zones.
//
// Input: byte 0 picks the world (bit 0; bit 3 set: worlds 2 and 3; bit 7 set: their delta
// twins, 4 more; bits 7 and 4 set: the delta relay worlds, 8 more; bit 4 alone: the plain relay
// worlds, 12 more) and the victim rank (bits 1-2);
// then up to 16 messages to the victim, each:
//   control byte c: id c & 7 (grant, completion, abort, data, hello, a raw id byte follows,
//     data, progress); origin (c >> 3) & 3: the named rank's own endpoint (a legitimate,
//     possibly buggy peer), the victim's endpoint to another peer, null, or an endpoint of
//     another worker (forgers); bit 5: arrived by UCX's rendezvous protocol; bit 6: the header
//     is raw bytes (a length byte, then the bytes) instead of a well-formed one; bit 7: a byte
//     follows giving the progress rounds (0..63) of all ranks before the message is dispatched.
//   well-formed header: from_rank byte (a rank, one past the world, or >= 0xf0: raw int32),
//     handle byte (the victim's handle, another rank's, raw u64; bit 4: raw magic; bits 5-7 can
//     cut or extend the header length), epoch byte (current epoch + int8, 0x7f: raw u64); data
//     messages add transfer (a transfer of the plan, or raw u32), packed (bit 0, or raw u32)
//     and to_offset (u16, 2^64 - u16, raw u64, or the transfer's region offset); in delta
//     worlds then stream_bytes (a byte: 0 the payload's length, 0xff a raw u64, else x 8).
//   payload: a length byte (x 8 bytes, or >= 0xe0: u16 follows; 0xff: the data pointer is
//     null), then the bytes: completion indices (each a byte naming a transfer of the plan, or
//     raw u32), progress records of 16 bytes (a transfer as for completions, then bytes: a
//     byte x 64 KiB, or >= 0xf0: raw u64), an abort reason from the input, a landing round's number
//     when the message is one (ids 16 and 17) of 8 bytes (a byte: round byte % 8, or >= 0xf0: raw
//     u64), or a fill byte. A data message in a delta world reads a form byte first: bit 0 clear,
//     the fill byte; set, a delta stream header for the named transfer's piece (bit 1: raw magic;
//     bit 2: kDelta, else kFull; bit 3: raw element size byte; bit 4: raw element count; bit 5:
//     base epoch the victim's version + int8, else its version; bit 6: raw stream length, else the
//     payload's length) followed by input bytes (the chunk table and payloads).
// Missing input bytes read as 0. Each input: every rank fills its sources and poisons its
// destinations (delta worlds: destinations keep the last refit's values), Starts a new epoch, the
// messages are dispatched to the victim through victim_runtime->Dispatch while all ranks progress
// round robin, until every rank is out of the epoch or 2 s passed (then Wait with a past deadline
// must end the epoch promptly). When an epoch failed or a legitimate peer's messages were injected,
// every rank Resets and a clean epoch follows; when that fails after a legitimate peer granted a
// future epoch, the world's engines are rebuilt. So every input starts from engines that just
// refitted cleanly. An input takes milliseconds; one that fails an epoch about 50 ms more per
// failing rank (a failed epoch pushes its abort out for 50 ms).
//
// Properties (a violation aborts, which is a finding):
// - guard zones before and after every buffer are intact after every input, and destination
//   bytes no tile covers (view holes) are never written;
// - a message that does not reach a live handle of the victim, or names a rank outside the
//   world, changes nothing; a message addressed to the victim that did not arrive on the
//   endpoint of the rank it names (a forger) changes no byte and no state of the victim
//   (status, epoch, peer health) and raises rejected_messages() by exactly one;
// - a message that arrived on the named rank's own endpoint writes at most the destination
//   bytes the plan has that rank write into the victim (checked right after each dispatch);
// - with only forged messages, every rank's refit is OK and byte-exact (Verify) within 2 s;
// - an epoch never outlives its deadline: Wait returns within 1 s of a past deadline;
// - after Reset, a clean epoch refits byte-exact (unless a legitimate peer granted a future
//   epoch, which a source rightly remembers); in a delta world it sends no delta (the epoch
//   rule: no rank holds a base).
// Byte-exact in a delta world means equal to the world's model of the tensors (every epoch's
// changes applied in turn), which the sources were filled from.
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "src/common/delta_codec.h"
#include "src/cuda/runtime.h"
#include "src/net/refit_engine.h"
#include "src/net/runtime.h"
#include "src/net/wire.h"
#include "src/plan/fill.h"
#include "src/plan/plan.h"
#include "src/plan/spec_json.h"
#include "src/rendezvous/file_store.h"

namespace reshard::net {
namespace {

constexpr int32_t kWorld = 4;
constexpr size_t kGuard = 64;
constexpr uint8_t kGuardByte = 0x5c;
constexpr uint8_t kPoison = 0xa5;
constexpr size_t kMaxMessages = 16;
constexpr absl::Duration kEpochBound = absl::Seconds(2);

constexpr char kSpec[] = R"json({"tensors": [
  {"name": "w", "dtype": "fp32", "shape": [64, 48],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}},
  {"name": "b", "dtype": "fp32", "shape": [64, 128],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["R"]}},
  {"name": "r", "dtype": "bf16", "shape": [16, 32],
   "src": {"mesh": [2, 3], "placements": ["S(0)"]},
   "dst": {"mesh": [0, 1], "placements": ["S(1)"], "view": {"offset": 4, "strides": [24, 1]}}}]})json";

// The relay worlds' plan: rank 0 sends every piece once, into its own domain's neighbour, and
// the destination domains relay them on (relays of relays among them): a (fp32, into a strided
// destination view with holes), h (bf16, packed) and v (u8).
constexpr char kRelaySpec[] = R"json({"topology": {"domains": [[0], [1], [2], [3]]}, "tensors": [
  {"name": "a", "dtype": "fp32", "shape": [64, 48], "src": {"mesh": [0], "placements": ["R"]},
   "dst": {"mesh": [1, 2, 3], "placements": ["R"], "view": {"offset": 4, "strides": [56, 1]}}},
  {"name": "h", "dtype": "bf16", "shape": [16, 96], "src": {"mesh": [0], "placements": ["S(1)"]},
   "dst": {"mesh": [1, 2, 3], "placements": ["R"]}},
  {"name": "v", "dtype": "u8", "shape": [300], "src": {"mesh": [0], "placements": ["R"]},
   "dst": {"mesh": [2, 3], "placements": ["R"]}}]})json";

// The plain relay worlds' plan: kRelaySpec's a, and s (fp32 [4, 10, 2048], 320 KiB: two data
// messages) relayed on with runs of 8 KiB (unpacked) into destinations whose view swaps dims 0
// and 1, so its runs land out of region order in the buffer.
constexpr char kStreamRelaySpec[] = R"json({"topology": {"domains": [[0], [1], [2], [3]]},
  "tensors": [
  {"name": "a", "dtype": "fp32", "shape": [64, 48], "src": {"mesh": [0], "placements": ["R"]},
   "dst": {"mesh": [1, 2, 3], "placements": ["R"], "view": {"offset": 4, "strides": [56, 1]}}},
  {"name": "s", "dtype": "fp32", "shape": [4, 10, 2048], "src": {"mesh": [0], "placements": ["R"]},
   "dst": {"mesh": [1, 2, 3], "placements": ["R"], "view": {"strides": [2048, 8192, 1]}}}]})json";

[[noreturn]] __attribute__((format(printf, 1, 2))) void Finding(const char* format, ...) {
  std::fprintf(stderr, "fuzz_engine: ");
  va_list args;
  va_start(args, format);
  std::vfprintf(stderr, format, args);
  va_end(args);
  std::fprintf(stderr, "\n");
  std::abort();
}

// The harness cannot run (not a finding of the input).
[[noreturn]] void SetupFailed(const std::string& what) {
  std::fprintf(stderr, "fuzz_engine: set-up failed: %s\n", what.c_str());
  std::abort();
}

// Input bytes; reads past the end give 0.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  template <typename T>
  T Raw() {
    T value{};
    uint8_t bytes[sizeof(T)];
    for (uint8_t& b : bytes) b = Byte();
    std::memcpy(&value, bytes, sizeof(T));
    return value;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// One rank of a world: its buffers (each with guard zones), runtime and engine.
struct Rank {
  std::vector<std::vector<uint8_t>> memory;  // kGuard + bytes + kGuard per buffer.
  std::vector<BufferView> views;
  std::shared_ptr<Runtime> runtime;
  std::unique_ptr<rendezvous::FileStore> store;
  std::unique_ptr<RefitEngine> engine;
  uint8_t* data(size_t b) { return memory[b].data() + kGuard; }
};

struct Setting;

struct World {
  const Setting* setting = nullptr;  // The plan it refits.
  RefitEngineOptions options;
  std::array<Rank, kWorld> ranks;
  uint64_t epoch = 0;
  int generation = 0;
  // Delta worlds: the global tensors (row-major, by tensor) as the sources hold them at `epoch`.
  std::vector<std::vector<uint8_t>> model;
};

// What the plan lets each peer write on each rank: writes[rank][peer][buffer] is a byte mask of
// the destination buffer; covered[rank][buffer] their union (the bytes some transfer writes).
struct Masks {
  std::vector<std::vector<std::vector<std::vector<bool>>>> writes;
  std::vector<std::vector<std::vector<bool>>> covered;
};

// One plan the worlds refit, with what each rank's buffers hold and what peers may write.
struct Setting {
  plan::Plan plan;
  std::vector<std::vector<int64_t>> bytes;  // By rank, by buffer.
  Masks masks;
};

struct Harness {
  std::vector<Setting> settings;  // kSpec's, then kRelaySpec's.
  std::array<World, 16> worlds;
};

Harness* harness = nullptr;
// FUZZ_ENGINE_VERBOSE set: the plan's transfers (what an input's transfer bytes name) at start,
// then each epoch's outcome per rank.
bool verbose = false;

void BuildMasks(Setting& h) {
  const plan::Plan& p = h.plan;
  const size_t nb = p.buffers().size();
  h.masks.writes.assign(kWorld, {});
  h.masks.covered.assign(kWorld, {});
  for (int32_t r = 0; r < kWorld; ++r) {
    h.masks.writes[r].assign(kWorld, {});
    for (int32_t q = 0; q < kWorld; ++q) {
      h.masks.writes[r][q].resize(nb);
      for (size_t b = 0; b < nb; ++b) h.masks.writes[r][q][b].assign(h.bytes[r][b], false);
    }
    h.masks.covered[r].resize(nb);
    for (size_t b = 0; b < nb; ++b) h.masks.covered[r][b].assign(h.bytes[r][b], false);
  }
  for (const plan::Transfer& t : p.transfers()) {
    const plan::Region& region = p.region(t.region);
    const uint32_t b = p.buffer_of(t.tensor, t.to_side);
    std::vector<bool>& mask = h.masks.writes[t.to_rank][t.from_rank][b];
    std::vector<bool>& covered = h.masks.covered[t.to_rank][b];
    plan::ForEachRun(region, p.region_dims(region), [&](int64_t, int64_t to, int64_t n) {
      for (int64_t i = to; i < to + n; ++i) {
        if (i < 0 || static_cast<size_t>(i) >= mask.size())
          SetupFailed("a region outside its buffer");
        mask[i] = covered[i] = true;
      }
    });
  }
}

void BuildWorld(World& world) {
  const Setting& h = *world.setting;
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/reshard-fuzz-engine-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) SetupFailed(absl::StrCat("mkdtemp ", pattern));
  const std::string dir = pattern;
  // Runtimes are made here, one at a time, and kept when a world is rebuilt.
  for (int32_t r = 0; r < kWorld; ++r) {
    Rank& rank = world.ranks[r];
    if (rank.runtime != nullptr) continue;
    absl::StatusOr<std::shared_ptr<Runtime>> runtime = Runtime::Create();
    if (!runtime.ok()) SetupFailed(absl::StrCat("rank ", r, ": ", runtime.status().ToString()));
    rank.runtime = *std::move(runtime);
  }
  world.generation++;
  world.options.key_prefix = absl::StrCat("fuzz/engine/", world.generation);
  world.epoch = 0;
  std::array<absl::Status, kWorld> status;
  std::vector<std::thread> threads;
  for (int32_t r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r]() {
      Rank& rank = world.ranks[r];
      absl::StatusOr<std::unique_ptr<rendezvous::FileStore>> store =
          rendezvous::FileStore::Open(dir);
      if (!store.ok()) {
        status[r] = store.status();
        return;
      }
      rank.store = *std::move(store);
      absl::StatusOr<std::unique_ptr<RefitEngine>> engine =
          RefitEngine::Create(h.plan, r, *rank.store, rank.runtime, rank.views, world.options);
      if (!engine.ok()) {
        status[r] = engine.status();
        return;
      }
      rank.engine = *std::move(engine);
    });
  }
  for (std::thread& t : threads) t.join();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  for (int32_t r = 0; r < kWorld; ++r) {
    if (!status[r].ok()) SetupFailed(absl::StrCat("rank ", r, ": ", status[r].ToString()));
  }
}

// Worlds 2, 3, 6 and 7 must stage what they should (one clean epoch each), and the delta
// worlds send deltas once they have a base (a second one). Defined after RunEpoch.
void CheckStagingWorlds();
void CheckDeltaWorlds();

// Delta worlds' model: random tensors, then per epoch a share of the elements changed.
void InitModel(World& world, size_t w) {
  const plan::RefitSpec& s = world.setting->plan.spec();
  std::mt19937_64 rng(w);
  world.model.clear();
  for (const plan::TensorSpec& t : s.tensors) {
    int64_t n = plan::DTypeSize(t.dtype);
    for (int64_t d : t.shape) n *= d;
    std::vector<uint8_t>& v = world.model.emplace_back(static_cast<size_t>(n));
    for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
  }
}

// The share of the elements that epoch `epoch` changes: by turns many, all, some, none, few (the
// first epoch of a world, epoch 1, sends everything anyway).
double ChangedShare(uint64_t epoch) {
  constexpr double kShares[5] = {0.3, 1.0, 0.02, 0.0, 0.005};
  return kShares[epoch % 5];
}

// The model at `epoch`: each changed element's lowest byte flipped by 1-15 (a few ulp, as an
// optimizer step leaves a weight), the same elements on every rank.
void AdvanceModel(World& world, uint64_t epoch) {
  const plan::RefitSpec& s = world.setting->plan.spec();
  std::mt19937_64 rng(epoch * 7919);
  std::bernoulli_distribution changed(ChangedShare(epoch));
  for (size_t t = 0; t < world.model.size(); ++t) {
    const size_t es = static_cast<size_t>(plan::DTypeSize(s.tensors[t].dtype));
    for (size_t e = 0; e < world.model[t].size(); e += es) {
      if (changed(rng)) world.model[t][e] ^= static_cast<uint8_t>(1 + rng() % 15);
    }
  }
}

void Init() {
  // Shared memory between the workers of this process (DESIGN §5: name the transports).
  setenv("UCX_TLS", "self,posix,sysv,cma", 1);
  setenv("UCX_NET_DEVICES", "all", 1);
  unsetenv("RESHARD_DELIVERY");      // Each world names its delivery.
  unsetenv("RESHARD_FAULT_INJECT");  // No injected faults.
  setenv("RESHARD_LOG_LEVEL", "error", 0);
  verbose = std::getenv("FUZZ_ENGINE_VERBOSE") != nullptr;
  harness = new Harness{};  // Never destroyed: UCX may outlive exit.
  for (const char* text : {kSpec, kRelaySpec, kStreamRelaySpec}) {
    absl::StatusOr<plan::RefitSpec> spec = plan::ParseSpecJson(text);
    if (!spec.ok()) SetupFailed(spec.status().ToString());
    absl::StatusOr<plan::Plan> plan =
        plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*std::move(spec)));
    if (!plan.ok()) SetupFailed(plan.status().ToString());
    Setting& h = harness->settings.emplace_back(Setting{*std::move(plan), {}, {}});
    for (int32_t r = 0; r < kWorld; ++r) h.bytes.push_back(h.plan.BufferBytes(r));
    BuildMasks(h);
    if (verbose) {
      std::fprintf(stderr, "plan %zu:\n", harness->settings.size() - 1);
      for (size_t i = 0; i < h.plan.transfers().size(); ++i) {
        const plan::Transfer& t = h.plan.transfers()[i];
        const plan::Region& region = h.plan.region(t.region);
        std::fprintf(stderr,
                     "transfer %zu: tensor %s, %s rank %d -> %d, %lld bytes at offset %lld, "
                     "runs of %lld\n",
                     i, h.plan.spec().tensors[t.tensor].name.c_str(),
                     plan::IsRelay(t) ? "relay" : plan::TransferKindName(t.kind), t.from_rank,
                     t.to_rank, static_cast<long long>(region.bytes),
                     static_cast<long long>(region.to_offset),
                     static_cast<long long>(region.run_bytes));
      }
    }
  }
  for (size_t s : {size_t{1}, size_t{2}}) {
    int relays = 0;
    for (const plan::Transfer& t : harness->settings[s].plan.transfers()) {
      relays += plan::IsRelay(t) && plan::IsRelay(harness->settings[s].plan.transfers()[t.after]);
    }
    if (relays == 0) SetupFailed(absl::StrCat("relay plan ", s, " has no relay of a relay"));
  }
  // Worlds 2, 3, 6 and 7's "device" buffers are host memory (the others use host buffers,
  // which the emulation leaves alone).
  cuda::EmulateDevicesOnHost(true, /*ucx_registers_them=*/false);
  for (size_t w = 0; w < harness->worlds.size(); ++w) {
    World& world = harness->worlds[w];
    // Worlds 4-7 are worlds 0-3 with delta refits, worlds 8-11 worlds 4-7 on kRelaySpec, and
    // worlds 12-15 worlds 0-3 on kStreamRelaySpec.
    world.setting = &harness->settings[w >= 12 ? 2 : w >= 8 ? 1 : 0];
    const Setting& h = *world.setting;
    const size_t base = w % 4;
    const bool am = base == 0 || base == 3;
    world.options.delivery =
        am ? RefitEngineOptions::Delivery::kActiveMessage : RefitEngineOptions::Delivery::kPut;
    world.options.setup_timeout = absl::Seconds(30);
    world.options.delta = w >= 4 && w < 12;
    if (world.options.delta) InitModel(world, w);
    const bool device = base >= 2;
    if (device) {
      world.options.stage_ring_bytes = 8 << 10;
      world.options.stage_landing_bytes = 32 << 10;
      world.options.stage_round_bytes = 4 << 10;
    }
    for (int32_t r = 0; r < kWorld; ++r) {
      Rank& rank = world.ranks[r];
      for (size_t b = 0; b < h.bytes[r].size(); ++b) {
        const int64_t n = h.bytes[r][b];
        std::vector<uint8_t>& m = rank.memory.emplace_back(kGuard + n + kGuard, kGuardByte);
        // Destinations start poisoned (delta worlds never poison them again).
        if (h.plan.buffers()[b].side != plan::Side::kSrc) {
          std::memset(m.data() + kGuard, kPoison, static_cast<size_t>(n));
        }
        rank.views.push_back(BufferView{n > 0 ? m.data() + kGuard : nullptr, n,
                                        device ? MemoryKind::kCuda : MemoryKind::kHost});
      }
    }
    BuildWorld(world);
    const std::string expected = am ? "am" : "put";
    if (world.ranks[0].engine->delivery() != expected) SetupFailed("delivery not honoured");
  }
  CheckStagingWorlds();
  CheckDeltaWorlds();
}

// Source tiles hold `epoch`'s fill and destination buffers are poisoned; in a delta world the
// sources hold the model at `epoch` and destinations what the last refit wrote.
void Prepare(World& world, uint64_t epoch) {
  const Setting& h = *world.setting;
  const plan::RefitSpec& s = h.plan.spec();
  const bool delta = world.options.delta;
  if (delta) AdvanceModel(world, epoch);
  for (int32_t r = 0; r < kWorld; ++r) {
    Rank& rank = world.ranks[r];
    for (size_t b = 0; b < h.plan.buffers().size(); ++b) {
      if (!delta && h.plan.buffers()[b].side != plan::Side::kSrc) {
        std::memset(rank.data(b), kPoison, static_cast<size_t>(h.bytes[r][b]));
      }
    }
    for (size_t t = 0; t < s.tensors.size(); ++t) {
      uint8_t* src = rank.data(h.plan.buffer_of(t, plan::Side::kSrc));
      const size_t es = static_cast<size_t>(plan::DTypeSize(s.tensors[t].dtype));
      plan::ForEachTile(s, t, plan::Side::kSrc, [&](int32_t holder, const plan::Box& box) {
        if (holder != r) return;
        if (!delta) {
          plan::FillTile(s, t, plan::Side::kSrc, box, epoch, src);
          return;
        }
        plan::ForEachElement(s.tensors[t].src, s.tensors[t].shape, box,
                             [&](int64_t offset, int64_t global) {
                               std::memcpy(src + offset * es, &world.model[t][global * es], es);
                             });
      });
    }
  }
}

absl::Status Verify(World& world, int32_t r, uint64_t epoch) {
  const plan::Plan& p = world.setting->plan;
  const plan::RefitSpec& s = p.spec();
  absl::Status status;
  for (size_t t = 0; t < s.tensors.size(); ++t) {
    const uint8_t* dst = world.ranks[r].data(p.buffer_of(t, plan::Side::kDst));
    plan::ForEachTile(s, t, plan::Side::kDst, [&](int32_t holder, const plan::Box& box) {
      if (holder != r || !status.ok()) return;
      status = world.options.delta
                   ? plan::VerifyTileAgainst(s, t, box, r, dst, world.model[t].data())
                   : plan::VerifyTile(s, t, box, epoch, r, dst);
    });
  }
  return status;
}

// Guard zones intact everywhere; destination bytes no transfer writes still poisoned.
void CheckGuards(World& world, const char* when) {
  const Setting& h = *world.setting;
  for (int32_t r = 0; r < kWorld; ++r) {
    Rank& rank = world.ranks[r];
    for (size_t b = 0; b < rank.memory.size(); ++b) {
      const std::vector<uint8_t>& m = rank.memory[b];
      const size_t n = static_cast<size_t>(h.bytes[r][b]);
      for (size_t i = 0; i < kGuard; ++i) {
        if (m[i] != kGuardByte || m[kGuard + n + i] != kGuardByte) {
          Finding("%s: rank %d: the guard zone %s buffer \"%s\" was written", when, r,
                  m[i] != kGuardByte ? "before" : "after", h.plan.buffers()[b].name.c_str());
        }
      }
      if (h.plan.buffers()[b].side == plan::Side::kSrc) continue;
      for (size_t i = 0; i < n; ++i) {
        if (!h.masks.covered[r][b][i] && m[kGuard + i] != kPoison) {
          Finding("%s: rank %d: byte %zu of buffer \"%s\", which no transfer writes, was written",
                  when, r, i, h.plan.buffers()[b].name.c_str());
        }
      }
    }
  }
}

enum class Origin : uint8_t { kNamedRank, kOtherPeer, kNull, kOtherWorker };

struct Message {
  unsigned id = 0;
  Origin origin = Origin::kNamedRank;
  bool rendezvous = false;
  int delay = 0;
  std::vector<uint8_t> header;
  std::vector<uint8_t> payload;
  bool null_data = false;
};

constexpr unsigned kIds[8] = {wire::kGrantAm, wire::kDoneAm,    wire::kAbortAm,
                              wire::kDataAm,  wire::kHelloAm,   0,
                              wire::kDataAm,  wire::kProgressAm};

uint32_t PickTransfer(Reader& in, const plan::Plan& p) {
  const uint8_t t = in.Byte();
  if (t >= 0xf0) return in.Raw<uint32_t>();
  return t % static_cast<uint32_t>(p.transfers().size() + 1);
}

// A data message's payload in a delta world that begins with a stream header for transfer
// `transfer`'s piece (see the input format above), `length` bytes at least.
std::vector<uint8_t> DeltaPayload(Reader& in, const plan::Plan& p, uint8_t form, size_t length,
                                  uint32_t transfer, uint64_t version) {
  const plan::Transfer& t = p.transfers()[transfer % p.transfers().size()];
  const int64_t bytes = p.region(t.region).bytes;
  // The element size the engine compares at (net::DeltaElemBytes).
  const int es = p.buffers()[p.buffer_of(t.tensor, t.to_side)].elem_bytes;
  delta::StreamHeader header;
  if ((form & 2) != 0) header.magic = in.Raw<uint32_t>();
  header.mode = (form & 4) != 0 ? delta::kDelta : delta::kFull;
  header.elem_size = (form & 8) != 0 ? in.Byte() : static_cast<uint8_t>(es);
  header.elems = (form & 0x10) != 0
                     ? in.Raw<uint64_t>()
                     : static_cast<uint64_t>(delta::SegmentLength(bytes / es, es, 0));
  header.base_epoch =
      version + ((form & 0x20) != 0 ? static_cast<uint64_t>(static_cast<int8_t>(in.Byte())) : 0);
  std::vector<uint8_t> payload(std::max(length, sizeof(header)));
  header.bytes = (form & 0x40) != 0 ? in.Raw<uint64_t>() : payload.size();
  std::memcpy(payload.data(), &header, sizeof(header));
  for (size_t i = sizeof(header); i < payload.size(); ++i) payload[i] = in.Byte();
  return payload;
}

Message Decode(Reader& in, const World& world, int32_t victim) {
  Message m;
  uint32_t transfer = 0;           // The transfer a data message names (delta payloads).
  bool stream_is_payload = false;  // Delta worlds: stream_bytes is the payload's length.
  const uint8_t c = in.Byte();
  m.id = kIds[c & 7];
  if ((c & 7) == 5) m.id = in.Byte();
  m.origin = static_cast<Origin>((c >> 3) & 3);
  m.rendezvous = (c & 0x20) != 0;
  if ((c & 0x80) != 0) m.delay = in.Byte() & 63;
  const bool data = m.id == wire::kDataAm;
  if ((c & 0x40) != 0) {
    m.header.resize(in.Byte() % 64);
    for (uint8_t& b : m.header) b = in.Byte();
  } else {
    wire::DataHeader h;
    const uint8_t f = in.Byte();
    h.base.from_rank = f >= 0xf0 ? in.Raw<int32_t>() : static_cast<int32_t>(f % (kWorld + 1));
    const uint8_t hb = in.Byte();
    switch (hb & 3) {
      case 0:
      case 1:
        h.base.handle = RefitEngine::HandleId(world.options.key_prefix, victim);
        break;
      case 2:
        h.base.handle = RefitEngine::HandleId(world.options.key_prefix, (hb >> 2) & 3);
        break;
      default:
        h.base.handle = in.Raw<uint64_t>();
    }
    if ((hb & 0x10) != 0) h.base.magic = in.Raw<uint32_t>();
    const uint8_t e = in.Byte();
    h.base.epoch = e == 0x7f ? in.Raw<uint64_t>()
                             : world.epoch + 1 + static_cast<uint64_t>(static_cast<int8_t>(e));
    if (data) {
      h.transfer = PickTransfer(in, world.setting->plan);
      const uint8_t p = in.Byte();
      h.packed = (p & 0x80) != 0 ? in.Raw<uint32_t>() : (p & 1);
      const uint8_t o = in.Byte();
      switch (o & 3) {
        case 0:
          h.to_offset = in.Raw<uint16_t>();
          break;
        case 1:
          h.to_offset = ~uint64_t{0} - in.Raw<uint16_t>();
          break;
        case 2:
          h.to_offset = in.Raw<uint64_t>();
          break;
        default: {
          const auto& transfers = world.setting->plan.transfers();
          const plan::Transfer& t = transfers[h.transfer % transfers.size()];
          const plan::Region& region = world.setting->plan.region(t.region);
          h.to_offset = h.packed != 0 ? 0 : static_cast<uint64_t>(region.to_offset);
          h.to_offset += static_cast<uint64_t>(o >> 2) * 8;
        }
      }
      transfer = h.transfer;
      if (world.options.delta) {
        const uint8_t sb = in.Byte();
        stream_is_payload = sb == 0;
        h.stream_bytes = sb == 0xff ? in.Raw<uint64_t>() : uint64_t{sb} * 8;
      }
    }
    size_t length = data ? sizeof(wire::DataHeader) : sizeof(wire::AmHeader);
    switch (hb >> 5) {
      case 5:
        length -= 1;
        break;
      case 6:
        length += 4;
        break;
      case 7:
        length = data ? sizeof(wire::AmHeader) : sizeof(wire::DataHeader);
        break;
      default:
        break;
    }
    m.header.assign(length, 0);
    std::memcpy(m.header.data(), &h, std::min(length, sizeof(h)));
  }
  const uint8_t l = in.Byte();
  size_t length = l >= 0xe0 ? in.Raw<uint16_t>() : size_t{l} * 8;
  if (m.id == wire::kDoneAm) {
    length = std::min<size_t>(length, (wire::kMaxIndicesPerSignal + 8) * sizeof(uint32_t));
    m.payload.resize(length);
    for (size_t i = 0; i + sizeof(uint32_t) <= length; i += sizeof(uint32_t)) {
      const uint32_t index = PickTransfer(in, world.setting->plan);
      std::memcpy(m.payload.data() + i, &index, sizeof(index));
    }
  } else if (m.id == wire::kProgressAm) {
    length =
        std::min<size_t>(length, (wire::kMaxProgressPerSignal + 2) * sizeof(wire::ProgressRecord));
    m.payload.resize(length);
    for (size_t i = 0; i + sizeof(wire::ProgressRecord) <= length;
         i += sizeof(wire::ProgressRecord)) {
      wire::ProgressRecord r;
      r.transfer = PickTransfer(in, world.setting->plan);
      const uint8_t b = in.Byte();
      r.bytes = b >= 0xf0 ? in.Raw<uint64_t>() : uint64_t{b} << 16;
      std::memcpy(m.payload.data() + i, &r, sizeof(r));
    }
  } else if ((m.id == wire::kRoundAm || m.id == wire::kRoundGrantAm) && length == 8) {
    const uint8_t r = in.Byte();
    const uint64_t round = r >= 0xf0 ? in.Raw<uint64_t>() : r % 8;
    m.payload.resize(sizeof(round));
    std::memcpy(m.payload.data(), &round, sizeof(round));
  } else if (m.id == wire::kAbortAm) {
    length = std::min<size_t>(length, 2 * wire::kMaxAbortReasonBytes);
    m.payload.resize(length);
    for (uint8_t& b : m.payload) b = in.empty() ? 'x' : in.Byte();
  } else if (data && world.options.delta) {
    const uint8_t form = in.Byte();
    if ((form & 1) != 0) {
      m.payload = DeltaPayload(in, world.setting->plan, form, length, transfer, world.epoch);
    } else {
      m.payload.assign(length, in.Byte());
    }
  } else {
    m.payload.assign(length, in.Byte());
  }
  if (stream_is_payload && m.header.size() >= sizeof(wire::DataHeader)) {
    const uint64_t stream_bytes = m.payload.size();
    std::memcpy(m.header.data() + offsetof(wire::DataHeader, stream_bytes), &stream_bytes,
                sizeof(stream_bytes));
  }
  // A payload without its data (UCX never does this; the decoder must not read it).
  m.null_data = !m.payload.empty() && l == 0xff;
  return m;
}

// Who the message says it is from and whether it reaches the victim's handle (Runtime::Dispatch:
// its header has the size of the id's header, our magic and the victim's handle id).
struct Addressing {
  bool addressed = false;
  bool well_formed = false;  // Also names a rank of the world.
  int32_t from_rank = -1;
  uint64_t epoch = 0;
};

Addressing Address(const Message& m, uint64_t victim_handle) {
  Addressing a;
  const bool known = m.id == wire::kGrantAm || m.id == wire::kDoneAm || m.id == wire::kAbortAm ||
                     m.id == wire::kDataAm || m.id == wire::kHelloAm || m.id == wire::kRoundAm ||
                     m.id == wire::kRoundGrantAm || m.id == wire::kProgressAm;
  const size_t want = m.id == wire::kDataAm ? sizeof(wire::DataHeader) : sizeof(wire::AmHeader);
  if (m.header.size() >= sizeof(wire::AmHeader)) {
    wire::AmHeader h;
    std::memcpy(&h, m.header.data(), sizeof(h));
    a.from_rank = h.from_rank;
    a.epoch = h.epoch;
    a.addressed =
        known && m.header.size() == want && h.magic == wire::kMagic && h.handle == victim_handle;
    a.well_formed = a.addressed && wire::WellFormed(h, kWorld);
  }
  return a;
}

ucp_ep* OriginEndpoint(const World& world, int32_t victim, const Message& m, int32_t named) {
  const RefitEngine& v = *world.ranks[victim].engine;
  switch (m.origin) {
    case Origin::kNamedRank:
      return v.EndpointTo(named);
    case Origin::kOtherPeer:
      for (int32_t r = 0; r < kWorld; ++r) {
        if (r != named && v.EndpointTo(r) != nullptr) return v.EndpointTo(r);
      }
      return nullptr;
    case Origin::kNull:
      return nullptr;
    case Origin::kOtherWorker:
      // Another rank's endpoint to the victim: a different worker's endpoint altogether.
      for (int32_t r = 0; r < kWorld; ++r) {
        if (r != victim && world.ranks[r].engine->EndpointTo(victim) != nullptr) {
          return world.ranks[r].engine->EndpointTo(victim);
        }
      }
      return nullptr;
  }
  return nullptr;
}

struct VictimState {
  int64_t rejected;
  absl::StatusCode status;
  bool in_epoch;
  uint64_t epoch;
  std::string peers;  // CheckAllPeers().
};

VictimState StateOf(const RefitEngine& e) {
  return VictimState{e.rejected_messages(), e.last_status().code(), e.in_epoch(), e.last_epoch(),
                     e.CheckAllPeers().ToString()};
}

const char* IdName(unsigned id) {
  switch (id) {
    case wire::kGrantAm:
      return "grant";
    case wire::kDoneAm:
      return "completion";
    case wire::kAbortAm:
      return "abort";
    case wire::kDataAm:
      return "data";
    case wire::kHelloAm:
      return "hello";
    case wire::kRoundAm:
      return "landing round";
    case wire::kRoundGrantAm:
      return "landing round grant";
    case wire::kProgressAm:
      return "progress";
    default:
      return "unknown";
  }
}

struct Injection {
  bool legit = false;         // Some message arrived on the named rank's own endpoint.
  bool future_grant = false;  // ... and granted an epoch after the current one.
};

// Dispatches `m` to the victim and checks what it changed.
void Inject(World& world, int32_t victim, const Message& m, Injection* injection) {
  const Setting& h = *world.setting;
  Rank& rank = world.ranks[victim];
  RefitEngine& e = *rank.engine;
  const uint64_t handle = RefitEngine::HandleId(world.options.key_prefix, victim);
  const Addressing a = Address(m, handle);
  ucp_ep* from = OriginEndpoint(world, victim, m, a.from_rank);
  const bool legit = a.well_formed && from != nullptr && from == e.EndpointTo(a.from_rank);
  const bool forged = a.well_formed && !legit;
  const std::vector<std::vector<uint8_t>> before_memory = rank.memory;
  const VictimState before = StateOf(e);
  const void* data = m.null_data || m.payload.empty() ? nullptr : m.payload.data();
  rank.runtime->Dispatch(m.id, m.header.empty() ? nullptr : m.header.data(), m.header.size(), data,
                         m.payload.size(), m.rendezvous, from);
  const VictimState after = StateOf(e);
  const char* kind = legit ? "legitimate" : forged ? "forged" : "stray";
  for (size_t b = 0; b < rank.memory.size(); ++b) {
    const std::vector<uint8_t>& was = before_memory[b];
    const std::vector<uint8_t>& now = rank.memory[b];
    for (size_t i = 0; i < now.size(); ++i) {
      if (was[i] == now[i]) continue;
      const bool inside = i >= kGuard && i < kGuard + static_cast<size_t>(h.bytes[victim][b]);
      if (legit && inside && h.masks.writes[victim][a.from_rank][b][i - kGuard]) continue;
      Finding(
          "a %s %s message (id %u) naming rank %d, epoch %llu, to rank %d wrote byte %lld of "
          "buffer \"%s\"%s, which the plan does not have rank %d write there",
          kind, IdName(m.id), m.id, a.from_rank, static_cast<unsigned long long>(a.epoch), victim,
          static_cast<long long>(i) - static_cast<long long>(kGuard),
          h.plan.buffers()[b].name.c_str(), inside ? "" : " (a guard zone)", a.from_rank);
    }
  }
  if (legit) {
    injection->legit = true;
    if (m.id == wire::kGrantAm && !m.rendezvous && a.epoch > world.epoch) {
      injection->future_grant = true;
    }
    if (after.rejected != before.rejected) {
      Finding("a legitimate %s message from rank %d to rank %d was counted as rejected",
              IdName(m.id), a.from_rank, victim);
    }
    return;
  }
  const int64_t expected = before.rejected + (forged ? 1 : 0);
  if (after.rejected != expected) {
    Finding(
        "a %s %s message (id %u, header %zu bytes) naming rank %d to rank %d: "
        "rejected_messages() went from %lld to %lld, expected %lld",
        kind, IdName(m.id), m.id, m.header.size(), a.from_rank, victim,
        static_cast<long long>(before.rejected), static_cast<long long>(after.rejected),
        static_cast<long long>(expected));
  }
  if (after.status != before.status || after.in_epoch != before.in_epoch ||
      after.epoch != before.epoch || after.peers != before.peers) {
    Finding(
        "a %s %s message naming rank %d changed rank %d's state: status %d -> %d, in epoch "
        "%d -> %d, peers %s -> %s",
        kind, IdName(m.id), a.from_rank, victim, static_cast<int>(before.status),
        static_cast<int>(after.status), before.in_epoch, after.in_epoch, before.peers.c_str(),
        after.peers.c_str());
  }
}

// One epoch on every rank of `world`, with `messages` dispatched to `victim` along the way.
// Returns whether every rank's epoch is OK.
bool RunEpoch(World& world, int32_t victim, const std::vector<Message>& messages,
              Injection* injection, const char* what) {
  const uint64_t epoch = ++world.epoch;
  Prepare(world, epoch);
  for (int32_t r = 0; r < kWorld; ++r) {
    const absl::Status started = world.ranks[r].engine->Start(epoch);
    if (!started.ok() && !injection->legit) {
      Finding("%s: rank %d: Start(%llu) failed: %s", what, r,
              static_cast<unsigned long long>(epoch), started.ToString().c_str());
    }
  }
  const absl::Time deadline = absl::Now() + kEpochBound;
  size_t next = 0;
  std::vector<uint32_t> landed;
  for (int round = 0;; ++round) {
    while (next < messages.size() && messages[next].delay <= round) {
      Inject(world, victim, messages[next++], injection);
    }
    bool busy = false;
    for (int32_t r = 0; r < kWorld; ++r) {
      RefitEngine& e = *world.ranks[r].engine;
      busy = busy || e.in_epoch();
      (void)e.Progress(&landed);
    }
    landed.clear();
    if ((!busy && next == messages.size()) || absl::Now() >= deadline) break;
  }
  // Every epoch ends by its deadline: Wait with a past deadline ends it promptly.
  for (int32_t r = 0; r < kWorld; ++r) {
    RefitEngine& e = *world.ranks[r].engine;
    if (!e.in_epoch()) continue;
    if (!injection->legit) {
      Finding("%s: rank %d: with only forged messages, epoch %llu did not finish within %s", what,
              r, static_cast<unsigned long long>(epoch), absl::FormatDuration(kEpochBound).c_str());
    }
    const absl::Time start = absl::Now();
    const absl::Status waited = e.Wait(start);
    const absl::Duration took = absl::Now() - start;
    if (waited.ok() || e.in_epoch() || took > absl::Seconds(1)) {
      Finding("%s: rank %d: Wait with a past deadline returned %s after %s, in epoch: %d", what, r,
              waited.ToString().c_str(), absl::FormatDuration(took).c_str(), e.in_epoch());
    }
  }
  CheckGuards(world, what);
  bool ok = true;
  for (int32_t r = 0; r < kWorld; ++r) ok = ok && world.ranks[r].engine->last_status().ok();
  if (verbose) {
    std::fprintf(stderr,
                 "%s, world %d (%s, %s buffers%s) generation %d, epoch %llu, victim %d, %zu "
                 "message(s)%s:\n",
                 what, static_cast<int>(&world - harness->worlds.data()),
                 world.ranks[0].engine->delivery(),
                 world.ranks[0].views[0].kind == MemoryKind::kCuda ? "device" : "host",
                 world.options.delta ? ", delta" : "", world.generation,
                 static_cast<unsigned long long>(epoch), victim, messages.size(),
                 injection->legit ? " (legitimate ones among them)" : "");
    for (int32_t r = 0; r < kWorld; ++r) {
      const RefitEngine& e = *world.ranks[r].engine;
      std::fprintf(stderr, "  rank %d: rejected %lld, %s\n", r,
                   static_cast<long long>(e.rejected_messages()),
                   e.last_status().ToString().c_str());
    }
  }
  if (injection->legit) return ok;
  for (int32_t r = 0; r < kWorld; ++r) {
    const absl::Status& status = world.ranks[r].engine->last_status();
    if (!status.ok()) {
      Finding("%s: rank %d: with only forged messages, epoch %llu failed: %s", what, r,
              static_cast<unsigned long long>(epoch), status.ToString().c_str());
    }
    const absl::Status verified = Verify(world, r, epoch);
    if (!verified.ok()) {
      Finding(
          "%s: rank %d: with only forged messages, epoch %llu reported OK but is not "
          "byte-exact: %s",
          what, r, static_cast<unsigned long long>(epoch), verified.ToString().c_str());
    }
  }
  return true;
}

void CheckStagingWorlds() {
  for (size_t w : {size_t{2}, size_t{3}, size_t{6}, size_t{7}, size_t{10}, size_t{11}}) {
    World& world = harness->worlds[w];
    Injection clean;
    const std::string what = absl::StrCat("world ", w, "'s first epoch");
    if (!RunEpoch(world, 0, {}, &clean, what.c_str())) SetupFailed(what + " failed");
    int64_t bounced = 0;
    for (int32_t r = 0; r < kWorld; ++r) {
      const RefitStats& st = world.ranks[r].engine->last_stats();
      // World 2: rounds and the ring. World 3: every data message through the bounce area.
      // Worlds 6, 7, 10 and 11 (delta): sources staged whole, streams applied to host copies.
      const bool staged = w == 2   ? st.stage_landing_rounds >= 2 && st.stage_ring_batches >= 1
                          : w == 3 ? st.bounced_data_messages == st.data_messages_received
                                   : true;
      if (st.cuda_buffers_staged == 0 || !staged) {
        SetupFailed(absl::StrCat("world ", w, ", rank ", r, ": ", st.cuda_buffers_staged,
                                 " CUDA buffers staged, ", st.stage_landing_rounds,
                                 " landing rounds, ", st.stage_ring_batches, " ring batches, ",
                                 st.bounced_data_messages, " of ", st.data_messages_received,
                                 " data messages bounced: not the staging world it should be"));
      }
      bounced += st.bounced_data_messages;
    }
    if (w == 3 && bounced == 0) SetupFailed("world 3 bounced no data message");
  }
}

// The delta worlds' second clean epoch (every rank then holds a base, and the epoch changes few
// elements): every rank that sends delta pieces (plan::DeltaElemBytes; relays too) sends deltas,
// every rank that receives them applies deltas, and nothing goes plain for want of a base.
void CheckDeltaWorlds() {
  if (ChangedShare(2) > 0.1) SetupFailed("epoch 2 changes too many elements to send deltas");
  for (size_t w = 4; w < 12; ++w) {
    World& world = harness->worlds[w];
    // Worlds 6, 7, 10 and 11 ran their first epoch in CheckStagingWorlds.
    while (world.epoch < 2) {
      Injection clean;
      const std::string what = absl::StrCat("world ", w, "'s epoch ", world.epoch + 1);
      if (!RunEpoch(world, 0, {}, &clean, what.c_str())) SetupFailed(what + " failed");
    }
    const plan::Plan& p = world.setting->plan;
    for (int32_t r = 0; r < kWorld; ++r) {
      int64_t sends = 0, receives = 0;
      for (const plan::Transfer& t : p.transfers()) {
        if (plan::DeltaElemBytes(p, t) == 0) continue;
        sends += t.from_rank == r;
        receives += t.to_rank == r;
      }
      const RefitStats& st = world.ranks[r].engine->last_stats();
      if ((sends > 0 && st.delta_pieces == 0) || (receives > 0 && st.deltas_applied == 0) ||
          st.delta_full_no_base != 0) {
        SetupFailed(
            absl::StrCat("world ", w, ", rank ", r, ", epoch 2: ", st.delta_pieces, " of ", sends,
                         " pieces sent as deltas, ", st.deltas_applied, " of ", receives,
                         " applied, ", st.delta_full_no_base,
                         " sent plain for want of a base: not the delta world it should be"));
      }
    }
  }
}

void RunInput(const uint8_t* data, size_t size) {
  Reader in(data, size);
  const uint8_t setup = in.Byte();
  // Bit 7: a delta world; with bit 4 too, a delta relay world; bit 4 alone, a plain relay world.
  const size_t kind = (setup & 0x80) != 0   ? ((setup & 0x10) == 0 ? 4 : 8)
                      : (setup & 0x10) != 0 ? 12
                                            : 0;
  World& world = harness->worlds[kind + ((setup & 8) != 0 ? 2 : 0) + (setup & 1)];
  const int32_t victim = (setup >> 1) & 3;
  std::vector<Message> messages;
  while (!in.empty() && messages.size() < kMaxMessages) {
    messages.push_back(Decode(in, world, victim));
  }
  // Dispatch order follows the rounds (stable for equal delays).
  std::stable_sort(messages.begin(), messages.end(),
                   [](const Message& a, const Message& b) { return a.delay < b.delay; });
  Injection injection;
  const bool ok = RunEpoch(world, victim, messages, &injection, "epoch with messages");
  if (ok && !injection.legit) return;
  // A failed epoch, or a legitimate peer's messages that may outlive it (an abort that came
  // after the epoch ended on the victim fails its next Start, by design): every rank resets,
  // then a clean epoch must refit exactly - unless a legitimate peer granted a future epoch,
  // which the source remembers (not a defect).
  for (Rank& rank : world.ranks) rank.engine->Reset();
  Injection clean;
  clean.legit = injection.future_grant;
  if (RunEpoch(world, victim, {}, &clean, "clean epoch after Reset")) {
    // The epoch rule: after Reset no rank holds a base, so no piece goes as a delta.
    for (int32_t r = 0; r < kWorld; ++r) {
      const RefitStats& st = world.ranks[r].engine->last_stats();
      if (st.delta_pieces != 0 || st.deltas_applied != 0) {
        Finding("clean epoch after Reset: rank %d sent %lld pieces as deltas and applied %lld", r,
                static_cast<long long>(st.delta_pieces), static_cast<long long>(st.deltas_applied));
      }
    }
    return;
  }
  // A source that was granted a future epoch can't be trusted any more: new engines.
  for (Rank& rank : world.ranks) rank.engine->Reset();
  for (Rank& rank : world.ranks) rank.engine.reset();
  BuildWorld(world);
  if (verbose) std::fprintf(stderr, "rebuilt the %s world\n", world.ranks[0].engine->delivery());
}

}  // namespace
}  // namespace reshard::net

// LeakSanitizer does not scan memory that UCX maps itself (its endpoints live in a strided
// allocator's mmap'ed chunks, its shared-memory segments in pool chunks), so the objects UCX
// hangs off them look leaked while the engines live, and they live until the process exits.
// Suppressed by UCX's own allocation frames only (ucs_malloc & co., libuct): an allocation of
// reshard's handlers, which UCX calls, is made by reshard's frames and stays reported.
extern "C" const char* __lsan_default_suppressions() { return "leak:libucs.so\nleak:libuct.so\n"; }

extern "C" const char* __lsan_default_options() { return "print_suppressions=0"; }

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  reshard::net::Init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (reshard::net::harness == nullptr) reshard::net::Init();
  reshard::net::RunInput(data, size);
  return 0;
}
