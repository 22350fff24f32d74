// Multi-process harness for the fan-out backends: one forked process per rank that takes part in
// a domain's fan-out. The network stage is played by the receiving rank itself: it computes the
// source tiles with the verification fill (deterministic, so no source process is needed) and
// copies each network region into its own buffer in a shuffled order, calling Fanout::Landed()
// after each, the way the engine reports landings. Every destination tile is then checked
// against the strong fill of the epoch, after poisoning the buffers before each epoch.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "src/nvlink/fanout.h"
#include "src/common/shared_memory.h"
#include "src/plan/fill.h"
#include "src/plan/plan.h"
#include "src/plan/schedule.h"
#include "src/plan/spec_json.h"
#include "src/rendezvous/file_store.h"
#include "tests/testing/multiprocess.h"

namespace reshard::nvlink::testing {

// How a rank allocates and reaches its buffers (host shared, host private, CUDA).
struct MemoryOps {
  MemoryKind kind = MemoryKind::kHost;
  // Returns memory of `bytes`, owned by the returned holder.
  std::function<void*(int64_t bytes, std::shared_ptr<void>* holder, const std::string& tag)> alloc;
  std::function<void(void* dst, const void* host_src, int64_t n)> copy_in;
  std::function<void(void* host_dst, const void* src, int64_t n)> copy_out;
};

inline MemoryOps SharedHostMemory() {
  MemoryOps m;
  m.alloc = [](int64_t bytes, std::shared_ptr<void>* holder, const std::string& tag) -> void* {
    auto b = SharedBuffer::Allocate(tag, bytes);
    if (!b.ok()) return nullptr;
    void* p = (*b)->data();
    *holder = std::shared_ptr<SharedBuffer>(std::move(*b));
    return p;
  };
  m.copy_in = [](void* d, const void* s, int64_t n) { std::memcpy(d, s, n); };
  m.copy_out = [](void* d, const void* s, int64_t n) { std::memcpy(d, s, n); };
  return m;
}

inline MemoryOps PrivateHostMemory() {
  MemoryOps m = SharedHostMemory();
  m.alloc = [](int64_t bytes, std::shared_ptr<void>* holder, const std::string&) -> void* {
    auto v = std::make_shared<std::vector<uint8_t>>(bytes);
    void* p = v->data();
    *holder = v;
    return p;
  };
  return m;
}

struct RankOptions {
  int epochs = 3;
  std::string backend = "auto";
  std::string prefix = "t";
  // Exit (SIGKILL) right after Create() instead of refitting: a peer that dies.
  bool die_after_create = false;
  absl::Duration wait_timeout = absl::Seconds(20);
  // Sleep before entering each epoch (a slow rank, still busy with the previous refit).
  absl::Duration start_delay = absl::ZeroDuration();
  // FanoutOptions for the GPU backends (0: the default budget).
  int64_t gpu_staging_bytes = 0;
  bool cuda_ipc_kernel_only = false;
};

// What a rank reports to the parent (one line per figure, key=value).
inline void Report(const std::string& dir, int32_t rank, const std::string& text) {
  std::ofstream out(absl::StrFormat("%s/rank%d.out", dir, rank), std::ios::app);
  out << text << "\n";
}

inline std::map<std::string, std::string> ReadReport(const std::string& dir, int32_t rank) {
  std::map<std::string, std::string> kv;
  std::ifstream in(absl::StrFormat("%s/rank%d.out", dir, rank));
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) kv[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return kv;
}

// Body of one rank; returns the error to report, or OK.
inline absl::Status RunRank(const plan::Plan& plan, int32_t rank, const std::string& dir,
                            const MemoryOps& mem, const RankOptions& opt) {
  const plan::RefitSpec& spec = plan.spec();
  plan::DomainMap domains(spec);
  const std::vector<int32_t>& domain = domains.ranks(domains.domain_of(rank));
  auto store_or = rendezvous::FileStore::Open(dir + "/store");
  if (!store_or.ok()) return store_or.status();
  rendezvous::Store& store = **store_or;

  // This rank's buffers (destination and staging through `mem`).
  const std::vector<int64_t> sizes = plan.BufferBytes(rank);
  std::vector<std::shared_ptr<void>> holders(sizes.size());
  std::vector<BufferView> buffers(sizes.size());
  for (uint32_t b = 0; b < sizes.size(); ++b) {
    if (sizes[b] == 0 || plan.buffers()[b].side == plan::Side::kSrc) continue;
    void* p = mem.alloc(sizes[b], &holders[b], absl::StrFormat("r%d-b%d", rank, b));
    if (p == nullptr) return absl::ResourceExhaustedError("allocation failed");
    buffers[b] = {p, sizes[b], mem.kind};
  }
  FanoutOptions fo;
  fo.backend = opt.backend;
  fo.key_prefix = opt.prefix;
  fo.setup_timeout = absl::Seconds(20);
  if (opt.gpu_staging_bytes > 0) fo.gpu_staging_bytes = opt.gpu_staging_bytes;
  fo.cuda_ipc_kernel_only = opt.cuda_ipc_kernel_only;
  auto fanout_or =
      Fanout::Create(FanoutTable::FromPlan(plan, domain), rank, domain, store, buffers, fo);
  if (!fanout_or.ok()) return fanout_or.status();
  Fanout& fanout = **fanout_or;
  Report(dir, rank, absl::StrFormat("backend=%s", fanout.backend_name()));
  Report(dir, rank, absl::StrFormat("incoming=%d", fanout.incoming()));
  Report(dir, rank, absl::StrFormat("outgoing=%d", fanout.outgoing()));
  const int64_t mappings_after_create = fanout.mappings_created();
  Report(dir, rank, absl::StrFormat("mappings_create=%d", mappings_after_create));
  if (opt.die_after_create) {
    // Let the peers reach their Wait() first, then die without a word.
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    raise(SIGKILL);
  }

  // Source buffers of every rank, computed locally (the network stage is simulated).
  std::map<int32_t, std::vector<std::vector<uint8_t>>> sources;
  std::vector<uint32_t> landings;
  {
    auto [b, e] = plan.receives(rank);
    for (const uint32_t* it = b; it != e; ++it) {
      const plan::Transfer& tr = plan.transfers()[*it];
      if (tr.kind == plan::TransferKind::kFanout) continue;
      if (tr.from_side != plan::Side::kSrc) {
        return absl::UnimplementedError("the harness only plays network transfers from sources");
      }
      landings.push_back(*it);
    }
  }
  std::mt19937 rng(1234 + rank);
  const uint8_t kPoison = 0xA5;
  for (int ep = 1; ep <= opt.epochs; ++ep) {
    const uint64_t epoch = static_cast<uint64_t>(ep);
    // Fills of this epoch for every source rank feeding us.
    sources.clear();
    for (uint32_t t : landings) {
      const plan::Transfer& tr = plan.transfers()[t];
      if (sources.count(tr.from_rank)) continue;
      auto& bufs = sources[tr.from_rank];
      const std::vector<int64_t> ssz = plan.BufferBytes(tr.from_rank);
      bufs.resize(ssz.size());
      for (size_t b = 0; b < ssz.size(); ++b) bufs[b].assign(ssz[b], 0);
      for (size_t tensor = 0; tensor < spec.tensors.size(); ++tensor) {
        plan::ForEachTile(spec, tensor, plan::Side::kSrc, [&](int32_t r, const plan::Box& box) {
          if (r != tr.from_rank) return;
          plan::FillTile(spec, tensor, plan::Side::kSrc, box, epoch,
                         bufs[plan.buffer_of(tensor, plan::Side::kSrc)].data());
        });
      }
    }
    // Poison our buffers, then enter the epoch (peers may write from now on).
    for (uint32_t b = 0; b < buffers.size(); ++b) {
      if (buffers[b].data == nullptr) continue;
      std::vector<uint8_t> poison(buffers[b].bytes, kPoison);
      mem.copy_in(buffers[b].data, poison.data(), buffers[b].bytes);
    }
    absl::SleepFor(opt.start_delay);
    if (absl::Status s = fanout.Start(epoch); !s.ok()) return s;
    std::shuffle(landings.begin(), landings.end(), rng);
    std::set<uint32_t> seen;
    int64_t polled = 0;
    auto poll = [&]() -> absl::Status {
      std::vector<uint32_t> got;
      if (absl::Status st = fanout.Poll(epoch, &got); !st.ok()) return st;
      for (uint32_t t : got) {
        if (!seen.insert(t).second) {
          return absl::InternalError(absl::StrFormat("piece %d reported twice", t));
        }
        if (plan.transfers()[t].to_rank != rank) {
          return absl::InternalError(absl::StrFormat("piece %d is not for rank %d", t, rank));
        }
        ++polled;
      }
      return absl::OkStatus();
    };
    for (uint32_t t : landings) {
      const plan::Transfer& tr = plan.transfers()[t];
      const plan::Region& r = plan.region(tr.region);
      const uint8_t* from = sources[tr.from_rank][plan.buffer_of(tr.tensor, tr.from_side)].data();
      uint8_t* to = static_cast<uint8_t*>(buffers[plan.buffer_of(tr.tensor, tr.to_side)].data);
      plan::ForEachRun(r, plan.region_dims(r),
                       [&](int64_t f, int64_t o, int64_t n) { mem.copy_in(to + o, from + f, n); });
      if (absl::Status s = fanout.Landed(t, epoch); !s.ok()) return s;
      if (absl::Status s = poll(); !s.ok()) return s;
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
    }
    if (absl::Status s = fanout.Wait(epoch, absl::Now() + opt.wait_timeout); !s.ok()) return s;
    if (absl::Status s = poll(); !s.ok()) return s;
    if (polled != fanout.incoming()) {
      return absl::InternalError(absl::StrFormat("epoch %d: %d arrivals polled, %d expected", ep,
                                                 polled, fanout.incoming()));
    }
    // Byte-exact check of every destination tile of this rank.
    for (size_t tensor = 0; tensor < spec.tensors.size(); ++tensor) {
      const uint32_t id = plan.buffer_of(tensor, plan::Side::kDst);
      absl::Status status;
      plan::ForEachTile(spec, tensor, plan::Side::kDst, [&](int32_t r, const plan::Box& box) {
        if (r != rank || !status.ok()) return;
        std::vector<uint8_t> host(buffers[id].bytes);
        mem.copy_out(host.data(), buffers[id].data, buffers[id].bytes);
        status = plan::VerifyTile(spec, tensor, box, epoch, rank, host.data());
      });
      if (!status.ok()) return status;
    }
    const FanoutStats& st = fanout.stats();
    Report(dir, rank,
           absl::StrFormat("epoch%d=arrivals:%d,forwards:%d,hidden:%.3f", ep, st.arrivals,
                           st.forwards, st.hidden_fraction));
  }
  Report(dir, rank, absl::StrFormat("mappings_end=%d", fanout.mappings_created()));
  Report(dir, rank, "ok=1");
  return absl::OkStatus();
}

// Specs with fan-out shared by the fan-out suites.
// Trainer TP4 -> inference TP2 x DP2 in one domain of 4 (DESIGN §1).
inline constexpr char kTp4ToTp2Dp2[] = R"json({
  "topology": {"domains": [[0, 1, 2, 3], [4, 5, 6, 7]]},
  "tensors": [
    {"name": "w", "dtype": "bf16", "shape": [64, 256],
     "src": {"mesh": [0, 1, 2, 3], "placements": ["S(1)"]},
     "dst": {"mesh": [[4, 5], [6, 7]], "placements": ["R", "S(1)"]}},
    {"name": "rows", "dtype": "fp32", "shape": [48, 40],
     "src": {"mesh": [0, 1, 2, 3], "placements": ["S(0)"]},
     "dst": {"mesh": [[4, 5], [6, 7]], "placements": ["R", "S(1)"]}}
  ]
})json";

// 8 trainer ranks -> 8 inference ranks as TP2 x DP4 in two domains of 4.
inline constexpr char kEightToTp2Dp4[] = R"json({
  "topology": {"ranks_per_domain": 4},
  "tensors": [
    {"name": "w", "dtype": "bf16", "shape": [64, 512],
     "src": {"mesh": [0, 1, 2, 3, 4, 5, 6, 7], "placements": ["S(1)"]},
     "dst": {"mesh": [[8, 9], [10, 11], [12, 13], [14, 15]], "placements": ["R", "S(1)"]}},
    {"name": "o", "dtype": "fp32", "shape": [40, 96],
     "src": {"mesh": [0, 1, 2, 3, 4, 5, 6, 7], "placements": ["S(0)"]},
     "dst": {"mesh": [[8, 9], [10, 11], [12, 13], [14, 15]], "placements": ["R", "S(1)"]}}
  ]
})json";

// One source tile replicated to a domain of 3: one rank takes it off the network and only
// sends, the others only receive (peers that never send to a rank still watch its liveness).
inline constexpr char kOneToThreeReplicas[] = R"json({
  "topology": {"domains": [[0], [1, 2, 3]]},
  "tensors": [
    {"name": "bias", "dtype": "fp32", "shape": [1000],
     "src": {"mesh": [0], "placements": ["R"]},
     "dst": {"mesh": [1, 2, 3], "placements": ["R"]}}
  ]
})json";

// Two sources -> two replicas in one domain of 2 (the smallest NCCL case: two GPUs).
inline constexpr char kTp2ToDp2[] = R"json({
  "topology": {"domains": [[0, 1], [2, 3]]},
  "tensors": [
    {"name": "w", "dtype": "fp32", "shape": [32, 96],
     "src": {"mesh": [0, 1], "placements": ["S(1)"]},
     "dst": {"mesh": [2, 3], "placements": ["R"]}}
  ]
})json";

using reshard::testing::ForkRanks;

// A fresh scratch directory under TMPDIR.
inline std::string MakeScratchDir() { return reshard::testing::ScratchDir("nvlink"); }

inline absl::StatusOr<plan::Plan> PlanFromJson(const std::string& json) {
  auto spec = plan::ParseSpecJson(json);
  if (!spec.ok()) return spec.status();
  return plan::BuildPlan(std::make_shared<const plan::RefitSpec>(std::move(*spec)));
}

// Ranks that take part in some fan-out edge of `plan`.
inline std::vector<int32_t> FanoutRanks(const plan::Plan& plan) {
  std::set<int32_t> ranks;
  for (const plan::Transfer& tr : plan.transfers()) {
    if (tr.kind != plan::TransferKind::kFanout) continue;
    ranks.insert(tr.from_rank);
    ranks.insert(tr.to_rank);
  }
  return {ranks.begin(), ranks.end()};
}

}  // namespace reshard::nvlink::testing
