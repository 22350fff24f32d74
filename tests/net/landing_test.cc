// Landing's view of a region for the CUDA delta kernels (DeltaPieceOf, src/net/landing.h): on
// both sides, element e of the piece lies where plan::ForEachRun's runs put it, for every region
// of the example specs' plans (rows to columns, fused q/k/v views, uneven nested shards, a
// domain schedule with fan-out), so the GPU encode reads and the GPU apply writes exactly the
// bytes the host path gathers and applies. And the checks of data messages (Landing::Data)
// against hostile headers: delta segments, and messages into device memory (bounce area).
#include "src/net/landing.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "src/common/delta_codec.h"
#include "src/cuda/delta_index.h"
#include "src/cuda/runtime.h"
#include "src/net/registered_memory.h"
#include "src/net/runtime.h"
#include "src/net/send_program.h"
#include "src/net/wire.h"
#include "src/plan/spec_json.h"

namespace reshard::net {
namespace {

// The plan of a spec. Also sets up UCX for an in-process test: one context over loopback memory
// only (no peers: nothing is sent).
absl::StatusOr<plan::Plan> PlanOf(const char* spec_json) {
  setenv("UCX_TLS", "self,sm", 1);
  setenv("UCX_NET_DEVICES", "all", 1);
  auto spec = plan::ParseSpecJson(spec_json);
  if (!spec.ok()) return spec.status();
  return plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*std::move(spec)));
}

// One u8 tensor "u" of 600,000 elements, whole on rank 0 and on rank 1.
absl::StatusOr<plan::Plan> WholeTensorPlan() {
  return PlanOf(R"json({"tensors": [{"name": "u", "dtype": "u8",
      "shape": [600000], "src": {"mesh": [0], "placements": ["R"]},
      "dst": {"mesh": [1], "placements": ["R"]}}]})json");
}

TEST(DeltaPieceOf, ElementsLieWhereTheRegionsRunsPutThem) {
  int64_t regions = 0, strided = 0;
  for (const char* name :
       {"fig1-rows-to-cols", "fig3-tp4-to-tp2dp2", "fused-qkv", "uneven-nested"}) {
    SCOPED_TRACE(name);
    std::ifstream in(std::string(RESHARD_SOURCE_DIR) + "/examples/specs/" + name + ".json");
    std::stringstream text;
    text << in.rdbuf();
    auto spec = plan::ParseSpecJson(text.str());
    ASSERT_TRUE(spec.ok()) << spec.status();
    auto plan = plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*spec));
    ASSERT_TRUE(plan.ok()) << plan.status();
    for (const plan::Transfer& t : plan->transfers()) {
      const plan::Region& region = plan->region(t.region);
      if (region.bytes == 0) continue;
      // As the engine compares elements (DeltaElemBytes): at the destination's element size.
      const int es = plan->buffers()[plan->buffer_of(t.tensor, t.to_side)].elem_bytes;
      for (const bool source : {true, false}) {
        const cuda::DeltaPiece p = DeltaPieceOf(*plan, region, source, es);
        ASSERT_EQ(p.elems * es, region.bytes);
        int64_t e = 0;
        plan::ForEachRun(region, plan->region_dims(region),
                         [&](int64_t from, int64_t to, int64_t n) {
                           for (int64_t k = 0; k < n / es; ++k, ++e) {
                             ASSERT_EQ(cuda::ElementOffset(p, e), (source ? from : to) + k * es)
                                 << "element " << e;
                           }
                         });
        ASSERT_EQ(e, p.elems);
      }
      ++regions;
      strided += region.ndims > 0;
    }
  }
  EXPECT_GT(regions, 20);
  EXPECT_GT(strided, 10);
}

// Data messages of a delta piece of three segments (u8, 600,000 elements: 262,144 + 262,144 +
// 75,712) arriving at rank 1, as a peer on its own endpoint could send them: every header that
// points outside the piece's segments, wraps, names another length than the message carries
// (a part of a stream: senders never cut one), brings more than the segment's capacity, repeats
// a segment, or carries a malformed stream is DataLoss and writes nothing; then the three
// segments' plain streams, one message each, sent last segment first, land the piece exactly
// (true only with the last). With active messages nothing is reserved for the streams; with
// puts the landing area holds their capacity.
// Host memory for each of `rank`'s plan buffers, filled with `fill`, and views of it.
struct HostBuffers {
  HostBuffers(const plan::Plan& plan, int32_t rank, uint8_t fill) {
    const std::vector<int64_t> bytes = plan.BufferBytes(rank);
    memory.reserve(bytes.size());
    for (int64_t b : bytes) {
      memory.emplace_back(static_cast<size_t>(b), fill);
      views.push_back(common::BufferView{memory.back().data(), b, common::MemoryKind::kHost});
    }
  }
  std::vector<std::vector<uint8_t>> memory;
  std::vector<common::BufferView> views;
};

TEST(LandingDelta, HostileSegmentMessagesAreRefusedAndNothingIsWritten) {
  auto plan = WholeTensorPlan();
  ASSERT_TRUE(plan.ok()) << plan.status();
  {
    const SendProgram puts = BuildSendProgram(*plan, 1, SendProgramOptions{true, 0, 0, true});
    EXPECT_EQ(puts.landing_bytes, delta::PieceCapacity(600000, 1));
    EXPECT_EQ(puts.landing_offset[0], 0);
  }
  {
    const SendProgram program =
        BuildSendProgram(*plan, 1, SendProgramOptions{true, 0, wire::kAmChunkBytes, true});
    ASSERT_EQ(program.received.size(), 1u);
    ASSERT_EQ(program.delta_elem_bytes[0], 1);
    EXPECT_EQ(program.landing_bytes, 0);  // Nothing reserved for delta streams.
    EXPECT_EQ(program.landing_offset[0], -1);
    auto runtime = Runtime::Create();
    ASSERT_TRUE(runtime.ok()) << runtime.status();
    HostBuffers host(*plan, 1, 0xA5);
    std::vector<std::vector<uint8_t>>& memory = host.memory;
    auto registered = RegisteredMemory::Create(*plan, 1, **runtime, host.views, 0, 0);
    ASSERT_TRUE(registered.ok()) << registered.status();
    Landing landing(*plan, program, **registered, /*data_messages=*/true);
    const uint32_t dst = plan->buffer_of(0, plan::Side::kDst);
    const std::vector<uint8_t> poisoned(600000, 0xA5);
    auto untouched = [&] { return memory[dst] == poisoned; };

    const int64_t stride = delta::SegmentStride(1);
    const int64_t last = delta::StreamCapacity(75712, 1);  // The third segment's plain stream.
    std::vector<uint8_t> junk(static_cast<size_t>(stride + 8), 0x33);
    uint64_t epoch = 0;
    auto send = [&](uint64_t offset, uint64_t stream, const uint8_t* data, size_t n,
                    uint32_t packed = 1) {
      const wire::DataHeader h{wire::AmHeader{wire::kMagic, 0, 0, epoch}, program.received_ids[0],
                               packed, offset, stream};
      uint32_t slot = 0;
      return landing.Data(h, data, n, &slot);
    };
    struct Case {
      const char* what;
      uint64_t offset, stream;
      size_t n;
      const char* says;
    };
    const Case cases[] = {
        {"an offset that wraps", UINT64_MAX - 3, 64, 64, "not one whole segment"},
        {"a fourth segment", static_cast<uint64_t>(3 * stride), 64, 64, "not one whole segment"},
        {"far past the piece", static_cast<uint64_t>(1) << 62, 64, 64, "not one whole segment"},
        {"a stream longer than its segment", 0, static_cast<uint64_t>(stride + 1),
         static_cast<size_t>(stride + 1), "not one whole segment"},
        {"a stream longer than the last segment", static_cast<uint64_t>(2 * stride),
         static_cast<uint64_t>(last + 1), static_cast<size_t>(last + 1), "not one whole segment"},
        {"a stream shorter than its header", 0, 8, 8, "not one whole segment"},
        {"a part of a stream", 0, 100, 64, "not one whole segment"},
        {"a stream's end at its segment's offset", static_cast<uint64_t>(stride + 60), 64, 64,
         "not one whole segment"},
        {"a stream length of 2^64 - 1", 0, UINT64_MAX, 64, "not one whole segment"},
        {"a whole segment that is not a delta stream", 0, 64, 64, "segment 0"},
    };
    for (const Case& c : cases) {
      SCOPED_TRACE(c.what);
      landing.StartEpoch(++epoch, 0);
      auto got = send(c.offset, c.stream, junk.data(), c.n);
      ASSERT_FALSE(got.ok());
      EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
      EXPECT_NE(got.status().message().find("tensor \"u\""), std::string::npos) << got.status();
      EXPECT_NE(got.status().message().find(c.says), std::string::npos) << got.status();
      EXPECT_TRUE(untouched());
    }
    {
      SCOPED_TRACE("a data message without the packed flag");
      landing.StartEpoch(++epoch, 0);
      auto got = send(0, 64, junk.data(), 64, /*packed=*/0);
      ASSERT_FALSE(got.ok());
      EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
    }

    // The real thing: plain streams of the three segments, one message each, the last segment
    // first; then the last segment again.
    std::vector<uint8_t> values(600000), shadow(600000);
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint8_t>(i * 7 + 3);
    landing.StartEpoch(++epoch, 0);
    std::vector<uint8_t> stream(static_cast<size_t>(stride));
    int64_t bytes_last = 0;
    for (int64_t k = 2; k >= 0; --k) {
      const int64_t first = delta::SegmentFirst(k, 1), n = delta::SegmentLength(600000, 1, k);
      const delta::EncodeResult r = delta::EncodePiece(values.data() + first, shadow.data() + first,
                                                       n, 1, 0, /*delta=*/false, stream.data());
      ASSERT_EQ(r.mode, delta::kFull);
      auto got = send(static_cast<uint64_t>(k * stride), static_cast<uint64_t>(r.bytes),
                      stream.data(), static_cast<size_t>(r.bytes));
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(*got, k == 0) << "segment " << k;
      if (k == 0) bytes_last = r.bytes;
    }
    EXPECT_EQ(memory[dst], values);
    EXPECT_EQ(landing.wire_bytes(0), 600000 + 3 * 32);
    auto again =
        send(0, static_cast<uint64_t>(bytes_last), stream.data(), static_cast<size_t>(bytes_last));
    ASSERT_FALSE(again.ok());
    EXPECT_NE(again.status().message().find("segment 0 of transfer"), std::string::npos)
        << again.status();
    EXPECT_NE(again.status().message().find("twice"), std::string::npos) << again.status();
  }
}

// With puts, a delta piece's sender says after each segment's stream but the last how many
// segments' places are filled (wire::kProgressAm): they are applied then, as at the signal, so a
// relay forwards them early; the signal applies the rest. Progress that is not whole segments'
// places, or more of them than the piece has, is DataLoss naming the tensor.
TEST(LandingDelta, ProgressAppliesSegmentsBeforeTheSignal) {
  auto plan = WholeTensorPlan();
  ASSERT_TRUE(plan.ok()) << plan.status();
  const SendProgram program = BuildSendProgram(*plan, 1, SendProgramOptions{true, 0, 0, true});
  ASSERT_EQ(program.delta_elem_bytes[0], 1);
  ASSERT_EQ(program.landing_offset[0], 0);
  auto runtime = Runtime::Create();
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  HostBuffers host(*plan, 1, 0xA5);
  auto registered =
      RegisteredMemory::Create(*plan, 1, **runtime, host.views, 0, program.landing_bytes);
  ASSERT_TRUE(registered.ok()) << registered.status();
  Landing landing(*plan, program, **registered, /*data_messages=*/false);
  EXPECT_FALSE(landing.TrackPrefix(0));  // Delta pieces: their segments say it.
  const uint32_t dst = plan->buffer_of(0, plan::Side::kDst);
  const int64_t stride = delta::SegmentStride(1);
  // Plain streams of the three segments, each at its place in the landing area.
  std::vector<uint8_t> values(600000), shadow(600000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint8_t>(i * 5 + 1);
  for (int64_t k = 0; k < 3; ++k) {
    const int64_t first = delta::SegmentFirst(k, 1), n = delta::SegmentLength(600000, 1, k);
    const delta::EncodeResult r =
        delta::EncodePiece(values.data() + first, shadow.data() + first, n, 1, 0,
                           /*delta=*/false, (*registered)->landing() + k * stride);
    ASSERT_EQ(r.mode, delta::kFull);
  }
  landing.StartEpoch(1, 0);
  const uint32_t id = program.received_ids[0];
  uint32_t slot = 7;
  for (uint64_t bad : {uint64_t(stride + 1), uint64_t(4 * stride), uint64_t{1} << 63}) {
    auto got = landing.Progressed(0, id, bad, &slot);
    ASSERT_FALSE(got.ok()) << bad;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
    EXPECT_NE(got.status().message().find("tensor \"u\""), std::string::npos) << got.status();
  }
  EXPECT_EQ(landing.SegmentsApplied(0), 0);
  auto got = landing.Progressed(0, id, static_cast<uint64_t>(stride), &slot);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got);
  EXPECT_EQ(slot, 0u);
  EXPECT_TRUE(landing.SegmentApplied(0, 0));
  EXPECT_FALSE(landing.SegmentApplied(0, 1));
  const int64_t first1 = delta::SegmentFirst(1, 1);
  EXPECT_TRUE(std::equal(values.begin(), values.begin() + first1, host.memory[dst].begin()));
  EXPECT_EQ(host.memory[dst][first1], 0xA5);                              // Segment 1: not yet.
  got = landing.Progressed(0, id, static_cast<uint64_t>(stride), &slot);  // Again: nothing new.
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(*got);
  auto fresh = landing.Signalled(0, id, &slot);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_TRUE(*fresh);
  EXPECT_EQ(landing.SegmentsApplied(0), 3);
  EXPECT_EQ(host.memory[dst], values);
  EXPECT_EQ(landing.wire_bytes(0), 600000 + 3 * 32);
}

// Records an event after the copies queued so far and polls it until they ran (an emulated
// queue runs them at the first poll after them, which answers "not yet" once).
void RunQueuedCopies(cuda::CopyQueue& queue) {
  auto event = queue.Record();
  ASSERT_TRUE(event.ok()) << event.status();
  bool done = false;
  for (int poll = 0; poll < 3 && !done; ++poll) {
    auto d = queue.Done(*event);
    ASSERT_TRUE(d.ok()) << d.status();
    done = *d;
  }
  ASSERT_TRUE(done);
  queue.Release(*event);
}

// Data messages into device memory the engine writes (a direct destination, devices emulated on
// the host) go through the pinned bounce area and the copy queue, one queued copy per message,
// never a synchronous copy: three messages (two chunks and the rest) of a 600,000-byte piece land
// it once the queue ran. A message longer than a chunk, which no sender cuts, is DataLoss naming
// the tensor and writes nothing; so is a data message without the bounce area (Internal).
TEST(LandingBounce, DataMessagesIntoDeviceMemoryGoThroughTheBounceAreaOnly) {
  cuda::EmulateDevicesOnHost(true);
  struct Restore {
    ~Restore() { cuda::EmulateDevicesOnHost(false); }
  } restore;
  auto plan = WholeTensorPlan();
  ASSERT_TRUE(plan.ok()) << plan.status();
  const SendProgram program =
      BuildSendProgram(*plan, 1, SendProgramOptions{true, 0, wire::kAmChunkBytes});
  ASSERT_EQ(program.received.size(), 1u);
  auto runtime = Runtime::Create();
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  const uint32_t dst = plan->buffer_of(0, plan::Side::kDst);
  const std::vector<int64_t> bytes = plan->BufferBytes(1);
  ASSERT_EQ(bytes[dst], 600000);
  std::vector<uint8_t> device(600000, 0xA5);
  std::vector<common::BufferView> views(bytes.size());
  views[dst] = common::BufferView{device.data(), 600000, common::MemoryKind::kCuda};
  std::vector<bool> direct(bytes.size(), false);
  direct[dst] = true;
  auto registered = RegisteredMemory::Create(*plan, 1, **runtime, views, 0, 0, {}, direct);
  ASSERT_TRUE(registered.ok()) << registered.status();
  ASSERT_TRUE((*registered)->device(dst));
  auto queue = cuda::CopyQueue::Create();
  ASSERT_TRUE(queue.ok()) << queue.status();
  const std::vector<uint8_t> poisoned = device;

  std::vector<uint8_t> values(600000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint8_t>(i * 7 + 3);
  uint64_t epoch = 0;
  auto send = [&](Landing& landing, uint64_t offset, size_t n) {
    const wire::DataHeader h{wire::AmHeader{wire::kMagic, 0, 0, epoch}, program.received_ids[0], 0,
                             offset, 0};
    uint32_t slot = 0;
    return landing.Data(h, values.data() + offset, n, &slot);
  };
  constexpr auto kChunk = static_cast<size_t>(wire::kAmChunkBytes);
  {
    SCOPED_TRACE("no bounce area");
    Landing landing(*plan, program, **registered, /*data_messages=*/true);
    landing.StartEpoch(++epoch, 0);
    auto got = send(landing, 0, 1000);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInternal) << got.status();
    EXPECT_NE(got.status().message().find("tensor \"u\""), std::string::npos) << got.status();
    EXPECT_EQ(device, poisoned);
  }
  Landing landing(*plan, program, **registered, /*data_messages=*/true);
  landing.set_copy_queue(queue->get());
  ASSERT_TRUE(landing.InitBounce().ok());
  EXPECT_EQ(landing.bounce_bytes(), Landing::kBounceSlots * wire::kAmChunkBytes);
  {
    SCOPED_TRACE("a message one byte longer than a chunk");
    landing.StartEpoch(++epoch, 0);
    auto got = send(landing, 0, kChunk + 1);
    ASSERT_FALSE(got.ok());
    EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss) << got.status();
    EXPECT_NE(got.status().message().find("tensor \"u\""), std::string::npos) << got.status();
    EXPECT_NE(got.status().message().find("more than the 262144 bytes"), std::string::npos)
        << got.status();
    EXPECT_EQ(landing.bounced_messages(), 0);
    EXPECT_EQ(device, poisoned);
  }
  // The piece in three messages, the last first: complete with the third, and in the device
  // buffer only once the queue ran the copies.
  landing.StartEpoch(++epoch, 0);
  auto got = send(landing, 2 * kChunk, 600000 - 2 * kChunk);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_FALSE(*got);
  got = send(landing, 0, kChunk);
  ASSERT_TRUE(got.ok() && !*got) << got.status();
  got = send(landing, kChunk, kChunk);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got);
  EXPECT_EQ(landing.bounced_messages(), 3);
  EXPECT_EQ(device, poisoned) << "copied before the queue ran";
  auto landed = landing.Land(0);
  ASSERT_TRUE(landed.ok()) << landed.status();
  EXPECT_TRUE(*landed) << "the copies are queued: the engine waits for an event";
  RunQueuedCopies(**queue);
  EXPECT_EQ(device, values);
  EXPECT_EQ(landing.staged_to_device(), 600000);
}

// What a plain relay may forward before its feed landed (Landing::TrackPrefix, active messages):
// the prefix of the feed's region, in region order, whose bytes are in place. A 64 x 64 fp32
// matrix lands whole in a column-major destination, one 4-byte run per element: data messages in
// buffer order (column by column) arrive far out of region order (row by row), and after each the
// prefix is what a bitmap of the landed elements says; a packed stream's messages, the second
// half first, likewise. With puts the sender's progress messages set it (Progressed): a packed
// stream is unpacked as far as they say, the rest at the signal; more bytes than the region's,
// or a transfer the sender does not send, is DataLoss. Delta streams keep no prefix.
TEST(LandingPrefix, DataMessagesAdvanceTheRegionOrderPrefixRelaysForward) {
  auto plan = PlanOf(R"json({"tensors": [{"name": "m", "dtype": "fp32",
      "shape": [64, 64], "src": {"mesh": [0], "placements": ["R"]},
      "dst": {"mesh": [1], "placements": ["R"], "view": {"strides": [1, 64]}}}]})json");
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto runtime = Runtime::Create();
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  const uint32_t dst = plan->buffer_of(0, plan::Side::kDst);
  HostBuffers host(*plan, 1, 0);
  std::vector<std::vector<uint8_t>>& memory = host.memory;
  auto registered = RegisteredMemory::Create(*plan, 1, **runtime, host.views, 0, 0);
  ASSERT_TRUE(registered.ok()) << registered.status();
  std::vector<uint8_t> values(64 * 64 * 4);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint8_t>(i * 13 + 5);
  constexpr int64_t kRegion = 64 * 64 * 4;
  // Element (i, j): region position (i * 64 + j) * 4, buffer offset (i + j * 64) * 4.
  auto element_here = [&](int64_t i, int64_t j) {
    return std::memcmp(memory[dst].data() + (i + j * 64) * 4, values.data() + (i * 64 + j) * 4,
                       4) == 0;
  };

  {
    SCOPED_TRACE("unpacked, column by column");
    const SendProgram program =
        BuildSendProgram(*plan, 1, SendProgramOptions{true, 0, wire::kAmChunkBytes});
    ASSERT_EQ(program.received.size(), 1u);
    ASSERT_LT(program.landing_offset[0], 0);  // Not packed.
    Landing landing(*plan, program, **registered, /*data_messages=*/true);
    ASSERT_TRUE(landing.TrackPrefix(0));
    for (uint64_t epoch = 1; epoch <= 2; ++epoch) {  // A second epoch starts from nothing.
      landing.StartEpoch(epoch, 0);
      EXPECT_EQ(landing.LandedPrefix(0), 0);
      std::vector<bool> here(64 * 64, false);
      size_t prefix = 0;
      for (int64_t j = 0; j < 64; ++j) {
        for (int64_t i = 0; i < 64; ++i) {
          // Element (i, j): region position (i * 64 + j) * 4, buffer offset (i + j * 64) * 4.
          const uint64_t to = static_cast<uint64_t>((i + j * 64) * 4);
          const wire::DataHeader h{wire::AmHeader{wire::kMagic, 0, 0, epoch},
                                   program.received_ids[0], 0, to, 0};
          uint32_t slot = 0;
          auto got = landing.Data(h, values.data() + (i * 64 + j) * 4, 4, &slot);
          ASSERT_TRUE(got.ok()) << got.status();
          EXPECT_EQ(*got, i == 63 && j == 63);
          here[static_cast<size_t>(i * 64 + j)] = true;
          while (prefix < here.size() && here[prefix]) prefix++;
          ASSERT_EQ(landing.LandedPrefix(0), static_cast<int64_t>(prefix * 4))
              << "after element (" << i << ", " << j << ")";
        }
      }
      auto landed = landing.Land(0);
      ASSERT_TRUE(landed.ok()) << landed.status();
      EXPECT_EQ(landing.LandedPrefix(0), kRegion);
    }
    for (int64_t i = 0; i < 64; ++i) {
      for (int64_t j = 0; j < 64; ++j) ASSERT_TRUE(element_here(i, j)) << i << ", " << j;
    }
  }
  {
    SCOPED_TRACE("packed, the second half first");
    const SendProgram program =
        BuildSendProgram(*plan, 1, SendProgramOptions{true, 1 << 20, wire::kAmChunkBytes});
    ASSERT_GE(program.landing_offset[0], 0);  // Packed.
    Landing landing(*plan, program, **registered, /*data_messages=*/true);
    ASSERT_TRUE(landing.TrackPrefix(0));
    landing.StartEpoch(1, 0);
    auto send = [&](uint64_t at, size_t n) {
      const wire::DataHeader h{wire::AmHeader{wire::kMagic, 0, 0, 1}, program.received_ids[0], 1,
                               at, 0};
      uint32_t slot = 0;
      return landing.Data(h, values.data() + at, n, &slot);
    };
    auto got = send(kRegion / 2, kRegion / 4);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(landing.LandedPrefix(0), 0);
    got = send(3 * kRegion / 4, kRegion / 4);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(landing.LandedPrefix(0), 0);
    got = send(0, kRegion / 4);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(landing.LandedPrefix(0), kRegion / 4);
    got = send(kRegion / 4, kRegion / 4);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(*got);
    EXPECT_EQ(landing.LandedPrefix(0), kRegion);
  }
  {
    SCOPED_TRACE("puts, unpacked");
    const SendProgram puts = BuildSendProgram(*plan, 1, SendProgramOptions{true, 0, 0});
    Landing landing(*plan, puts, **registered, /*data_messages=*/false);
    ASSERT_TRUE(landing.TrackPrefix(0));
    landing.StartEpoch(1, 0);
    uint32_t slot = 7;
    auto grew = landing.Progressed(0, puts.received_ids[0], kRegion / 4, &slot);
    ASSERT_TRUE(grew.ok()) << grew.status();
    EXPECT_TRUE(*grew);
    EXPECT_EQ(slot, 0u);
    EXPECT_EQ(landing.LandedPrefix(0), kRegion / 4);
    grew = landing.Progressed(0, puts.received_ids[0], kRegion / 8, &slot);  // Never shrinks.
    ASSERT_TRUE(grew.ok()) << grew.status();
    EXPECT_FALSE(*grew);
    EXPECT_EQ(landing.LandedPrefix(0), kRegion / 4);
    auto hostile = landing.Progressed(0, puts.received_ids[0], kRegion + 1, &slot);
    ASSERT_FALSE(hostile.ok());
    EXPECT_EQ(hostile.status().code(), absl::StatusCode::kDataLoss) << hostile.status();
    EXPECT_NE(hostile.status().message().find("tensor \"m\""), std::string::npos)
        << hostile.status();
    hostile = landing.Progressed(1, puts.received_ids[0], 4, &slot);  // Not its sender.
    EXPECT_EQ(hostile.status().code(), absl::StatusCode::kDataLoss) << hostile.status();
  }
  {
    SCOPED_TRACE("puts, packed");
    const SendProgram puts = BuildSendProgram(*plan, 1, SendProgramOptions{true, 1 << 20, 0});
    ASSERT_GE(puts.landing_offset[0], 0);
    auto with_area =
        RegisteredMemory::Create(*plan, 1, **runtime, host.views, 0, puts.landing_bytes);
    ASSERT_TRUE(with_area.ok()) << with_area.status();
    // The stream is the region in region order: element (i, j) at (i * 64 + j) * 4.
    std::memcpy((*with_area)->landing() + puts.landing_offset[0], values.data(), kRegion);
    std::fill(memory[dst].begin(), memory[dst].end(), 0);
    Landing landing(*plan, puts, **with_area, /*data_messages=*/false);
    ASSERT_TRUE(landing.TrackPrefix(0));
    landing.StartEpoch(1, 0);
    uint32_t slot = 0;
    auto grew = landing.Progressed(0, puts.received_ids[0], kRegion / 2, &slot);
    ASSERT_TRUE(grew.ok()) << grew.status();
    EXPECT_TRUE(element_here(31, 63));  // The first half of the rows: unpacked.
    EXPECT_FALSE(element_here(32, 0));  // The rest: not yet.
    auto fresh = landing.Signalled(0, puts.received_ids[0], &slot);
    ASSERT_TRUE(fresh.ok()) << fresh.status();
    EXPECT_TRUE(*fresh);
    for (int64_t i = 0; i < 64; ++i) {
      for (int64_t j = 0; j < 64; ++j) ASSERT_TRUE(element_here(i, j)) << i << ", " << j;
    }
  }
  {
    SCOPED_TRACE("delta streams");
    const SendProgram delta =
        BuildSendProgram(*plan, 1, SendProgramOptions{true, 0, wire::kAmChunkBytes, true});
    ASSERT_NE(delta.delta_elem_bytes[0], 0);
    Landing deltas(*plan, delta, **registered, /*data_messages=*/true);
    EXPECT_FALSE(deltas.TrackPrefix(0));
  }
}

// A 512 x 256 u8 matrix into a column-major destination: 131,072 one-byte runs, the stream the
// bounds on data ahead of a gap and on queued advances are tested with.
constexpr char kColumnMajorBytes[] = R"json({"tensors": [{"name": "b", "dtype": "u8",
    "shape": [512, 256], "src": {"mesh": [0], "placements": ["R"]},
    "dst": {"mesh": [1], "placements": ["R"], "view": {"strides": [1, 512]}}}]})json";

// Data ahead of a gap waits in a map bounded per piece (Landing::kMaxAhead, 65,536 messages): a
// 512 x 256 u8 matrix into a column-major destination, one byte per run, sent column by column,
// leaves about 510 messages ahead per column; past the bound the next such message is DataLoss
// naming the tensor, before its byte is written.
TEST(LandingPrefix, DataFarAheadOfAGapIsBounded) {
  auto plan = PlanOf(kColumnMajorBytes);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto runtime = Runtime::Create();
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  HostBuffers host(*plan, 1, 0);
  auto registered = RegisteredMemory::Create(*plan, 1, **runtime, host.views, 0, 0);
  ASSERT_TRUE(registered.ok()) << registered.status();
  const SendProgram program =
      BuildSendProgram(*plan, 1, SendProgramOptions{true, 0, wire::kAmChunkBytes});
  ASSERT_LT(program.landing_offset[0], 0);
  Landing landing(*plan, program, **registered, /*data_messages=*/true);
  ASSERT_TRUE(landing.TrackPrefix(0));
  landing.StartEpoch(1, 0);
  const uint32_t dst = plan->buffer_of(0, plan::Side::kDst);
  const uint8_t one = 1;
  int64_t sent = 0;
  absl::Status refused;
  for (uint64_t to = 0; to < 512 * 256 && refused.ok(); ++to, ++sent) {
    const wire::DataHeader h{wire::AmHeader{wire::kMagic, 0, 0, 1}, program.received_ids[0], 0, to,
                             0};
    uint32_t slot = 0;
    auto got = landing.Data(h, &one, 1, &slot);
    if (!got.ok()) {
      refused = got.status();
      EXPECT_EQ(host.memory[dst][to], 0) << "written before it was refused";
    }
  }
  ASSERT_FALSE(refused.ok()) << "all " << sent << " messages accepted";
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << refused;
  EXPECT_NE(refused.message().find("tensor \"b\""), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("ahead of a gap"), std::string::npos) << refused;
  EXPECT_GT(sent, 65536);
}

// Relays out of CUDA destinations (devices emulated on the host): the prefix is kept where the
// landing knows the bytes are in place. A staged destination's pieces land in its pinned copy
// (what a relay reads): data messages advance the prefix and leave the device buffer alone until
// the piece lands. With a CUDA-aware UCX a registered destination tracks plain pieces by puts
// (the sender's progress) and landing rounds (RoundDrained: a round's scatter completed), and,
// with a copy queue, data messages through the bounce area and packed streams unpacked from the
// landing area, whose bytes count once the queue ran their copies (QueuedAdvance, then
// AdvanceInPlace; a landed piece is in place only with its copies' event); a progress message
// for a round piece is DataLoss naming the tensor.
TEST(LandingPrefix, CudaDestinationsKeepThePrefixWhereTheirBytesAreInPlace) {
  struct Restore {
    ~Restore() { cuda::EmulateDevicesOnHost(false); }
  } restore;
  auto plan = PlanOf(R"json({"tensors": [{"name": "m", "dtype": "fp32",
      "shape": [64, 64], "src": {"mesh": [0], "placements": ["R"]},
      "dst": {"mesh": [1], "placements": ["R"], "view": {"strides": [1, 64]}}}]})json");
  ASSERT_TRUE(plan.ok()) << plan.status();
  const uint32_t dst = plan->buffer_of(0, plan::Side::kDst);
  constexpr int64_t kRegion = 64 * 64 * 4;
  std::vector<uint8_t> values(kRegion);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint8_t>(i * 13 + 5);
  HostBuffers device(*plan, 1, 0xA5);
  for (common::BufferView& v : device.views) v.kind = common::MemoryKind::kCuda;
  const std::vector<uint8_t> untouched = device.memory[dst];
  const SendProgram am =
      BuildSendProgram(*plan, 1, SendProgramOptions{true, 0, wire::kAmChunkBytes});
  const SendProgram puts = BuildSendProgram(*plan, 1, SendProgramOptions{true, 0, 0});
  const SendProgram packed = BuildSendProgram(*plan, 1, SendProgramOptions{true, 1 << 20, 0});
  ASSERT_LT(puts.landing_offset[0], 0);
  ASSERT_GE(packed.landing_offset[0], 0);
  {
    SCOPED_TRACE("staged");
    cuda::EmulateDevicesOnHost(true, /*ucx_registers_them=*/false);
    auto runtime = Runtime::Create();
    ASSERT_TRUE(runtime.ok()) << runtime.status();
    auto staged = RegisteredMemory::Create(*plan, 1, **runtime, device.views, 0, 0);
    ASSERT_TRUE(staged.ok()) << staged.status();
    ASSERT_TRUE((*staged)->staged(dst));
    Landing landing(*plan, am, **staged, /*data_messages=*/true);
    ASSERT_TRUE(landing.TrackPrefix(0));
    landing.StartEpoch(1, 0);
    // Row 0 (region positions 0-255): element (0, j) at buffer offset j * 256.
    for (int64_t j = 0; j < 64; ++j) {
      const wire::DataHeader h{wire::AmHeader{wire::kMagic, 0, 0, 1}, am.received_ids[0], 0,
                               static_cast<uint64_t>(j * 256), 0};
      uint32_t slot = 0;
      auto got = landing.Data(h, values.data() + j * 4, 4, &slot);
      ASSERT_TRUE(got.ok()) << got.status();
    }
    EXPECT_EQ(landing.LandedPrefix(0), 256);
    EXPECT_EQ(std::memcmp((*staged)->data(dst) + 63 * 256, values.data() + 63 * 4, 4), 0);
    EXPECT_EQ(device.memory[dst], untouched) << "the device buffer is written when it landed";
    Landing by_puts(*plan, puts, **staged, /*data_messages=*/false);
    ASSERT_TRUE(by_puts.TrackPrefix(0));
    by_puts.StartEpoch(1, 0);
    uint32_t slot = 0;
    auto grew = by_puts.Progressed(0, puts.received_ids[0], kRegion / 2, &slot);
    ASSERT_TRUE(grew.ok()) << grew.status();
    EXPECT_TRUE(*grew);
    EXPECT_EQ(by_puts.LandedPrefix(0), kRegion / 2);
  }
  SCOPED_TRACE("registered");
  cuda::EmulateDevicesOnHost(true, /*ucx_registers_them=*/true);
  auto runtime = Runtime::Create();
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  ASSERT_TRUE((*runtime)->supports_cuda_memory());
  auto registered =
      RegisteredMemory::Create(*plan, 1, **runtime, device.views, 0, packed.landing_bytes);
  ASSERT_TRUE(registered.ok()) << registered.status();
  ASSERT_TRUE((*registered)->device(dst));
  // Without a copy queue nothing moves data messages or landing-area streams to the device.
  EXPECT_FALSE(Landing(*plan, am, **registered, /*data_messages=*/true).TrackPrefix(0));
  EXPECT_FALSE(Landing(*plan, packed, **registered, /*data_messages=*/false).TrackPrefix(0));
  auto queue = cuda::CopyQueue::Create();
  ASSERT_TRUE(queue.ok()) << queue.status();
  auto run_queue = [&] { RunQueuedCopies(**queue); };
  {
    SCOPED_TRACE("registered, data messages through the bounce area");
    Landing landing(*plan, am, **registered, /*data_messages=*/true);
    landing.set_copy_queue(queue->get());
    ASSERT_TRUE(landing.InitBounce().ok());
    ASSERT_TRUE(landing.TrackPrefix(0));
    landing.StartEpoch(1, 0);
    int64_t at = -1, length = 0;
    EXPECT_FALSE(landing.QueuedAdvance(&at, &length));
    // Element (0, 0): region position 0, buffer offset 0.
    const wire::DataHeader h{wire::AmHeader{wire::kMagic, 0, 0, 1}, am.received_ids[0], 0, 0, 0};
    uint32_t slot = 0;
    auto got = landing.Data(h, values.data(), 4, &slot);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(landing.LandedPrefix(0), 0) << "in place only once the copy ran";
    ASSERT_TRUE(landing.QueuedAdvance(&at, &length));
    EXPECT_EQ(at, 0);
    EXPECT_EQ(length, 4);
    EXPECT_FALSE(landing.QueuedAdvance(&at, &length)) << "taken once";
    run_queue();
    EXPECT_EQ(std::memcmp(device.memory[dst].data(), values.data(), 4), 0);
    EXPECT_TRUE(landing.AdvanceInPlace(0, at, length));
    EXPECT_EQ(landing.LandedPrefix(0), 4);
  }
  {
    SCOPED_TRACE("registered, a packed stream unpacked from the landing area");
    // The stream is the region in region order: element (i, j) at (i * 64 + j) * 4.
    std::memcpy((*registered)->landing() + packed.landing_offset[0], values.data(), kRegion);
    std::fill(device.memory[dst].begin(), device.memory[dst].end(), 0);
    Landing landing(*plan, packed, **registered, /*data_messages=*/false);
    landing.set_copy_queue(queue->get());
    ASSERT_TRUE(landing.TrackPrefix(0));
    landing.StartEpoch(1, 0);
    uint32_t slot = 0;
    auto grew = landing.Progressed(0, packed.received_ids[0], kRegion / 2, &slot);
    ASSERT_TRUE(grew.ok()) << grew.status();
    EXPECT_FALSE(*grew) << "queued: grows once the copies ran";
    int64_t at = -1, length = 0;
    ASSERT_TRUE(landing.QueuedAdvance(&at, &length));
    EXPECT_EQ(at, 0);
    EXPECT_EQ(length, kRegion / 2);
    EXPECT_EQ(landing.LandedPrefix(0), 0);
    run_queue();
    // Row 31 unpacked (element (31, 63) at buffer offset (31 + 63 * 64) * 4), row 32 not.
    EXPECT_EQ(std::memcmp(device.memory[dst].data() + (31 + 63 * 64) * 4,
                          values.data() + (31 * 64 + 63) * 4, 4),
              0);
    EXPECT_NE(std::memcmp(device.memory[dst].data() + 32 * 4, values.data() + 32 * 64 * 4, 4), 0);
    EXPECT_TRUE(landing.AdvanceInPlace(0, at, length));
    EXPECT_EQ(landing.LandedPrefix(0), kRegion / 2);
    // The signal unpacks the rest (queued too); landed, but in place only with its event.
    auto fresh = landing.Signalled(0, packed.received_ids[0], &slot);
    ASSERT_TRUE(fresh.ok() && *fresh) << fresh.status();
    auto queued = landing.Land(0);
    ASSERT_TRUE(queued.ok()) << queued.status();
    EXPECT_TRUE(*queued);
    EXPECT_TRUE(landing.landed(0));
    EXPECT_FALSE(landing.in_place(0));
    EXPECT_EQ(landing.LandedPrefix(0), kRegion / 2);
    run_queue();
    landing.InPlace(0);
    EXPECT_EQ(landing.LandedPrefix(0), kRegion);
    for (int64_t i = 0; i < 64; ++i) {
      for (int64_t j = 0; j < 64; ++j) {
        ASSERT_EQ(std::memcmp(device.memory[dst].data() + (i + j * 64) * 4,
                              values.data() + (i * 64 + j) * 4, 4),
                  0)
            << i << ", " << j;
      }
    }
  }
  {
    Landing landing(*plan, puts, **registered, /*data_messages=*/false);
    ASSERT_TRUE(landing.TrackPrefix(0));
    landing.StartEpoch(1, 0);
    uint32_t slot = 0;
    auto grew = landing.Progressed(0, puts.received_ids[0], kRegion / 4, &slot);
    ASSERT_TRUE(grew.ok()) << grew.status();
    EXPECT_TRUE(*grew);
    EXPECT_EQ(landing.LandedPrefix(0), kRegion / 4);
  }
  // The piece (4,096 runs) into a strided registered destination travels in landing rounds.
  std::vector<RoundMode> modes(device.views.size(), RoundMode::kNone);
  modes[dst] = RoundMode::kStrided;
  auto rounds = PlanLandingRounds(*plan, puts, modes, int64_t{1} << 20);
  ASSERT_TRUE(rounds.ok()) << rounds.status();
  Landing landing(*plan, puts, **registered, /*data_messages=*/false);
  landing.set_rounds(&*rounds);
  ASSERT_TRUE(landing.InRounds(0));
  ASSERT_TRUE(landing.TrackPrefix(0));
  for (uint64_t epoch = 1; epoch <= 2; ++epoch) {  // A second epoch starts from nothing.
    landing.StartEpoch(epoch, 0);
    EXPECT_EQ(landing.LandedPrefix(0), 0);
    EXPECT_TRUE(landing.RoundDrained(0, 4096));
    EXPECT_FALSE(landing.RoundDrained(0, 1024));  // Never shrinks.
    EXPECT_EQ(landing.LandedPrefix(0), 4096);
    uint32_t slot = 0;
    auto hostile = landing.Progressed(0, puts.received_ids[0], 8192, &slot);
    ASSERT_FALSE(hostile.ok());
    EXPECT_EQ(hostile.status().code(), absl::StatusCode::kDataLoss) << hostile.status();
    EXPECT_NE(hostile.status().message().find("tensor \"m\""), std::string::npos)
        << hostile.status();
    EXPECT_NE(hostile.status().message().find("landing rounds"), std::string::npos)
        << hostile.status();
    EXPECT_EQ(landing.LandedPrefix(0), 4096);
    landing.LandRound(0);
    EXPECT_EQ(landing.LandedPrefix(0), kRegion);
    EXPECT_FALSE(landing.RoundDrained(0, 8192));
  }
}

// Progress for a packed stream into registered device memory queues its unpacking and an event
// each time (devices emulated on the host): a sender saying one byte more each time, never
// letting the copies run, is refused past Landing::kMaxAhead queued advances with DataLoss
// naming the tensor (a 512 x 256 u8 matrix into a column-major destination: 131,072 bytes of
// one-byte runs, so its stream could take twice as many).
TEST(LandingPrefix, ProgressQueuedIntoDeviceMemoryIsBounded) {
  struct Restore {
    ~Restore() { cuda::EmulateDevicesOnHost(false); }
  } restore;
  cuda::EmulateDevicesOnHost(true, /*ucx_registers_them=*/true);
  auto plan = PlanOf(kColumnMajorBytes);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto runtime = Runtime::Create();
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  HostBuffers device(*plan, 1, 0);
  for (common::BufferView& v : device.views) v.kind = common::MemoryKind::kCuda;
  const SendProgram packed = BuildSendProgram(*plan, 1, SendProgramOptions{true, 1 << 20, 0});
  ASSERT_GE(packed.landing_offset[0], 0);
  auto registered =
      RegisteredMemory::Create(*plan, 1, **runtime, device.views, 0, packed.landing_bytes);
  ASSERT_TRUE(registered.ok()) << registered.status();
  auto queue = cuda::CopyQueue::Create();
  ASSERT_TRUE(queue.ok()) << queue.status();
  Landing landing(*plan, packed, **registered, /*data_messages=*/false);
  landing.set_copy_queue(queue->get());
  ASSERT_TRUE(landing.TrackPrefix(0));
  landing.StartEpoch(1, 0);
  absl::Status refused;
  uint64_t bytes = 0;
  while (refused.ok() && bytes < 512 * 256) {
    uint32_t slot = 0;
    auto grew = landing.Progressed(0, packed.received_ids[0], ++bytes, &slot);
    if (!grew.ok()) {
      refused = grew.status();
      break;
    }
    int64_t at = 0, length = 0;
    ASSERT_TRUE(landing.QueuedAdvance(&at, &length));  // Left queued: no event polled.
  }
  ASSERT_FALSE(refused.ok()) << "all " << bytes << " progress messages accepted";
  EXPECT_EQ(bytes, 65537u);
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss) << refused;
  EXPECT_NE(refused.message().find("tensor \"b\""), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("more than 65536 progress messages"), std::string::npos)
      << refused;
  // Once the queue ran them and they advanced, the next one is taken.
  RunQueuedCopies(**queue);
  for (uint64_t k = 0; k < 65536; ++k) landing.AdvanceInPlace(0, static_cast<int64_t>(k), 1);
  EXPECT_EQ(landing.LandedPrefix(0), 65536);
  uint32_t slot = 0;
  auto taken = landing.Progressed(0, packed.received_ids[0], 65537, &slot);
  EXPECT_TRUE(taken.ok()) << taken.status();
}

}  // namespace
}  // namespace reshard::net
