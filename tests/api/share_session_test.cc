// Issue 12: the refit session runs on each rank's share of the plan (RefitHandle::Create plans
// with plan::BuildRankPlan). Real processes (one forked child per rank, UCX over shared memory or
// tcp with UCX_TLS and UCX_NET_DEVICES set, a file store), the public API inside the children:
//  - a spec with relays, staging, fan-out and packed streams from several senders refits
//    byte-exact, through the fan-out layer and through engine puts, and every rank reports the
//    world plan's fingerprint;
//  - delta refits (docs/delta.md) over 110 refits with random changes, failures and resets stay
//    byte-exact on every destination;
//  - a rank whose set-up fails (its spec does not plan, its buffers do not match) makes the
//    other ranks fail at once, naming it, instead of at their set-up deadline; the next handle
//    then works on every rank.
// Children report through their exit code; every wait in them has a deadline, and the harness
// kills a child still running at its timeout, so a failing assertion cannot hang the suite.
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "reshard/reshard.h"
#include "src/common/status.h"
#include "src/plan/plan.h"
#include "src/plan/spec_json.h"
#include "src/rendezvous/file_store.h"
#include "tests/api/forked_ranks.h"
#include "tests/testing/multiprocess.h"

namespace reshard {
namespace {

using forked::Callbacks;
using forked::Transport;

std::string StoreDir(const std::string& tag) { return forked::StoreDir("share", tag); }

// Ranks 0 and 7 (one domain) train; ranks 1-3 and 4-6 are two destination domains. Rank 0 alone
// holds w, v and t, so the second domain gets them relayed by the first; ranks 3 and 6 hold only
// the small t, so they take parts of w off the network into staging and forward them; u and c
// fan out inside each domain; c's column slices (short runs) from two sources travel packed.
constexpr char kSpec[] = R"json({"topology": {"domains": [[0, 7], [1, 2, 3], [4, 5, 6]]},
 "tensors": [
  {"name": "w", "dtype": "fp32", "shape": [256, 256], "src": {"mesh": [0], "placements": ["R"]},
   "dst": {"mesh": [[1, 2], [4, 5]], "placements": ["R", "S(0)"]}},
  {"name": "v", "dtype": "fp32", "shape": [128, 128], "src": {"mesh": [0], "placements": ["R"]},
   "dst": {"mesh": [1, 4], "placements": ["R"]}},
  {"name": "t", "dtype": "fp32", "shape": [8, 8], "src": {"mesh": [0], "placements": ["R"]},
   "dst": {"mesh": [3, 6], "placements": ["R"]}},
  {"name": "u", "dtype": "fp32", "shape": [64, 64], "src": {"mesh": [7], "placements": ["R"]},
   "dst": {"mesh": [1, 2, 4, 5], "placements": ["R"]}},
  {"name": "c", "dtype": "fp32", "shape": [64, 96], "src": {"mesh": [0, 7], "placements": ["S(0)"]},
   "dst": {"mesh": [[1, 2], [4, 5]], "placements": ["R", "S(1)"]}}]})json";
constexpr int kWorld = 8;

// The value of element `index` (row-major, global) of tensor `tensor` in refit `step`.
uint32_t Value(size_t tensor, int64_t index, int step) {
  uint64_t z = (static_cast<uint64_t>(tensor) << 40) ^ (static_cast<uint64_t>(step) << 32) ^
               static_cast<uint64_t>(index);
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint32_t>(z ^ (z >> 31));
}

// One rank's buffers, by side and name (every tensor of kSpec is fp32).
struct Memory {
  std::map<std::pair<Side, std::string>, std::vector<uint32_t>> buffers;
  LocalBuffers Views() {
    LocalBuffers views;
    for (auto& [key, words] : buffers) {
      views.Add(key.first, key.second,
                Buffer{words.data(), static_cast<int64_t>(words.size() * sizeof(uint32_t))});
    }
    return views;
  }
};

absl::StatusOr<Memory> Allocate(const RefitSpec& spec, int rank) {
  absl::StatusOr<std::vector<BufferRequirement>> reqs = spec.LocalBuffers(rank);
  if (!reqs.ok()) return reqs.status();
  Memory m;
  for (const BufferRequirement& r : *reqs) {
    m.buffers[{r.side, r.name}].assign(static_cast<size_t>(r.bytes / 4), 0xFFFFFFFFu);
  }
  return m;
}

// What every forked rank of these tests sets up first: the shared file store, a communicator
// over it, the spec and this rank's buffers.
struct RankSetUp {
  std::unique_ptr<rendezvous::FileStore> store;
  Communicator comm;
  RefitSpec spec;
  Memory memory;
};
absl::StatusOr<RankSetUp> SetUpRank(const std::string& dir, int32_t rank, int32_t world,
                                    const char* json) {
  RESHARD_ASSIGN_OR_RETURN(std::unique_ptr<rendezvous::FileStore> store,
                           rendezvous::FileStore::Open(dir));
  RESHARD_ASSIGN_OR_RETURN(Communicator comm,
                           Communicator::FromCallbacks(Callbacks(store.get()), rank, world));
  RESHARD_ASSIGN_OR_RETURN(RefitSpec spec, RefitSpec::FromJson(json));
  RESHARD_ASSIGN_OR_RETURN(Memory memory, Allocate(spec, rank));
  return RankSetUp{std::move(store), std::move(comm), std::move(spec), std::move(memory)};
}

// Calls fn(word in the buffer, expected value) for every element of `rank`'s tiles on `side`
// (2-D tensors).
template <typename Fn>
bool ForEachElement(const RefitSpec& spec, int rank, Side side, int step, Memory& m, Fn fn) {
  absl::StatusOr<std::vector<LocalTile>> tiles = spec.LocalTiles(rank, side);
  if (!tiles.ok()) return false;
  for (const LocalTile& tile : *tiles) {
    size_t t = 0;
    while (spec.tensors()[t].name != tile.tensor) ++t;
    std::vector<uint32_t>& words = m.buffers.at({side, tile.buffer});
    for (int64_t i = tile.lo[0]; i < tile.hi[0]; ++i) {
      for (int64_t j = tile.lo[1]; j < tile.hi[1]; ++j) {
        const int64_t at =
            tile.offset + (i - tile.lo[0]) * tile.strides[0] + (j - tile.lo[1]) * tile.strides[1];
        fn(words[static_cast<size_t>(at)], Value(t, i * tile.global_shape[1] + j, step));
      }
    }
  }
  return true;
}

class ShareSessionTest : public ::testing::TestWithParam<std::tuple<std::string, Fanout>> {};

TEST_P(ShareSessionTest, RelaysStagingAndFanoutRefitByteExact) {
  // Plain variables, not a structured binding: clang (the sanitizer builds) does not let the
  // rank lambdas below capture bindings.
  const std::string transport = std::get<0>(GetParam());
  const Fanout fanout = std::get<1>(GetParam());
  // The world plan, for what the ranks must report: the schedule has relays, staging and
  // fan-out, and each rank's share is a fraction of it.
  auto parsed = plan::ParseSpecJson(kSpec);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto shared = std::make_shared<const plan::RefitSpec>(*parsed);
  auto world = plan::BuildPlan(shared);
  ASSERT_TRUE(world.ok()) << world.status();
  ASSERT_GT(world->stats().bytes_relay, 0);
  ASSERT_GT(world->stats().bytes_staged, 0);
  ASSERT_GT(world->stats().bytes_fanout, 0);
  for (int32_t r = 0; r < kWorld; ++r) {
    auto share = plan::BuildRankPlan(shared, r);
    ASSERT_TRUE(share.ok()) << share.status();
    ASSERT_LT(share->transfers().size(), world->transfers().size()) << "rank " << r;
  }
  const uint64_t fingerprint = world->fingerprint();
  const std::string dir = StoreDir("refit");
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(kWorld),
      [&](int32_t rank) {
        absl::StatusOr<RankSetUp> set_up = SetUpRank(dir, rank, kWorld, kSpec);
        CHILD_EXPECT(set_up.ok(), set_up.status().ToString());
        // Pointers, used as the StatusOrs they replace were (clang's lambdas cannot capture
        // structured bindings).
        Communicator* comm = &set_up->comm;
        RefitSpec* spec = &set_up->spec;
        Memory* memory = &set_up->memory;
        HandleOptions options;
        options.fanout = fanout;
        options.setup_timeout = absl::Seconds(30);
        auto handle = RefitHandle::Create(*comm, *spec, memory->Views(), options);
        CHILD_EXPECT(handle.ok(), handle.status().ToString());
        CHILD_EXPECT(handle->plan_fingerprint() == fingerprint);
        for (int step = 1; step <= 3; ++step) {
          ForEachElement(*spec, rank, Side::kSource, step, *memory,
                         [](uint32_t& word, uint32_t value) { word = value; });
          ForEachElement(*spec, rank, Side::kDestination, step, *memory,
                         [](uint32_t& word, uint32_t) { word = 0xFFFFFFFFu; });
          const absl::Status st = handle->Execute(absl::Now() + absl::Seconds(30));
          CHILD_EXPECT(st.ok(), st.ToString());
          int64_t wrong = 0;
          CHILD_EXPECT(
              ForEachElement(*spec, rank, Side::kDestination, step, *memory,
                             [&](uint32_t& word, uint32_t value) { wrong += word != value; }));
          CHILD_EXPECT(wrong == 0, absl::StrCat(wrong, " wrong elements in refit ", step));
          const Stats& s = handle->stats();
          CHILD_EXPECT(s.pieces_received == s.pieces_expected,
                       absl::StrCat(s.pieces_received, " of ", s.pieces_expected, " pieces"));
          CHILD_EXPECT(s.bytes_fanout_received ==
                       (fanout == Fanout::kAuto ? s.planned_fanout_in : 0));
          if (step > 1) CHILD_EXPECT(s.registrations_this_refit == 0);
        }
        return 0;
      },
      Transport(transport));
  for (int32_t r = 0; r < kWorld; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Transports, ShareSessionTest,
                         ::testing::Combine(::testing::Values("sm", "tcp"),
                                            ::testing::Values(Fanout::kAuto, Fanout::kEngine)),
                         [](const auto& info) {
                           return std::get<0>(info.param) +
                                  (std::get<1>(info.param) == Fanout::kAuto ? "FanoutLayer"
                                                                            : "EnginePuts");
                         });

// Delta refits through RefitHandle (docs/delta.md) on the same spec (relays, staging, fan-out,
// packed streams), over sm and tcp, with the fan-out layer: 110 consecutive refits, each
// changing a random fraction (0 and 1 included) of every source tensor's elements by 1-15 ulp,
// three refits failed by source rank 0 or destination rank 1 giving up at once, each followed by
// Reset() on every rank. Every rank keeps the global tensors' values and checks every destination
// element after every successful refit; deltas must have been sent and applied (after a refit that
// changed nothing, every delta piece each rank receives, into staging and relays too), and the
// first refit and the one after each Reset sent no delta.
class ShareSessionDeltaTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ShareSessionDeltaTest, HundredRefitsWithRandomChangesFailuresAndResetsStayByteExact) {
  const std::string transport = GetParam();
  const std::string dir = StoreDir("delta");
  // Per rank, the pieces it receives as delta streams (plan::DeltaElemBytes), pieces into
  // staging and relays included: a refit that changed nothing applies every one of them as a
  // delta.
  std::vector<int64_t> encoded_in(kWorld, 0);
  int64_t staged = 0, relayed = 0;
  {
    auto parsed = plan::ParseSpecJson(kSpec);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    auto world = plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*std::move(parsed)));
    ASSERT_TRUE(world.ok()) << world.status();
    for (const plan::Transfer& t : world->transfers()) {
      if (plan::DeltaElemBytes(*world, t) == 0) continue;
      encoded_in[t.to_rank]++;
      staged += t.to_side == plan::Side::kStage;
      relayed += plan::IsRelay(t);
    }
  }
  ASSERT_GT(staged, 0);
  ASSERT_GT(relayed, 0);
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(kWorld),
      [&](int32_t rank) {
        absl::StatusOr<RankSetUp> set_up = SetUpRank(dir, rank, kWorld, kSpec);
        CHILD_EXPECT(set_up.ok(), set_up.status().ToString());
        // Pointers, used as the StatusOrs they replace were (clang's lambdas cannot capture
        // structured bindings).
        std::unique_ptr<rendezvous::FileStore>* store = &set_up->store;
        Communicator* comm = &set_up->comm;
        RefitSpec* spec = &set_up->spec;
        Memory* memory = &set_up->memory;
        HandleOptions options;
        options.delta = true;
        options.setup_timeout = absl::Seconds(30);
        auto handle = RefitHandle::Create(*comm, *spec, memory->Views(), options);
        CHILD_EXPECT(handle.ok(), handle.status().ToString());
        // The global tensors, row-major, the same on every rank.
        std::vector<std::vector<uint32_t>> model;
        for (size_t t = 0; t < spec->tensors().size(); ++t) {
          const auto& shape = spec->tensors()[t].shape;
          model.emplace_back(static_cast<size_t>(shape[0] * shape[1]));
          for (size_t i = 0; i < model[t].size(); ++i) model[t][i] = Value(t, i, 0);
        }
        // Calls fn(word, global value) for every element of this rank's tiles on `side`.
        auto each = [&](Side side, auto fn) {
          absl::StatusOr<std::vector<LocalTile>> tiles = spec->LocalTiles(rank, side);
          for (const LocalTile& tile : *tiles) {
            size_t t = 0;
            while (spec->tensors()[t].name != tile.tensor) ++t;
            std::vector<uint32_t>& words = memory->buffers.at({side, tile.buffer});
            for (int64_t i = tile.lo[0]; i < tile.hi[0]; ++i) {
              for (int64_t j = tile.lo[1]; j < tile.hi[1]; ++j) {
                const int64_t at = tile.offset + (i - tile.lo[0]) * tile.strides[0] +
                                   (j - tile.lo[1]) * tile.strides[1];
                fn(words[static_cast<size_t>(at)], model[t][i * tile.global_shape[1] + j]);
              }
            }
          }
        };
        bool full_next = true;
        int64_t deltas = 0, applied = 0, failed = 0;
        for (int step = 1; step <= 110; ++step) {
          std::mt19937_64 rng(static_cast<uint64_t>(step));
          const double f = step % 10 == 0   ? 0.0
                           : step % 10 == 1 ? 1.0
                                            : std::uniform_real_distribution<double>(0, 1)(rng);
          std::uniform_real_distribution<double> u(0, 1);
          for (auto& tensor : model) {
            for (uint32_t& v : tensor) {
              if (u(rng) < f) v ^= static_cast<uint32_t>(1 + rng() % 15);
            }
          }
          each(Side::kSource, [](uint32_t& word, uint32_t value) { word = value; });
          // Refits 20 and 80: source rank 0 gives up at once; refit 50: destination rank 1.
          // The others learn it from the engine's aborts or the fan-out layer's boards (a 30 s
          // deadline they do not reach: the test would take minutes). A source whose destinations
          // granted before its Start can finish within Start, so at refit 20 the others start only
          // once rank 0 gave up (its abort reaches them before or during their refit: a failure
          // that cannot race); at 80 and 50 everyone starts together and the abort lands mid-refit
          // (rank 0 may win the race at 80 and succeed, which is a consistent outcome too).
          const bool fail_step = step == 20 || step == 50 || step == 80;
          const int32_t quitter = step == 50 ? 1 : 0;
          const std::string quit_key = absl::StrCat("delta-quit/", step);
          if (step == 20 && rank != quitter) {
            CHILD_EXPECT((*store)->Get(quit_key, absl::Now() + absl::Seconds(60)).ok());
          }
          absl::Status st = handle->Start();
          if (st.ok()) {
            st = handle->Wait(!fail_step        ? absl::Now() + absl::Seconds(30)
                              : rank == quitter ? absl::InfinitePast()
                                                : absl::Now() + absl::Seconds(30));
          }
          if (step == 20 && rank == quitter) {
            CHILD_EXPECT(!st.ok(), "rank 0 finished refit 20 before any destination started");
            CHILD_EXPECT((*store)->Set(quit_key, "1").ok());
          }
          if (fail_step) {
            failed += !st.ok();
            handle->Reset();
            const std::string key = absl::StrCat("delta-reset/", step, "/");
            CHILD_EXPECT((*store)->Set(absl::StrCat(key, rank), "1").ok());
            for (int r = 0; r < kWorld; ++r) {
              CHILD_EXPECT(
                  (*store)->Get(absl::StrCat(key, r), absl::Now() + absl::Seconds(60)).ok());
            }
            full_next = true;
            continue;
          }
          CHILD_EXPECT(st.ok(), absl::StrCat("refit ", step, ": ", st.ToString()));
          int64_t wrong = 0;
          each(Side::kDestination, [&](uint32_t& word, uint32_t value) { wrong += word != value; });
          CHILD_EXPECT(wrong == 0, absl::StrCat(wrong, " wrong elements in refit ", step));
          const Stats& s = handle->stats();
          if (full_next) CHILD_EXPECT(s.delta_pieces == 0, absl::StrCat("refit ", step));
          if (!full_next && f == 0) {
            CHILD_EXPECT(
                s.delta_full_no_base + s.delta_full_receiver_version + s.delta_full_not_smaller ==
                    0,
                absl::StrCat("refit ", step));
            CHILD_EXPECT(s.deltas_applied == encoded_in[rank],
                         absl::StrCat("refit ", step, ": ", s.deltas_applied, " deltas applied of ",
                                      encoded_in[rank]));
          }
          CHILD_EXPECT(s.bytes_network_sent >= s.delta_stream_bytes);
          deltas += s.delta_pieces;
          applied += s.deltas_applied;
          full_next = false;
        }
        const Stats& s = handle->stats();
        if (s.delta_shadow_bytes > 0) CHILD_EXPECT(deltas > 0 && s.send_scratch_bytes > 0);
        if (rank == 1 || rank == 4) CHILD_EXPECT(applied > 0);
        // The streams a rank receives take room in its landing area with puts (shared memory),
        // none with active messages (tcp): each is applied from its message.
        if (transport == "tcp") {
          CHILD_EXPECT(s.landing_area_bytes == 0, absl::StrCat(s.landing_area_bytes));
        } else if (encoded_in[rank] > 0) {
          CHILD_EXPECT(s.landing_area_bytes > 0);
        }
        if (rank <= 1) CHILD_EXPECT(failed > 0);
        return 0;
      },
      Transport(transport));
  for (int32_t r = 0; r < kWorld; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Transports, ShareSessionDeltaTest, ::testing::Values("sm", "tcp"),
                         [](const auto& info) { return info.param; });

// A rank that waits on a domain peer's fan-out copies learns at once that the peer failed the
// refit (the peer publishes it on its signal board; docs/reliability.md), instead of at its
// deadline: rank 0 replicates w to domain {1, 2}, and in refit 2 the rank the plan has forward
// pieces to the other gives up at once. The other fails with Unavailable naming it, well before
// its 60 s deadline (not asserted: a DeadlineExceeded would fail the test). Rank 0 starts only
// after both failed, so nothing but the fan-out layer can tell the other. Refit 3, after Reset
// on every rank, is byte-exact.
TEST(FanoutAbortTest, ADomainPeerWaitingOnAFailedRanksCopiesFailsAtOnceNamingIt) {
  constexpr char kFanoutSpec[] = R"json({"topology": {"domains": [[0], [1, 2]]}, "tensors": [
    {"name": "w", "dtype": "fp32", "shape": [256, 256], "src": {"mesh": [0], "placements": ["R"]},
     "dst": {"mesh": [1, 2], "placements": ["R"]}}]})json";
  auto parsed = plan::ParseSpecJson(kFanoutSpec);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto world = plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*parsed));
  ASSERT_TRUE(world.ok()) << world.status();
  int32_t quitter = -1;
  for (const plan::Transfer& t : world->transfers()) {
    if (t.kind == plan::TransferKind::kFanout) quitter = t.from_rank;
  }
  ASSERT_NE(quitter, -1) << "the plan has no fan-out";
  const int32_t other = 3 - quitter;
  const std::string dir = StoreDir("fanout-abort");
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(3),
      [&](int32_t rank) {
        absl::StatusOr<RankSetUp> set_up = SetUpRank(dir, rank, 3, kFanoutSpec);
        CHILD_EXPECT(set_up.ok(), set_up.status().ToString());
        // Pointers, used as the StatusOrs they replace were (clang's lambdas cannot capture
        // structured bindings).
        std::unique_ptr<rendezvous::FileStore>* store = &set_up->store;
        Communicator* comm = &set_up->comm;
        RefitSpec* spec = &set_up->spec;
        Memory* memory = &set_up->memory;
        auto handle = RefitHandle::Create(*comm, *spec, memory->Views());
        CHILD_EXPECT(handle.ok(), handle.status().ToString());
        auto key_set = [&](const std::string& key) {
          return (*store)->Get(key, absl::Now() + absl::Seconds(60)).ok();
        };
        for (int step = 1; step <= 3; ++step) {
          ForEachElement(*spec, rank, Side::kSource, step, *memory,
                         [](uint32_t& word, uint32_t value) { word = value; });
          if (step == 2 && rank == 0) CHILD_EXPECT(key_set("failed/1") && key_set("failed/2"));
          absl::Status st = handle->Start();
          if (st.ok()) {
            st = handle->Wait(step == 2 && rank == quitter ? absl::InfinitePast()
                                                           : absl::Now() + absl::Seconds(60));
          }
          if (step == 2) {
            if (rank == quitter) CHILD_EXPECT(!st.ok(), "the quitter finished refit 2");
            if (rank == other) {
              CHILD_EXPECT(st.code() == absl::StatusCode::kUnavailable, st.ToString());
              CHILD_EXPECT(st.message().find(absl::StrCat("fan-out peer rank ", quitter,
                                                          " failed")) != std::string::npos,
                           st.ToString());
            }
            if (rank != 0) CHILD_EXPECT((*store)->Set(absl::StrCat("failed/", rank), "1").ok());
            handle->Reset();
            CHILD_EXPECT((*store)->Set(absl::StrCat("reset/", rank), "1").ok());
            CHILD_EXPECT(key_set("reset/0") && key_set("reset/1") && key_set("reset/2"));
            continue;
          }
          CHILD_EXPECT(st.ok(), absl::StrCat("refit ", step, ": ", st.ToString()));
          int64_t wrong = 0;
          ForEachElement(*spec, rank, Side::kDestination, step, *memory,
                         [&](uint32_t& word, uint32_t value) { wrong += word != value; });
          CHILD_EXPECT(wrong == 0, absl::StrCat(wrong, " wrong elements in refit ", step));
        }
        return 0;
      },
      Transport("sm"));
  for (int32_t r = 0; r < 3; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

constexpr char kRowsToCols[] = R"json({"tensors": [{"name": "w", "dtype": "fp32",
  "shape": [8, 6], "src": {"mesh": [0, 1], "placements": ["S(0)"]},
  "dst": {"mesh": [2, 3], "placements": ["S(1)"]}}]})json";
// What goes wrong on rank 3 before the ranks agree on the plan.
// kAbandoned: rank 3 refuses its own buffers before Create (as a binding that checks its
// framework's tensors first does) and calls RefitHandle::Abandon instead.
enum class Fault { kSpecDoesNotPlan, kBufferTooSmall, kAbandoned };

class SetUpFailureTest : public ::testing::TestWithParam<Fault> {};

TEST_P(SetUpFailureTest, OneRanksFailureFailsTheOthersAtOnceNamingIt) {
  const std::string dir = StoreDir("fail");
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(4),
      [&](int32_t rank) {
        absl::StatusOr<RankSetUp> set_up = SetUpRank(dir, rank, 4, kRowsToCols);
        CHILD_EXPECT(set_up.ok(), set_up.status().ToString());
        // Pointers, used as the StatusOrs they replace were (clang's lambdas cannot capture
        // structured bindings).
        Communicator* comm = &set_up->comm;
        RefitSpec* spec = &set_up->spec;
        Memory* memory = &set_up->memory;
        HandleOptions options;
        options.setup_timeout = absl::Seconds(40);
        absl::StatusOr<RefitHandle> handle = absl::UnknownError("not created");
        const absl::Time start = absl::Now();
        if (rank == 3 && GetParam() == Fault::kSpecDoesNotPlan) {
          // Rank 3's copy of the spec shards a dim the tensor does not have: it alone cannot
          // plan (as a rank whose own buffers overlap cannot, once planning validates per rank).
          RefitSpec broken;
          broken.AddTensor("w", DType::kFp32, {8, 6}, Layout(Mesh({0, 1}), {Shard(0)}),
                           Layout(Mesh({2, 3}), {Shard(2)}));
          handle = RefitHandle::Create(*comm, broken, memory->Views(), options);
        } else if (rank == 3 && GetParam() == Fault::kAbandoned) {
          const absl::Status why = RefitHandle::Abandon(
              *comm, *spec,
              absl::InvalidArgumentError("rank 3: destination \"w\" is not contiguous"), options);
          CHILD_EXPECT(why.message() == "rank 3: destination \"w\" is not contiguous",
                       why.ToString());
          handle = why;
        } else if (rank == 3) {
          LocalBuffers views;
          for (auto& [key, words] : memory->buffers) {
            views.Add(key.first, key.second,
                      Buffer{words.data(), static_cast<int64_t>(words.size() * 4) - 4});
          }
          handle = RefitHandle::Create(*comm, *spec, std::move(views), options);
        } else {
          handle = RefitHandle::Create(*comm, *spec, memory->Views(), options);
        }
        const absl::Duration took = absl::Now() - start;
        CHILD_EXPECT(!handle.ok());
        const std::string message = handle.status().ToString();
        CHILD_EXPECT(handle.status().code() == absl::StatusCode::kInvalidArgument, message);
        if (rank != 3) {
          CHILD_EXPECT(message.find("rank 3 failed before agreeing on the plan fingerprint") !=
                           std::string::npos,
                       message);
          CHILD_EXPECT(GetParam() != Fault::kAbandoned ||
                           message.find("destination \"w\" is not contiguous") != std::string::npos,
                       message);
          CHILD_EXPECT(took < absl::Seconds(10),
                       absl::StrCat(absl::FormatDuration(took), ": ", message));
        }
        // Every rank consumed the same handle number: the next handle meets on every rank.
        auto next = RefitHandle::Create(*comm, *spec, memory->Views(), options);
        CHILD_EXPECT(next.ok(), next.status().ToString());
        ForEachElement(*spec, rank, Side::kSource, 1, *memory,
                       [](uint32_t& word, uint32_t value) { word = value; });
        const absl::Status st = next->Execute(absl::Now() + absl::Seconds(30));
        CHILD_EXPECT(st.ok(), st.ToString());
        int64_t wrong = 0;
        CHILD_EXPECT(
            ForEachElement(*spec, rank, Side::kDestination, 1, *memory,
                           [&](uint32_t& word, uint32_t value) { wrong += word != value; }));
        CHILD_EXPECT(wrong == 0, absl::StrCat(wrong, " wrong elements"));
        return 0;
      },
      Transport("sm"));
  for (int32_t r = 0; r < 4; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Faults, SetUpFailureTest,
                         ::testing::Values(Fault::kSpecDoesNotPlan, Fault::kBufferTooSmall,
                                           Fault::kAbandoned),
                         [](const auto& info) {
                           switch (info.param) {
                             case Fault::kSpecDoesNotPlan:
                               return "SpecDoesNotPlan";
                             case Fault::kBufferTooSmall:
                               return "BufferTooSmall";
                             case Fault::kAbandoned:
                               break;
                           }
                           return "Abandoned";
                         });

}  // namespace
}  // namespace reshard
