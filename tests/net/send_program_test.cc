// The send program (src/net/send_program.h) on small plans, without UCX: every byte a rank
// receives is covered exactly once by the runs of its senders, packed streams agree on their
// landing offsets at both ends, dependencies are the plan's `after`, executing the programs in
// plan order (gather, move, unpack, as the engine does) reproduces every destination tile, and
// the program built from a rank's share of the plan is the one built from the world plan, with
// tables sized by the share.
#include "src/net/send_program.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "src/net/wire.h"
#include "src/plan/fill.h"
#include "src/plan/sim.h"
#include "src/plan/spec_json.h"

namespace reshard::net {
namespace {

using plan::Plan;
using plan::Side;
using plan::Transfer;

Plan MakePlan(const std::string& json) {
  auto spec = plan::ParseSpecJson(json);
  EXPECT_TRUE(spec.ok()) << spec.status();
  auto plan = plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*spec));
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

constexpr char kRowsToCols[] = R"json({"tensors": [{"name": "w", "dtype": "fp32", "shape": [64, 48],
  "src": {"mesh": [0, 1], "placements": ["S(0)"]}, "dst": {"mesh": [2, 3], "placements": ["S(1)"]}}]})json";
constexpr char kMixed[] = R"json({"tensors": [
  {"name": "a", "dtype": "fp32", "shape": [64, 48],
   "src": {"mesh": [0, 1], "placements": ["S(1)"]}, "dst": {"mesh": [1, 2, 3], "placements": ["S(0)"]}},
  {"name": "b", "dtype": "bf16", "shape": [32, 4096],
   "src": {"mesh": [0, 1, 2, 3], "placements": ["S(0)"]}, "dst": {"mesh": [0, 1], "placements": ["S(1)"]}}]})json";
constexpr char kDomains[] =
    R"json({"topology": {"domains": [[0, 1, 2, 3], [4, 5, 6, 7]]}, "tensors": [
  {"name": "w", "dtype": "bf16", "shape": [64, 256],
   "src": {"mesh": [0, 1, 2, 3], "placements": ["S(1)"]},
   "dst": {"mesh": [[4, 5], [6, 7]], "placements": ["R", "S(1)"]}},
  {"name": "v", "dtype": "fp32", "shape": [128, 64],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]},
   "dst": {"mesh": [4, 5, 6, 7], "placements": ["R"]}}]})json";

struct Case {
  const char* name;
  const char* spec;
  SendProgramOptions options;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (const char* spec : {kRowsToCols, kMixed, kDomains}) {
    cases.push_back({"puts, packed", spec, {true, 8192, 0}});
    cases.push_back({"puts, never packed", spec, {true, 0, 0}});
    cases.push_back({"active messages, 100-byte chunks", spec, {true, 8192, 100}});
    cases.push_back({"no fan-out", spec, {false, 8192, 0}});
  }
  return cases;
}

// Where `sender`'s packed streams start in `receiver`'s landing area.
int64_t BlockAt(const SendProgram& receiver, int32_t sender) {
  for (const LandingBlock& b : receiver.landing_blocks) {
    if (b.rank == sender) return b.offset;
  }
  ADD_FAILURE() << "rank " << receiver.rank << " has no landing block for rank " << sender;
  return 0;
}

std::vector<SendProgram> Programs(const Plan& plan, const SendProgramOptions& options) {
  std::vector<SendProgram> programs;
  for (int32_t r = 0; r < plan.world_size(); ++r) {
    programs.push_back(BuildSendProgram(plan, r, options));
  }
  return programs;
}

TEST(SendProgram, EveryReceivedByteIsCoveredOnceAndPackedOffsetsAgree) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(absl::StrCat(c.name, "\n", c.spec));
    const Plan plan = MakePlan(c.spec);
    const std::vector<SendProgram> programs = Programs(plan, c.options);
    const auto& transfers = plan.transfers();
    for (int32_t r = 0; r < plan.world_size(); ++r) {
      const std::vector<int64_t> sizes = plan.BufferBytes(r);
      std::vector<std::vector<int>> cover(sizes.size());
      for (size_t b = 0; b < sizes.size(); ++b) cover[b].assign(sizes[b], 0);
      std::vector<uint32_t> received;
      std::vector<int64_t> from(plan.world_size(), 0);
      for (int32_t s = 0; s < plan.world_size(); ++s) {
        const SendProgram& p = programs[s];
        const std::vector<int64_t> sender_sizes = plan.BufferBytes(s);
        for (uint32_t di = p.peer_begin[r]; di < p.peer_begin[r + 1]; ++di) {
          const SendDesc& d = p.descs[di];
          const Transfer& t = transfers[d.transfer];
          ASSERT_EQ(d.peer, r);
          ASSERT_EQ(t.from_rank, s);
          ASSERT_EQ(t.to_rank, r);
          received.push_back(d.transfer);
          if (s != r) from[s]++;
          const plan::Region& region = plan.region(t.region);
          int64_t run_bytes = 0;
          std::vector<int> stream(d.packed ? region.bytes : 0, 0);
          for (uint32_t i = d.run_begin; i < d.run_end; ++i) {
            const SendRun& run = p.runs[i];
            ASSERT_GT(run.bytes, 0);
            if (c.options.chunk_bytes > 0 && s != r) {
              ASSERT_LE(run.bytes, c.options.chunk_bytes);
            }
            run_bytes += run.bytes;
            if (d.packed) {
              ASSERT_GE(run.local_offset, d.send_offset);
              ASSERT_LE(run.local_offset + run.bytes, d.send_offset + d.bytes);
              ASSERT_LE(run.local_offset + run.bytes, p.send_scratch_bytes);
              ASSERT_LE(run.remote_offset + run.bytes, region.bytes);
              for (int64_t k = 0; k < run.bytes; ++k) stream[run.remote_offset + k]++;
            } else {
              ASSERT_LE(run.local_offset + run.bytes, sender_sizes[d.from_buffer]);
              ASSERT_LE(run.remote_offset + run.bytes, sizes[d.to_buffer]);
              for (int64_t k = 0; k < run.bytes; ++k) cover[d.to_buffer][run.remote_offset + k]++;
            }
          }
          EXPECT_EQ(run_bytes, region.bytes) << "transfer " << d.transfer;
          const int64_t slot = programs[r].Slot(d.id);
          ASSERT_GE(slot, 0) << "transfer " << d.transfer;
          if (d.packed) {
            EXPECT_NE(s, r);
            // Both ends compute the same landing offset: the sender's inside its block, the
            // block where the receiver placed it.
            const int64_t at = BlockAt(programs[r], s) + d.landing_offset;
            EXPECT_EQ(at, programs[r].landing_offset[slot]);
            ASSERT_LE(at + d.bytes, programs[r].landing_bytes);
            for (int v : stream) ASSERT_EQ(v, 1) << "packed stream of transfer " << d.transfer;
            plan::ForEachRun(region, plan.region_dims(region), [&](int64_t, int64_t to, int64_t n) {
              for (int64_t k = 0; k < n; ++k) cover[d.to_buffer][to + k]++;
            });
          } else {
            EXPECT_EQ(programs[r].landing_offset[slot], -1);
          }
        }
      }
      for (size_t b = 0; b < sizes.size(); ++b) {
        const Side side = plan.buffers()[b].side;
        if (side == Side::kSrc) continue;
        for (int64_t k = 0; k < sizes[b]; ++k) {
          ASSERT_LE(cover[b][k], 1) << "rank " << r << " buffer " << b << " byte " << k;
          // Every destination byte arrives, unless fan-outs are left to another layer.
          if (side == Side::kDst && c.options.execute_fanout) {
            ASSERT_EQ(cover[b][k], 1) << "rank " << r << " buffer " << b << " byte " << k;
          }
        }
      }
      std::vector<uint32_t> want = programs[r].received;
      std::sort(received.begin(), received.end());
      std::sort(want.begin(), want.end());
      EXPECT_EQ(received, want) << "rank " << r;
      EXPECT_EQ(from, programs[r].expected_from) << "rank " << r;
    }
  }
}

// What `reshard sim` reports of a delta refit's memory (plan::DeltaMemoryOf, from the plan
// alone) is what every rank's send program reserves: its shadows, its send scratch (the delta
// streams' capacity; nothing else is packed here) and, with puts, its landing area; with active
// messages no landing area at all.
TEST(SendProgram, DeltaMemoryOfIsWhatTheProgramsReserve) {
  // And the example whose relays forward delta streams (a scratch without a shadow).
  std::ifstream file(std::string(RESHARD_SOURCE_DIR) +
                     "/examples/specs/relays-three-replicas.json");
  const std::string relays((std::istreambuf_iterator<char>(file)),
                           std::istreambuf_iterator<char>());
  ASSERT_FALSE(relays.empty());
  for (const std::string& spec :
       {std::string(kRowsToCols), std::string(kMixed), std::string(kDomains), relays}) {
    const Plan plan = MakePlan(spec);
    const plan::DeltaMemory m = plan::DeltaMemoryOf(plan);
    EXPECT_GT(m.shadow_bytes, 0);
    if (spec == relays) {
      EXPECT_GT(plan.stats().bytes_relay, 0);
      EXPECT_GT(m.send_scratch_bytes, m.shadow_bytes + plan.stats().bytes_relay);
    }
    for (const bool am : {false, true}) {
      SCOPED_TRACE(am ? "active messages" : "puts");
      const std::vector<SendProgram> programs =
          Programs(plan, SendProgramOptions{true, 0, am ? wire::kAmChunkBytes : 0, true});
      plan::DeltaMemory want;
      for (const SendProgram& p : programs) {
        want.shadow_bytes += p.shadow_bytes;
        want.send_scratch_bytes += p.send_scratch_bytes;
        want.landing_bytes += p.landing_bytes;
        want.max_shadow_bytes = std::max(want.max_shadow_bytes, p.shadow_bytes);
        want.max_send_scratch_bytes = std::max(want.max_send_scratch_bytes, p.send_scratch_bytes);
        want.max_landing_bytes = std::max(want.max_landing_bytes, p.landing_bytes);
      }
      EXPECT_EQ(m.shadow_bytes, want.shadow_bytes);
      EXPECT_EQ(m.max_shadow_bytes, want.max_shadow_bytes);
      EXPECT_EQ(programs[static_cast<size_t>(m.max_shadow_rank)].shadow_bytes, m.max_shadow_bytes);
      EXPECT_EQ(m.send_scratch_bytes, want.send_scratch_bytes);
      EXPECT_EQ(m.max_send_scratch_bytes, want.max_send_scratch_bytes);
      if (am) {
        EXPECT_EQ(want.landing_bytes, 0);
      } else {
        EXPECT_EQ(m.landing_bytes, want.landing_bytes);
        EXPECT_EQ(m.max_landing_bytes, want.max_landing_bytes);
        EXPECT_EQ(programs[static_cast<size_t>(m.max_landing_rank)].landing_bytes,
                  m.max_landing_bytes);
      }
    }
  }
}

TEST(SendProgram, DependenciesAreThePlansAfter) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(absl::StrCat(c.name, "\n", c.spec));
    const Plan plan = MakePlan(c.spec);
    bool any_after = false;
    for (const SendProgram& p : Programs(plan, c.options)) {
      size_t waiting = 0;
      for (uint32_t di = 0; di < p.descs.size(); ++di) {
        const int32_t after = plan.transfers()[p.descs[di].transfer].after;
        if (after < 0) {
          const auto initial = p.dependencies.initial();
          EXPECT_NE(std::find(initial.begin(), initial.end(), di), initial.end());
        } else {
          any_after = true;
          ++waiting;
          const auto deps = p.dependencies.WaitingOn(static_cast<uint32_t>(after));
          EXPECT_NE(std::find(deps.begin(), deps.end(), di), deps.end());
          // The transfer waited for lands on this rank.
          EXPECT_EQ(plan.transfers()[after].to_rank, p.rank);
        }
      }
      EXPECT_EQ(p.dependencies.initial().size() + waiting, p.descs.size());
    }
    if (std::string(c.spec) == kDomains && c.options.execute_fanout) {
      EXPECT_TRUE(any_after);
    }
  }
}

// Runs every rank's program in plan order on host memory, the way the engine moves bytes, and
// checks every destination tile.
TEST(SendProgram, ExecutingTheProgramsReproducesEveryDestinationTile) {
  for (const Case& c : Cases()) {
    if (!c.options.execute_fanout) continue;
    SCOPED_TRACE(absl::StrCat(c.name, "\n", c.spec));
    const Plan plan = MakePlan(c.spec);
    const plan::RefitSpec& spec = plan.spec();
    const std::vector<SendProgram> programs = Programs(plan, c.options);
    const int32_t world = plan.world_size();
    std::vector<std::vector<std::vector<uint8_t>>> memory(world);
    std::vector<std::vector<uint8_t>> scratch(world), landing(world);
    for (int32_t r = 0; r < world; ++r) {
      for (int64_t bytes : plan.BufferBytes(r)) memory[r].emplace_back(bytes, 0xA5);
      scratch[r].assign(programs[r].send_scratch_bytes, 0);
      landing[r].assign(programs[r].landing_bytes, 0);
      for (size_t t = 0; t < spec.tensors.size(); ++t) {
        uint8_t* src = memory[r][plan.buffer_of(t, Side::kSrc)].data();
        plan::ForEachTile(spec, t, Side::kSrc, [&](int32_t owner, const plan::Box& box) {
          if (owner == r) plan::FillTile(spec, t, Side::kSrc, box, 7, src);
        });
      }
    }
    // Desc of each transfer on its sender.
    std::vector<const SendDesc*> desc_of(plan.transfers().size(), nullptr);
    for (const SendProgram& p : programs) {
      for (const SendDesc& d : p.descs) desc_of[d.transfer] = &d;
    }
    for (uint32_t ti = 0; ti < plan.transfers().size(); ++ti) {
      const SendDesc* d = desc_of[ti];
      ASSERT_NE(d, nullptr) << "transfer " << ti;
      const Transfer& t = plan.transfers()[ti];
      const SendProgram& p = programs[t.from_rank];
      const plan::Region& region = plan.region(t.region);
      uint8_t* from = memory[t.from_rank][d->from_buffer].data();
      uint8_t* to = memory[t.to_rank][d->to_buffer].data();
      if (!d->packed) {
        for (uint32_t i = d->run_begin; i < d->run_end; ++i) {
          const SendRun& run = p.runs[i];
          std::memcpy(to + run.remote_offset, from + run.local_offset, run.bytes);
        }
        continue;
      }
      int64_t pos = 0;  // Gather.
      plan::ForEachRun(region, plan.region_dims(region), [&](int64_t f, int64_t, int64_t n) {
        std::memcpy(scratch[t.from_rank].data() + d->send_offset + pos, from + f, n);
        pos += n;
      });
      uint8_t* stream = landing[t.to_rank].data() + BlockAt(programs[t.to_rank], t.from_rank) +
                        d->landing_offset;  // Move.
      for (uint32_t i = d->run_begin; i < d->run_end; ++i) {
        const SendRun& run = p.runs[i];
        std::memcpy(stream + run.remote_offset, scratch[t.from_rank].data() + run.local_offset,
                    run.bytes);
      }
      pos = 0;  // Unpack.
      plan::ForEachRun(region, plan.region_dims(region), [&](int64_t, int64_t o, int64_t n) {
        std::memcpy(to + o, stream + pos, n);
        pos += n;
      });
    }
    for (int32_t r = 0; r < world; ++r) {
      for (size_t t = 0; t < spec.tensors.size(); ++t) {
        const uint8_t* dst = memory[r][plan.buffer_of(t, Side::kDst)].data();
        plan::ForEachTile(spec, t, Side::kDst, [&](int32_t owner, const plan::Box& box) {
          if (owner == r) {
            EXPECT_TRUE(plan::VerifyTile(spec, t, box, 7, r, dst).ok()) << "rank " << r;
          }
        });
      }
    }
  }
}

// The refit session builds each rank's program from the rank's share (BuildRankPlan): it must be
// the world plan's program, named by world index, and no table may be sized by the world's
// transfers.
TEST(SendProgram, ProgramsFromSharesEqualTheWorldPlans) {
  size_t most_blocks = 0;  // Receivers of packed streams from several senders are covered.
  for (const Case& c : Cases()) {
    SCOPED_TRACE(absl::StrCat(c.name, "\n", c.spec));
    const Plan world = MakePlan(c.spec);
    const std::vector<SendProgram> expected = Programs(world, c.options);
    for (int32_t r = 0; r < world.world_size(); ++r) {
      SCOPED_TRACE(absl::StrCat("rank ", r));
      auto share = plan::BuildRankPlan(world.shared_spec(), r);
      ASSERT_TRUE(share.ok()) << share.status();
      ASSERT_LT(share->transfers().size(), world.transfers().size());
      const SendProgram p = BuildSendProgram(*share, r, c.options);
      const SendProgram& w = expected[r];
      ASSERT_EQ(p.descs.size(), w.descs.size());
      for (size_t i = 0; i < p.descs.size(); ++i) {
        const SendDesc& a = p.descs[i];
        const SendDesc& b = w.descs[i];
        EXPECT_EQ(a.id, b.id);
        EXPECT_EQ(b.id, b.transfer);  // The world plan's index is its world index.
        EXPECT_EQ(share->transfer_id(a.transfer), a.id);
        EXPECT_EQ(a.peer, b.peer);
        EXPECT_EQ(a.from_buffer, b.from_buffer);
        EXPECT_EQ(a.to_buffer, b.to_buffer);
        EXPECT_EQ(a.bytes, b.bytes);
        EXPECT_EQ(a.packed, b.packed);
        EXPECT_EQ(a.send_offset, b.send_offset);
        EXPECT_EQ(a.landing_offset, b.landing_offset);
        EXPECT_EQ(a.slot, b.slot);
        ASSERT_EQ(a.run_end - a.run_begin, b.run_end - b.run_begin);
        for (uint32_t k = 0; k < a.run_end - a.run_begin; ++k) {
          const SendRun& ra = p.runs[a.run_begin + k];
          const SendRun& rb = w.runs[b.run_begin + k];
          EXPECT_EQ(ra.local_offset, rb.local_offset);
          EXPECT_EQ(ra.remote_offset, rb.remote_offset);
          EXPECT_EQ(ra.bytes, rb.bytes);
        }
        // The same dependency, by world index.
        EXPECT_EQ(share->transfers()[a.transfer].after, world.transfers()[b.transfer].after);
      }
      EXPECT_EQ(p.peer_begin, w.peer_begin);
      EXPECT_EQ(p.received_ids, w.received_ids);
      EXPECT_EQ(w.received_ids, w.received);
      EXPECT_EQ(p.landing_offset, w.landing_offset);
      EXPECT_EQ(p.expected_from, w.expected_from);
      EXPECT_EQ(p.peers, w.peers);
      EXPECT_EQ(p.send_scratch_bytes, w.send_scratch_bytes);
      EXPECT_EQ(p.landing_bytes, w.landing_bytes);
      ASSERT_EQ(p.landing_blocks.size(), w.landing_blocks.size());
      most_blocks = std::max(most_blocks, p.landing_blocks.size());
      for (size_t k = 0; k < p.landing_blocks.size(); ++k) {
        EXPECT_EQ(p.landing_blocks[k].rank, w.landing_blocks[k].rank);
        EXPECT_EQ(p.landing_blocks[k].offset, w.landing_blocks[k].offset);
        EXPECT_EQ(p.landing_blocks[k].bytes, w.landing_blocks[k].bytes);
      }
      ASSERT_EQ(p.packed_to.size(), w.packed_to.size());
      for (size_t k = 0; k < p.packed_to.size(); ++k) {
        EXPECT_EQ(p.packed_to[k].rank, w.packed_to[k].rank);
        EXPECT_EQ(p.packed_to[k].bytes, w.packed_to[k].bytes);
      }
      EXPECT_EQ(
          std::vector<uint32_t>(p.dependencies.initial().begin(), p.dependencies.initial().end()),
          std::vector<uint32_t>(w.dependencies.initial().begin(), w.dependencies.initial().end()));
      // Sized by what the rank sends and receives.
      EXPECT_LE(p.received.size(), share->transfers().size());
      EXPECT_LE(p.descs.size(), share->transfers().size());
      for (uint32_t slot = 0; slot < p.received.size(); ++slot) {
        EXPECT_EQ(p.Slot(p.received_ids[slot]), slot);
        EXPECT_EQ(share->transfer_id(p.received[slot]), p.received_ids[slot]);
      }
      // A world index that does not land here has no slot.
      for (uint32_t id = 0; id < world.transfers().size(); ++id) {
        const bool lands = std::binary_search(w.received_ids.begin(), w.received_ids.end(), id);
        EXPECT_EQ(p.Slot(id) >= 0, lands) << "transfer " << id;
      }
    }
  }
  EXPECT_GE(most_blocks, 2u);
}

TEST(Wire, InBoundsDoesNotWrap) {
  EXPECT_TRUE(wire::InBounds(0, 16, 16));
  EXPECT_TRUE(wire::InBounds(16, 0, 16));
  EXPECT_FALSE(wire::InBounds(1, 16, 16));
  EXPECT_FALSE(wire::InBounds(17, 0, 16));
  // offset + length wraps to a small number: still out of bounds.
  EXPECT_FALSE(wire::InBounds(UINT64_MAX - 3, 8, 16));
  EXPECT_FALSE(wire::InBounds(8, UINT64_MAX - 3, 16));
}

}  // namespace
}  // namespace reshard::net
