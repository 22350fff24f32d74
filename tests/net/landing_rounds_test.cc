// Landing rounds (src/net/landing_rounds.h) on real plans, without UCX: the receiver's table and
// every sender's stream agree piece by piece (the same world indices at the same stream
// offsets, the same totals), slices stay within the budget with at least two places per sender
// (every round its own place when everything fits), rounds no larger than stage_round_bytes,
// every stream byte has one place in its sender's slice and round r takes place r % slots,
// pieces that cannot travel in rounds (delta, empty, relayed; packed into direct destinations,
// contiguous into registered ones) are left out, and a
// budget too small is refused with the rank named. The wire-up field is parsed strictly.
#include "src/net/landing_rounds.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "src/net/refit_engine.h"
#include "src/net/wireup.h"
#include "src/plan/region.h"
#include "src/plan/spec_json.h"

namespace reshard::net {
namespace {

plan::Plan MakeRoundsPlan(const std::string& json) {
  auto spec = plan::ParseSpecJson(json);
  EXPECT_TRUE(spec.ok()) << spec.status();
  auto plan = plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*spec));
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

// Rows -> columns (plain runs of 2 KiB and packed runs of 64 bytes) and a replicated
// destination: every destination rank receives from both sources.
constexpr char kRoundsTwoSenders[] = R"json({"tensors": [
  {"name": "v", "dtype": "fp32", "shape": [64, 1024],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}},
  {"name": "w", "dtype": "bf16", "shape": [64, 64],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}},
  {"name": "e", "dtype": "fp32", "shape": [16, 40],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["R"]}}]})json";
// The same in two domains: the engine runs the fan-out, so relayed pieces (`after`) land too.
constexpr char kRoundsInDomains[] =
    R"json({"topology": {"domains": [[0, 1], [2, 3, 4, 5]]}, "tensors": [
  {"name": "v", "dtype": "fp32", "shape": [64, 1024],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}},
  {"name": "w", "dtype": "bf16", "shape": [64, 64],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}},
  {"name": "e", "dtype": "fp32", "shape": [16, 40],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3, 4, 5], "placements": ["R"]}}]})json";

SendProgramOptions RoundsOptions() {
  SendProgramOptions o;
  o.pack_below_run_bytes = 1024;
  return o;
}

// Every destination buffer in `mode` (direct by default).
std::vector<RoundMode> AllDirect(const plan::Plan& plan, RoundMode mode = RoundMode::kAll) {
  std::vector<RoundMode> modes(plan.buffers().size(), RoundMode::kNone);
  for (size_t b = 0; b < modes.size(); ++b) {
    if (plan.buffers()[b].side != plan::Side::kSrc) modes[b] = mode;
  }
  return modes;
}

void ExpectRoundTablesAgree(const char* spec, RoundMode mode) {
  const plan::Plan plan = MakeRoundsPlan(spec);
  const std::vector<RoundMode> direct = AllDirect(plan, mode);
  std::vector<SendProgram> programs;
  for (int32_t r = 0; r < plan.world_size(); ++r)
    programs.push_back(BuildSendProgram(plan, r, RoundsOptions()));
  int64_t round_pieces = 0, packed_round_pieces = 0;
  for (int32_t p = 0; p < plan.world_size(); ++p) {
    absl::StatusOr<LandingRounds> rounds = PlanLandingRounds(plan, programs[p], direct, 1 << 20);
    ASSERT_TRUE(rounds.ok()) << rounds.status();
    std::map<int32_t, const RoundSender*> by_rank;
    for (const RoundSender& s : rounds->senders) by_rank[s.rank] = &s;
    for (int32_t s = 0; s < plan.world_size(); ++s) {
      int64_t total = 0;
      const std::vector<int64_t> bases = RoundStreamBases(plan, programs[s], p, direct, &total);
      auto it = by_rank.find(s);
      ASSERT_EQ(total, it == by_rank.end() ? 0 : it->second->total) << s << " -> " << p;
      if (it == by_rank.end()) continue;
      // The sender's round descriptors, in its order, are the receiver's pieces, in its order.
      uint32_t k = it->second->piece_begin;
      for (uint32_t i = programs[s].peer_begin[p]; i < programs[s].peer_begin[p + 1]; ++i) {
        if (bases[i] < 0) continue;
        ASSERT_LT(k, it->second->piece_end);
        const RoundPiece& piece = rounds->pieces[k++];
        EXPECT_EQ(programs[p].received_ids[piece.slot], programs[s].descs[i].id);
        EXPECT_EQ(piece.base, bases[i]);
        EXPECT_EQ(piece.bytes, programs[s].descs[i].bytes);
        EXPECT_EQ(rounds->sender_of_slot[piece.slot], it->second - rounds->senders.data());
        round_pieces++;
      }
      EXPECT_EQ(k, it->second->piece_end);
    }
    // Network pieces only, never relayed or local ones, packed streams included; kStrided: only
    // those of more than one run.
    for (uint32_t slot = 0; slot < programs[p].received.size(); ++slot) {
      const plan::Transfer& t = plan.transfers()[programs[p].received[slot]];
      const plan::Region& region = plan.region(t.region);
      const bool strided = region.bytes > region.run_bytes;
      const bool packed = programs[p].landing_offset[slot] >= 0;
      if (rounds->sender_of_slot[slot] < 0) {
        EXPECT_TRUE(t.from_rank == p || t.after >= 0 || region.bytes == 0 ||
                    (mode == RoundMode::kStrided && !strided))
            << "slot " << slot << " of rank " << p;
      } else {
        EXPECT_TRUE(t.from_rank != p && t.after < 0 && (mode == RoundMode::kAll || strided));
      }
      packed_round_pieces += packed && rounds->sender_of_slot[slot] >= 0 ? 1 : 0;
    }
  }
  EXPECT_GT(round_pieces, 0);
  EXPECT_GT(packed_round_pieces, 0);
}

TEST(LandingRounds, ReceiverAndSendersAgreePieceByPiece) {
  ExpectRoundTablesAgree(kRoundsTwoSenders, RoundMode::kAll);
  ExpectRoundTablesAgree(kRoundsInDomains, RoundMode::kAll);
}

// A receiver's record that its plan does not explain: a total off by one byte, or modes it did
// not plan with (every buffer strided, or every one direct, where it planned the other), is
// refused by the sender at set-up, naming both ranks.
TEST(LandingRounds, ASenderRefusesRoundsThePlanDoesNotExplain) {
  const plan::Plan plan = MakeRoundsPlan(kRoundsTwoSenders);
  const SendProgram receiver = BuildSendProgram(plan, 2, RoundsOptions());
  const SendProgram sender = BuildSendProgram(plan, 0, RoundsOptions());
  for (const RoundMode planned : {RoundMode::kAll, RoundMode::kStrided}) {
    absl::StatusOr<LandingRounds> rounds =
        PlanLandingRounds(plan, receiver, AllDirect(plan, planned), 1 << 20);
    ASSERT_TRUE(rounds.ok()) << rounds.status();
    const int64_t total = rounds->senders[0].total;
    EXPECT_TRUE(CheckedRoundStreamBases(plan, sender, 2, rounds->modes, total).ok());
    for (const int64_t hostile : {total + 1, total - 1, int64_t{0}, INT64_MAX, INT64_MIN}) {
      absl::StatusOr<std::vector<int64_t>> bases =
          CheckedRoundStreamBases(plan, sender, 2, rounds->modes, hostile);
      ASSERT_FALSE(bases.ok()) << hostile;
      EXPECT_EQ(bases.status().code(), absl::StatusCode::kFailedPrecondition);
      EXPECT_NE(bases.status().message().find("rank 2 expects"), std::string::npos);
      EXPECT_NE(bases.status().message().find("from rank 0"), std::string::npos);
    }
    const RoundMode other = planned == RoundMode::kAll ? RoundMode::kStrided : RoundMode::kAll;
    EXPECT_EQ(
        CheckedRoundStreamBases(plan, sender, 2, AllDirect(plan, other), total).status().code(),
        absl::StatusCode::kFailedPrecondition);
  }
}

// Registered CUDA destinations (a CUDA-aware UCX) take only strided pieces in rounds, packed
// streams included: the replicated "e" (contiguous rows) is put straight into its buffer.
TEST(LandingRounds, RegisteredDestinationsTakeOnlyStridedPiecesInRounds) {
  ExpectRoundTablesAgree(kRoundsTwoSenders, RoundMode::kStrided);
  ExpectRoundTablesAgree(kRoundsInDomains, RoundMode::kStrided);
  const plan::Plan plan = MakeRoundsPlan(kRoundsTwoSenders);
  const SendProgram program = BuildSendProgram(plan, 2, RoundsOptions());
  absl::StatusOr<LandingRounds> all = PlanLandingRounds(plan, program, AllDirect(plan), 1 << 20);
  absl::StatusOr<LandingRounds> strided =
      PlanLandingRounds(plan, program, AllDirect(plan, RoundMode::kStrided), 1 << 20);
  ASSERT_TRUE(all.ok() && strided.ok());
  // Each of the two senders: "v" (32 rows of 2 KiB) and the packed "w" (32 rows of 64 bytes) in
  // both, "e" (8 rows of 160 bytes, one run) only in the first.
  ASSERT_EQ(strided->senders.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(strided->senders[i].total, 64 * 1024 * 4 / 4 + 32 * 64);
    EXPECT_EQ(all->senders[i].total, 64 * 1024 * 4 / 4 + 32 * 64 + 8 * 40 * 4);
  }
}

TEST(LandingRounds, TheEngineDefaultsToTheDefaultRoundSize) {
  EXPECT_EQ(RefitEngineOptions{}.stage_round_bytes, kDefaultRoundBytes);
}

TEST(LandingRounds, ABudgetThatHoldsEverythingGivesOneRoundEach) {
  const plan::Plan plan = MakeRoundsPlan(kRoundsTwoSenders);
  const SendProgram program = BuildSendProgram(plan, 2, RoundsOptions());
  absl::StatusOr<LandingRounds> rounds =
      PlanLandingRounds(plan, program, AllDirect(plan), 256 << 20);
  ASSERT_TRUE(rounds.ok()) << rounds.status();
  ASSERT_EQ(rounds->senders.size(), 2u);
  int64_t all = 0;
  for (const RoundSender& s : rounds->senders) {
    EXPECT_LT(s.total, kDefaultRoundBytes);
    EXPECT_EQ(s.rounds, 1);
    EXPECT_EQ(s.slots, 1);
    EXPECT_EQ(s.quota, s.total);
    EXPECT_EQ(s.offset, all);
    all += s.total;
  }
  EXPECT_EQ(rounds->area_bytes, all);
}

// Streams longer than stage_round_bytes are cut into rounds of it even when the budget holds
// everything: each round has its own place (the stream's bytes in order, all granted with the
// epoch), so the receiver copies a round out while the next ones land.
TEST(LandingRounds, ABudgetThatHoldsEverythingStillCutsLongStreamsIntoRounds) {
  const plan::Plan plan = MakeRoundsPlan(kRoundsTwoSenders);
  const SendProgram program = BuildSendProgram(plan, 2, RoundsOptions());
  const int64_t round_bytes = (16 << 10) + 100;  // Rounds in whole 256-byte units: 16 KiB.
  absl::StatusOr<LandingRounds> rounds =
      PlanLandingRounds(plan, program, AllDirect(plan), 256 << 20, round_bytes);
  ASSERT_TRUE(rounds.ok()) << rounds.status();
  ASSERT_EQ(rounds->senders.size(), 2u);
  int64_t all = 0;
  for (const RoundSender& s : rounds->senders) {
    EXPECT_EQ(s.quota, 16 << 10);
    EXPECT_EQ(s.rounds, (s.total + s.quota - 1) / s.quota);
    EXPECT_GE(s.rounds, 4);
    EXPECT_EQ(s.slots, s.rounds);
    EXPECT_EQ(s.offset, all);
    EXPECT_EQ(s.SliceBytes(), s.total);
    for (int64_t x : {int64_t{0}, s.quota - 1, s.quota, 3 * s.quota + 7, s.total - 1}) {
      EXPECT_EQ(s.AreaOffset(x), s.offset + x);
    }
    all += s.total;
  }
  EXPECT_EQ(rounds->area_bytes, all);
  // Below the least round: refused, naming the option.
  rounds = PlanLandingRounds(plan, program, AllDirect(plan), 256 << 20, kMinRoundQuota - 1);
  ASSERT_FALSE(rounds.ok());
  EXPECT_EQ(rounds.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(rounds.status().message().find("stage_round_bytes"), std::string::npos);
}

// A budget below the streams: each sender's share holds at least two places (two halves when
// the share is below twice stage_round_bytes, more places of stage_round_bytes otherwise),
// reused in turn.
TEST(LandingRounds, ASmallBudgetCutsEveryStreamIntoPlacesReusedInTurn) {
  const plan::Plan plan = MakeRoundsPlan(kRoundsTwoSenders);
  const SendProgram program = BuildSendProgram(plan, 3, RoundsOptions());
  const int64_t budget = 40 << 10;
  for (int64_t round_bytes : {kDefaultRoundBytes, int64_t{4096}}) {
    absl::StatusOr<LandingRounds> rounds =
        PlanLandingRounds(plan, program, AllDirect(plan), budget, round_bytes);
    ASSERT_TRUE(rounds.ok()) << rounds.status();
    EXPECT_LE(rounds->area_bytes, budget);
    int64_t end = 0;
    for (const RoundSender& s : rounds->senders) {
      EXPECT_GE(s.quota, kMinRoundQuota);
      EXPECT_LE(s.quota, round_bytes);
      EXPECT_EQ(s.quota % 256, 0);
      EXPECT_GT(s.rounds, s.slots) << "sender " << s.rank;
      // Two halves of about a quarter of the budget each, or five places of 4 KiB.
      EXPECT_EQ(s.slots, round_bytes == 4096 ? 5 : 2) << "sender " << s.rank;
      EXPECT_EQ(s.offset, end);  // Slices follow each other.
      EXPECT_EQ(s.SliceBytes(), s.slots * s.quota);
      end = s.offset + s.SliceBytes();
      for (int32_t r = 0; r < s.rounds; ++r) {
        const int64_t first = s.AreaOffset(s.RoundBegin(r));
        EXPECT_EQ(first, s.offset + (r % s.slots) * s.quota);
        EXPECT_LE(s.AreaOffset(s.RoundEnd(r) - 1), first + s.quota - 1);
        EXPECT_EQ(s.RoundOf(s.RoundEnd(r) - 1), r);
      }
      EXPECT_EQ(s.RoundEnd(s.rounds - 1), s.total);
    }
    EXPECT_EQ(end, rounds->area_bytes);
  }
}

// The scatters of a device round area (PlanRoundScatters), run with the kernel's host twin:
// each sender's stream, written round by round into its places in turn and scattered after
// each round, leaves every destination byte as the executor's copy from the senders' sources
// does, packed streams and plain pieces alike, a piece cut at round ends included.
TEST(LandingRounds, RoundScattersPutEveryByteWhereTheExecutorDoes) {
  const plan::Plan plan = MakeRoundsPlan(kRoundsTwoSenders);
  std::vector<SendProgram> programs;
  for (int32_t r = 0; r < plan.world_size(); ++r) {
    programs.push_back(BuildSendProgram(plan, r, RoundsOptions()));
  }
  const std::vector<RoundMode> modes = AllDirect(plan, RoundMode::kStrided);
  // Every rank's buffers in one allocation each, at 16-byte aligned offsets; random sources.
  std::vector<std::vector<uint8_t>> memory(plan.world_size());
  std::vector<std::vector<int64_t>> at(plan.world_size());
  uint64_t seed = 0x2545F4914F6CDD1DULL;
  for (int32_t r = 0; r < plan.world_size(); ++r) {
    int64_t size = 0;
    for (int64_t b : plan.BufferBytes(r)) {
      at[r].push_back(size);
      size += (b + 15) / 16 * 16;
    }
    memory[r].resize(static_cast<size_t>(size));
    for (uint8_t& byte : memory[r]) {
      seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
      byte = static_cast<uint8_t>(seed);
    }
  }
  // 16 KiB of round area for about 66 KiB from each sender (two places of 4 KiB, pieces cut),
  // 64 KiB (rounds of 4 KiB in eight places) and 1 MiB (everything: rounds of 8 KiB, each in
  // its own place).
  struct Sizes {
    int64_t budget, round_bytes;
  };
  for (const Sizes sizes :
       {Sizes{16 << 10, kDefaultRoundBytes}, Sizes{64 << 10, 4 << 10}, Sizes{1 << 20, 8 << 10}})
    for (int32_t p = 2; p < plan.world_size(); ++p) {
      absl::StatusOr<LandingRounds> rounds =
          PlanLandingRounds(plan, programs[p], modes, sizes.budget, sizes.round_bytes);
      ASSERT_TRUE(rounds.ok()) << rounds.status();
      absl::StatusOr<RoundScatters> scatters =
          PlanRoundScatters(plan, programs[p], *rounds, at[p], cuda::kMaxPackWidth);
      ASSERT_TRUE(scatters.ok()) << scatters.status();
      std::vector<uint8_t> ours(memory[p].size(), 0xA5), expected(memory[p].size(), 0xA5);
      std::vector<uint8_t> area(static_cast<size_t>(rounds->area_bytes), 0);
      int32_t batches = 0;
      for (size_t i = 0; i < rounds->senders.size(); ++i) {
        const RoundSender& s = rounds->senders[i];
        // The sender's stream: its round pieces' runs in order, from its source buffers.
        std::vector<uint8_t> stream;
        for (uint32_t k = s.piece_begin; k < s.piece_end; ++k) {
          const plan::Transfer& t = plan.transfers()[programs[p].received[rounds->pieces[k].slot]];
          const plan::Region& region = plan.region(t.region);
          const uint8_t* from =
              memory[s.rank].data() + at[s.rank][plan.buffer_of(t.tensor, t.from_side)];
          uint8_t* to = expected.data() + at[p][plan.buffer_of(t.tensor, t.to_side)];
          plan::ForEachRun(region, plan.region_dims(region), [&](int64_t f, int64_t d, int64_t n) {
            stream.insert(stream.end(), from + f, from + f + n);
            std::memcpy(to + d, from + f, static_cast<size_t>(n));
          });
        }
        ASSERT_EQ(static_cast<int64_t>(stream.size()), s.total);
        ASSERT_GT(s.rounds, 2);
        ASSERT_EQ(scatters->first[i], batches);
        for (int32_t r = 0; r < s.rounds; ++r) {
          std::memcpy(area.data() + s.AreaOffset(s.RoundBegin(r)), stream.data() + s.RoundBegin(r),
                      static_cast<size_t>(s.RoundEnd(r) - s.RoundBegin(r)));
          cuda::UnpackOnHost(scatters->batches[static_cast<size_t>(scatters->first[i] + r)],
                             area.data(), ours.data());
        }
        batches += s.rounds;
      }
      EXPECT_EQ(static_cast<int32_t>(scatters->batches.size()), batches);
      EXPECT_EQ(ours, expected) << "rank " << p;
    }
}

// Compacting the landing area: each receiver lays it out again without its round pieces'
// packed streams, each sender its block the same way from the receiver's modes, and the two
// agree stream by stream. Two packed tensors, one into a direct destination (its streams go in
// rounds) and one into a host destination (its streams stay, closing up), in both orders.
TEST(LandingRounds, CompactedLandingAreasAgreeBetweenSendersAndReceivers) {
  constexpr char kTwoPacked[] = R"json({"tensors": [
    {"name": "w", "dtype": "bf16", "shape": [64, 64],
     "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}},
    {"name": "x", "dtype": "bf16", "shape": [64, 96],
     "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}},
    {"name": "y", "dtype": "bf16", "shape": [32, 64],
     "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}}]})json";
  const plan::Plan plan = MakeRoundsPlan(kTwoPacked);
  for (const char* direct : {"w", "x", "y"}) {
    std::vector<RoundMode> modes(plan.buffers().size(), RoundMode::kNone);
    for (size_t b = 0; b < modes.size(); ++b) {
      if (plan.buffers()[b].side == plan::Side::kDst && plan.buffers()[b].name == direct) {
        modes[b] = RoundMode::kAll;
      }
    }
    for (int32_t p = 2; p < plan.world_size(); ++p) {
      SendProgram receiver = BuildSendProgram(plan, p, RoundsOptions());
      const int64_t before = receiver.landing_bytes;
      absl::StatusOr<LandingRounds> rounds = PlanLandingRounds(plan, receiver, modes, 1 << 20);
      ASSERT_TRUE(rounds.ok()) << rounds.status();
      CompactLandingArea(*rounds, &receiver);
      int64_t kept = 0;
      for (const LandingBlock& b : receiver.landing_blocks) {
        EXPECT_EQ(b.offset, kept);
        kept += b.bytes;
      }
      EXPECT_EQ(receiver.landing_bytes, kept);
      EXPECT_LT(receiver.landing_bytes, before) << direct << " -> rank " << p;
      EXPECT_GT(receiver.landing_bytes, 0) << direct << " -> rank " << p;
      for (int32_t s = 0; s < 2; ++s) {
        SendProgram sender = BuildSendProgram(plan, s, RoundsOptions());
        int64_t total = 0;
        const std::vector<int64_t> bases = RoundStreamBases(plan, sender, p, modes, &total);
        CompactLandingBlock(p, bases, &sender);
        const LandingBlock* block = nullptr;
        for (const LandingBlock& b : receiver.landing_blocks) {
          if (b.rank == s) block = &b;
        }
        ASSERT_NE(block, nullptr);
        int64_t packed_to = 0;
        for (const LandingBlock& b : sender.packed_to) {
          if (b.rank == p) packed_to = b.bytes;
        }
        EXPECT_EQ(packed_to, block->bytes);
        for (uint32_t i = sender.peer_begin[p]; i < sender.peer_begin[p + 1]; ++i) {
          const SendDesc& d = sender.descs[i];
          const int64_t slot = receiver.Slot(d.id);
          ASSERT_GE(slot, 0);
          if (bases[i] >= 0) {
            EXPECT_EQ(d.landing_offset, -1);
            EXPECT_EQ(receiver.landing_offset[slot], -1);
          } else {
            ASSERT_TRUE(d.packed);
            EXPECT_EQ(receiver.landing_offset[slot], block->offset + d.landing_offset)
                << "tensor " << plan.spec().tensors[plan.transfers()[d.transfer].tensor].name;
            EXPECT_LE(d.landing_offset + d.bytes, block->bytes);
          }
        }
      }
    }
  }
}

TEST(LandingRounds, ABudgetTooSmallIsRefusedNamingTheRank) {
  const plan::Plan plan = MakeRoundsPlan(kRoundsTwoSenders);
  const SendProgram program = BuildSendProgram(plan, 3, RoundsOptions());
  absl::StatusOr<LandingRounds> rounds = PlanLandingRounds(plan, program, AllDirect(plan), 8192);
  ASSERT_FALSE(rounds.ok());
  EXPECT_EQ(rounds.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(rounds.status().message().find("rank 3: stage_landing_bytes of 8192 bytes"),
            std::string::npos)
      << rounds.status();
  rounds = PlanLandingRounds(plan, program, AllDirect(plan), 100);
  ASSERT_FALSE(rounds.ok());
  EXPECT_EQ(rounds.status().code(), absl::StatusCode::kInvalidArgument);
  // No direct destination: no rounds, whatever the budget.
  rounds = PlanLandingRounds(plan, program, {}, 100);
  ASSERT_TRUE(rounds.ok());
  EXPECT_TRUE(rounds->empty());
  EXPECT_EQ(rounds->area_bytes, 0);
}

TEST(LandingRounds, DeltaStreamsNeverTravelInRounds) {
  for (const char* spec : {kRoundsTwoSenders, kRoundsInDomains}) {
    const plan::Plan plan = MakeRoundsPlan(spec);
    SendProgramOptions options = RoundsOptions();
    options.delta = true;
    for (int32_t p = 0; p < plan.world_size(); ++p) {
      const SendProgram program = BuildSendProgram(plan, p, options);
      absl::StatusOr<LandingRounds> rounds =
          PlanLandingRounds(plan, program, AllDirect(plan), 1 << 20);
      ASSERT_TRUE(rounds.ok()) << rounds.status();
      for (uint32_t slot = 0; slot < program.received.size(); ++slot) {
        if (program.delta_elem_bytes[slot] != 0) {
          EXPECT_EQ(rounds->sender_of_slot[slot], -1);
        }
      }
    }
  }
}

TEST(LandingRounds, TheWireUpFieldIsParsedStrictly) {
  rendezvous::Record theirs;
  absl::StatusOr<RoundSender> s = RoundStreamOf(theirs, 1, 4, 1 << 20);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->quota, 0);  // None published: no rounds.
  theirs["rounds.1"] = "4096:8192:40000:2";
  s = RoundStreamOf(theirs, 1, 4, 1 << 20);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->offset, 4096);
  EXPECT_EQ(s->quota, 8192);
  EXPECT_EQ(s->total, 40000);
  EXPECT_EQ(s->rounds, 5);
  EXPECT_EQ(s->slots, 2);
  // More places than rounds: every round its own (the slice is the stream).
  theirs["rounds.1"] = "4096:8192:40000:2147483647";
  s = RoundStreamOf(theirs, 1, 4, 1 << 20);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->slots, 5);
  EXPECT_EQ(s->SliceBytes(), 40000);
  for (const char* bad : {"4096:8192:40000", "x:8192:40000:2", "4096:0:40000:2", "-1:8192:40000:2",
                          "4096:8192:0:2", "4096:8192:40000:0", "4096:8192:40000:-2",
                          "4096:8192:40000:2:1", "4096:8192:40000:x", "0:1:4294967296:2"}) {
    theirs["rounds.1"] = bad;
    s = RoundStreamOf(theirs, 1, 4, 1 << 20);
    ASSERT_FALSE(s.ok()) << bad;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss) << bad;
    EXPECT_NE(s.status().message().find("rank 4"), std::string::npos) << s.status();
  }
  // Two places of 8192 at 4096 do not fit 16 KiB; one round of the whole stream does.
  theirs["rounds.1"] = "4096:8192:40000:2";
  s = RoundStreamOf(theirs, 1, 4, 16 << 10);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  theirs["rounds.1"] = "4096:12288:12288:1";
  EXPECT_TRUE(RoundStreamOf(theirs, 1, 4, 16 << 10).ok());
  // Hostile sizes in a record that also claims a huge area: the offset leaves no room for the
  // slice (the stream); refused without wrapping.
  theirs["rounds.1"] = "9223372036854775807:4611686018427387905:9223372036854775807:2";
  s = RoundStreamOf(theirs, 1, 4, UINT64_MAX);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  // A slice of 2^63 - 1 bytes at offset 1 fits 2^64 - 1 registered bytes, but not int64 offsets.
  theirs["rounds.1"] = "1:4611686018427387905:9223372036854775807:2";
  s = RoundStreamOf(theirs, 1, 4, UINT64_MAX);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kDataLoss);
  theirs["rounds.1"] = "0:4611686018427387905:9223372036854775807:1";  // One place: fits.
  EXPECT_FALSE(RoundStreamOf(theirs, 1, 4, uint64_t{1} << 62).ok());
  s = RoundStreamOf(theirs, 1, 4, UINT64_MAX);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->rounds, 2);
  EXPECT_EQ(s->SliceBytes(), 4611686018427387905);
  // Many places of many bytes: slots * quota would overflow, but a slice is never above the
  // stream.
  theirs["rounds.1"] = "0:4611686018427387904:9223372036854775807:3";
  s = RoundStreamOf(theirs, 1, 4, UINT64_MAX);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->slots, 2);
  EXPECT_EQ(s->SliceBytes(), 9223372036854775807);
}

}  // namespace
}  // namespace reshard::net
