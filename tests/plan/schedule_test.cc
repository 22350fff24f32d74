// The domain-aware schedule: every piece crosses the network exactly once per destination domain
// that needs it, fan-out reaches exactly the ranks that need it, loads balance, relays and
// staging keep plans correct, and the point-to-point baseline stays available.
#include "src/plan/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "src/common/hash.h"
#include "src/plan/executor.h"
#include "src/plan/fill.h"
#include "src/plan/layouts.h"
#include "src/plan/model.h"
#include "src/plan/plan.h"
#include "src/plan/spec_json.h"
#include "tests/plan/rank_plan_check.h"
#include "tests/plan/spec_text.h"

namespace reshard::plan {
namespace {

std::shared_ptr<const RefitSpec> LoadExample(const std::string& name) {
  auto spec = LoadSpecFile(std::string(RESHARD_SOURCE_DIR) + "/examples/specs/" + name);
  EXPECT_TRUE(spec.ok()) << spec.status();
  return std::make_shared<const RefitSpec>(spec.ok() ? *std::move(spec) : RefitSpec{});
}

Plan MustPlan(std::shared_ptr<const RefitSpec> spec, const PlanOptions& options = {}) {
  auto plan = BuildPlan(std::move(spec), options);
  EXPECT_TRUE(plan.ok()) << plan.status();
  return *std::move(plan);
}

TEST(ScheduleTest, Fig3CrossesTheNetworkOncePerDomainAndFansOut) {
  auto spec = LoadExample("fig3-tp4-to-tp2dp2.json");
  const Plan ours = MustPlan(spec);
  PlanOptions p2p;
  p2p.schedule = PlanOptions::Schedule::kPointToPoint;
  const Plan naive = MustPlan(spec, p2p);
  int network = 0, fanout = 0;
  for (const Transfer& tr : ours.transfers()) {
    if (tr.kind == TransferKind::kNetwork) {
      ++network;
      EXPECT_EQ(tr.from_side, Side::kSrc);
      EXPECT_EQ(tr.to_side, Side::kDst);
    }
    if (tr.kind == TransferKind::kFanout) {
      ++fanout;
      ASSERT_GE(tr.after, 0);
      const Transfer& parent = ours.transfers()[tr.after];
      EXPECT_EQ(parent.to_rank, tr.from_rank);
      EXPECT_EQ(ours.spec().topology.DomainOf(tr.from_rank),
                ours.spec().topology.DomainOf(tr.to_rank));
    }
  }
  EXPECT_EQ(network, 4);
  EXPECT_EQ(fanout, 4);
  int naive_network = 0;
  for (const Transfer& tr : naive.transfers()) naive_network += tr.kind == TransferKind::kNetwork;
  EXPECT_EQ(naive_network, 8);
  EXPECT_EQ(ours.stats().bytes_network * 2, naive.stats().bytes_network);
  EXPECT_EQ(ours.stats().bytes_fanout, ours.stats().bytes_network);
  EXPECT_EQ(ours.stats().bytes_dst_total, naive.stats().bytes_dst_total);
  // Each of the 4 receivers takes one piece: the NICs are balanced.
  EXPECT_EQ(ours.stats().max_nic_bytes, ours.stats().bytes_network / 4);
  EXPECT_TRUE(VerifyPlanInProcess(ours, int64_t{1} << 30).ok());
  EXPECT_TRUE(VerifyPlanInProcess(naive, int64_t{1} << 30).ok());
  EXPECT_NE(ours.fingerprint(), naive.fingerprint());
}

TEST(ScheduleTest, EveryExampleVerifiesWithEveryOption) {
  for (const char* name : {"fig1-rows-to-cols.json", "fig3-tp4-to-tp2dp2.json", "fused-qkv.json",
                           "uneven-nested.json"}) {
    SCOPED_TRACE(name);
    auto spec = LoadExample(name);
    for (int variant = 0; variant < 4; ++variant) {
      PlanOptions o;
      o.relay = variant & 1;
      o.staging = variant & 2;
      o.split_min_bytes = 64;  // Split everything that can be split.
      o.split_part_bytes = 16;
      const Plan plan = MustPlan(spec, o);
      EXPECT_TRUE(VerifyPlanInProcess(plan, int64_t{1} << 30).ok()) << variant;
    }
  }
}

// A random spec over `world` ranks with random domains; i64 elements so that a buffer element
// can carry its global index.
RefitSpec RandomSpec(std::mt19937_64& rng, int world) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  RefitSpec spec;
  // Random domains: consecutive groups of random sizes over a shuffled rank order.
  std::vector<int32_t> order(world);
  for (int r = 0; r < world; ++r) order[r] = r;
  std::shuffle(order.begin(), order.end(), rng);
  for (int r = 0; r < world;) {
    const int n = std::min(world - r, pick(1, 4));
    spec.topology.domains.emplace_back(order.begin() + r, order.begin() + r + n);
    r += n;
  }
  const int tensors = pick(1, 3);
  for (int t = 0; t < tensors; ++t) {
    TensorSpec ts;
    ts.name = absl::StrCat("t", t);
    ts.dtype = DType::kI64;
    const int ndim = pick(1, 3);
    for (int d = 0; d < ndim; ++d) ts.shape.push_back(pick(1, 9));
    for (Layout* l : {&ts.src, &ts.dst}) {
      const int mdim = pick(1, 2);
      int64_t size = 1;
      for (int a = 0; a < mdim; ++a) {
        l->mesh.shape.push_back(pick(1, 3));
        size *= l->mesh.shape.back();
      }
      std::vector<int32_t> ranks(order);
      std::shuffle(ranks.begin(), ranks.end(), rng);
      if (size > world) {
        l->mesh.shape.assign(1, world);
        size = world;
      }
      l->mesh.ranks.assign(ranks.begin(), ranks.begin() + size);
      for (int a = 0; a < l->mesh.ndim(); ++a) {
        l->placements.push_back(pick(0, 2) == 0 ? Placement::Replicate()
                                                : Placement::Shard(pick(0, ndim - 1)));
      }
    }
    spec.tensors.push_back(std::move(ts));
  }
  return spec;
}

// Executes `plan` over buffers whose elements hold global indices and checks, per destination
// domain, that each needed element crosses the network into the domain exactly once, that no
// domain receives what it does not need or already holds, and that every destination element of
// every rank is written exactly once with the right value.
void CheckOncePerDomain(const Plan& plan) {
  const RefitSpec& spec = plan.spec();
  const int32_t world = plan.world_size();
  std::vector<std::vector<std::vector<int64_t>>> buf(world);
  for (int32_t r = 0; r < world; ++r) {
    const auto bytes = plan.BufferBytes(r);
    buf[r].resize(bytes.size());
    for (size_t b = 0; b < bytes.size(); ++b) buf[r][b].assign(bytes[b] / 8 + 1, -1);
  }
  for (size_t t = 0; t < spec.tensors.size(); ++t) {
    const uint32_t id = plan.buffer_of(t, Side::kSrc);
    ForEachTile(spec, t, Side::kSrc, [&](int32_t rank, const Box& box) {
      ForEachElement(spec.tensors[t].src, spec.tensors[t].shape, box,
                     [&](int64_t off, int64_t global) { buf[rank][id][off] = global; });
    });
  }
  const DomainMap domains(spec);
  // (tensor, domain, global index) -> network arrivals; (tensor, rank, offset) -> writes.
  std::map<std::tuple<uint32_t, int32_t, int64_t>, int> arrivals;
  std::map<std::tuple<uint32_t, int32_t, int64_t>, int> writes;
  for (const Transfer& tr : plan.transfers()) {
    const Region& r = plan.region(tr.region);
    const auto& from = buf[tr.from_rank][plan.buffer_of(tr.tensor, tr.from_side)];
    auto& to = buf[tr.to_rank][plan.buffer_of(tr.tensor, tr.to_side)];
    if (tr.kind == TransferKind::kFanout || tr.kind == TransferKind::kLocal) {
      EXPECT_EQ(domains.domain_of(tr.from_rank), domains.domain_of(tr.to_rank));
    } else {
      EXPECT_NE(domains.domain_of(tr.from_rank), domains.domain_of(tr.to_rank));
    }
    ForEachRun(r, plan.region_dims(r), [&](int64_t f, int64_t o, int64_t n) {
      ASSERT_EQ(f % 8, 0);
      ASSERT_EQ(o % 8, 0);
      ASSERT_LE(f / 8 + n / 8, static_cast<int64_t>(from.size()));
      ASSERT_LE(o / 8 + n / 8, static_cast<int64_t>(to.size()));
      for (int64_t k = 0; k < n / 8; ++k) {
        const int64_t v = from[f / 8 + k];
        ASSERT_GE(v, 0) << "a transfer reads data that has not arrived";
        to[o / 8 + k] = v;
        if (tr.kind == TransferKind::kNetwork) {
          ++arrivals[{tr.tensor, domains.domain_of(tr.to_rank), v}];
        }
        if (tr.to_side == Side::kDst) ++writes[{tr.tensor, tr.to_rank, o / 8 + k}];
      }
    });
  }
  for (size_t t = 0; t < spec.tensors.size(); ++t) {
    const TensorSpec& ts = spec.tensors[t];
    // Elements each domain holds on the source side and needs on the destination side.
    std::map<int32_t, std::set<int64_t>> held, needed;
    ForEachTile(spec, t, Side::kSrc, [&](int32_t rank, const Box& box) {
      ForEachElement(ts.src, ts.shape, box,
                     [&](int64_t, int64_t g) { held[domains.domain_of(rank)].insert(g); });
    });
    const uint32_t id = plan.buffer_of(t, Side::kDst);
    ForEachTile(spec, t, Side::kDst, [&](int32_t rank, const Box& box) {
      ForEachElement(ts.dst, ts.shape, box, [&](int64_t off, int64_t g) {
        needed[domains.domain_of(rank)].insert(g);
        EXPECT_EQ(buf[rank][id][off], g) << ts.name << " rank " << rank;
        EXPECT_EQ((writes[{static_cast<uint32_t>(t), rank, off}]), 1)
            << ts.name << " rank " << rank;
      });
    });
    for (int32_t d = 0; d < domains.num_domains(); ++d) {
      for (int64_t g : needed[d]) {
        const int expected = held[d].count(g) ? 0 : 1;
        EXPECT_EQ((arrivals[{static_cast<uint32_t>(t), d, g}]), expected)
            << ts.name << " domain " << d << " element " << g;
      }
    }
    for (const auto& [key, count] : arrivals) {
      const auto& [tensor, d, g] = key;
      if (tensor != t) continue;
      EXPECT_TRUE(needed[d].count(g)) << "domain " << d << " receives element " << g << " of "
                                      << ts.name << " that none of its ranks needs";
    }
  }
  // Writes only land on ranks that hold the destination tile (fan-out reaches exactly them).
  for (const auto& [key, count] : writes) {
    const auto& [tensor, rank, off] = key;
    EXPECT_GE(spec.tensors[tensor].dst.mesh.IndexOf(rank), 0);
  }
}

// Schedule variants of the random-topology tests: 0-3 domain-aware with relays (bit 0),
// staging (bit 1) and, for 3, nearly every piece split; 4 point-to-point.
PlanOptions VariantOptions(int variant) {
  PlanOptions o;
  o.relay = variant & 1;
  o.staging = variant & 2;
  o.split_min_bytes = variant == 3 ? 16 : o.split_min_bytes;
  o.split_part_bytes = 8;
  if (variant == 4) o.schedule = PlanOptions::Schedule::kPointToPoint;
  return o;
}

TEST(ScheduleTest, RandomTopologiesCrossTheNetworkOncePerDomain) {
  std::mt19937_64 rng(12345);
  int checked = 0;
  int64_t relayed = 0, staged = 0, fanned_out = 0;
  for (int iter = 0; iter < 150; ++iter) {
    const int world = std::uniform_int_distribution<int>(2, 10)(rng);
    RefitSpec spec = RandomSpec(rng, world);
    if (!Validate(spec).ok()) continue;
    auto shared = std::make_shared<const RefitSpec>(spec);
    for (int variant = 0; variant < 4; ++variant) {
      SCOPED_TRACE(absl::StrCat("iteration ", iter, " variant ", variant, "\n", SpecToJson(spec)));
      const Plan plan = MustPlan(shared, VariantOptions(variant));
      CheckOncePerDomain(plan);
      EXPECT_TRUE(VerifyPlanInProcess(plan, int64_t{1} << 28).ok());
      if (HasFailure()) return;
      relayed += plan.stats().bytes_relay;
      staged += plan.stats().bytes_staged;
      fanned_out += plan.stats().bytes_fanout;
    }
    ++checked;
  }
  EXPECT_GT(checked, 100);
  // The random cases exercise every mechanism.
  EXPECT_GT(relayed, 0);
  EXPECT_GT(staged, 0);
  EXPECT_GT(fanned_out, 0);
}

TEST(ScheduleTest, DomainsHoldingASourceReplicaCopyInsideTheDomain) {
  auto spec = ParseSpecJson(R"js({"topology": {"domains": [[0, 1, 2, 3]]}, "tensors": [
    {"name": "w", "dtype": "fp32", "shape": [4, 4],
     "src": {"mesh": [0, 1], "placements": ["S(0)"]},
     "dst": {"mesh": [0, 1, 2, 3], "placements": ["R"]}}]})js");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const Plan plan = MustPlan(std::make_shared<const RefitSpec>(*std::move(spec)));
  EXPECT_EQ(plan.stats().bytes_network, 0);
  EXPECT_EQ(plan.stats().bytes_local, 2 * 32);
  EXPECT_EQ(plan.stats().bytes_fanout, 6 * 32);
  EXPECT_TRUE(VerifyPlanInProcess(plan, int64_t{1} << 20).ok());
}

// One trainer tile is needed by 8 domains: without relays each source NIC sends 8 copies; with
// relays the sources send little more than the lower bound and the receivers pass the data on.
// (Deliberately tight: 18 NICs must emit 8 x 16 KiB against a bound of 8 KiB each.)
TEST(ScheduleTest, RelaysRelieveASingleSourceNic) {
  auto spec =
      ParseSpecJson(absl::StrCat(R"js({"topology": {"ranks_per_domain": 2}, "tensors": [
    {"name": "expert", "dtype": "i64", "shape": [32, 64],
     "src": {"mesh": [0, 1], "placements": ["S(0)"]},
     "dst": {"mesh": )js",
                                 ReplicaMesh(8, 2, 2), R"js(, "placements": ["R", "S(1)"]}}]})js"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto shared = std::make_shared<const RefitSpec>(*std::move(spec));
  PlanOptions no_relay;
  no_relay.relay = false;
  const Plan direct = MustPlan(shared, no_relay);
  const Plan relayed = MustPlan(shared);
  const LowerBound lb = ComputeLowerBound(*shared, DomainMap(*shared));
  const int64_t half = 16 * 64 * 8;  // Each trainer's tile.
  EXPECT_EQ(lb.max_nic_bytes, half);
  EXPECT_EQ(direct.stats().bytes_relay, 0);
  EXPECT_GT(relayed.stats().bytes_relay, 0);
  EXPECT_EQ(direct.stats().bytes_network, relayed.stats().bytes_network);
  EXPECT_EQ(direct.stats().max_nic_bytes, 8 * half);  // Each trainer sends its half 8 times.
  // Greedy, without look-ahead: within 2x of the bound here, 4x better than direct sends.
  EXPECT_LE(std::max(relayed.nic_out_bytes()[0], relayed.nic_out_bytes()[1]), 2 * half);
  EXPECT_LE(relayed.stats().max_nic_bytes, 2 * half);
  for (const Transfer& tr : relayed.transfers()) {
    if (tr.kind == TransferKind::kNetwork && tr.from_side != Side::kSrc) {
      ASSERT_GE(tr.after, 0);
      EXPECT_EQ(relayed.transfers()[tr.after].to_rank, tr.from_rank);
      EXPECT_EQ(relayed.transfers()[tr.after].kind, TransferKind::kNetwork);
    }
  }
  CheckOncePerDomain(relayed);
  EXPECT_TRUE(VerifyPlanInProcess(relayed, int64_t{1} << 28).ok());
}

// One source NIC, 8 replicas of TP8 in 8 domains, 64 tensors of 8 pieces each: the source can
// send each byte about once, so relays carry the rest. Each piece has one holder per domain, and
// relays are chosen among the domains served before in the part's rotation. The rotation must
// not alias with the 8 pieces per tensor: with a start that was a counter, piece j of every
// tensor was served first to domain j, and the 8 ranks holding piece j's slice there did nearly
// all the relaying (docs/simulator.md, "The per-expert gap was aliasing").
TEST(ScheduleTest, RelaysSpreadOverEveryHolderWhenPiecesPerTensorMatchTheDomains) {
  const std::string dst_mesh = ReplicaMesh(8, 8, 8);
  std::string tensors;
  for (int i = 0; i < 64; ++i) {
    absl::StrAppend(&tensors, i ? ", " : "", R"js({"name": "w)js", i,
                    R"js(", "dtype": "i64", "shape": [8, 64], "src": {"mesh": [0],
                    "placements": ["R"]}, "dst": {"mesh": )js",
                    dst_mesh, R"js(, "placements": ["R", "S(0)"]}})js");
  }
  auto spec = ParseSpecJson(
      absl::StrCat(R"js({"topology": {"ranks_per_domain": 8}, "tensors": [)js", tensors, "]}"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  const Plan plan = MustPlan(std::make_shared<const RefitSpec>(*std::move(spec)));
  ASSERT_GT(plan.stats().bytes_relay, 0);
  int64_t most = 0, relaying = 0;
  for (int32_t r = 8; r < 72; ++r) {
    most = std::max(most, plan.nic_out_bytes()[r]);
    relaying += plan.nic_out_bytes()[r] > 0;
  }
  // Hashed start: all 64 relay, the busiest 1.07x the mean. The counter: 32 relayed, the
  // busiest 2.3x the mean.
  EXPECT_EQ(relaying, 64);
  EXPECT_LE(most, plan.stats().bytes_relay / 64 * 3 / 2);
  CheckOncePerDomain(plan);
  // The source's sends are what the relays forward: each one a relay feed.
  EXPECT_EQ(CheckRelayFeeds(plan), "");
  for (const Transfer& t : plan.transfers()) {
    if (t.kind == TransferKind::kNetwork && t.from_rank == 0) {
      EXPECT_TRUE(t.feeds_relay);
    }
  }
}

// A domain with more NICs than holders of a cell: staging receivers spread the ingress.
TEST(ScheduleTest, StagingSpreadsIngressOverTheWholeDomain) {
  auto spec = ParseSpecJson(R"js({"topology": {"domains": [[0, 1], [2, 3, 4, 5]]}, "tensors": [
    {"name": "w", "dtype": "bf16", "shape": [64, 64],
     "src": {"mesh": [0, 1], "placements": ["S(0)"]},
     "dst": {"mesh": [2, 3, 4, 5], "placements": ["S(1)"]}},
    {"name": "v", "dtype": "bf16", "shape": [64, 64],
     "src": {"mesh": [0, 1], "placements": ["S(0)"]},
     "dst": {"mesh": [2], "placements": ["R"]}}]})js");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto shared = std::make_shared<const RefitSpec>(*std::move(spec));
  PlanOptions plain;
  plain.staging = false;
  plain.split_min_bytes = 1024;
  plain.split_part_bytes = 512;
  PlanOptions staged = plain;
  staged.staging = true;
  const Plan a = MustPlan(shared, plain);
  const Plan b = MustPlan(shared, staged);
  // Without staging rank 2 ingests all of v and its quarter of w: 8 KiB + 2 KiB. With staging
  // the 16 KiB spread over the 4 NICs, within one part (1 KiB) of 4 KiB each. (The two trainers
  // still emit 8 KiB each: that is the lower bound here.)
  EXPECT_EQ(a.nic_in_bytes()[2], 10 * 1024);
  for (int32_t r = 2; r < 6; ++r) EXPECT_LE(b.nic_in_bytes()[r], 5 * 1024) << r;
  const LowerBound lb = ComputeLowerBound(*shared, DomainMap(*shared));
  EXPECT_EQ(lb.domain_ingest_bytes, 4 * 1024);
  EXPECT_EQ(b.stats().max_nic_bytes, lb.max_nic_bytes);
  EXPECT_GT(b.stats().bytes_staged, 0);
  EXPECT_NE(b.stage_buffer(), Plan::kNoBuffer);
  EXPECT_TRUE(VerifyPlanInProcess(b, int64_t{1} << 24).ok());
}

// Real model layouts (fused qkv / gate_up / w13 views, experts over EP) verify element by element
// with fan-out, staging and relays, on NVL8 nodes and on a GB200 rack.
TEST(ScheduleTest, ModelLayoutsVerifyInProcess) {
  const std::string root = std::string(RESHARD_SOURCE_DIR) + "/examples/";
  auto cfg = LoadModelConfig(root + "models/tiny-moe.json");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  int64_t relayed = 0, staged = 0, fanned_out = 0;
  for (const char* cluster_name : {"h100-nvl8.json", "gb200-nvl72.json"}) {
    auto cluster = LoadClusterFile(root + "clusters/" + cluster_name);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    for (const auto& [train_text, infer_text] :
         {std::pair{"tp=2,pp=2,ep=2,gpus=8", "tp=2,dp=8"},
          std::pair{"pp=2,ep=4,gpus=8", "tp=4,dp=5"}, std::pair{"tp=2,pp=4,gpus=8", "tp=8,dp=3"}}) {
      SCOPED_TRACE(absl::StrCat(cluster_name, " ", train_text, " -> ", infer_text));
      auto train = ParseTrainParallelism(train_text);
      auto infer = ParseInferParallelism(infer_text);
      ASSERT_TRUE(train.ok() && infer.ok());
      auto made = MakeModelSpec(*cfg, *train, *infer, *cluster);
      ASSERT_TRUE(made.ok()) << made.status();
      auto spec = std::make_shared<const RefitSpec>(*std::move(made));
      PlanOptions o;
      o.split_min_bytes = 4096;  // Exercise parts on this small model.
      o.split_part_bytes = 1024;
      const Plan plan = MustPlan(spec, o);
      const absl::Status verified = VerifyPlanInProcess(plan, int64_t{1} << 30);
      EXPECT_TRUE(verified.ok()) << verified;
      const LowerBound lb = ComputeLowerBound(*spec, DomainMap(*spec));
      EXPECT_EQ(plan.stats().bytes_network, lb.network_bytes);
      relayed += plan.stats().bytes_relay;
      staged += plan.stats().bytes_staged;
      fanned_out += plan.stats().bytes_fanout;
    }
  }
  EXPECT_GT(relayed, 0);
  EXPECT_GT(staged, 0);
  EXPECT_GT(fanned_out, 0);
}

// Every rank's share of random specs with random domains, in every schedule variant, equals the
// world plan restricted to that rank: same transfers, regions, staging, stats and fingerprint.
TEST(ScheduleTest, RankPlansEqualTheWorldPlanRestricted) {
  std::mt19937_64 rng(2026);
  int compared = 0;
  int64_t relay_feeds = 0;
  for (int iter = 0; iter < 120; ++iter) {
    const int world = std::uniform_int_distribution<int>(2, 12)(rng);
    RefitSpec spec = RandomSpec(rng, world);
    if (!Validate(spec).ok()) continue;
    auto shared = std::make_shared<const RefitSpec>(spec);
    for (int variant = 0; variant < 5; ++variant) {
      SCOPED_TRACE(absl::StrCat("iteration ", iter, " variant ", variant, "\n", SpecToJson(spec)));
      const PlanOptions o = VariantOptions(variant);
      const Plan plan = MustPlan(shared, o);
      ASSERT_EQ(CheckRelayFeeds(plan), "");
      relay_feeds += std::count_if(plan.transfers().begin(), plan.transfers().end(),
                                   [](const Transfer& t) { return t.feeds_relay; });
      for (int32_t rank = 0; rank < plan.world_size(); ++rank) {
        auto share = BuildRankPlan(shared, rank, o);
        ASSERT_TRUE(share.ok()) << share.status();
        ASSERT_EQ(CompareRankPlan(plan, *share, rank), "");
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 1000);
  EXPECT_GT(relay_feeds, 0);  // Shares mark them as the world plan does.
  // A rank outside the world is refused.
  auto shared = LoadExample("fig3-tp4-to-tp2dp2.json");
  EXPECT_EQ(BuildRankPlan(shared, shared->WorldSize()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildRankPlan(shared, -1).status().code(), absl::StatusCode::kInvalidArgument);
  // A share cannot stand for the whole plan where the whole plan is executed.
  auto share = BuildRankPlan(shared, 0);
  ASSERT_TRUE(share.ok());
  EXPECT_EQ(VerifyPlanInProcess(*share, int64_t{1} << 30).code(),
            absl::StatusCode::kInvalidArgument);
}

// World plans pinned by their schedule hash (every region and transfer in plan order): the
// examples and bench specs with default options, and 150 random specs with random domains under
// every option variant, folded into one value per variant. A change that alters any of them
// alters schedules: bump kScheduleVersion (src/plan/planner.cc), so that ranks running different
// schedules cannot agree on a fingerprint, then update the values here.
TEST(ScheduleTest, ScheduleHashesArePinned) {
  const std::pair<const char*, uint64_t> files[] = {
      {"examples/specs/fig1-rows-to-cols.json", 0xc0c44dd23ba71b3aULL},
      {"examples/specs/fig3-tp4-to-tp2dp2.json", 0x7f286ad688353d6fULL},
      {"examples/specs/fused-qkv.json", 0xe0db0517886c890eULL},
      {"examples/specs/uneven-nested.json", 0xbd86328e1d3b9c84ULL},
      {"bench/specs/replicated_tp4_to_tp2x2.json", 0xb5a8a55c26bd747dULL},
      {"bench/specs/row_to_col_256mib.json", 0xdd879a131dbb0e9fULL},
  };
  for (const auto& [path, hash] : files) {
    auto spec = LoadSpecFile(std::string(RESHARD_SOURCE_DIR) + "/" + path);
    ASSERT_TRUE(spec.ok()) << spec.status();
    const Plan plan = MustPlan(std::make_shared<const RefitSpec>(*std::move(spec)));
    EXPECT_EQ(plan.schedule_hash(), hash) << path << ": 0x" << std::hex << plan.schedule_hash();
  }
  const uint64_t random[5] = {0x0726a15c16de5956ULL, 0x3e2dd781a4e1df2dULL, 0x1b65c3d3b8feb086ULL,
                              0xdbdc809ef1cb05b7ULL, 0x196a39ccbde8e7c5ULL};
  Fingerprint folded[5];
  std::mt19937_64 rng(31337);
  int planned = 0;
  for (int iter = 0; iter < 150; ++iter) {
    const int world = std::uniform_int_distribution<int>(2, 12)(rng);
    RefitSpec spec = RandomSpec(rng, world);
    if (!Validate(spec).ok()) continue;
    auto shared = std::make_shared<const RefitSpec>(spec);
    for (int variant = 0; variant < 5; ++variant) {
      folded[variant].Add(MustPlan(shared, VariantOptions(variant)).schedule_hash());
    }
    ++planned;
  }
  EXPECT_GT(planned, 100);
  for (int variant = 0; variant < 5; ++variant) {
    EXPECT_EQ(folded[variant].value(), random[variant])
        << "variant " << variant << ": 0x" << std::hex << folded[variant].value();
  }
}

TEST(ScheduleTest, PlansAreDeterministic) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20; ++i) {
    RefitSpec spec = RandomSpec(rng, 9);
    if (!Validate(spec).ok()) continue;
    auto a = MustPlan(std::make_shared<const RefitSpec>(spec));
    auto b = MustPlan(std::make_shared<const RefitSpec>(spec));
    EXPECT_EQ(a.fingerprint(), b.fingerprint());
  }
}

TEST(ScheduleTest, LowerBoundOfFig3) {
  auto spec = LoadExample("fig3-tp4-to-tp2dp2.json");
  const LowerBound lb = ComputeLowerBound(*spec, DomainMap(*spec));
  const int64_t tensor = 1024 * 4096 * 2;
  EXPECT_EQ(lb.network_bytes, tensor);            // The destination domain ingests it once.
  EXPECT_EQ(lb.domain_ingest_bytes, tensor / 4);  // Over 4 NICs.
  EXPECT_EQ(lb.source_egress_bytes, tensor / 4);  // Each trainer emits its quarter.
  EXPECT_EQ(lb.max_nic_bytes, tensor / 4);
  EXPECT_EQ(lb.nvlink_bytes, tensor / 4);  // 2 tensors land, 1 arrives over the network.
  EXPECT_DOUBLE_EQ(lb.seconds, (tensor / 4) / 50e9);
}

// Issue 10: the source-egress term compared every candidate group with every replica set over
// world-sized bitsets (a 10,000-rank gather planned in 14.6 s, 30,000 ranks in minutes). It now
// visits only the sets indexed under a group's ranks; this 20,000-rank gather with replicated
// sources (pairs of ranks hold each shard) must give the exact bound, and does in milliseconds.
TEST(ScheduleTest, LowerBoundOfAWideReplicatedGather) {
  const int32_t shards = 10000;
  std::vector<std::string> rows;
  for (int32_t i = 0; i < shards; ++i) rows.push_back(absl::StrCat("[", i, ",", shards + i, "]"));
  const std::string json =
      absl::StrCat(R"j({"tensors": [{"name": "w", "dtype": "u8", "shape": [)j", shards * 64,
                   R"j(], "src": {"mesh": [)j", absl::StrJoin(rows, ","),
                   R"j(], "placements": ["S(0)", "R"]}, "dst": {"mesh": [)j", 2 * shards,
                   R"j(], "placements": ["R"]}}]})j");
  auto parsed = ParseSpecJson(json);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const RefitSpec& spec = *parsed;
  const LowerBound lb = ComputeLowerBound(spec, DomainMap(spec));
  EXPECT_EQ(lb.network_bytes, shards * 64);
  // Each shard's two holders emit its 64 bytes at best 32 each; the whole mesh its share.
  EXPECT_EQ(lb.source_egress_bytes, 32);
  EXPECT_EQ(lb.domain_ingest_bytes, shards * 64);  // One destination NIC ingests everything.
}

}  // namespace
}  // namespace reshard::plan
