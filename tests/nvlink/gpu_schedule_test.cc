// The GPU fan-out backends' decisions (src/nvlink/gpu_schedule.h), replayed on host memory with
// the kernels' own index arithmetic (pack_index.h): the NCCL rounds (pack every piece of a round
// into a rank's staging, hand each stream to its receiver as ncclSend/ncclRecv would, unpack)
// and the CUDA IPC copies (cudaMemcpy/2D/3D emulated row by row, the copy kernel through its
// host twin). Random tables check that every destination byte is written exactly once, with the
// bytes the in-process executor's copy puts there, and that no staging exceeds its budget; the
// example plan with fan-out is verified element by element by the in-process executor.
#include "src/nvlink/gpu_schedule.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "src/cuda/pack_batch.h"
#include "src/cuda/pack_index.h"
#include "src/nvlink/fanout.h"
#include "src/plan/executor.h"
#include "src/plan/plan.h"
#include "src/plan/spec_json.h"
#include "tests/cuda/pack_test_util.h"

namespace reshard::nvlink::internal {
namespace {

using cuda::testing::ExecutorCopy;
using cuda::testing::MakeRandomRegion;
using cuda::testing::RandomRegion;
using cuda::testing::Rng;

uint8_t* At(int64_t address) { return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(address)); }
int64_t AddressOf(const void* p) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(p)); }

// Counts the writes into one address range (the arena of the random tables); others are ignored.
struct WriteCounter {
  int64_t begin = 0;
  std::vector<uint8_t>* counts = nullptr;
  void Add(int64_t address, int64_t n) const {
    if (counts == nullptr) return;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t at = address + i - begin;
      if (at >= 0 && at < static_cast<int64_t>(counts->size())) ++(*counts)[at];
    }
  }
};

// The pack kernel's host twin over integer addresses: unit by unit, as a thread moves it.
void HostPack(const cuda::PackBatch& b, bool pack, int64_t strided_base, uint8_t* staging,
              const WriteCounter& counter) {
  const int32_t n = static_cast<int32_t>(b.entries.size());
  for (uint64_t u = 0; u < b.total_units; ++u) {
    const cuda::PackEntry& e = b.entries[cuda::FindPackEntry(b.entries.data(), 0, n - 1, u)];
    // Plain checks per unit (gtest assertions would dominate the test's time).
    if (u < e.units_begin || u - e.units_begin >= e.units) FAIL() << "unit " << u << " misplaced";
    const cuda::UnitAddress a = cuda::LocatePackUnit(e, u - e.units_begin);
    const int64_t strided = strided_base + a.strided_offset;
    if (strided % a.width != 0) FAIL() << "unit " << u << " unaligned";
    if (pack) {
      std::memcpy(staging + a.packed_offset, At(strided), a.width);
    } else {
      std::memcpy(At(strided), staging + a.packed_offset, a.width);
      counter.Add(strided, a.width);
    }
  }
}

// Every rank's program, run round by round on host staging. `addresses[rank][buffer]`.
void RunNcclOnHost(const FanoutTable& table, const NcclSchedule& schedule,
                   const std::map<int32_t, std::vector<int64_t>>& addresses,
                   const WriteCounter& counter) {
  std::map<int32_t, NcclRankProgram> programs;
  std::map<int32_t, std::vector<uint8_t>> staging;
  // (rank, round) -> this rank's round.
  std::map<std::pair<int32_t, uint32_t>, const NcclRankRound*> rounds;
  for (const auto& [rank, addr] : addresses) {
    absl::StatusOr<NcclRankProgram> p = BuildNcclRankProgram(table, schedule, rank, addr);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_LE(p->staging_bytes, schedule.staging_bytes) << "rank " << rank;
    programs[rank] = *std::move(p);
    staging[rank].assign(programs[rank].staging_bytes, 0xEE);
  }
  for (const auto& [rank, p] : programs) {
    ASSERT_EQ(p.batches.size(), schedule.num_batches);
    for (const NcclRankBatch& b : p.batches) {
      for (const NcclRankRound& rr : b.rounds) rounds[{rank, rr.round}] = &rr;
    }
  }
  for (uint32_t r = 0; r < schedule.rounds.size(); ++r) {
    for (auto& [rank, p] : programs) {
      auto it = rounds.find({rank, r});
      if (it == rounds.end() || it->second->sends.empty()) continue;
      HostPack(it->second->pack, true, p.from_base, staging[rank].data(), counter);
    }
    // The group: every send meets exactly one receive of the same length on its peer.
    for (auto& [rank, p] : programs) {
      auto it = rounds.find({rank, r});
      if (it == rounds.end()) continue;
      std::set<int32_t> peers;
      for (const NcclStream& s : it->second->sends) {
        ASSERT_TRUE(peers.insert(s.peer).second) << "two sends to one peer in one round";
        auto peer_round = rounds.find({s.peer, r});
        ASSERT_NE(peer_round, rounds.end())
            << "rank " << rank << " sends, rank " << s.peer << " has no round " << r;
        int matched = 0;
        for (const NcclStream& q : peer_round->second->recvs) {
          if (q.peer != rank) continue;
          ++matched;
          ASSERT_EQ(q.bytes, s.bytes);
          std::memcpy(staging[s.peer].data() + q.staging_offset,
                      staging[rank].data() + s.staging_offset, s.bytes);
        }
        ASSERT_EQ(matched, 1);
      }
    }
    for (auto& [rank, p] : programs) {
      auto it = rounds.find({rank, r});
      if (it == rounds.end() || it->second->recvs.empty()) continue;
      HostPack(it->second->unpack, false, p.to_base, staging[rank].data(), counter);
    }
  }
}

// One edge as the CUDA IPC backend copies it, on host memory.
void HostGpuCopy(const GpuCopy& c, int64_t from, int64_t to, const WriteCounter& counter) {
  const cuda::CopyRegion& r = c.region;
  switch (c.method) {
    case GpuCopyMethod::kNothing:
      ASSERT_EQ(r.bytes(), 0);
      return;
    case GpuCopyMethod::kMemcpy:
    case GpuCopyMethod::kMemcpy2D:
    case GpuCopyMethod::kMemcpy3D:
      ASSERT_GE(c.width, c.method == GpuCopyMethod::kMemcpy ? 1 : kMinCopyEngineRun);
      for (int64_t z = 0; z < c.depth; ++z) {
        for (int64_t y = 0; y < c.height; ++y) {
          const int64_t f = from + r.from_offset + (z * c.from_rows + y) * c.from_pitch;
          const int64_t t = to + r.to_offset + (z * c.to_rows + y) * c.to_pitch;
          std::memcpy(At(t), At(f), c.width);
          counter.Add(t, c.width);
        }
      }
      return;
    case GpuCopyMethod::kKernel: {
      cuda::CopyBatchOptions o;
      o.from_base_align = AddressAlignment(from);
      o.to_base_align = AddressAlignment(to);
      absl::StatusOr<cuda::CopyBatch> b = cuda::BuildCopyBatch({&r, 1}, o);
      ASSERT_TRUE(b.ok()) << b.status();
      const int32_t n = static_cast<int32_t>(b->entries.size());
      for (uint64_t u = 0; u < b->total_units; ++u) {
        const cuda::CopyEntry& e = b->entries[cuda::FindCopyEntry(b->entries.data(), 0, n - 1, u)];
        const cuda::CopyUnitAddress a = cuda::LocateCopyUnit(e, u - e.units_begin);
        if ((from + a.from_offset) % a.width != 0 || (to + a.to_offset) % a.width != 0) {
          FAIL() << "copy unit " << u << " unaligned";
        }
        std::memcpy(At(to + a.to_offset), At(from + a.from_offset), a.width);
        counter.Add(to + a.to_offset, a.width);
      }
      return;
    }
  }
}

// A random domain: 2..5 ranks, each with source buffers 0 and 1 and destination buffers 2 and 3
// in one arena (at unaligned bases now and then); edges with random regions between random
// ranks, each written into its own slice of the destination buffer (as plans write every
// destination byte once); sources may overlap.
struct RandomDomain {
  FanoutTable table;
  std::vector<int32_t> ranks;
  std::vector<uint8_t> arena;
  std::map<int32_t, std::vector<int64_t>> addresses;  // [rank][buffer]
};

constexpr uint32_t kBuffers = 4;

RandomDomain MakeRandomDomain(Rng& rng, int max_edges, bool wide) {
  RandomDomain d;
  const int nranks = static_cast<int>(rng.Uniform(2, 5));
  for (int r = 0; r < nranks; ++r) d.ranks.push_back(static_cast<int32_t>(3 * r + 1));
  std::map<std::pair<int32_t, uint32_t>, int64_t> size;
  const int nedges = static_cast<int>(rng.Uniform(1, max_edges));
  for (int i = 0; i < nedges; ++i) {
    RandomRegion rr = MakeRandomRegion(rng);
    if (wide && rng.Coin(15)) {
      // Slices of whole rows of 512 B and more (what cudaMemcpy3DAsync takes), sometimes with
      // a slice stride that is no whole number of rows.
      rr = RandomRegion();
      const int64_t run = 512 + 16 * rng.Uniform(0, 40);
      const int64_t rows = rng.Uniform(1, 6), slices = rng.Uniform(2, 4);
      const int64_t from_pitch = run + 16 * rng.Uniform(0, 4);
      const int64_t to_pitch = run + 16 * rng.Uniform(0, 4);
      const int64_t from_slice = from_pitch * (rows + rng.Uniform(0, 2)) + (rng.Coin(20) ? 16 : 0);
      const int64_t to_slice = to_pitch * (rows + rng.Uniform(0, 2));
      rr.dims = {{slices, from_slice, to_slice}, {rows, from_pitch, to_pitch}};
      rr.region.run_bytes = run;
      rr.region.bytes = run * rows * slices;
      rr.region.ndims = 2;
      rr.from_size = from_slice * (slices - 1) + from_pitch * (rows - 1) + run;
      rr.to_size = to_slice * (slices - 1) + to_pitch * (rows - 1) + run;
    } else if (wide && rr.region.run_bytes >= 64 && rng.Coin(60)) {
      // Runs of 512 B and more, for the copy engines' paths.
      constexpr int64_t k = 8;
      rr.region.run_bytes *= k;
      rr.region.bytes *= k;
      rr.region.from_offset *= k;
      rr.region.to_offset *= k;
      for (auto& dim : rr.dims) dim.from_stride *= k, dim.to_stride *= k;
      rr.from_size *= k;
      rr.to_size *= k;
    }
    const int64_t fi = rng.Uniform(0, nranks - 1);
    int64_t ti = rng.Uniform(0, nranks - 2);
    if (ti >= fi) ++ti;
    const int32_t from = d.ranks[fi], to = d.ranks[ti];
    const uint32_t fb = static_cast<uint32_t>(rng.Uniform(0, 1));
    const uint32_t tb = static_cast<uint32_t>(rng.Uniform(2, 3));
    int64_t& fs = size[{from, fb}];
    int64_t& ts = size[{to, tb}];
    // Sources: anywhere in the buffer (may overlap other sources); destinations: a fresh slice.
    const int64_t from_at = rng.Coin(50) ? 0 : rng.Uniform(0, 64);
    const int64_t to_at = rng.Coin(70) ? (ts + 15) / 16 * 16 : ts + rng.Uniform(0, 9);
    rr.region.from_offset += from_at;
    rr.region.to_offset += to_at;
    fs = std::max(fs, from_at + rr.from_size);
    ts = to_at + rr.to_size;
    d.table.Add(static_cast<uint32_t>(100 + i), -1, 0, fb, tb, from, to, rr.region, rr.dims.data());
  }
  d.table.tensor_names = {"t"};
  int64_t total = 0;
  std::map<std::pair<int32_t, uint32_t>, int64_t> at;
  for (int32_t r : d.ranks) {
    for (uint32_t b = 0; b < kBuffers; ++b) {
      total = rng.Coin(75) ? (total + 15) / 16 * 16 : total + rng.Uniform(1, 15);
      at[{r, b}] = total;
      total += size[{r, b}] + 1;
    }
  }
  d.arena.resize(total + 16);
  for (auto& x : d.arena) x = static_cast<uint8_t>(rng.Next());
  // Addresses relative to a 16-byte aligned point of the arena, so that the bases' alignments
  // are the ones chosen above.
  const int64_t base = (AddressOf(d.arena.data()) + 15) / 16 * 16;
  for (int32_t r : d.ranks) {
    d.addresses[r].assign(kBuffers, 0);
    for (uint32_t b = 0; b < kBuffers; ++b) d.addresses[r][b] = base + at[{r, b}];
  }
  return d;
}

// What the in-process executor leaves in the arena, and how often each byte must be written.
void Expected(const RandomDomain& d, std::vector<uint8_t>* bytes, std::vector<uint8_t>* writes) {
  *bytes = d.arena;
  writes->assign(d.arena.size(), 0);
  const int64_t arena = AddressOf(d.arena.data());
  for (const FanoutEdge& e : d.table.edges) {
    const int64_t from = d.addresses.at(e.from_rank)[e.from_buffer] - arena;
    const int64_t to = d.addresses.at(e.to_rank)[e.to_buffer] - arena;
    // Sources and destinations are different buffers, so the source bytes are the originals.
    ExecutorCopy(e.region, d.table.dims_of(e), d.arena.data() + from, bytes->data() + to);
    plan::ForEachRun(e.region, d.table.dims_of(e), [&](int64_t, int64_t t, int64_t n) {
      for (int64_t i = 0; i < n; ++i) ++(*writes)[to + t + i];
    });
  }
}

TEST(GpuScheduleTest, NcclRoundsOnRandomTablesWriteEveryByteOnceWithinTheBudget) {
  Rng rng(0x5eedf00d);
  int64_t multi_round_batches = 0, split_regions = 0, cases = 0;
  for (int c = 0; c < 120; ++c) {
    RandomDomain d = MakeRandomDomain(rng, 40, c % 3 == 0);
    const int32_t batch = static_cast<int32_t>(rng.Uniform(1, 20));
    const int64_t budgets[] = {256, 1024, 4096, int64_t{1} << 20};
    const int64_t budget = budgets[rng.Uniform(0, 3)];
    SCOPED_TRACE(::testing::Message() << "case " << c << ": " << d.table.edges.size()
                                      << " edges, batch " << batch << ", budget " << budget);
    absl::StatusOr<NcclSchedule> s = BuildNcclSchedule(d.table, batch, budget);
    ASSERT_TRUE(s.ok()) << s.status();
    std::vector<uint8_t> expected, writes;
    Expected(d, &expected, &writes);
    std::vector<uint8_t> counts(d.arena.size(), 0);
    RunNcclOnHost(d.table, *s, d.addresses, {AddressOf(d.arena.data()), &counts});
    if (HasFatalFailure()) return;
    ASSERT_EQ(counts, writes) << "a destination byte was written other than exactly once";
    ASSERT_EQ(d.arena, expected);
    // Rounds stay inside their batch and in batch order; each piece's stream fits the budget.
    std::map<uint32_t, int> rounds_per_batch;
    std::map<uint32_t, int> pieces_per_edge;
    uint32_t last_batch = 0;
    for (const NcclRound& r : s->rounds) {
      ASSERT_GE(r.batch, last_batch);
      last_batch = r.batch;
      ++rounds_per_batch[r.batch];
      for (const NcclPiece& p : r.pieces) {
        ASSERT_EQ(p.edge / batch, r.batch);
        ++pieces_per_edge[p.edge];
      }
    }
    for (const auto& [b, n] : rounds_per_batch) multi_round_batches += n > 1;
    for (const auto& [e, n] : pieces_per_edge) split_regions += n > 1;
    ++cases;
  }
  // The random cases reach the budget's two mechanisms.
  EXPECT_GT(multi_round_batches, 0);
  EXPECT_GT(split_regions, 0);
  std::printf("%lld cases, %lld batches in several rounds, %lld regions cut into pieces\n",
              static_cast<long long>(cases), static_cast<long long>(multi_round_batches),
              static_cast<long long>(split_regions));
}

// A budget that holds every batch: one round per batch, one send per peer per batch, one pack
// and one unpack launch per rank and batch.
TEST(GpuScheduleTest, NcclBatchWithinTheBudgetIsOneSendPerPeer) {
  Rng rng(77);
  for (int c = 0; c < 50; ++c) {
    RandomDomain d = MakeRandomDomain(rng, 30, false);
    const int32_t batch = static_cast<int32_t>(rng.Uniform(1, 12));
    absl::StatusOr<NcclSchedule> s = BuildNcclSchedule(d.table, batch, int64_t{64} << 20);
    ASSERT_TRUE(s.ok()) << s.status();
    std::set<uint32_t> batches_with_bytes;
    for (const NcclRound& r : s->rounds) {
      ASSERT_TRUE(batches_with_bytes.insert(r.batch).second) << "batch " << r.batch << " split";
      std::set<std::pair<int32_t, int32_t>> pairs;
      for (const NcclPiece& p : r.pieces) {
        const FanoutEdge& e = d.table.edges[p.edge];
        pairs.insert({e.from_rank, e.to_rank});
      }
      ASSERT_EQ(r.streams.size(), pairs.size());
    }
    for (int32_t rank : d.ranks) {
      absl::StatusOr<NcclRankProgram> p =
          BuildNcclRankProgram(d.table, *s, rank, d.addresses[rank]);
      ASSERT_TRUE(p.ok()) << p.status();
      for (const NcclRankBatch& b : p->batches) ASSERT_LE(b.rounds.size(), 1u);
    }
  }
}

TEST(GpuScheduleTest, NcclBadOptionsAndMissingBuffersAreInvalidArgument) {
  Rng rng(5);
  RandomDomain d = MakeRandomDomain(rng, 5, false);
  EXPECT_EQ(BuildNcclSchedule(d.table, 4, 100).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildNcclSchedule(d.table, 4, 1000).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BuildNcclSchedule(d.table, 0, 4096).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<NcclSchedule> s = BuildNcclSchedule(d.table, 4, 4096);
  ASSERT_TRUE(s.ok()) << s.status();
  const FanoutEdge& e = d.table.edges[0];
  std::vector<int64_t> addresses = d.addresses[e.from_rank];
  addresses[e.from_buffer] = 0;
  absl::StatusOr<NcclRankProgram> p = BuildNcclRankProgram(d.table, *s, e.from_rank, addresses);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find(absl::StrFormat("rank %d", e.from_rank)), std::string::npos)
      << p.status();
}

TEST(GpuScheduleTest, CudaIpcCopiesOfRandomTablesWriteEveryByteOnce) {
  Rng rng(0xc0ffee);
  std::map<GpuCopyMethod, int64_t> methods;
  for (int c = 0; c < 100; ++c) {
    RandomDomain d = MakeRandomDomain(rng, 20, true);
    const bool kernel_only = rng.Coin(20);
    std::vector<uint8_t> expected, writes;
    Expected(d, &expected, &writes);
    std::vector<uint8_t> counts(d.arena.size(), 0);
    const WriteCounter counter{AddressOf(d.arena.data()), &counts};
    for (const FanoutEdge& e : d.table.edges) {
      const GpuCopy g = ChooseGpuCopy(CopyRegionOf(d.table, e), kernel_only);
      if (kernel_only) {
        ASSERT_TRUE(g.method == GpuCopyMethod::kKernel || g.method == GpuCopyMethod::kNothing);
      }
      ++methods[g.method];
      HostGpuCopy(g, d.addresses[e.from_rank][e.from_buffer], d.addresses[e.to_rank][e.to_buffer],
                  counter);
      if (HasFatalFailure()) return;
    }
    ASSERT_EQ(counts, writes) << "case " << c;
    ASSERT_EQ(d.arena, expected) << "case " << c;
  }
  for (GpuCopyMethod m : {GpuCopyMethod::kMemcpy, GpuCopyMethod::kMemcpy2D,
                          GpuCopyMethod::kMemcpy3D, GpuCopyMethod::kKernel}) {
    EXPECT_GT(methods[m], 0) << "no random region took " << GpuCopyMethodName(m);
  }
}

TEST(GpuScheduleTest, CudaIpcChoosesTheCopyEnginesOnlyForWholeRows) {
  cuda::CopyRegion r;
  r.run_bytes = 4096;
  EXPECT_EQ(ChooseGpuCopy(r, false).method, GpuCopyMethod::kMemcpy);
  EXPECT_EQ(ChooseGpuCopy(r, true).method, GpuCopyMethod::kKernel);
  // Rows: 1 KiB of every 4 KiB on one side, 2 KiB on the other.
  r.run_bytes = 1024;
  r.ndims = 1;
  r.count[0] = 64;
  r.from_stride[0] = 4096;
  r.to_stride[0] = 2048;
  GpuCopy g = ChooseGpuCopy(r, false);
  EXPECT_EQ(g.method, GpuCopyMethod::kMemcpy2D);
  EXPECT_EQ(g.width, 1024);
  EXPECT_EQ(g.height, 64);
  EXPECT_EQ(g.from_pitch, 4096);
  EXPECT_EQ(g.to_pitch, 2048);
  // Narrow rows go to the kernel, and so do aliasing reads (a broadcast row).
  r.run_bytes = 64;
  EXPECT_EQ(ChooseGpuCopy(r, false).method, GpuCopyMethod::kKernel);
  r.run_bytes = 1024;
  r.from_stride[0] = 0;
  EXPECT_EQ(ChooseGpuCopy(r, false).method, GpuCopyMethod::kKernel);
  // Slices of rows: 8 slices of 16 rows, slice strides whole numbers of pitches.
  r.ndims = 2;
  r.count[0] = 8;
  r.count[1] = 16;
  r.from_stride[0] = 4096 * 20;
  r.from_stride[1] = 4096;
  r.to_stride[0] = 2048 * 16;
  r.to_stride[1] = 2048;
  g = ChooseGpuCopy(r, false);
  EXPECT_EQ(g.method, GpuCopyMethod::kMemcpy3D);
  EXPECT_EQ(g.from_rows, 20);
  EXPECT_EQ(g.to_rows, 16);
  EXPECT_EQ(g.depth, 8);
  r.from_stride[0] = 4096 * 20 + 16;  // Not a whole number of rows.
  EXPECT_EQ(ChooseGpuCopy(r, false).method, GpuCopyMethod::kKernel);
  // Dims of count 1 drop out, contiguous dims merge into the run.
  cuda::CopyRegion m;
  m.run_bytes = 256;
  m.ndims = 3;
  m.count[0] = 1;
  m.from_stride[0] = 999;
  m.to_stride[0] = 7;
  m.count[1] = 4;
  m.from_stride[1] = 1024;
  m.to_stride[1] = 1024;
  m.count[2] = 4;
  m.from_stride[2] = 256;
  m.to_stride[2] = 256;
  g = ChooseGpuCopy(m, false);
  EXPECT_EQ(g.method, GpuCopyMethod::kMemcpy);
  EXPECT_EQ(g.width, 4096);
  cuda::CopyRegion empty;
  EXPECT_EQ(ChooseGpuCopy(empty, false).method, GpuCopyMethod::kNothing);
}

// The example plan with fan-out: the network transfers by the executor's copy, then every
// domain's fan-out once through the NCCL rounds (a small budget, so batches are cut) and once
// through the CUDA IPC copies; the in-process executor's verification checks every element.
TEST(GpuScheduleTest, ExamplePlanFanoutVerifiesInProcess) {
  absl::StatusOr<plan::RefitSpec> spec = plan::LoadSpecFile(
      std::string(RESHARD_SOURCE_DIR) + "/tests/nvlink/specs/tp4-to-tp2dp2.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<plan::Plan> plan =
      plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*std::move(spec)));
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const bool nccl : {true, false}) {
    SCOPED_TRACE(nccl ? "nccl" : "cuda_ipc");
    absl::StatusOr<plan::LocalWorld> world = plan::LocalWorld::Create(*plan, int64_t{1} << 30);
    ASSERT_TRUE(world.ok()) << world.status();
    world->Prepare(5);
    for (const plan::Transfer& tr : plan->transfers()) {
      if (tr.kind == plan::TransferKind::kFanout) continue;
      const plan::Region& r = plan->region(tr.region);
      ExecutorCopy(r, plan->region_dims(r),
                   world->buffer(tr.from_rank, plan->buffer_of(tr.tensor, tr.from_side)),
                   world->buffer(tr.to_rank, plan->buffer_of(tr.tensor, tr.to_side)));
    }
    int64_t edges = 0;
    for (const std::vector<int32_t>& domain : plan->spec().topology.domains) {
      FanoutTable table = FanoutTable::FromPlan(*plan, domain);
      edges += static_cast<int64_t>(table.edges.size());
      std::map<int32_t, std::vector<int64_t>> addresses;
      for (int32_t rank : domain) {
        for (uint32_t b = 0; b < plan->buffers().size(); ++b) {
          addresses[rank].push_back(AddressOf(world->buffer(rank, b)));
        }
      }
      if (nccl) {
        absl::StatusOr<NcclSchedule> s = BuildNcclSchedule(table, 3, 64 << 10);
        ASSERT_TRUE(s.ok()) << s.status();
        if (!table.edges.empty()) {
          EXPECT_GT(s->rounds.size(), s->num_batches) << "a 64 KiB budget cuts no batch";
        }
        RunNcclOnHost(table, *s, addresses, {});
      } else {
        for (const FanoutEdge& e : table.edges) {
          HostGpuCopy(ChooseGpuCopy(CopyRegionOf(table, e), false),
                      addresses[e.from_rank][e.from_buffer], addresses[e.to_rank][e.to_buffer], {});
        }
      }
      if (HasFatalFailure()) return;
    }
    EXPECT_GT(edges, 0);
    const absl::Status verified = world->Verify(5);
    EXPECT_TRUE(verified.ok()) << verified;
  }
}

}  // namespace
}  // namespace reshard::nvlink::internal
