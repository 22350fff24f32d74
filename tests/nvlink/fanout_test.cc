// Fan-out interface checks that need no peer process: backend choice by capability, clear
// errors for bad input, the shared-memory allocator.
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "tests/nvlink/fanout_harness.h"

namespace reshard::nvlink {
namespace {

using testing::MakeScratchDir;
using testing::PlanFromJson;

constexpr char kTp4ToTp2Dp2[] = R"json({
  "topology": {"domains": [[0, 1, 2, 3], [4, 5, 6, 7]]},
  "tensors": [
    {"name": "w", "dtype": "bf16", "shape": [64, 256],
     "src": {"mesh": [0, 1, 2, 3], "placements": ["S(1)"]},
     "dst": {"mesh": [[4, 5], [6, 7]], "placements": ["R", "S(1)"]}}
  ]
})json";

TEST(FanoutCapability, NamedBackendThatCannotRunSaysWhy) {
  auto plan = PlanFromJson(kTp4ToTp2Dp2);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const std::string dir = MakeScratchDir();
  auto store = rendezvous::FileStore::Open(dir + "/store");
  ASSERT_TRUE(store.ok());
  const std::vector<int32_t> domain = {4, 5, 6, 7};
  const std::vector<int32_t> ranks = testing::FanoutRanks(*plan);
  const int32_t rank = ranks.front();
  const std::vector<int64_t> sizes = plan->BufferBytes(rank);
  std::vector<std::vector<uint8_t>> memory(sizes.size());
  std::vector<BufferView> buffers(sizes.size());
  for (size_t b = 0; b < sizes.size(); ++b) {
    memory[b].resize(sizes[b]);
    if (sizes[b] > 0) buffers[b] = {memory[b].data(), sizes[b], MemoryKind::kHost};
  }
  for (const char* name : {"cuda_ipc", "nccl"}) {
    FanoutOptions o;
    o.backend = name;
    auto f =
        Fanout::Create(FanoutTable::FromPlan(*plan, domain), rank, domain, **store, buffers, o);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), absl::StatusCode::kFailedPrecondition) << f.status();
    EXPECT_NE(std::string(f.status().message()).find(name), std::string::npos) << f.status();
  }
  FanoutOptions bogus;
  bogus.backend = "carrier-pigeon";
  auto f =
      Fanout::Create(FanoutTable::FromPlan(*plan, domain), rank, domain, **store, buffers, bogus);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument) << f.status();
  // A domain that leaves out a rank of an edge is a caller error.
  auto g = Fanout::Create(FanoutTable::FromPlan(*plan, domain), rank, {rank}, **store, buffers);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << g.status();
  // Every factory answers Viable() without crashing, whatever this build has.
  FanoutTable table = FanoutTable::FromPlan(*plan, domain);
  FanoutContext ctx;
  ctx.table = &table;
  ctx.rank = rank;
  ctx.domain = domain;
  ctx.store = store->get();
  ctx.buffers = buffers;
  for (const FanoutFactory* factory : AllFactories()) {
    absl::Status v = factory->Viable(ctx);
    if (std::string(factory->name()) == "host") {
      EXPECT_TRUE(v.ok()) << v;
    } else {
      EXPECT_EQ(v.code(), absl::StatusCode::kFailedPrecondition) << factory->name() << ": " << v;
    }
  }
}

// Every rank of a domain derives the same fan-out table from its own share of the plan
// (BuildRankPlan keeps the domain's fan-out transfers): equal to the world plan's, edge for edge,
// named by world index.
TEST(FanoutTable, EveryRanksShareGivesTheWorldPlansTable) {
  std::vector<std::string> specs = {kTp4ToTp2Dp2};
  for (const char* name : {"tp4-to-tp2dp2.json", "eight-to-tp2dp4.json"}) {
    auto spec = plan::LoadSpecFile(absl::StrCat(RESHARD_SOURCE_DIR, "/tests/nvlink/specs/", name));
    ASSERT_TRUE(spec.ok()) << spec.status();
    specs.push_back(plan::SpecToJson(*spec));
  }
  // Relays, staging and fan-out from a staging receiver, in two destination domains.
  specs.push_back(R"json({"topology": {"domains": [[0, 7], [1, 2, 3], [4, 5, 6]]}, "tensors": [
    {"name": "w", "dtype": "fp32", "shape": [256, 256], "src": {"mesh": [0], "placements": ["R"]},
     "dst": {"mesh": [[1, 2], [4, 5]], "placements": ["R", "S(0)"]}},
    {"name": "v", "dtype": "fp32", "shape": [128, 128], "src": {"mesh": [0], "placements": ["R"]},
     "dst": {"mesh": [1, 4], "placements": ["R"]}},
    {"name": "t", "dtype": "fp32", "shape": [8, 8], "src": {"mesh": [0], "placements": ["R"]},
     "dst": {"mesh": [3, 6], "placements": ["R"]}},
    {"name": "c", "dtype": "fp32", "shape": [64, 96],
     "src": {"mesh": [0, 7], "placements": ["S(0)"]},
     "dst": {"mesh": [[1, 2], [4, 5]], "placements": ["R", "S(1)"]}}]})json");
  int compared = 0;
  for (const std::string& text : specs) {
    SCOPED_TRACE(text);
    auto world = PlanFromJson(text);
    ASSERT_TRUE(world.ok()) << world.status();
    ASSERT_GT(world->stats().bytes_fanout, 0);
    plan::DomainMap domains(world->spec());
    for (int32_t rank = 0; rank < world->world_size(); ++rank) {
      if (domains.domain_of(rank) < 0) continue;
      const std::vector<int32_t>& domain = domains.ranks(domains.domain_of(rank));
      auto share = plan::BuildRankPlan(world->shared_spec(), rank);
      ASSERT_TRUE(share.ok()) << share.status();
      const FanoutTable want = FanoutTable::FromPlan(*world, domain);
      const FanoutTable got = FanoutTable::FromPlan(*share, domain);
      ASSERT_EQ(got.edges.size(), want.edges.size()) << "rank " << rank;
      for (size_t i = 0; i < want.edges.size(); ++i) {
        const FanoutEdge& a = got.edges[i];
        const FanoutEdge& b = want.edges[i];
        EXPECT_EQ(a.transfer, b.transfer);
        EXPECT_EQ(a.after, b.after);
        EXPECT_EQ(a.tensor, b.tensor);
        EXPECT_EQ(a.from_buffer, b.from_buffer);
        EXPECT_EQ(a.to_buffer, b.to_buffer);
        EXPECT_EQ(a.from_rank, b.from_rank);
        EXPECT_EQ(a.to_rank, b.to_rank);
        EXPECT_EQ(a.region.from_offset, b.region.from_offset);
        EXPECT_EQ(a.region.to_offset, b.region.to_offset);
        EXPECT_EQ(a.region.bytes, b.region.bytes);
        EXPECT_EQ(a.region.run_bytes, b.region.run_bytes);
        ASSERT_EQ(a.region.ndims, b.region.ndims);
        for (int d = 0; d < a.region.ndims; ++d) {
          EXPECT_EQ(got.dims_of(a)[d].count, want.dims_of(b)[d].count);
          EXPECT_EQ(got.dims_of(a)[d].from_stride, want.dims_of(b)[d].from_stride);
          EXPECT_EQ(got.dims_of(a)[d].to_stride, want.dims_of(b)[d].to_stride);
        }
        ++compared;
      }
    }
  }
  EXPECT_GT(compared, 0);
}

TEST(SharedBufferTest, LookupFindsContainingBufferAndPeersSeeWrites) {
  auto a = SharedBuffer::Allocate("lookup test", 10000);
  ASSERT_TRUE(a.ok()) << a.status();
  auto loc = SharedBuffer::Lookup((*a)->data() + 100, 50);
  ASSERT_TRUE(loc.has_value());
  EXPECT_EQ(loc->name, (*a)->name());
  EXPECT_EQ(loc->offset, 100);
  EXPECT_FALSE(SharedBuffer::Lookup((*a)->data() + 100, 1 << 20).has_value());
  int local = 0;
  EXPECT_FALSE(SharedBuffer::Lookup(&local, sizeof(local)).has_value());
  auto m = SharedMapping::Open((*a)->name(), (*a)->bytes());
  ASSERT_TRUE(m.ok()) << m.status();
  m->data()[1234] = 77;
  EXPECT_EQ((*a)->data()[1234], 77);
  EXPECT_EQ(SharedBuffer::Allocate("x", 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SharedMapping::Open("/reshard-does-not-exist", 8).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace reshard::nvlink
