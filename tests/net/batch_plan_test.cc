// The pipelined GPU delta encode's plan, on the CPU with real send programs of the example specs
// (and one of many small pieces), as the engine uses them: segments of delta pieces
// (docs/delta.md, "The GPU encode pipeline"): PostingOrder lists every selected delta piece
// once, in the order the engine's PostSends posts them (round-robin over the links, rotated by
// rank, each link's initial descriptors in order), and PlanBatches cuts that order into
// consecutive batches whose streams fit their pinned slot, each at an aligned offset, without
// overlap, within the budget (a piece larger than a slot alone in its batch). The staging ring's
// plan (RingBatches.*): the same planner over whole descriptors, split at their runs; and the
// ring's pack batches run on the CPU (RingPlan.*): each slot holds exactly the bytes of its parts.
#include "src/cuda/batch_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "src/common/delta_codec.h"
#include "src/net/posting_order.h"
#include "src/net/ring_plan.h"
#include "src/net/send_program.h"
#include "src/net/wire.h"
#include "src/plan/region.h"
#include "src/plan/spec_json.h"
#include "tests/cuda/pack_test_util.h"

namespace reshard::net {
namespace {

// Several tensors of several dtypes from four trainer ranks to four inference ranks (one of them
// replicated, so with fan-out): each source sends many delta pieces of a few KiB, enough for
// several multi-piece batches at small budgets.
constexpr char kManyPieces[] = R"json({"tensors": [
  {"name": "a", "dtype": "bf16", "shape": [64, 256],
   "src": {"mesh": [0, 1, 2, 3], "placements": ["S(0)"]}, "dst": {"mesh": [4, 5, 6, 7], "placements": ["S(1)"]}},
  {"name": "b", "dtype": "fp32", "shape": [96, 40],
   "src": {"mesh": [0, 1, 2, 3], "placements": ["S(1)"]}, "dst": {"mesh": [4, 5, 6, 7], "placements": ["S(0)"]}},
  {"name": "c", "dtype": "i32", "shape": [33, 17],
   "src": {"mesh": [0, 1, 2, 3], "placements": ["S(0)"]}, "dst": {"mesh": [4, 5, 6], "placements": ["S(1)"]}},
  {"name": "d", "dtype": "bf16", "shape": [8192],
   "src": {"mesh": [0, 1, 2, 3], "placements": ["S(0)"]}, "dst": {"mesh": [4, 5, 6, 7], "placements": ["R"]}}]})json";

// The specs every test here plans: four example specs and kManyPieces.
constexpr const char* kExamples[] = {"fig1-rows-to-cols", "fig3-tp4-to-tp2dp2", "fused-qkv",
                                     "uneven-nested", "many-pieces"};

plan::Plan LoadExample(const std::string& name) {
  std::stringstream text;
  if (name == "many-pieces") {
    text << kManyPieces;
  } else {
    std::ifstream in(std::string(RESHARD_SOURCE_DIR) + "/examples/specs/" + name + ".json");
    text << in.rdbuf();
  }
  auto spec = plan::ParseSpecJson(text.str());
  EXPECT_TRUE(spec.ok()) << spec.status();
  auto plan = plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*spec));
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

// Checks `order` against the engine's posting rule for program `p`: every selected descriptor
// once; descriptor x before y when x's place in its link's initial list is smaller, or the
// places are equal and x's link comes first in program.peers rotated by the rank.
void ExpectPostingOrder(const SendProgram& p, const std::vector<bool>& selected,
                        const std::vector<uint32_t>& order) {
  const size_t n = p.peers.size();
  std::vector<int64_t> link(p.peer_begin.size(), -1);  // By rank: its place in the rotation.
  for (size_t i = 0; i < n; ++i) {
    link[p.peers[i]] = static_cast<int64_t>((i + n - static_cast<size_t>(p.rank) % n) % n);
  }
  std::vector<int64_t> place(p.descs.size(), -1), seen(p.peer_begin.size(), 0);
  size_t expected = 0;
  for (uint32_t di : p.dependencies.initial()) {
    if (p.descs[di].peer == p.rank) continue;
    place[di] = seen[p.descs[di].peer]++;
    expected += selected[di] ? 1 : 0;
  }
  ASSERT_EQ(order.size(), expected);
  std::vector<int> count(p.descs.size(), 0);
  for (size_t k = 0; k < order.size(); ++k) {
    const uint32_t di = order[k];
    ASSERT_LT(di, p.descs.size());
    EXPECT_TRUE(selected[di]) << "descriptor " << di;
    EXPECT_EQ(++count[di], 1) << "descriptor " << di;
    ASSERT_GE(place[di], 0) << "descriptor " << di << " is not an initial network descriptor";
    if (k == 0) continue;
    const uint32_t prev = order[k - 1];
    const auto key = [&](uint32_t d) { return std::make_pair(place[d], link[p.descs[d].peer]); };
    EXPECT_LT(key(prev), key(di)) << "descriptors " << prev << " and " << di;
  }
}

// Checks the batches of `pieces` planned with `budget` and `slots`.
void ExpectBatches(const std::vector<cuda::BatchPiece>& pieces, int64_t budget, int32_t slots) {
  SCOPED_TRACE(testing::Message() << "budget " << budget << ", " << slots << " slots");
  const cuda::BatchPlan plan = cuda::PlanBatches(pieces, budget, slots);
  ASSERT_EQ(plan.entries.size(), pieces.size());
  EXPECT_EQ(plan.slots, pieces.empty() ? std::max<int32_t>(slots, 1)
                                       : std::min(std::max<int32_t>(slots, 1), plan.batches()));
  EXPECT_EQ(plan.pinned_bytes(), static_cast<int64_t>(plan.slots) * plan.slot_bytes);
  if (pieces.empty()) {
    EXPECT_EQ(plan.batches(), 0);
    EXPECT_EQ(plan.slot_bytes, 0);
    return;
  }
  const auto aligned = [](int64_t b) {
    return (b + cuda::kBatchAlign - 1) / cuda::kBatchAlign * cuda::kBatchAlign;
  };
  int64_t largest = 0;
  for (const cuda::BatchPiece& p : pieces) largest = std::max(largest, aligned(p.bytes));
  const int64_t share = budget / plan.slots / cuda::kBatchAlign * cuda::kBatchAlign;
  // Within the budget, unless one piece alone is larger than a slot's share; no larger than
  // the largest batch (checked below).
  EXPECT_LE(plan.slot_bytes, std::max(share, largest));
  EXPECT_EQ(plan.slot_bytes % cuda::kBatchAlign, 0);
  int64_t largest_batch = 0;
  ASSERT_GE(plan.batches(), 1);
  EXPECT_EQ(plan.batch_begin.front(), 0u);
  EXPECT_EQ(plan.batch_begin.back(), pieces.size());
  for (int32_t b = 0; b < plan.batches(); ++b) {
    const uint32_t first = plan.batch_begin[b], last = plan.batch_begin[b + 1];
    ASSERT_LT(first, last) << "batch " << b << " is empty";
    int64_t end = 0;
    for (uint32_t e = first; e < last; ++e) {
      const cuda::BatchPlan::Entry& entry = plan.entries[e];
      // The given order, every piece once, its capacity.
      EXPECT_EQ(entry.id, pieces[e].id);
      EXPECT_EQ(entry.bytes, pieces[e].bytes);
      // Aligned, after the previous stream, inside the slot with its word-rounded copy.
      EXPECT_EQ(entry.offset % cuda::kBatchAlign, 0);
      EXPECT_GE(entry.offset, end);
      end = entry.offset + aligned(entry.bytes);
      EXPECT_LE(end, plan.slot_bytes);
      EXPECT_LE(entry.offset + (entry.bytes + 7) / 8 * 8, plan.slot_bytes);
    }
    // Batches are as large as the slot allows: the next piece did not fit.
    if (last < pieces.size()) {
      EXPECT_GT(end + aligned(pieces[last].bytes), plan.slot_bytes) << "batch " << b;
    }
    largest_batch = std::max(largest_batch, end);
  }
  EXPECT_EQ(plan.slot_bytes, largest_batch);
}

TEST(DeltaBatches, EngineOrderAndBatchesOfExampleSpecs) {
  int64_t pieces_seen = 0, multi_batch = 0;
  for (const char* name : kExamples) {
    SCOPED_TRACE(name);
    const plan::Plan plan = LoadExample(name);
    for (const bool fanout : {true, false}) {
      for (int32_t r = 0; r < plan.world_size(); ++r) {
        SCOPED_TRACE(testing::Message() << "rank " << r << (fanout ? "" : ", no fan-out"));
        const SendProgram p = BuildSendProgram(plan, r, {fanout, 8192, 0, /*delta=*/true});
        // Every delta piece on the GPU, and every other one (a mix of device and host sources).
        std::vector<bool> all(p.descs.size(), false), half(p.descs.size(), false);
        int k = 0;
        for (uint32_t i = 0; i < p.descs.size(); ++i) {
          all[i] = p.descs[i].delta_elem_bytes > 0;
          half[i] = all[i] && (k++ % 2 == 0);
        }
        for (const std::vector<bool>* selected : {&all, &half}) {
          const std::vector<uint32_t> order = PostingOrder(p, *selected);
          ExpectPostingOrder(p, *selected, order);
          std::vector<cuda::BatchPiece> pieces;
          for (uint32_t di : order) {
            // As the engine lists them: each piece's segments, one after another, named by
            // their segment number.
            const SendDesc& d = p.descs[di];
            const int es = d.delta_elem_bytes;
            const int64_t elems = d.bytes / es;
            ASSERT_EQ(d.segments, delta::NumSegments(elems, es)) << "descriptor " << di;
            int64_t reserved = 0;
            for (uint32_t run = d.run_begin; run < d.run_end; ++run) reserved += p.runs[run].bytes;
            EXPECT_EQ(reserved, delta::PieceCapacity(elems, es)) << "descriptor " << di;
            for (uint32_t k = 0; k < d.segments; ++k) {
              const int64_t capacity =
                  delta::StreamCapacity(delta::SegmentLength(elems, es, k), es);
              // The stream the engine copies into the send scratch fits the segment's place
              // there.
              EXPECT_LE(k * delta::SegmentStride(es) + capacity, reserved)
                  << "descriptor " << di << " segment " << k;
              pieces.push_back({d.segment_begin + k, capacity});
            }
          }
          pieces_seen += static_cast<int64_t>(pieces.size());
          for (const int64_t budget : {int64_t{0}, int64_t{4096}, int64_t{16} << 10,
                                       int64_t{64} << 10, cuda::kDeltaBatchBudget}) {
            for (const int32_t slots : {0, 1, 2, 3}) ExpectBatches(pieces, budget, slots);
          }
          // Several batches of several pieces each.
          const cuda::BatchPlan small = cuda::PlanBatches(pieces, int64_t{16} << 10, 2);
          multi_batch += small.batches() > 2 && small.batch_begin[1] > 1;
        }
      }
    }
  }
  EXPECT_GT(pieces_seen, 50);
  EXPECT_GE(multi_batch, 8);  // The small budgets cut real programs into several batches.
}

TEST(DeltaBatches, NoPiecesNoBatches) { ExpectBatches({}, cuda::kDeltaBatchBudget, 2); }

// A rank that sends little pins little: 1000 bytes under a 256 MiB budget are one slot of 1 KiB,
// and three batches of a 2 KiB slot size keep two slots of the largest batch.
TEST(RingBatches, ASmallSenderPinsOnlyWhatItSends) {
  const cuda::BatchPlan one = cuda::PlanBatches({{1, 1000}}, cuda::kStageRingBudget, 2);
  EXPECT_EQ(one.slots, 1);
  EXPECT_EQ(one.slot_bytes, 1024);
  EXPECT_EQ(one.pinned_bytes(), 1024);
  const cuda::BatchPlan three = cuda::PlanBatches({{1, 2000}, {2, 2000}, {3, 700}}, 4096, 2);
  EXPECT_EQ(three.batches(), 3);
  EXPECT_EQ(three.slots, 2);
  EXPECT_EQ(three.slot_bytes, 2048);
}

TEST(DeltaBatches, OversizedPiecesTravelAloneAndSmallOnesShareASlot) {
  // Slots of 1024 bytes: 300-byte streams (512 aligned) two to a batch; a 5000-byte stream
  // raises the slot to 5120 bytes, so the small ones then pack ten to a batch.
  const std::vector<cuda::BatchPiece> small = {{7, 300}, {3, 300}, {9, 300}};
  cuda::BatchPlan plan = cuda::PlanBatches(small, 2048, 2);
  EXPECT_EQ(plan.slot_bytes, 1024);
  EXPECT_EQ(plan.batch_begin, (std::vector<uint32_t>{0, 2, 3}));
  EXPECT_EQ(plan.entries[1].offset, 512);
  EXPECT_EQ(plan.entries[2].offset, 0);
  ExpectBatches(small, 2048, 2);
  std::vector<cuda::BatchPiece> mixed = {{0, 5000}};
  for (uint32_t i = 1; i <= 12; ++i) mixed.push_back({i, 300});
  plan = cuda::PlanBatches(mixed, 2048, 2);
  EXPECT_EQ(plan.slot_bytes, 5120);
  EXPECT_EQ(plan.batch_begin, (std::vector<uint32_t>{0, 1, 11, 13}));
  ExpectBatches(mixed, 2048, 2);
}

}  // namespace
}  // namespace reshard::net

namespace reshard::net {
namespace {

// The staging ring's plan, as the engine builds it (RefitEngine::Impl::InitRing): every
// non-delta descriptor with runs, in PostingOrder with local copies last, runs cut at the slot
// size (SendProgramOptions::max_run_bytes), each piece splittable at its runs. Checks that every
// piece is covered once, part after part, each part whole runs, inside its slot, in the order
// given, and that only pieces larger than a slot are split.
void ExpectRingPlan(const SendProgram& p, const std::vector<uint32_t>& order, int64_t budget,
                    int64_t* split_pieces, int64_t* batches) {
  const int64_t slot = cuda::SlotBytes(budget, cuda::kStageRingSlots);
  std::vector<cuda::BatchPiece> pieces;
  for (uint32_t di : order) {
    const SendDesc& d = p.descs[di];
    cuda::BatchPiece piece{di, 0};
    for (uint32_t r = d.run_begin; r < d.run_end; ++r) {
      ASSERT_LE(p.runs[r].bytes, slot) << "run " << r << " of descriptor " << di;
      if (r > d.run_begin) piece.cuts.push_back(piece.bytes);
      piece.bytes += p.runs[r].bytes;
    }
    EXPECT_EQ(piece.bytes, d.bytes) << "descriptor " << di;
    pieces.push_back(std::move(piece));
  }
  const cuda::BatchPlan plan = cuda::PlanBatches(pieces, budget, cuda::kStageRingSlots);
  // Within the budget: runs fit a slot, so no part raises it.
  EXPECT_LE(plan.slot_bytes, pieces.empty() ? 0 : slot);
  EXPECT_LE(plan.pinned_bytes(),
            std::max<int64_t>(budget, cuda::kStageRingSlots * cuda::kBatchAlign));
  size_t piece = 0;
  int64_t next = 0;  // The next byte of pieces[piece] to cover.
  int parts = 0;
  std::vector<int32_t> batch_of(plan.entries.size(), -1);
  for (int32_t b = 0; b < plan.batches(); ++b) {
    ASSERT_LT(plan.batch_begin[b], plan.batch_begin[b + 1]) << "batch " << b << " is empty";
    int64_t end = 0;
    for (uint32_t e = plan.batch_begin[b]; e < plan.batch_begin[b + 1]; ++e) {
      const cuda::BatchPlan::Entry& entry = plan.entries[e];
      ASSERT_LT(piece, pieces.size());
      const cuda::BatchPiece& pc = pieces[piece];
      // The given order; each part starts where the last one ended, at a cut (a run).
      ASSERT_EQ(entry.id, pc.id) << "entry " << e;
      ASSERT_EQ(entry.begin, next) << "entry " << e;
      EXPECT_TRUE(entry.begin == 0 ||
                  std::binary_search(pc.cuts.begin(), pc.cuts.end(), entry.begin));
      const int64_t stop = entry.begin + entry.bytes;
      EXPECT_TRUE(stop == pc.bytes || std::binary_search(pc.cuts.begin(), pc.cuts.end(), stop));
      EXPECT_GT(entry.bytes, 0);
      // Aligned, after the previous part, inside the slot.
      EXPECT_EQ(entry.offset % cuda::kBatchAlign, 0);
      EXPECT_GE(entry.offset, end);
      end = entry.offset +
            (entry.bytes + cuda::kBatchAlign - 1) / cuda::kBatchAlign * cuda::kBatchAlign;
      EXPECT_LE(end, plan.slot_bytes);
      ++parts;
      next = stop;
      if (next == pc.bytes) {
        // A piece that fits in a slot is never split.
        if (pc.bytes <= plan.slot_bytes) {
          EXPECT_EQ(parts, 1) << "descriptor " << pc.id;
        }
        *split_pieces += parts > 1;
        parts = 0;
        next = 0;
        ++piece;
      }
    }
  }
  EXPECT_EQ(piece, pieces.size());
  *batches += plan.batches();
}

TEST(RingBatches, EveryPieceOnceInPostingOrderWithinTheBudget) {
  int64_t pieces_seen = 0, split = 0, batches = 0;
  for (const char* name : kExamples) {
    SCOPED_TRACE(name);
    const plan::Plan plan = LoadExample(name);
    for (const int64_t budget :
         {int64_t{2} << 10, int64_t{8} << 10, int64_t{64} << 10, cuda::kStageRingBudget}) {
      for (const bool am : {false, true}) {
        for (int32_t r = 0; r < plan.world_size(); ++r) {
          SCOPED_TRACE(testing::Message() << "rank " << r << ", budget " << budget
                                          << (am ? ", active messages" : ", puts"));
          SendProgramOptions options{true, 8192, am ? wire::kAmChunkBytes : 0, false,
                                     cuda::SlotBytes(budget, cuda::kStageRingSlots)};
          const SendProgram p = BuildSendProgram(plan, r, options);
          std::vector<bool> selected(p.descs.size(), false);
          for (uint32_t i = 0; i < p.descs.size(); ++i) {
            selected[i] = plan.transfers()[p.descs[i].transfer].from_side == plan::Side::kSrc &&
                          p.descs[i].run_end > p.descs[i].run_begin;
          }
          const std::vector<uint32_t> order = PostingOrder(p, selected, /*local_copies=*/true);
          // The network part is the engine's posting order; local copies follow, in order.
          std::vector<bool> network(p.descs.size(), false);
          std::vector<uint32_t> local;
          for (uint32_t i = 0; i < p.descs.size(); ++i) {
            network[i] = selected[i] && p.descs[i].peer != r;
          }
          for (uint32_t di : p.dependencies.initial()) {
            if (selected[di] && p.descs[di].peer == r) local.push_back(di);
          }
          const std::vector<uint32_t> net_order = PostingOrder(p, network);
          ExpectPostingOrder(p, network, net_order);
          std::vector<uint32_t> expected = net_order;
          expected.insert(expected.end(), local.begin(), local.end());
          EXPECT_EQ(order, expected);
          pieces_seen += static_cast<int64_t>(order.size());
          ExpectRingPlan(p, order, budget, &split, &batches);
        }
      }
    }
  }
  EXPECT_GT(pieces_seen, 100);
  EXPECT_GT(split, 20);     // Small budgets split real pieces at their runs.
  EXPECT_GT(batches, 200);  // And cut the programs into many batches.
}

TEST(RingBatches, LargePiecesSplitAtCutsAndFillTheSlotBefore) {
  // Slots of 1024 bytes. A 300-byte piece, then a 2500-byte piece with cuts every 500 bytes:
  // its first part fills what the first slot has left (512 of 1024 bytes: one 500-byte part),
  // the rest goes two runs (1000 bytes) per slot; the next piece starts a batch of its own.
  std::vector<cuda::BatchPiece> pieces = {{1, 300}, {2, 2500, {500, 1000, 1500, 2000}}, {3, 100}};
  const cuda::BatchPlan plan = cuda::PlanBatches(pieces, 2048, 2);
  EXPECT_EQ(plan.slot_bytes, 1024);
  ASSERT_EQ(plan.entries.size(), 5u);
  EXPECT_EQ(plan.batch_begin, (std::vector<uint32_t>{0, 2, 3, 4, 5}));
  const uint32_t ids[] = {1, 2, 2, 2, 3};
  const int64_t begins[] = {0, 0, 500, 1500, 0};
  const int64_t bytes[] = {300, 500, 1000, 1000, 100};
  const int64_t offsets[] = {0, 512, 0, 0, 0};
  for (size_t e = 0; e < plan.entries.size(); ++e) {
    EXPECT_EQ(plan.entries[e].id, ids[e]) << "entry " << e;
    EXPECT_EQ(plan.entries[e].begin, begins[e]) << "entry " << e;
    EXPECT_EQ(plan.entries[e].bytes, bytes[e]) << "entry " << e;
    EXPECT_EQ(plan.entries[e].offset, offsets[e]) << "entry " << e;
  }
  // Without cuts a large piece travels whole and raises the slot (the delta encode's case).
  pieces[1].cuts.clear();
  const cuda::BatchPlan whole = cuda::PlanBatches(pieces, 2048, 2);
  EXPECT_EQ(whole.slot_bytes, 2560);
  EXPECT_EQ(whole.entries.size(), 3u);
}

}  // namespace
}  // namespace reshard::net

namespace reshard::net {
namespace {

// The staging ring's plan as the engine builds it (PlanRing), run on the CPU: every rank's
// source buffers of five example specs lie in one arena at unaligned shifts (one launch reads
// them all), and each batch's pack batch is executed by the pack kernels' host twin into a
// poisoned slot. Each part must then hold exactly the bytes its runs would have been put from
// (packed streams: the piece's region runs in order), every other slot byte stays poisoned, and
// the parts of each descriptor cover its runs once, in order. The ring sources' packed streams
// take no send scratch.
TEST(RingPlan, PackBatchesFillEachSlotWithThePartsBytes) {
  int64_t parts_checked = 0, split = 0;
  for (const char* name : kExamples) {
    SCOPED_TRACE(name);
    const plan::Plan plan = LoadExample(name);
    for (const int64_t budget : {int64_t{2} << 10, int64_t{8} << 10, int64_t{256} << 10}) {
      for (const bool am : {false, true}) {
        for (int32_t r = 0; r < plan.world_size(); ++r) {
          SCOPED_TRACE(testing::Message() << "rank " << r << ", budget " << budget
                                          << (am ? ", active messages" : ", puts"));
          // As the engine builds it: runs cut at the slot size, and no send scratch for the
          // ring sources' packed streams (every source buffer here).
          std::vector<bool> sources(plan.buffers().size(), false);
          for (size_t b = 0; b < sources.size(); ++b) {
            sources[b] = plan.buffers()[b].side == plan::Side::kSrc;
          }
          const SendProgramOptions options{true,
                                           8192,
                                           am ? wire::kAmChunkBytes : 0,
                                           false,
                                           cuda::SlotBytes(budget, cuda::kStageRingSlots),
                                           sources};
          const SendProgram p = BuildSendProgram(plan, r, options);
          SendProgramOptions scratch_options = options;
          scratch_options.ring_sources.clear();
          const SendProgram with_scratch = BuildSendProgram(plan, r, scratch_options);
          int64_t ring_streams = 0;
          for (const SendDesc& d : p.descs) {
            if (d.packed && sources[d.from_buffer]) {
              EXPECT_EQ(d.send_offset, 0);
              ring_streams += d.bytes;
            }
          }
          EXPECT_EQ(p.send_scratch_bytes, with_scratch.send_scratch_bytes - ring_streams);
          // Source buffers in one arena, each 3 bytes past a 16-byte boundary after the last.
          const std::vector<int64_t> bytes = plan.BufferBytes(r);
          std::vector<int64_t> shift(bytes.size(), 0);
          int64_t arena_bytes = 0;
          for (size_t b = 0; b < bytes.size(); ++b) {
            shift[b] = (arena_bytes + 15) / 16 * 16 + 3;
            arena_bytes = shift[b] + bytes[b];
          }
          std::vector<uint8_t> arena(static_cast<size_t>(arena_bytes));
          uint64_t x = 0x2545F4914F6CDD1Dull;
          for (uint8_t& v : arena) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            v = static_cast<uint8_t>(x);
          }
          std::vector<bool> selected(p.descs.size(), false);
          for (uint32_t i = 0; i < p.descs.size(); ++i) {
            selected[i] = plan.transfers()[p.descs[i].transfer].from_side == plan::Side::kSrc &&
                          p.descs[i].run_end > p.descs[i].run_begin;
          }
          absl::StatusOr<RingPlan> ring = PlanRing(plan, p, selected, shift, 1, budget);
          ASSERT_TRUE(ring.ok()) << ring.status();
          ASSERT_EQ(ring->pack.size(), ring->batch_bytes.size());
          // Each selected descriptor's parts: consecutive, covering its runs once, in order.
          for (uint32_t i = 0; i < p.descs.size(); ++i) {
            ASSERT_EQ(ring->on_ring(i), selected[i]) << "descriptor " << i;
            if (!selected[i]) continue;
            uint32_t run = p.descs[i].run_begin;
            int64_t at = 0;
            int64_t k = ring->first_part[i];
            for (; k < static_cast<int64_t>(ring->parts.size()) && ring->parts[k].desc == i; ++k) {
              EXPECT_EQ(ring->parts[k].run_begin, run);
              EXPECT_EQ(ring->parts[k].begin, at);
              EXPECT_LT(ring->parts[k].run_begin, ring->parts[k].run_end);
              run = ring->parts[k].run_end;
              at += ring->parts[k].bytes;
            }
            EXPECT_EQ(run, p.descs[i].run_end) << "descriptor " << i;
            EXPECT_EQ(at, p.descs[i].bytes) << "descriptor " << i;
            split += k - ring->first_part[i] > 1;
          }
          for (int32_t b = 0; b < ring->batches(); ++b) {
            std::vector<uint8_t> slot(static_cast<size_t>(ring->slot_bytes), 0xEE);
            std::vector<uint8_t> expected = slot;
            ASSERT_LE(ring->pack[b].packed_end, ring->slot_bytes);
            ASSERT_TRUE(cuda::testing::HostMove(ring->pack[b], true, arena.data(), slot.data()));
            int64_t bytes_in_batch = 0;
            for (uint32_t k = ring->batch_begin[b]; k < ring->batch_begin[b + 1]; ++k) {
              const RingPart& part = ring->parts[k];
              ASSERT_EQ(part.batch, b);
              const SendDesc& d = p.descs[part.desc];
              uint8_t* to = expected.data() + part.offset;
              if (d.packed) {
                // The stream the engine gathered before: the region's runs in order.
                const plan::Region& region = plan.region(plan.transfers()[d.transfer].region);
                plan::ForEachRunIn(region, plan.region_dims(region), part.begin,
                                   part.begin + part.bytes, [&](int64_t from, int64_t, int64_t n) {
                                     std::memcpy(to, arena.data() + shift[d.from_buffer] + from,
                                                 static_cast<size_t>(n));
                                     to += n;
                                   });
              } else {
                // What the runs are put from in the source buffer.
                for (uint32_t run = part.run_begin; run < part.run_end; ++run) {
                  const SendRun& sr = p.runs[run];
                  std::memcpy(to, arena.data() + shift[d.from_buffer] + sr.local_offset,
                              static_cast<size_t>(sr.bytes));
                  to += sr.bytes;
                }
              }
              ASSERT_EQ(to - (expected.data() + part.offset), part.bytes);
              bytes_in_batch += part.bytes;
              ++parts_checked;
            }
            EXPECT_EQ(ring->batch_bytes[b], bytes_in_batch);
            ASSERT_EQ(slot, expected) << "batch " << b;
          }
        }
      }
    }
  }
  EXPECT_GT(parts_checked, 300);
  EXPECT_GT(split, 10);  // Small budgets split descriptors into several parts.
}

}  // namespace
}  // namespace reshard::net
