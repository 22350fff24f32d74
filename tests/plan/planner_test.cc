// The planner: deterministic plans with a fingerprint, replica spreading, local copies for ranks
// in both meshes, consistent per-rank indexes and statistics.
#include <map>
#include <memory>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "src/plan/executor.h"
#include "src/plan/plan.h"
#include "src/plan/spec_json.h"

namespace reshard::plan {
namespace {

std::shared_ptr<const RefitSpec> Spec(const std::string& json) {
  auto spec = ParseSpecJson(json);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return std::make_shared<const RefitSpec>(spec.ok() ? *std::move(spec) : RefitSpec{});
}

Plan MustPlan(std::shared_ptr<const RefitSpec> spec, const PlanOptions& options = {}) {
  auto plan = BuildPlan(std::move(spec), options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

constexpr char kRowsToColumns[] = R"js({"tensors": [
  {"name": "w", "dtype": "bf16", "shape": [8, 8],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]},
   "dst": {"mesh": [[2, 3], [4, 5]], "placements": ["R", "S(1)"]}},
  {"name": "b", "dtype": "fp32", "shape": [10],
   "src": {"mesh": [[0], [1]], "placements": ["S(0)", "R"]},
   "dst": {"mesh": [2, 3, 4, 5], "placements": ["S(0)"]}}]})js";

TEST(PlannerTest, FingerprintIsIdenticalAcrossBuildsAndSpecCopies) {
  const Plan a = MustPlan(Spec(kRowsToColumns));
  const Plan b = MustPlan(Spec(kRowsToColumns));
  EXPECT_EQ(a.fingerprint(), b.fingerprint());
  ASSERT_EQ(a.transfers().size(), b.transfers().size());
  for (size_t i = 0; i < a.transfers().size(); ++i) {
    EXPECT_EQ(a.transfers()[i].from_rank, b.transfers()[i].from_rank);
    EXPECT_EQ(a.transfers()[i].to_rank, b.transfers()[i].to_rank);
    EXPECT_EQ(a.transfers()[i].region, b.transfers()[i].region);
  }
  // A spec written out and read back plans identically.
  const Plan c = MustPlan(Spec(SpecToJson(a.spec())));
  EXPECT_EQ(a.fingerprint(), c.fingerprint());
}

TEST(PlannerTest, FingerprintChangesWhenTheSpecChanges) {
  const uint64_t base = MustPlan(Spec(kRowsToColumns)).fingerprint();
  auto changed = [&](const std::string& from, const std::string& to) {
    std::string json = kRowsToColumns;
    const size_t at = json.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    json.replace(at, from.size(), to);
    return MustPlan(Spec(json)).fingerprint();
  };
  std::set<uint64_t> seen = {base};
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"bf16\"", "\"fp16\""},                                // Same size, other dtype.
           {"\"bf16\"", "\"fp32\""},                                // Other size.
           {"[8, 8]", "[8, 6]"},                                    // Shape.
           {"[\"R\", \"S(1)\"]", "[\"S(1)\", \"R\"]"},              // Placements.
           {"[[2, 3], [4, 5]]", "[[3, 2], [4, 5]]"},                // Rank order.
           {"\"name\": \"w\"", "\"name\": \"w2\""},                 // Name.
           {"\"placements\": [\"S(0)\"]}", "\"placements\": [\"S(0)\"], \"view\": {\"offset\": 4}}"},
       }) {
    const uint64_t fp = changed(from, to);
    EXPECT_TRUE(seen.insert(fp).second) << from << " -> " << to;
  }
  // Domains, and every option, change it too (they change the schedule).
  EXPECT_TRUE(seen.insert(changed("\"tensors\"", "\"topology\": {\"ranks_per_domain\": 2}, \"tensors\""))
                  .second);
  auto spec = Spec(kRowsToColumns);
  for (int option = 0; option < 6; ++option) {
    PlanOptions o;
    if (option == 0) o.schedule = PlanOptions::Schedule::kPointToPoint;
    if (option == 1) o.relay = false;
    if (option == 2) o.staging = false;
    if (option == 3) o.split_min_bytes = 64;
    if (option == 4) o.split_part_bytes = 16;
    if (option == 5) o.spread_replicas = false;
    EXPECT_TRUE(seen.insert(MustPlan(spec, o).fingerprint()).second) << "option " << option;
  }
  // The world plan and every rank's share carry the same fingerprint; only the world plan has a
  // schedule hash.
  const Plan world = MustPlan(spec);
  for (int32_t rank = 0; rank < world.world_size(); ++rank) {
    auto share = BuildRankPlan(spec, rank);
    ASSERT_TRUE(share.ok()) << share.status();
    EXPECT_EQ(share->fingerprint(), world.fingerprint());
    EXPECT_EQ(share->schedule_hash(), 0u);
  }
  EXPECT_NE(world.schedule_hash(), 0u);
}

TEST(PlannerTest, ReplicaSpreadingBalancesBytesAcrossSourceReplicas) {
  // Every trainer holds the whole tensors (4 replicas); 8 destination tiles per tensor.
  std::string json = R"js({"tensors": [)js";
  for (int t = 0; t < 6; ++t) {
    json += (t ? "," : "") + std::string(R"js({"name": "t)js") + std::to_string(t) +
            R"js(", "dtype": "fp32", "shape": [16, 4],
             "src": {"mesh": [0, 1, 2, 3], "placements": ["R"]},
             "dst": {"mesh": [4, 5, 6, 7, 8, 9, 10, 11], "placements": ["S(0)"]}})js";
  }
  json += "]}";
  const Plan plan = MustPlan(Spec(json));
  std::map<int32_t, int64_t> sent;
  for (const Transfer& tr : plan.transfers()) sent[tr.from_rank] += plan.region(tr.region).bytes;
  ASSERT_EQ(sent.size(), 4u);
  for (const auto& [rank, bytes] : sent) {
    EXPECT_EQ(bytes, 6 * 16 * 4 * 4 / 4) << "rank " << rank;
  }
  EXPECT_TRUE(VerifyPlanInProcess(plan, 1 << 20).ok());
}

TEST(PlannerTest, RanksInBothMeshesCopyLocally) {
  // Ranks 1 and 2 are trainers and inference ranks; the replicated source is local to both.
  const Plan plan = MustPlan(Spec(R"js({"tensors": [
    {"name": "w", "dtype": "i32", "shape": [6, 5],
     "src": {"mesh": [0, 1, 2], "placements": ["R"]},
     "dst": {"mesh": [1, 2, 3], "placements": ["S(0)"]}}]})js"));
  int local = 0, network = 0;
  for (const Transfer& tr : plan.transfers()) {
    if (tr.to_rank == 1 || tr.to_rank == 2) {
      EXPECT_EQ(tr.kind, TransferKind::kLocal);
      EXPECT_EQ(tr.from_rank, tr.to_rank);
      ++local;
    } else {
      EXPECT_EQ(tr.kind, TransferKind::kNetwork);
      EXPECT_NE(tr.from_rank, tr.to_rank);
      ++network;
    }
  }
  EXPECT_EQ(local, 2);
  EXPECT_EQ(network, 1);
  EXPECT_EQ(plan.stats().bytes_local, 2 * 2 * 5 * 4);
  EXPECT_EQ(plan.stats().bytes_network, 2 * 5 * 4);
  EXPECT_TRUE(VerifyPlanInProcess(plan, 1 << 20).ok());

  // Identical meshes and placements: everything is a local copy.
  const Plan same = MustPlan(Spec(R"js({"tensors": [
    {"name": "w", "dtype": "bf16", "shape": [4, 4],
     "src": {"mesh": [[0, 1]], "placements": ["R", "S(1)"]},
     "dst": {"mesh": [0, 1], "placements": ["S(1)"]}}]})js"));
  for (const Transfer& tr : same.transfers()) EXPECT_EQ(tr.kind, TransferKind::kLocal);
  EXPECT_EQ(same.stats().bytes_network, 0);
}

TEST(PlannerTest, PerRankIndexesListExactlyEachRanksTransfersInPlanOrder) {
  const Plan plan = MustPlan(Spec(kRowsToColumns));
  size_t sends = 0, receives = 0;
  for (int32_t rank = 0; rank < plan.world_size(); ++rank) {
    std::vector<uint32_t> expect_send, expect_recv;
    for (uint32_t i = 0; i < plan.transfers().size(); ++i) {
      if (plan.transfers()[i].from_rank == rank) expect_send.push_back(i);
      if (plan.transfers()[i].to_rank == rank) expect_recv.push_back(i);
    }
    auto [sb, se] = plan.sends(rank);
    auto [rb, re] = plan.receives(rank);
    EXPECT_EQ(std::vector<uint32_t>(sb, se), expect_send) << "rank " << rank;
    EXPECT_EQ(std::vector<uint32_t>(rb, re), expect_recv) << "rank " << rank;
    sends += se - sb;
    receives += re - rb;
  }
  EXPECT_EQ(sends, plan.transfers().size());
  EXPECT_EQ(receives, plan.transfers().size());
  EXPECT_EQ(plan.world_size(), 6);
}

TEST(PlannerTest, StatisticsAddUp) {
  // Point-to-point: every destination rank gets its own pieces from a source holder, so the
  // counts below follow from the layouts alone.
  PlanOptions p2p;
  p2p.schedule = PlanOptions::Schedule::kPointToPoint;
  const Plan plan = MustPlan(Spec(kRowsToColumns), p2p);
  const PlanStats& s = plan.stats();
  EXPECT_EQ(s.tensors, 2);
  // w: 4 destination ranks x 2 trainers. b: 10 over 4 = 3, 3, 3, 1 against 10 over 2 = 5, 5;
  // rank 3's [3, 6) straddles both trainers, so 5 pieces.
  EXPECT_EQ(s.pieces, 13);
  EXPECT_EQ(s.pieces, static_cast<int64_t>(plan.transfers().size()));
  EXPECT_EQ(s.bytes_dst_total, 2 * (8 * 8 * 2) + 10 * 4);
  EXPECT_EQ(s.bytes_network + s.bytes_local + s.bytes_fanout, s.bytes_dst_total);
  const TensorStats& w = plan.tensor_stats()[0];
  EXPECT_EQ(w.pieces, 8);
  EXPECT_EQ(w.max_sources, 2);
  EXPECT_EQ(w.dst_ranks, 4);
  EXPECT_EQ(w.contiguous, 0);  // 4x2 blocks out of row tiles: 4 runs each.
  EXPECT_EQ(w.runs, 8 * 4);
  const TensorStats& b = plan.tensor_stats()[1];
  EXPECT_EQ(b.pieces, 5);
  EXPECT_EQ(b.contiguous, 5);
  EXPECT_EQ(b.max_sources, 2);
  std::set<int32_t> senders_to_3;
  for (const Transfer& tr : plan.transfers()) {
    if (tr.tensor == 1 && tr.to_rank == 3) senders_to_3.insert(tr.from_rank);
  }
  EXPECT_EQ(senders_to_3, (std::set<int32_t>{0, 1}));

  // Any schedule: every byte that lands in a destination or staging buffer is counted once.
  const Plan domain = MustPlan(Spec(kRowsToColumns));
  const PlanStats& d = domain.stats();
  EXPECT_EQ(d.bytes_dst_total, s.bytes_dst_total);
  EXPECT_EQ(d.bytes_network + d.bytes_local + d.bytes_fanout, d.bytes_dst_total + d.bytes_staged);
  EXPECT_EQ(d.pieces, static_cast<int64_t>(domain.transfers().size()));
  int64_t dst_pieces = 0;
  for (const TensorStats& ts : domain.tensor_stats()) dst_pieces += ts.pieces;
  int64_t into_dst = 0;
  for (const Transfer& tr : domain.transfers()) into_dst += tr.to_side == Side::kDst;
  EXPECT_EQ(dst_pieces, into_dst);
}

TEST(PlannerTest, BufferBytesCoverFusedViews) {
  const Plan plan = MustPlan(Spec(R"js({"tensors": [
    {"name": "q", "dtype": "bf16", "shape": [8, 4],
     "src": {"mesh": [0], "placements": ["R"]},
     "dst": {"mesh": [1, 2], "placements": ["S(0)"], "buffer": "qkv", "view": {"offset": 0}}},
    {"name": "k", "dtype": "bf16", "shape": [2, 4],
     "src": {"mesh": [0], "placements": ["R"]},
     "dst": {"mesh": [1, 2], "placements": ["S(0)"], "buffer": "qkv", "view": {"offset": 18}}}]})js"));
  ASSERT_EQ(plan.buffers().size(), 3u);  // q and k on the source, qkv on the destination.
  EXPECT_EQ(plan.buffer_of(0, Side::kDst), plan.buffer_of(1, Side::kDst));
  EXPECT_NE(plan.buffer_of(0, Side::kSrc), plan.buffer_of(1, Side::kSrc));
  const std::vector<int64_t> bytes = plan.BufferBytes(1);
  EXPECT_EQ(bytes[plan.buffer_of(0, Side::kDst)], (18 + 1 * 4) * 2);
  EXPECT_EQ(bytes[plan.buffer_of(0, Side::kSrc)], 0);
  const std::vector<int64_t> src_bytes = plan.BufferBytes(0);
  EXPECT_EQ(src_bytes[plan.buffer_of(0, Side::kSrc)], 8 * 4 * 2);
  EXPECT_EQ(src_bytes[plan.buffer_of(1, Side::kSrc)], 2 * 4 * 2);
  EXPECT_TRUE(VerifyPlanInProcess(plan, 1 << 20).ok());
  // Elements 16 and 17 of qkv lie between q and k: a write there is caught.
  auto world = LocalWorld::Create(plan, 1 << 20);
  ASSERT_TRUE(world.ok()) << world.status();
  world->Prepare(1);
  world->Execute();
  ASSERT_TRUE(world->Verify(1).ok());
  world->buffer(1, plan.buffer_of(0, Side::kDst))[16 * 2 + 1] ^= 0xff;
  const absl::Status outside = world->Verify(1);
  EXPECT_EQ(outside.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(outside.message()).find("outside every destination view"),
            std::string::npos) << outside;
}

TEST(PlannerTest, ExecutorRefusesWorldsOverTheMemoryLimit) {
  const Plan plan = MustPlan(Spec(kRowsToColumns));
  const absl::Status s = VerifyPlanInProcess(plan, 16);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

TEST(PlannerTest, ExecutorReportsTheFirstWrongElement) {
  const Plan plan = MustPlan(Spec(kRowsToColumns));
  auto world = LocalWorld::Create(plan, 1 << 20);
  ASSERT_TRUE(world.ok()) << world.status();
  world->Prepare(7);
  world->Execute();
  ASSERT_TRUE(world->Verify(7).ok());
  // Verifying against another epoch's fill must fail and name tensor, rank and index.
  const absl::Status stale = world->Verify(8);
  EXPECT_EQ(stale.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(std::string(stale.message()).find("tensor \"w\": rank 2"), std::string::npos) << stale;
  // One corrupted byte of a destination element is caught and located.
  world->Prepare(7);
  world->Execute();
  world->buffer(4, plan.buffer_of(1, Side::kDst))[4 * 2 + 3] ^= 0x01;
  const absl::Status bad = world->Verify(7);
  EXPECT_EQ(std::string(bad.message()),
            "tensor \"b\": rank 4 holds a wrong value at global index [8] (1 of 3 elements wrong)");
}

}  // namespace
}  // namespace reshard::plan
