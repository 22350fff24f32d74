// Fan-out interface checks that need no peer process: backend choice by capability, clear
// errors for bad input, the shared-memory allocator.
#include <gtest/gtest.h>

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
