// RefitEngine contracts, each rank in its own forked process (UCX shared memory, a FileStore in
// a temporary directory): a failed epoch is remembered until Reset, Progress reports every landed
// transfer exactly once (with puts and with active messages), buffers are validated. (Plan
// fingerprints are compared by the refit session, tests/api.) Every child sets UCX_TLS,
// UCX_NET_DEVICES and uses explicit deadlines.
#include "src/common/delta_codec.h"
#include "src/net/refit_engine.h"

#include <malloc.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <set>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

#if defined(__SANITIZE_ADDRESS__)
#define RESHARD_ASAN_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RESHARD_ASAN_ALLOCATOR 1
#endif
#endif
#ifdef RESHARD_ASAN_ALLOCATOR
#include <sanitizer/allocator_interface.h>
#endif

#include "src/common/shared_memory.h"
#include "src/common/status.h"
#include "src/cuda/runtime.h"
#include "src/net/runtime.h"
#include "src/net/ucx/context.h"
#include "src/net/ucx/endpoint.h"
#include "src/net/ucx/ops.h"
#include "src/net/wire.h"
#include "src/plan/dtype.h"
#include "src/plan/fill.h"
#include "src/plan/spec_json.h"
#include "src/rendezvous/file_store.h"
#include "src/rendezvous/record.h"
#include "tests/plan/spec_text.h"
#include "tests/testing/multiprocess.h"

namespace reshard::net {
namespace {

using rendezvous::FileStore;

constexpr uint8_t kPoison = 0xA5;

std::string StoreDir(const std::string& name) {
  return testing::ScratchDir(absl::StrCat("engine-", name));
}

struct RankBuffers {
  plan::Plan plan;
  std::vector<absl::Span<uint8_t>> memory;  // By buffer id, in owned or shared.
  std::vector<BufferView> buffers;
  std::vector<std::vector<uint8_t>> owned;
  std::vector<std::unique_ptr<SharedBuffer>> shared;
};

// `share`: the rank's share of the plan (BuildRankPlan, what the refit session passes), else the
// world plan. `shared_destinations`: destination buffers are SharedBuffers (what HostBuffer
// allocates).
RankBuffers MakeBuffers(const std::string& spec_text, int32_t rank, bool share = false,
                        bool shared_destinations = false) {
  auto spec = plan::ParseSpecJson(spec_text);
  RESHARD_CHECK(spec.ok());
  auto shared = std::make_shared<const plan::RefitSpec>(*spec);
  auto plan = share ? plan::BuildRankPlan(shared, rank) : plan::BuildPlan(shared);
  RESHARD_CHECK(plan.ok());
  RankBuffers out{*std::move(plan), {}, {}, {}, {}};
  const std::vector<int64_t> bytes = out.plan.BufferBytes(rank);
  out.owned.resize(bytes.size());
  for (size_t b = 0; b < bytes.size(); ++b) {
    uint8_t* data = nullptr;
    if (shared_destinations && bytes[b] > 0 && out.plan.buffers()[b].side == plan::Side::kDst) {
      auto buffer = SharedBuffer::Allocate(absl::StrCat("r", rank, "-test"), bytes[b]);
      RESHARD_CHECK(buffer.ok());
      out.shared.push_back(*std::move(buffer));
      data = out.shared.back()->data();
      std::memset(data, kPoison, static_cast<size_t>(bytes[b]));
    } else {
      out.owned[b].assign(bytes[b], kPoison);
      data = out.owned[b].data();
    }
    out.memory.push_back(absl::Span<uint8_t>(data, static_cast<size_t>(bytes[b])));
    out.buffers.push_back(BufferView{data, bytes[b], MemoryKind::kHost});
  }
  return out;
}

void Fill(RankBuffers& rb, int32_t rank, uint64_t epoch) {
  const plan::RefitSpec& s = rb.plan.spec();
  for (size_t t = 0; t < s.tensors.size(); ++t) {
    uint8_t* src = rb.memory[rb.plan.buffer_of(t, plan::Side::kSrc)].data();
    plan::ForEachTile(s, t, plan::Side::kSrc, [&](int32_t r, const plan::Box& box) {
      if (r == rank) plan::FillTile(s, t, plan::Side::kSrc, box, epoch, src);
    });
  }
}

absl::Status Verify(const RankBuffers& rb, int32_t rank, uint64_t epoch) {
  const plan::RefitSpec& s = rb.plan.spec();
  absl::Status status;
  for (size_t t = 0; t < s.tensors.size(); ++t) {
    const uint8_t* dst = rb.memory[rb.plan.buffer_of(t, plan::Side::kDst)].data();
    plan::ForEachTile(s, t, plan::Side::kDst, [&](int32_t r, const plan::Box& box) {
      if (r == rank && status.ok()) status = plan::VerifyTile(s, t, box, epoch, rank, dst);
    });
  }
  return status;
}

// One rank's engine over a file store in `dir` (forked children): its buffers, store and runtime
// live as long as the engine.
struct ChildEngine {
  RankBuffers rb;
  std::unique_ptr<FileStore> store;
  std::shared_ptr<Runtime> runtime;
  std::unique_ptr<RefitEngine> engine;
};

// `kind` kCuda marks every buffer CUDA memory (the caller emulates devices on the host first:
// cuda::EmulateDevicesOnHost).
absl::StatusOr<ChildEngine> OpenEngine(const std::string& spec, int32_t rank,
                                       const std::string& dir, const RefitEngineOptions& options,
                                       bool share = false, bool shared_destinations = false,
                                       MemoryKind kind = MemoryKind::kHost) {
  ChildEngine c{MakeBuffers(spec, rank, share, shared_destinations), nullptr, nullptr, nullptr};
  for (BufferView& b : c.rb.buffers) b.kind = kind;
  RESHARD_ASSIGN_OR_RETURN(c.store, FileStore::Open(dir));
  RESHARD_ASSIGN_OR_RETURN(c.runtime, Runtime::Create());
  RESHARD_ASSIGN_OR_RETURN(
      c.engine, RefitEngine::Create(c.rb.plan, rank, *c.store, c.runtime, c.rb.buffers, options));
  return c;
}

constexpr char kRowsToCols[] = R"json({"tensors": [{"name": "w", "dtype": "fp32", "shape": [64, 48],
  "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}}]})json";

TEST(RefitEngine, PeerErrorHandlingFollowsTransports) {
  EXPECT_TRUE(ucx::TlsSupportsPeerErrorHandling(""));
  EXPECT_TRUE(ucx::TlsSupportsPeerErrorHandling("tcp"));
  EXPECT_TRUE(ucx::TlsSupportsPeerErrorHandling("sm,tcp"));
  EXPECT_TRUE(ucx::TlsSupportsPeerErrorHandling("rc,sm,self"));
  EXPECT_TRUE(ucx::TlsSupportsPeerErrorHandling("^tcp"));
  EXPECT_FALSE(ucx::TlsSupportsPeerErrorHandling("sm"));
  EXPECT_FALSE(ucx::TlsSupportsPeerErrorHandling("posix,sysv,cma,self"));
  EXPECT_FALSE(ucx::TlsSupportsPeerErrorHandling("shm,self,cuda_copy"));
}

TEST(RefitEngine, RejectsBuffersThatDoNotMatchThePlan) {
  RankBuffers rb = MakeBuffers(kRowsToCols, 2);
  auto store = FileStore::Open(StoreDir("buffers"));
  ASSERT_TRUE(store.ok());
  std::vector<BufferView> short_buffers = rb.buffers;
  for (BufferView& b : short_buffers) b.bytes = b.bytes > 0 ? b.bytes - 1 : 0;
  auto runtime = Runtime::Create();
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  auto engine = RefitEngine::Create(rb.plan, 2, **store, *runtime, short_buffers);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument) << engine.status();
  EXPECT_NE(engine.status().message().find("rank 2"), absl::string_view::npos);
  auto wrong_rank = RefitEngine::Create(rb.plan, 9, **store, *runtime, rb.buffers);
  auto no_runtime = RefitEngine::Create(rb.plan, 2, **store, nullptr, rb.buffers);
  EXPECT_EQ(no_runtime.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(wrong_rank.status().code(), absl::StatusCode::kInvalidArgument);
  // Another rank's share of the plan (BuildRankPlan) is refused.
  auto share = plan::BuildRankPlan(rb.plan.shared_spec(), 3);
  ASSERT_TRUE(share.ok()) << share.status();
  auto from_share = RefitEngine::Create(*share, 2, **store, *runtime, rb.buffers);
  EXPECT_EQ(from_share.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(from_share.status().message().find("rank 3's share"), absl::string_view::npos)
      << from_share.status();
  // Staging budgets below their least size: a ring below two minimal slots, a landing rounds'
  // budget below one least round (refused whether or not rounds are needed), rounds below the
  // least round.
  RefitEngineOptions tiny_ring, tiny_landing, tiny_rounds;
  tiny_ring.stage_ring_bytes = 511;
  tiny_landing.stage_landing_bytes = 4095;
  tiny_rounds.stage_round_bytes = 4095;
  for (const auto& [options, message] :
       {std::pair{tiny_ring, "rank 2: stage_ring_bytes is 511"},
        std::pair{tiny_landing, "rank 2: stage_landing_bytes is 4095"},
        std::pair{tiny_rounds, "rank 2: stage_round_bytes is 4095"}}) {
    auto refused = RefitEngine::Create(rb.plan, 2, **store, *runtime, rb.buffers, options);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_NE(refused.status().message().find(message), absl::string_view::npos)
        << refused.status();
  }
}

// Heap bytes in use: glibc's count (every arena, mmapped chunks included), or, under ASan, whose
// allocator replaces glibc's and leaves mallinfo2 at 0, ASan's count. (TSan's count misses large
// allocations, so scripts/sanitizers.sh does not run the test that uses this under TSan.)
size_t HeapInUse() {
#ifdef RESHARD_ASAN_ALLOCATOR
  return __sanitizer_get_current_allocated_bytes();
#else
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
#endif
}

// What a rank's engine keeps is sized by what the rank sends and receives, never by the world's
// transfers, whether it is given its share of the plan (what the refit session passes) or the
// world plan: rank 0 copies one tensor locally while ranks 1-16 move 128k pieces among
// themselves. (Rank 0 has no peers, so its engine wires up alone.) A forked child keeps the
// measurement free of the test runner's heap.
TEST(RefitEngine, SetUpMemoryDoesNotScaleWithWorldTransfers) {
  {
    // The count must see an allocation, or the bound below would hold without measuring.
    const size_t before = HeapInUse();
    auto probe = std::make_unique<char[]>(size_t{1} << 20);
    std::memset(probe.get(), 1, size_t{1} << 20);
    ASSERT_GE(HeapInUse(), before + (size_t{1} << 20)) << "HeapInUse() does not see the heap";
  }
  std::string spec = R"json({"tensors": [{"name": "own", "dtype": "fp32", "shape": [16, 16],
      "src": {"mesh": [0], "placements": ["R"]}, "dst": {"mesh": [0], "placements": ["R"]}})json";
  for (int t = 0; t < 2000; ++t) {
    absl::StrAppend(&spec, R"json(, {"name": "t)json", t,
                    R"json(", "dtype": "fp32", "shape": [64, 64],
        "src": {"mesh": [1, 2, 3, 4, 5, 6, 7, 8], "placements": ["S(1)"]},
        "dst": {"mesh": [9, 10, 11, 12, 13, 14, 15, 16], "placements": ["S(0)"]}})json");
  }
  spec += "]}";
  const std::string dir = StoreDir("memory");
  std::map<int32_t, int> codes = testing::ForkRanks(
      {0},
      [&](int32_t rank) {
        RankBuffers share = MakeBuffers(spec, rank, /*share=*/true);
        RankBuffers world = MakeBuffers(spec, rank, /*share=*/false);
        CHILD_EXPECT(world.plan.transfers().size() == 1 + 2000 * 64);
        CHILD_EXPECT(share.plan.transfers().size() == 1);
        auto store = FileStore::Open(dir);
        CHILD_EXPECT(store.ok());
        auto runtime = Runtime::Create();
        CHILD_EXPECT(runtime.ok());
        RefitEngineOptions options;
        // UCX allocates lazily on first use: warm it up with a first engine.
        options.key_prefix = "warm-up";
        {
          auto warm =
              RefitEngine::Create(share.plan, rank, **store, *runtime, share.buffers, options);
          CHILD_EXPECT(warm.ok());
          CHILD_EXPECT((*warm)->Execute(absl::Now() + absl::Seconds(10)).ok());
        }
        size_t grown[2] = {0, 0};
        for (int w = 0; w < 2; ++w) {
          RankBuffers& rb = w == 0 ? share : world;
          auto plan = std::make_shared<const plan::Plan>(rb.plan);
          options.key_prefix = w == 0 ? "share" : "world";
          const size_t before = HeapInUse();
          auto engine = RefitEngine::Create(plan, rank, **store, *runtime, rb.buffers, options);
          grown[w] = HeapInUse() - std::min(before, HeapInUse());
          CHILD_EXPECT(engine.ok());
          Fill(rb, rank, 1);
          CHILD_EXPECT((*engine)->Execute(absl::Now() + absl::Seconds(10)).ok());
          CHILD_EXPECT(Verify(rb, rank, 1).ok());
        }
        std::printf("engine set-up heap: %zu bytes on the share, %zu on the world plan of %d "
                    "transfers\n",
                    grown[0], grown[1], 1 + 2000 * 64);
        // The world plan's transfers alone take 3 MiB; the engine keeps none of them.
        for (size_t g : grown) CHILD_EXPECT(g < (size_t{512} << 10));
        return 0;
      },
      testing::SharedMemoryUcx());
  EXPECT_EQ(codes[0], 0);
}

// Found by fuzz_engine (tests/fuzz/regressions/engine/unknown-id-by-rendezvous): Runtime::Dispatch
// handed a message with an id that is none of the engine's to the sink's OnAbort when it came by
// rendezvous, so it failed the named peer. Unknown ids are dropped whatever their flags.
TEST(Runtime, DispatchDropsUnknownIds) {
  struct Sink final : MessageSink {
    int calls = 0;
    void OnGrant(const wire::AmHeader&, uint64_t, ucp_ep_h) override { calls++; }
    void OnHello(const wire::AmHeader&, ucp_ep_h) override { calls++; }
    void OnDone(const wire::AmHeader&, const uint32_t*, size_t, ucp_ep_h) override { calls++; }
    void OnData(const wire::DataHeader&, const void*, size_t, ucp_ep_h) override { calls++; }
    void OnAbort(const wire::AmHeader&, absl::string_view, ucp_ep_h) override { calls++; }
    void OnRound(const wire::AmHeader&, uint64_t, bool, ucp_ep_h) override { calls++; }
    void OnProgress(const wire::AmHeader&, const wire::ProgressRecord*, size_t, ucp_ep_h) override {
      calls++;
    }
  } sink;
  auto runtime = Runtime::Create();
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  ASSERT_TRUE((*runtime)->Register(7, &sink).ok());
  const wire::AmHeader h{wire::kMagic, 0, 7, 1};
  for (unsigned id : {0u, 10u, 19u, 255u}) {
    for (bool rendezvous : {false, true}) {
      (*runtime)->Dispatch(id, &h, sizeof(h), nullptr, 0, rendezvous, nullptr);
    }
  }
  EXPECT_EQ(sink.calls, 0);
  (*runtime)->Dispatch(wire::kGrantAm, &h, sizeof(h), nullptr, 0, true, nullptr);
  EXPECT_EQ(sink.calls, 1);  // A known id by rendezvous: a protocol error (OnAbort).
  (*runtime)->Unregister(7, &sink);
}

// Progress messages (wire::kProgressAm, put delivery) reach the sink only as 1 to
// kMaxProgressPerSignal whole records; an empty one, a cut record, one record too many or a
// payload without its data is a protocol error naming the peer (OnAbort), never read past its
// end.
TEST(Runtime, DispatchRefusesMalformedProgressMessages) {
  struct Sink final : MessageSink {
    std::vector<std::string> aborts;
    std::vector<wire::ProgressRecord> records;
    void OnGrant(const wire::AmHeader&, uint64_t, ucp_ep_h) override {}
    void OnHello(const wire::AmHeader&, ucp_ep_h) override {}
    void OnDone(const wire::AmHeader&, const uint32_t*, size_t, ucp_ep_h) override {}
    void OnData(const wire::DataHeader&, const void*, size_t, ucp_ep_h) override {}
    void OnAbort(const wire::AmHeader&, absl::string_view reason, ucp_ep_h) override {
      aborts.emplace_back(reason);
    }
    void OnRound(const wire::AmHeader&, uint64_t, bool, ucp_ep_h) override {}
    void OnProgress(const wire::AmHeader&, const wire::ProgressRecord* r, size_t count,
                    ucp_ep_h) override {
      records.insert(records.end(), r, r + count);
    }
  } sink;
  auto runtime = Runtime::Create();
  ASSERT_TRUE(runtime.ok()) << runtime.status();
  ASSERT_TRUE((*runtime)->Register(7, &sink).ok());
  const wire::AmHeader h{wire::kMagic, 3, 7, 1};
  std::vector<wire::ProgressRecord> many(wire::kMaxProgressPerSignal + 1);
  for (size_t i = 0; i < many.size(); ++i) many[i] = {static_cast<uint32_t>(i), 0, i * 4096};
  const size_t record = sizeof(wire::ProgressRecord);
  struct Case {
    const void* data;
    size_t length;
  };
  for (const Case& c :
       {Case{many.data(), 0}, Case{many.data(), record - 1}, Case{many.data(), record + 8},
        Case{many.data(), many.size() * record}, Case{nullptr, record}}) {
    (*runtime)->Dispatch(wire::kProgressAm, &h, sizeof(h), c.data, c.length, false, nullptr);
  }
  ASSERT_EQ(sink.aborts.size(), 5u);
  for (const std::string& reason : sink.aborts) {
    EXPECT_EQ(reason, "rank 3 sent a malformed progress message (protocol error)");
  }
  EXPECT_TRUE(sink.records.empty());
  (*runtime)->Dispatch(wire::kProgressAm, &h, sizeof(h), many.data(),
                       wire::kMaxProgressPerSignal * record, false, nullptr);
  ASSERT_EQ(sink.records.size(), wire::kMaxProgressPerSignal);
  EXPECT_EQ(sink.records.back().transfer, wire::kMaxProgressPerSignal - 1);
  EXPECT_EQ(sink.records.back().bytes, (wire::kMaxProgressPerSignal - 1) * 4096);
  (*runtime)->Unregister(7, &sink);
}

TEST(RefitEngine, FailedEpochIsRememberedUntilReset) {
  const std::string dir = StoreDir("reset");
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(4),
      [&](int32_t rank) {
        absl::StatusOr<ChildEngine> child = OpenEngine(kRowsToCols, rank, dir, {});
        CHILD_EXPECT(child.ok());
        RankBuffers& rb = child->rb;
        RefitEngine& e = *child->engine;
        if (rank == 0) {
          // Source 0 sits out epoch 1: its destinations miss their deadline.
          usleep(1500 * 1000);
        } else {
          Fill(rb, rank, 1);
          CHILD_EXPECT(e.Start(1).ok());
          const absl::Status st = e.Wait(absl::Now() + absl::Milliseconds(500));
          if (rank >= 2) {
            CHILD_EXPECT(st.code() == absl::StatusCode::kDeadlineExceeded ||
                         st.code() == absl::StatusCode::kUnavailable);
            CHILD_EXPECT(e.last_status().code() == st.code());
            const absl::Status again = e.Start(2);
            CHILD_EXPECT(again.code() == absl::StatusCode::kFailedPrecondition);
            CHILD_EXPECT(again.message().find("Reset") != absl::string_view::npos);
          }
        }
        // Every rank resets (peers must do the same) and waits until all have.
        e.Reset();
        CHILD_EXPECT(rendezvous::Barrier(*child->store, "reset-done", rank, testing::Ranks(4),
                                         absl::Now() + absl::Seconds(20))
                         .ok());
        Fill(rb, rank, 2);
        for (size_t b = 0; b < rb.memory.size(); ++b) {
          if (rb.plan.buffers()[b].side != plan::Side::kSrc)
            std::fill(rb.memory[b].begin(), rb.memory[b].end(), kPoison);
        }
        CHILD_EXPECT(e.Start(2).ok());
        const absl::Status st = e.Wait(absl::Now() + absl::Seconds(20));
        if (!st.ok())
          std::fprintf(stderr, "rank %d: %s\n", rank, std::string(st.message()).c_str());
        CHILD_EXPECT(st.ok());
        CHILD_EXPECT(Verify(rb, rank, 2).ok());
        CHILD_EXPECT(e.Shutdown(absl::Now() + absl::Seconds(10)).ok());
        return 0;
      },
      testing::SharedMemoryUcx());
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

// A rank whose refit fails before its engine starts the epoch (a failed quantization or amax
// exchange in the refit session) calls Abort(epoch) on the engine it never started: its
// destinations, waiting in that epoch with a 60 s deadline, fail at once with Unavailable
// quoting its reason (they used to wait for their deadline). Reset on every rank, then epoch 3
// verifies.
TEST(RefitEngine, AbortOfAnEpochNeverStartedFailsThePeersWaitingInItAtOnce) {
  const std::string dir = StoreDir("abort-unstarted");
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(4),
      [&](int32_t rank) {
        absl::StatusOr<ChildEngine> child = OpenEngine(kRowsToCols, rank, dir, {});
        CHILD_EXPECT(child.ok());
        RankBuffers& rb = child->rb;
        RefitEngine& e = *child->engine;
        for (uint64_t epoch = 1; epoch <= 3; ++epoch) {
          Fill(rb, rank, static_cast<int>(epoch));
          if (epoch == 2 && rank == 0) {
            e.Abort(2, absl::InternalError("quantizing tensor \"w\" failed"));
            CHILD_EXPECT(e.last_status().code() == absl::StatusCode::kInternal);
            CHILD_EXPECT(e.Start(3).code() == absl::StatusCode::kFailedPrecondition);
          } else {
            // Start fails too when the abort already arrived.
            absl::Status st = e.Start(epoch);
            if (st.ok()) st = e.Wait(absl::Now() + absl::Seconds(60));
            if (epoch == 2 && rank >= 2) {
              CHILD_EXPECT(st.code() == absl::StatusCode::kUnavailable, st.ToString());
              CHILD_EXPECT(st.message().find("quantizing tensor") != absl::string_view::npos,
                           st.ToString());
            }
            if (epoch != 2) CHILD_EXPECT(st.ok() && Verify(rb, rank, epoch).ok(), st.ToString());
          }
          if (epoch == 2) {
            e.Reset();
            CHILD_EXPECT(rendezvous::Barrier(*child->store, "reset", rank, testing::Ranks(4),
                                             absl::Now() + absl::Seconds(60))
                             .ok());
          }
        }
        CHILD_EXPECT(e.Shutdown(absl::Now() + absl::Seconds(10)).ok());
        return 0;
      },
      testing::SharedMemoryUcx());
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

// The fan-out hook: Progress reports every transfer that lands on a rank exactly once, by its
// world index, on a domain-aware plan with fan-out transfers (executed by the engine as network
// puts), by each way bytes travel: puts as copies into mapped HostBuffers (destinations and
// landing areas in shared memory; every peer is on this host), as single-copy writes (private
// destinations), UCX puts, and active messages; with every rank on the world plan, every rank
// on its share (BuildRankPlan), and odd ranks on shares among even ranks on the world plan
// (pieces are named by world index on the wire, so both interoperate).
enum class Path { kMapped, kSingleCopy, kUcxPut, kActiveMessage };
// The engine options that take `path` (delta refits when `delta`).
RefitEngineOptions PathOptions(Path path, bool delta = false) {
  RefitEngineOptions options;
  options.delta = delta;
  options.delivery = path == Path::kActiveMessage ? RefitEngineOptions::Delivery::kActiveMessage
                                                  : RefitEngineOptions::Delivery::kPut;
  options.single_copy = path == Path::kMapped || path == Path::kSingleCopy;
  options.map_shared_memory = path == Path::kMapped;
  return options;
}
enum class Plans { kWorld, kShares, kMixed };
class RefitEngineDelivery : public ::testing::TestWithParam<std::tuple<Path, Plans>> {
 protected:
  Path path() const { return std::get<0>(GetParam()); }
  bool Share(int32_t rank) const {
    const Plans plans = std::get<1>(GetParam());
    return plans == Plans::kShares || (plans == Plans::kMixed && rank % 2 == 1);
  }
};

TEST_P(RefitEngineDelivery, ProgressReportsEveryLandedTransferOnce) {
  const std::string spec =
      R"json({"topology": {"domains": [[0, 1, 2, 3], [4, 5, 6, 7]]}, "tensors": [
      {"name": "w", "dtype": "bf16", "shape": [64, 256],
       "src": {"mesh": [0, 1, 2, 3], "placements": ["S(1)"]},
       "dst": {"mesh": [[4, 5], [6, 7]], "placements": ["R", "S(1)"]}}]})json";
  {
    RankBuffers rb = MakeBuffers(spec, 0);
    bool fanout = false;
    for (const plan::Transfer& t : rb.plan.transfers())
      fanout |= t.kind == plan::TransferKind::kFanout;
    EXPECT_TRUE(fanout) << "the domain-aware plan should fan out inside the destination domain";
  }
  const std::string dir = StoreDir("progress");
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(8),
      [&](int32_t rank) {
        RefitEngineOptions options = PathOptions(path());
        const bool mapped = path() == Path::kMapped;
        // Short runs (bf16 columns) travel packed either way; a small batch makes several signals.
        options.signal_batch_bytes = 4096;
        absl::StatusOr<ChildEngine> child =
            OpenEngine(spec, rank, dir, options, Share(rank), mapped);
        CHILD_EXPECT(child.ok());
        RankBuffers& rb = child->rb;
        RefitEngine& e = *child->engine;
        for (uint64_t epoch = 1; epoch <= 3; ++epoch) {
          Fill(rb, rank, epoch);
          CHILD_EXPECT(e.Start(epoch).ok());
          std::vector<uint32_t> landed;
          const absl::Time deadline = absl::Now() + absl::Seconds(20);
          while (e.in_epoch() && absl::Now() < deadline) CHILD_EXPECT(e.Progress(&landed).ok());
          CHILD_EXPECT(e.Wait(deadline).ok());
          CHILD_EXPECT(e.Progress(&landed).ok());
          std::multiset<uint32_t> got(landed.begin(), landed.end());
          std::multiset<uint32_t> want;
          for (auto [it, end] = rb.plan.receives(rank); it != end; ++it) {
            want.insert(rb.plan.transfer_id(*it));
          }
          CHILD_EXPECT(got == want);
          CHILD_EXPECT(Verify(rb, rank, epoch).ok());
          const RefitStats& stats = e.last_stats();
          const bool am = path() == Path::kActiveMessage;
          CHILD_EXPECT(std::string(e.delivery()) == (am ? "am" : "put"));
          const int64_t used = mapped                       ? stats.mapped_copies
                               : path() == Path::kSingleCopy ? stats.single_copy_writes
                               : am                          ? stats.data_messages
                                                             : stats.puts;
          CHILD_EXPECT(stats.puts + stats.data_messages + stats.single_copy_writes +
                           stats.mapped_copies ==
                       used);
          if (stats.bytes_network_sent > 0) CHILD_EXPECT(used > 0);
          const bool single_copy =
              e.Transports().find("+ single-copy writes to") != std::string::npos;
          // Mapped links keep a writer for buffers outside shared memory (none here).
          CHILD_EXPECT(single_copy == ((mapped || path() == Path::kSingleCopy) &&
                                       stats.bytes_network_sent > 0));
          const bool mapped_copies =
              e.Transports().find("+ mapped copies to") != std::string::npos;
          CHILD_EXPECT(mapped_copies == (mapped && stats.bytes_network_sent > 0));
        }
        CHILD_EXPECT(e.Shutdown(absl::Now() + absl::Seconds(10)).ok());
        return 0;
      },
      testing::SharedMemoryUcx());
  for (int r = 0; r < 8; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(
    Delivery, RefitEngineDelivery,
    ::testing::Combine(::testing::Values(Path::kMapped, Path::kSingleCopy, Path::kUcxPut,
                                         Path::kActiveMessage),
                       ::testing::Values(Plans::kWorld, Plans::kShares, Plans::kMixed)),
    [](const auto& info) {
      const Path path = std::get<0>(info.param);
      const Plans plans = std::get<1>(info.param);
      return std::string(path == Path::kMapped       ? "Mapped"
                         : path == Path::kSingleCopy ? "SingleCopy"
                         : path == Path::kUcxPut     ? "Put"
                                                     : "Am") +
             (plans == Plans::kWorld ? "World" : plans == Plans::kShares ? "Shares" : "Mixed");
    });

// Delta refits (docs/delta.md): the global tensors as every rank models them. Epoch e changes a
// fraction of the elements drawn from [0, 1] (every 10th epoch none, the one after all), each
// by 1-15 ulp of its low bits, the same on every rank (seeded by the epoch).
struct DeltaModel {
  std::vector<std::vector<uint8_t>> tensors;

  explicit DeltaModel(const plan::RefitSpec& s) {
    std::mt19937_64 rng(99);
    for (const plan::TensorSpec& t : s.tensors) {
      int64_t n = plan::DTypeSize(t.dtype);
      for (int64_t d : t.shape) n *= d;
      std::vector<uint8_t>& v = tensors.emplace_back(static_cast<size_t>(n));
      for (uint8_t& b : v) b = static_cast<uint8_t>(rng());
    }
  }
  static double Fraction(uint64_t epoch) {
    if (epoch % 10 == 0) return 0;
    if (epoch % 10 == 1) return 1;
    std::mt19937_64 rng(epoch);
    return std::uniform_real_distribution<double>(0, 1)(rng);
  }
  void Advance(const plan::RefitSpec& s, uint64_t epoch) { Advance(s, epoch, Fraction(epoch)); }
  void Advance(const plan::RefitSpec& s, uint64_t epoch, double f) {
    std::mt19937_64 rng(epoch * 7919);
    std::uniform_real_distribution<double> u(0, 1);
    for (size_t t = 0; t < tensors.size(); ++t) {
      const size_t es = static_cast<size_t>(plan::DTypeSize(s.tensors[t].dtype));
      for (size_t e = 0; e < tensors[t].size(); e += es) {
        if (u(rng) < f) tensors[t][e] ^= static_cast<uint8_t>(1 + rng() % 15);
      }
    }
  }
  // Copies this rank's source tiles out of the model, or compares its destination tiles.
  void FillSources(RankBuffers& rb, int32_t rank) const {
    const plan::RefitSpec& s = rb.plan.spec();
    for (size_t t = 0; t < s.tensors.size(); ++t) {
      const int es = plan::DTypeSize(s.tensors[t].dtype);
      uint8_t* src = rb.memory[rb.plan.buffer_of(t, plan::Side::kSrc)].data();
      plan::ForEachTile(s, t, plan::Side::kSrc, [&](int32_t r, const plan::Box& box) {
        if (r != rank) return;
        plan::ForEachElement(s.tensors[t].src, s.tensors[t].shape, box,
                             [&](int64_t offset, int64_t global) {
                               std::memcpy(src + offset * es, &tensors[t][global * es], es);
                             });
      });
    }
  }
  // Fills this rank's sources, refits `epoch` (20 s deadline) and compares every destination.
  absl::Status Refit(RefitEngine& e, RankBuffers& rb, int32_t rank, uint64_t epoch) const {
    FillSources(rb, rank);
    absl::Status st = e.Start(epoch);
    if (st.ok()) st = e.Wait(absl::Now() + absl::Seconds(20));
    if (!st.ok()) return st;
    if (const int64_t bad = Mismatches(rb, rank); bad != 0) {
      return absl::DataLossError(absl::StrCat(bad, " destination elements differ from the model"));
    }
    return absl::OkStatus();
  }
  int64_t Mismatches(const RankBuffers& rb, int32_t rank) const {
    const plan::RefitSpec& s = rb.plan.spec();
    int64_t bad = 0;
    for (size_t t = 0; t < s.tensors.size(); ++t) {
      const int es = plan::DTypeSize(s.tensors[t].dtype);
      const uint8_t* dst = rb.memory[rb.plan.buffer_of(t, plan::Side::kDst)].data();
      plan::ForEachTile(s, t, plan::Side::kDst, [&](int32_t r, const plan::Box& box) {
        if (r != rank) return;
        plan::ForEachElement(
            s.tensors[t].dst, s.tensors[t].shape, box, [&](int64_t offset, int64_t global) {
              bad += std::memcmp(dst + offset * es, &tensors[t][global * es], es) != 0;
            });
      });
    }
    return bad;
  }
};

// 110 consecutive delta refits with random change fractions (0 and 1 included) on a plan with
// packed and plain network pieces and engine-run fan-out, every 13th epoch failed by a
// destination that gives up at once, then Reset on every rank: byte-exact on every destination
// after every successful refit; the first refit and the one after each Reset go full, the others
// send deltas whenever smaller. Over UCX puts into the landing areas (tests/api's
// ShareSessionDeltaTest covers mapped copies and active messages through RefitHandle; CI time
// is scarce).
class RefitEngineDelta : public ::testing::TestWithParam<Path> {};

TEST_P(RefitEngineDelta, HundredRefitsWithRandomChangesFailuresAndResetsStayByteExact) {
  const std::string spec =
      R"json({"topology": {"domains": [[0, 1, 2, 3], [4, 5, 6, 7]]}, "tensors": [
      {"name": "w", "dtype": "bf16", "shape": [64, 256],
       "src": {"mesh": [0, 1, 2, 3], "placements": ["S(1)"]},
       "dst": {"mesh": [[4, 5], [6, 7]], "placements": ["R", "S(1)"]}},
      {"name": "b", "dtype": "fp32", "shape": [96, 1000],
       "src": {"mesh": [0, 1, 2, 3], "placements": ["S(0)"]},
       "dst": {"mesh": [[4, 5], [6, 7]], "placements": ["R", "S(0)"]}},
      {"name": "q", "dtype": "u8", "shape": [333],
       "src": {"mesh": [1, 2], "placements": ["S(0)"]},
       "dst": {"mesh": [4, 5, 6], "placements": ["S(0)"]}}]})json";
  const std::string dir = StoreDir("delta");
  const Path path = GetParam();
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(8),
      [&](int32_t rank) {
        const RefitEngineOptions options = PathOptions(path, /*delta=*/true);
        absl::StatusOr<ChildEngine> child =
            OpenEngine(spec, rank, dir, options, /*share=*/true, path == Path::kMapped);
        CHILD_EXPECT(child.ok());
        RankBuffers& rb = child->rb;
        RefitEngine& e = *child->engine;
        DeltaModel model(rb.plan.spec());
        bool full_next = true;  // The first refit, and the one after a Reset.
        int failed = 0, deltas = 0, applied = 0;
        for (uint64_t epoch = 1; epoch <= 110; ++epoch) {
          model.Advance(rb.plan.spec(), epoch);
          model.FillSources(rb, rank);
          // Every 13th epoch rank 4 gives up at once; Start fails too on ranks that its abort
          // reached first. Every rank then resets, whatever its own outcome, and waits for all.
          const bool fail_epoch = epoch % 13 == 6;
          absl::Status st = e.Start(epoch);
          if (st.ok()) {
            st = e.Wait(fail_epoch && rank == 4 ? absl::InfinitePast()
                                                : absl::Now() + absl::Seconds(20));
          }
          const RefitStats& stats = e.last_stats();
          if (fail_epoch) {
            failed += !st.ok();
            e.Reset();
            CHILD_EXPECT(rendezvous::Barrier(*child->store, absl::StrCat("delta/reset/", epoch),
                                             rank, testing::Ranks(8),
                                             absl::Now() + absl::Seconds(30))
                             .ok());
            full_next = true;
            continue;
          }
          if (!st.ok()) {
            std::fprintf(stderr, "rank %d: epoch %d: %s\n", rank, static_cast<int>(epoch),
                         std::string(st.message()).c_str());
          }
          CHILD_EXPECT(st.ok());
          const int64_t bad = model.Mismatches(rb, rank);
          if (bad != 0) {
            std::fprintf(stderr, "rank %d: epoch %d: %d element(s) differ from the source's\n",
                         rank, static_cast<int>(epoch), static_cast<int>(bad));
          }
          CHILD_EXPECT(bad == 0);
          const int64_t sent = stats.delta_pieces + stats.delta_full_no_base +
                               stats.delta_full_receiver_version + stats.delta_full_not_smaller;
          if (full_next) {
            CHILD_EXPECT(stats.delta_pieces == 0 && stats.delta_full_no_base == sent);
          } else {
            CHILD_EXPECT(stats.delta_full_no_base == 0 && stats.delta_full_receiver_version == 0);
            if (DeltaModel::Fraction(epoch) == 0) CHILD_EXPECT(stats.delta_pieces == sent);
            if (DeltaModel::Fraction(epoch) == 1) CHILD_EXPECT(stats.delta_pieces == 0);
          }
          CHILD_EXPECT(stats.delta_stream_bytes <= stats.bytes_network_sent);
          deltas += static_cast<int>(stats.delta_pieces);
          applied += static_cast<int>(stats.deltas_applied);
          full_next = false;
        }
        // Sources sent deltas, destinations applied them, rank 4's early give-ups failed epochs.
        if (rank < 4) CHILD_EXPECT(deltas > 0 && e.last_stats().delta_shadow_bytes > 0);
        if (rank >= 4 && rank < 7) CHILD_EXPECT(applied > 0);
        if (rank == 4) CHILD_EXPECT(failed > 0);
        CHILD_EXPECT(e.Shutdown(absl::Now() + absl::Seconds(10)).ok());
        return 0;
      },
      testing::SharedMemoryUcx());
  for (int r = 0; r < 8; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

// A destination whose version differs from its source's gets plain pieces from that source
// while the source keeps sending deltas to the others (docs/delta.md, the epoch rule), in the two
// ways it happens. Sources 0 and 1 send `w` to rank 2; source 0 alone sends `v` to rank 3.
// - Epoch 3: rank 3 calls Reset() alone after a successful epoch 2 (what a caller that changed
//   its destination does): source 0 sends it `v` plain ("receiver version") and `w` as deltas.
// - Epoch 5: source 1 holds back until rank 2 gave up, so rank 2 fails while source 0 and rank 3
//   complete; rank 2's abort about epoch 5 fails neither's epoch 6. Ranks 1 and 2 Reset (1 may
//   have failed or completed: it starts only after rank 2's abort went out). Epoch 6: source 0
//   sends rank 2 plain pieces and rank 3 deltas, source 1 (reset) only plain pieces.
// Every epoch that returned OK is byte-exact; epoch 7 is all deltas again.
TEST_P(RefitEngineDelta, ADestinationThatResetOrFailedAloneGetsPlainPiecesTheOthersDeltas) {
  const std::string spec = R"json({"tensors": [
      {"name": "w", "dtype": "bf16", "shape": [64, 256],
       "src": {"mesh": [0, 1], "placements": ["S(0)"]},
       "dst": {"mesh": [2], "placements": ["R"]}},
      {"name": "v", "dtype": "fp32", "shape": [32, 300],
       "src": {"mesh": [0], "placements": ["R"]},
       "dst": {"mesh": [3], "placements": ["R"]}}]})json";
  const std::string dir = StoreDir("delta-alone");
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(4),
      [&](int32_t rank) {
        RefitEngineOptions options;
        options.delta = true;
        absl::StatusOr<ChildEngine> child = OpenEngine(spec, rank, dir, options);
        CHILD_EXPECT(child.ok(), child.status().ToString());
        RankBuffers& rb = child->rb;
        RefitEngine& e = *child->engine;
        rendezvous::Store& store = *child->store;
        auto key_set = [&](const std::string& key) {
          return store.Get(key, absl::Now() + absl::Seconds(60)).ok();
        };
        DeltaModel model(rb.plan.spec());
        for (uint64_t epoch = 1; epoch <= 7; ++epoch) {
          model.Advance(rb.plan.spec(), epoch, epoch == 1 ? 1.0 : 0.02);
          model.FillSources(rb, rank);
          absl::Status st;
          if (epoch == 5 && rank == 1) CHILD_EXPECT(key_set("alone/2-failed"));
          st = e.Start(epoch);
          if (epoch == 5 && rank == 2) {
            // Progress until source 0 completed, then give up: source 1 has not started.
            CHILD_EXPECT(st.ok(), st.ToString());
            while (!store.Get("alone/0-done", absl::Now()).ok()) {
              CHILD_EXPECT(e.Progress(nullptr).ok());
            }
            st = e.Wait(absl::InfinitePast());
            CHILD_EXPECT(!st.ok(), "rank 2 completed epoch 5 without source 1");
            CHILD_EXPECT(store.Set("alone/2-failed", "1").ok());
          } else if (st.ok()) {
            st = e.Wait(absl::Now() + absl::Seconds(20));
          }
          if (epoch == 5 && rank == 0) CHILD_EXPECT(store.Set("alone/0-done", "1").ok());
          if (epoch == 5 && (rank == 1 || rank == 2)) {
            e.Reset();
            CHILD_EXPECT(store.Set(absl::StrCat("alone/reset/", rank), "1").ok());
          }
          if (epoch == 5) {
            CHILD_EXPECT(key_set("alone/reset/1") && key_set("alone/reset/2"));
          }
          if (epoch == 5 && rank >= 1 && rank <= 2) continue;
          CHILD_EXPECT(st.ok(), absl::StrCat("epoch ", epoch, ": ", st.ToString()));
          CHILD_EXPECT(model.Mismatches(rb, rank) == 0, absl::StrCat("epoch ", epoch));
          const RefitStats& s = e.last_stats();
          if (rank == 0 && (epoch == 3 || epoch == 6)) {
            // Plain pieces to the reset or failed destination, deltas to the other.
            CHILD_EXPECT(s.delta_full_receiver_version > 0 && s.delta_pieces > 0 &&
                             s.delta_full_no_base == 0,
                         absl::StrCat("epoch ", epoch, ": ", s.delta_full_receiver_version, " ",
                                      s.delta_pieces, " ", s.delta_full_no_base));
          }
          if (rank == 1 && epoch == 6) {
            CHILD_EXPECT(s.delta_pieces == 0 && s.delta_full_no_base > 0);
          }
          if (rank <= 1 && (epoch == 2 || epoch == 4 || epoch == 7)) {
            CHILD_EXPECT(s.delta_pieces > 0 && s.delta_full_receiver_version == 0 &&
                             s.delta_full_no_base == 0 && s.delta_full_not_smaller == 0,
                         absl::StrCat("epoch ", epoch));
          }
          // Rank 3 calls Reset() alone after epoch 2.
          if (epoch == 2 && rank == 3) e.Reset();
        }
        CHILD_EXPECT(e.Shutdown(absl::Now() + absl::Seconds(10)).ok());
        return 0;
      },
      testing::SharedMemoryUcx());
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Delivery, RefitEngineDelta, ::testing::Values(Path::kUcxPut),
                         [](const auto& info) { return std::string("Put"); });

// Pieces larger than one segment (delta::kSegmentBytes) travel as one stream per segment, each
// encoded, sent, validated and applied on its own (docs/delta.md). Rank 0 sends `m` (bf16, a
// strided source region, two segments, the second ending in a partial chunk) to ranks 1 and 2,
// and `u` (u8, contiguous, three segments) to rank 1, over UCX puts and active messages (cut
// into many messages per segment). Epoch 1 is full; 2 changes nothing; 3 changes every element
// of the pieces' last segments and a few of the segments before (those go as deltas, the last
// ones plain); 4 changes everything (every segment plain); 5 changes 5% scattered. Byte-exact
// after every epoch, and each piece counts once in the statistics.
class RefitEngineDeltaSegments : public ::testing::TestWithParam<Path> {};

TEST_P(RefitEngineDeltaSegments, PiecesOfManySegmentsAreByteExactSegmentBySegment) {
  const std::string spec = R"json({"tensors": [
      {"name": "m", "dtype": "bf16", "shape": [512, 600],
       "src": {"mesh": [0], "placements": ["R"]},
       "dst": {"mesh": [1, 2], "placements": ["S(1)"]}},
      {"name": "u", "dtype": "u8", "shape": [600000],
       "src": {"mesh": [0], "placements": ["R"]},
       "dst": {"mesh": [1], "placements": ["R"]}}]})json";
  static_assert(delta::kSegmentBytes == 256 << 10);  // The shapes above span 2 and 3 segments.
  const std::string dir = StoreDir(GetParam() == Path::kUcxPut ? "segments-put" : "segments-am");
  const Path path = GetParam();
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(3),
      [&](int32_t rank) {
        const RefitEngineOptions options = PathOptions(path, /*delta=*/true);
        absl::StatusOr<ChildEngine> child = OpenEngine(spec, rank, dir, options);
        CHILD_EXPECT(child.ok(), child.status().ToString());
        RankBuffers& rb = child->rb;
        RefitEngine& e = *child->engine;
        DeltaModel model(rb.plan.spec());
        // Changes element g of tensor t (every rank the same way).
        auto change = [&](size_t t, int64_t g) {
          const int64_t es = t == 0 ? 2 : 1;
          model.tensors[t][static_cast<size_t>(g * es)] ^= static_cast<uint8_t>(1 + g % 15);
        };
        for (uint64_t epoch = 1; epoch <= 5; ++epoch) {
          for (int64_t g = 0; g < 512 * 600; ++g) {
            const int64_t row = g / 600, col = g % 600 % 300;  // Place in its piece (300 wide).
            const int64_t packed = row * 300 + col;            // Element of the piece.
            if (epoch == 1 || epoch == 4 || (epoch == 3 && packed >= 131072 - 100) ||
                (epoch == 5 && g % 20 == 7)) {
              change(0, g);
            }
          }
          for (int64_t g = 0; g < 600000; ++g) {
            if (epoch == 1 || epoch == 4 || (epoch == 3 && (g >= 2 * 262144 || g % 5000 == 0)) ||
                (epoch == 5 && g % 20 == 3)) {
              change(1, g);
            }
          }
          const absl::Status st = model.Refit(e, rb, rank, epoch);
          CHILD_EXPECT(st.ok(), absl::StrCat("epoch ", epoch, ": ", st.ToString()));
          const RefitStats& s = e.last_stats();
          const int64_t pieces = rank == 0 ? 3 : rank == 1 ? 2 : 1;
          const std::string what =
              absl::StrCat("epoch ", epoch, ": ", s.delta_pieces, " delta, ", s.deltas_applied,
                           " applied, ", s.delta_full_no_base, " no base, ",
                           s.delta_full_not_smaller, " not smaller, ", s.delta_stream_bytes,
                           " of ", s.delta_plain_bytes, " bytes");
          if (rank == 0) {
            CHILD_EXPECT(s.delta_plain_bytes == 512 * 600 * 2 + 600000, what);
            if (epoch == 1) CHILD_EXPECT(s.delta_full_no_base == pieces, what);
            if (epoch == 2 || epoch == 3 || epoch == 5) CHILD_EXPECT(s.delta_pieces == pieces, what);
            if (epoch == 4) CHILD_EXPECT(s.delta_full_not_smaller == pieces, what);
            // Epoch 3: the last segments travel plain, the others as small deltas.
            const int64_t last_segments = 2 * (153600 - 131072) * 2 + (600000 - 2 * 262144);
            if (epoch == 3) {
              CHILD_EXPECT(s.delta_stream_bytes > last_segments &&
                               s.delta_stream_bytes < last_segments + 64 * 1024,
                           what);
            }
            if (epoch == 2) CHILD_EXPECT(s.delta_stream_bytes < 4096, what);
          } else {
            const bool deltas = epoch == 2 || epoch == 3 || epoch == 5;
            CHILD_EXPECT(s.deltas_applied == (deltas ? pieces : 0), what);
          }
        }
        CHILD_EXPECT(e.Shutdown(absl::Now() + absl::Seconds(10)).ok());
        return 0;
      },
      testing::SharedMemoryUcx());
  for (int r = 0; r < 3; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Delivery, RefitEngineDeltaSegments,
                         ::testing::Values(Path::kUcxPut, Path::kActiveMessage),
                         [](const auto& info) {
                           return std::string(info.param == Path::kUcxPut ? "Put" : "Am");
                         });

// Relays forward delta streams (docs/delta.md, "Relays"): on kRelaySpec (trainers 0-1, three
// destination domains fed partly by relays between them) a relay sends on the stream its feed
// brought when its receiver holds the relay's version, and the plain segment, read from where
// the feed was applied, when the receiver holds another one. From the world plan: R, the first
// relay's sender, and T, its receiver. Epoch 1 is full; 2 changes 2% (every piece a delta);
// after it T resets alone, so in 3 everything into T goes plain ("receiver version" at R) while
// R's other relays stay deltas; after 3, R resets alone, so in 4 its feeds arrive plain and it
// forwards them plain ("no base"); 5 changes nothing (only deltas, the relays' bytes a few
// headers); 6 changes everything (plain, "not smaller"). Byte-exact on every rank after each.
// Over puts and active messages, into host memory and into CUDA buffers UCX cannot register
// (devices emulated on the host: relays then read the host copies the streams were applied to).
class RefitEngineDeltaRelays : public ::testing::TestWithParam<std::tuple<Path, bool>> {};

TEST_P(RefitEngineDeltaRelays, RelaysForwardStreamsAndSendPlainToAReceiverAtAnotherVersion) {
  auto parsed = plan::ParseSpecJson(plan::kRelaySpec);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto world = plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*std::move(parsed)));
  ASSERT_TRUE(world.ok()) << world.status();
  constexpr int kRanks = 8;
  // Delta pieces each rank sends and receives, relays among them; R's pieces to T.
  std::vector<int64_t> sends(kRanks, 0), receives(kRanks, 0), relays(kRanks, 0);
  // R: a rank that relays to two ranks or more, T the first of them.
  int32_t relay_from = -1, relay_to = -1;
  std::string listed;
  std::map<int32_t, std::set<int32_t>> relay_targets;
  for (const plan::Transfer& t : world->transfers()) {
    if (!plan::IsRelay(t)) continue;
    absl::StrAppend(&listed, " ", t.from_rank, "->", t.to_rank);
    relay_targets[t.from_rank].insert(t.to_rank);
  }
  for (const auto& [from, to] : relay_targets) {
    if (to.size() < 2) continue;
    relay_from = from;
    relay_to = *to.begin();
    break;
  }
  ASSERT_GE(relay_from, 0) << "no rank of kRelaySpec relays to two ranks:" << listed;
  int64_t r_to_t = 0, two_hops = 0;
  for (const plan::Transfer& t : world->transfers()) {
    if (plan::DeltaElemBytes(*world, t) == 0) continue;
    sends[t.from_rank]++;
    receives[t.to_rank]++;
    relays[t.from_rank] += plan::IsRelay(t);
    r_to_t += t.from_rank == relay_from && t.to_rank == relay_to;
    two_hops += plan::IsRelay(t) && plan::IsRelay(world->transfers()[t.after]);
  }
  ASSERT_EQ(relays[relay_from], sends[relay_from]);  // An inference rank sends only relays.
  ASSERT_LT(r_to_t, sends[relay_from]) << "R relays to T only: nothing to compare with";
  ASSERT_GT(two_hops, 0) << "kRelaySpec has no relay of a relay";
  // Not a structured binding: clang's lambdas cannot capture those.
  const Path path = std::get<0>(GetParam());
  const bool device = std::get<1>(GetParam());
  const std::string dir = StoreDir(
      absl::StrCat("relays-", path == Path::kUcxPut ? "put" : "am", device ? "-device" : ""));
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(kRanks),
      [&](int32_t rank) {
        const RefitEngineOptions options = PathOptions(path, /*delta=*/true);
        if (device) cuda::EmulateDevicesOnHost(true, /*ucx_registers_them=*/false);
        absl::StatusOr<ChildEngine> child = OpenEngine(
            plan::kRelaySpec, rank, dir, options, /*share=*/true,
            /*shared_destinations=*/false, device ? MemoryKind::kCuda : MemoryKind::kHost);
        CHILD_EXPECT(child.ok(), child.status().ToString());
        RankBuffers& rb = child->rb;
        RefitEngine& e = *child->engine;
        DeltaModel model(rb.plan.spec());
        const double fractions[] = {1.0, 0.02, 0.02, 0.02, 0.0, 1.0};
        for (uint64_t epoch = 1; epoch <= 6; ++epoch) {
          model.Advance(rb.plan.spec(), epoch, fractions[epoch - 1]);
          const absl::Status st = model.Refit(e, rb, rank, epoch);
          CHILD_EXPECT(st.ok(), absl::StrCat("epoch ", epoch, ": ", st.ToString()));
          const RefitStats& s = e.last_stats();
          const std::string what = absl::StrCat(
              "rank ", rank, " epoch ", epoch, ": ", s.delta_pieces, " delta, ",
              s.delta_full_no_base, " no base, ", s.delta_full_receiver_version,
              " receiver version, ", s.delta_full_not_smaller, " not smaller, ", s.deltas_applied,
              " applied, ", s.delta_stream_bytes, " of ", s.delta_plain_bytes, " bytes");
          if (epoch == 1) CHILD_EXPECT(s.delta_full_no_base == sends[rank], what);
          if (epoch == 2 || epoch == 5) {
            CHILD_EXPECT(s.delta_pieces == sends[rank] && s.deltas_applied == receives[rank], what);
          }
          if (epoch == 3) {
            if (rank == relay_from) {
              CHILD_EXPECT(
                  s.delta_full_receiver_version == r_to_t && s.delta_pieces == sends[rank] - r_to_t,
                  what);
            }
            if (rank == relay_to) CHILD_EXPECT(s.deltas_applied == 0, what);
            // What T relays on goes plain for want of a base, also where relayed further.
            CHILD_EXPECT(s.delta_full_not_smaller == 0, what);
          }
          if (epoch == 4 && rank == relay_from) {
            CHILD_EXPECT(
                s.delta_pieces == 0 && s.delta_full_no_base == sends[rank] && s.deltas_applied == 0,
                what);
          }
          if (epoch == 5 && relays[rank] > 0) {
            // Nothing changed: a relay's streams are headers and chunk tables.
            CHILD_EXPECT(s.bytes_network_sent == s.delta_stream_bytes &&
                             s.delta_stream_bytes * 100 < s.delta_plain_bytes,
                         what);
          }
          if (epoch == 6) {
            CHILD_EXPECT(s.delta_pieces == 0 && s.delta_full_not_smaller == sends[rank], what);
          }
          // T resets alone after epoch 2, R after epoch 3.
          if ((epoch == 2 && rank == relay_to) || (epoch == 3 && rank == relay_from)) e.Reset();
        }
        if (device) {
          // The relays' pieces came through staged host copies.
          CHILD_EXPECT(e.last_stats().cuda_buffers_staged > 0);
        }
        CHILD_EXPECT(e.Shutdown(absl::Now() + absl::Seconds(10)).ok());
        return 0;
      },
      testing::SharedMemoryUcx());
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Delivery, RefitEngineDeltaRelays,
                         ::testing::Combine(::testing::Values(Path::kUcxPut, Path::kActiveMessage),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return absl::StrCat(
                               std::get<0>(info.param) == Path::kUcxPut ? "Put" : "Am",
                               std::get<1>(info.param) ? "Device" : "");
                         });

// Issue 10: a process that holds the store token reads a rank's UCX address from the store and
// sends it messages in the name of other ranks: a data message whose offset would wrap
// (to_offset = 2^64 - 64), a completion, a grant, an abort and a hello. None may touch memory or
// change the refit: each is dropped because it did not arrive on the named rank's endpoint, and
// the refit after them is byte-exact. Under ASan this is the regression test of the reported
// heap-buffer-overflow.
class ForgedMessages : public ::testing::TestWithParam<bool> {};

struct SendDone final : ucx::Completion {
  int pending = 0;
  void Complete(ucs_status_t) override { pending--; }
};

int Forge(const std::string& dir, const std::string& prefix, int32_t victim) {
  const int rank = 4;
  absl::StatusOr<std::unique_ptr<FileStore>> store = FileStore::Open(dir);
  CHILD_EXPECT(store.ok());
  absl::StatusOr<std::shared_ptr<Runtime>> runtime = Runtime::Create();
  CHILD_EXPECT(runtime.ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  absl::StatusOr<rendezvous::Record> record =
      rendezvous::FetchRecord(**store, prefix, "wireup", victim, deadline);
  CHILD_EXPECT(record.ok());
  CHILD_EXPECT(record->count("address") == 1);
  absl::StatusOr<std::unique_ptr<ucx::Endpoint>> ep =
      ucx::Endpoint::Create((*runtime)->worker(), record->at("address"), victim, false);
  CHILD_EXPECT(ep.ok());
  const uint64_t handle = RefitEngine::HandleId(prefix, victim);
  SendDone done;
  auto send = [&](unsigned id, const void* header, size_t header_bytes, const void* data,
                  size_t bytes) {
    const ucs_status_t st =
        ucx::SendAm((*ep)->get(), id, header, header_bytes, data, bytes, nullptr, &done);
    if (st == UCS_INPROGRESS) done.pending++;
    return st == UCS_OK || st == UCS_INPROGRESS;
  };
  wire::AmHeader base;
  base.from_rank = 0;  // A source of the victim.
  base.handle = handle;
  base.epoch = 1;
  wire::DataHeader data;
  data.base = base;
  data.transfer = 0;
  data.to_offset = ~uint64_t{0} - 63;
  static uint8_t payload[64];
  std::memset(payload, 0xEE, sizeof(payload));
  const uint32_t indices[2] = {0, 1};
  const char reason[] = "forged abort";
  wire::AmHeader grant = base;
  grant.from_rank = 3;
  for (int i = 0; i < 4; ++i) {
    CHILD_EXPECT(send(wire::kDataAm, &data, sizeof(data), payload, sizeof(payload)));
    CHILD_EXPECT(send(wire::kDoneAm, &base, sizeof(base), indices, sizeof(indices)));
    CHILD_EXPECT(send(wire::kGrantAm, &grant, sizeof(grant), nullptr, 0));
    CHILD_EXPECT(send(wire::kHelloAm, &base, sizeof(base), nullptr, 0));
    CHILD_EXPECT(send(wire::kAbortAm, &base, sizeof(base), reason, sizeof(reason) - 1));
    data.base.epoch++;
  }
  // Over tcp the sends complete only once the victim progresses (it does in its refits).
  CHILD_EXPECT((*store)->Set("forged", "1").ok());
  // Stay until the victim has seen the messages (closing the endpoint may drop unread ones).
  while (!(*store)->Get("verified", absl::Now() + absl::Milliseconds(5)).ok()) {
    CHILD_EXPECT(absl::Now() < deadline);
    (*runtime)->worker().Progress();
  }
  CHILD_EXPECT(done.pending == 0);
  return 0;
}

TEST_P(ForgedMessages, AreDroppedAndTheRefitStaysExact) {
  const bool tcp = GetParam();
  const std::string dir = StoreDir(tcp ? "forged-tcp" : "forged-sm");
  const int32_t victim = 2;
  testing::ForkOptions fork = testing::SharedMemoryUcx();
  if (tcp) {
    fork.env = {{"UCX_TLS", "tcp"}, {"UCX_NET_DEVICES", "lo"}, {"UCX_WARN_UNUSED_ENV_VARS", "n"}};
  }
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(5),
      [&](int32_t rank) {
        RefitEngineOptions options;
        // Active messages: the delivery whose receiver writes what a data message says.
        options.delivery = RefitEngineOptions::Delivery::kActiveMessage;
        if (rank == 4) return Forge(dir, options.key_prefix, victim);
        absl::StatusOr<ChildEngine> child = OpenEngine(kRowsToCols, rank, dir, options);
        CHILD_EXPECT(child.ok());
        RankBuffers& rb = child->rb;
        RefitEngine& e = *child->engine;
        const absl::Time deadline = absl::Now() + absl::Seconds(20);
        CHILD_EXPECT(child->store->Get("forged", deadline).ok());
        for (uint64_t epoch = 1; epoch <= 2; ++epoch) {
          Fill(rb, rank, epoch);
          CHILD_EXPECT(e.Start(epoch).ok());
          const absl::Status st = e.Wait(deadline);
          if (!st.ok())
            std::fprintf(stderr, "rank %d: %s\n", rank, std::string(st.message()).c_str());
          CHILD_EXPECT(st.ok());
          CHILD_EXPECT(Verify(rb, rank, epoch).ok());
        }
        if (rank == victim) {
          std::vector<uint32_t> landed;
          while (e.rejected_messages() < 20 && absl::Now() < deadline) {
            CHILD_EXPECT(e.Progress(&landed).ok());
          }
          CHILD_EXPECT(e.rejected_messages() == 20);
          CHILD_EXPECT(e.CheckAllPeers().ok());
          CHILD_EXPECT(child->store->Set("verified", "1").ok());
        }
        CHILD_EXPECT(e.Shutdown(absl::Now() + absl::Seconds(10)).ok());
        return 0;
      },
      fork);
  for (int r = 0; r < 5; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Transports, ForgedMessages, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Tcp" : "SharedMemory"; });

// Found by fuzz_engine (tests/fuzz/regressions/engine/): a message that arrives on the endpoint
// of the rank it names (a buggy peer, or one configured with another delivery) but breaks the
// protocol. Each fails the receiver's epoch with DataLoss and writes nothing:
//  - a completion signal to an active-message receiver (it unpacked from the landing area that
//    receivers by active messages do not have: a null pointer, SIGSEGV);
//  - a data message at an offset outside its transfer's runs (the bytes of another peer's piece,
//    inside the buffer, were written);
//  - a data message for a packed transfer that says it is unpacked (same).
// The failure happens in a handler outside the receiver's own progress (here: Runtime::Dispatch
// by the test; in production: another handle progressing the shared worker). Its peers must then
// learn it from the receiver's next Progress (the abort was never sent, so they waited for their
// deadline), and after every rank Reset the next epoch must refit (the unsent abort went out at
// the next Start, naming the new epoch, and failed it on every peer).
enum class PeerProtocolError { kCompletionToActiveMessages, kDataOutsideItsRuns, kWrongPackedFlag };
class PeerProtocolErrors : public ::testing::TestWithParam<PeerProtocolError> {};

// Ranks 0 and 1 send w (packed: 96-byte runs) and b (unpacked: 16 KiB pieces) to ranks 2 and 3,
// which send r back, so ranks 0 and 1 wait for rank 2.
constexpr char kBothWays[] = R"json({"tensors": [
  {"name": "w", "dtype": "fp32", "shape": [64, 48],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}},
  {"name": "b", "dtype": "fp32", "shape": [64, 128],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["R"]}},
  {"name": "r", "dtype": "fp32", "shape": [16, 16],
   "src": {"mesh": [2, 3], "placements": ["S(0)"]}, "dst": {"mesh": [0, 1], "placements": ["S(1)"]}}]})json";

// Index of the transfer of tensor `name` from `from` to `to`.
uint32_t TransferOf(const plan::Plan& plan, const std::string& name, int32_t from, int32_t to) {
  for (uint32_t i = 0; i < plan.transfers().size(); ++i) {
    const plan::Transfer& t = plan.transfers()[i];
    if (plan.spec().tensors[t.tensor].name == name && t.from_rank == from && t.to_rank == to) {
      return i;
    }
  }
  RESHARD_CHECK_MSG(false, "no such transfer");
}

// Rank 2 receives the message from rank 0's endpoint right after Start(1), before any other rank
// starts, so ranks 0 and 1 still wait for its r.
int ReceiveProtocolError(ChildEngine& c, PeerProtocolError error) {
  const int32_t rank = 2;
  RefitEngine& e = *c.engine;
  const plan::Plan& plan = c.rb.plan;
  const uint64_t handle = RefitEngine::HandleId(RefitEngineOptions().key_prefix, rank);
  ucp_ep_h from = e.EndpointTo(0);
  CHILD_EXPECT(from != nullptr);
  CHILD_EXPECT(e.Start(1).ok());
  const absl::Span<uint8_t> b_buffer = c.rb.memory[plan.buffer_of(1, plan::Side::kDst)];
  const std::vector<uint8_t> before(b_buffer.begin(), b_buffer.end());
  std::string expected;
  static uint8_t payload[96];
  std::memset(payload, 0xEE, sizeof(payload));
  if (error == PeerProtocolError::kCompletionToActiveMessages) {
    const wire::AmHeader h{wire::kMagic, 0, handle, 1};
    const uint32_t indices[1] = {TransferOf(plan, "w", 0, rank)};
    c.runtime->Dispatch(wire::kDoneAm, &h, sizeof(h), indices, sizeof(indices), false, from);
    expected = "completion signal";
  } else {
    wire::DataHeader h{wire::AmHeader{wire::kMagic, 0, handle, 1}, 0, 0, 0};
    if (error == PeerProtocolError::kDataOutsideItsRuns) {
      // b from rank 0 is rows 0-31 (bytes [0, 16384)); rows 32-63 come from rank 1.
      h.transfer = TransferOf(plan, "b", 0, rank);
      h.to_offset = 16384;
      expected = "outside transfer";
    } else {
      h.transfer = TransferOf(plan, "w", 0, rank);  // Packed; at offset 0 unpacked.
      expected = "packed flag";
    }
    c.runtime->Dispatch(wire::kDataAm, &h, sizeof(h), payload, sizeof(payload), false, from);
  }
  // Nothing was written: b's buffer is as before (rank 1's rows included).
  CHILD_EXPECT(std::equal(b_buffer.begin(), b_buffer.end(), before.begin(), before.end()));
  CHILD_EXPECT(e.rejected_messages() == 0);
  const absl::Status st = e.Progress(nullptr);
  std::fprintf(stderr, "rank 2: %s\n", st.ToString().c_str());
  CHILD_EXPECT(st.code() == absl::StatusCode::kDataLoss);
  CHILD_EXPECT(st.message().find(expected) != absl::string_view::npos);
  return 0;
}

TEST_P(PeerProtocolErrors, FailTheEpochWriteNothingAndReset) {
  const std::string dir = StoreDir("protocol");
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(4),
      [&](int32_t rank) {
        RefitEngineOptions options;
        options.delivery = RefitEngineOptions::Delivery::kActiveMessage;
        absl::StatusOr<ChildEngine> child = OpenEngine(kBothWays, rank, dir, options);
        if (!child.ok())
          std::fprintf(stderr, "rank %d: %s\n", rank, child.status().ToString().c_str());
        CHILD_EXPECT(child.ok());
        RankBuffers& rb = child->rb;
        RefitEngine& e = *child->engine;
        Fill(rb, rank, 1);
        // Every engine is set up before rank 2 fails epoch 1: an abort that reaches a rank still
        // inside RefitEngine::Create fails its set-up instead (seen under ASan with coverage).
        CHILD_EXPECT(child->store->Set(absl::StrCat("open/", rank), "1").ok());
        for (int r = 0; r < 4; ++r) {
          CHILD_EXPECT(
              child->store->Get(absl::StrCat("open/", r), absl::Now() + absl::Seconds(20)).ok());
        }
        if (rank == 2) {
          if (ReceiveProtocolError(*child, GetParam()) != 0) return 1;
          CHILD_EXPECT(child->store->Set("failed", "1").ok());
        } else {
          CHILD_EXPECT(child->store->Get("failed", absl::Now() + absl::Seconds(20)).ok());
          // Told by rank 2 (directly, or through rank 0 or 1) in Start's first progress or
          // later, long before this deadline.
          absl::Status st = e.Start(1);
          if (st.ok()) st = e.Wait(absl::Now() + absl::Seconds(5));
          std::fprintf(stderr, "rank %d: %s\n", rank, st.ToString().c_str());
          if (rank == 3) {
            CHILD_EXPECT(st.ok() || st.code() == absl::StatusCode::kUnavailable);
          } else {
            CHILD_EXPECT(st.code() == absl::StatusCode::kUnavailable);
            CHILD_EXPECT(st.message().find("rank 2 failed refit epoch 1") !=
                         absl::string_view::npos);
          }
        }
        e.Reset();
        CHILD_EXPECT(rendezvous::Barrier(*child->store, "reset-done", rank, testing::Ranks(4),
                                         absl::Now() + absl::Seconds(20))
                         .ok());
        Fill(rb, rank, 2);
        for (size_t b = 0; b < rb.memory.size(); ++b) {
          if (rb.plan.buffers()[b].side != plan::Side::kSrc)
            std::fill(rb.memory[b].begin(), rb.memory[b].end(), kPoison);
        }
        CHILD_EXPECT(e.Start(2).ok());
        const absl::Status st = e.Wait(absl::Now() + absl::Seconds(20));
        if (!st.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, st.ToString().c_str());
        CHILD_EXPECT(st.ok());
        CHILD_EXPECT(Verify(rb, rank, 2).ok());
        CHILD_EXPECT(e.Shutdown(absl::Now() + absl::Seconds(10)).ok());
        return 0;
      },
      testing::SharedMemoryUcx());
  for (int r = 0; r < 4; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Errors, PeerProtocolErrors,
                         ::testing::Values(PeerProtocolError::kCompletionToActiveMessages,
                                           PeerProtocolError::kDataOutsideItsRuns,
                                           PeerProtocolError::kWrongPackedFlag),
                         [](const auto& info) {
                           switch (info.param) {
                             case PeerProtocolError::kCompletionToActiveMessages:
                               return "CompletionToActiveMessages";
                             case PeerProtocolError::kDataOutsideItsRuns:
                               return "DataOutsideItsRuns";
                             default:
                               return "WrongPackedFlag";
                           }
                         });

}  // namespace
}  // namespace reshard::net

