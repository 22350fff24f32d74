#include "src/net/send_program.h"

#include <algorithm>

namespace reshard::net {

using plan::Transfer;
using plan::TransferKind;

bool Executes(const Transfer& t, const SendProgramOptions& options) {
  return t.kind != TransferKind::kFanout || options.execute_fanout;
}

bool IsPacked(const plan::Plan& plan, const Transfer& t, const SendProgramOptions& options) {
  if (t.from_rank == t.to_rank || !Executes(t, options)) return false;
  const plan::Region& r = plan.region(t.region);
  return r.ndims > 0 && r.run_bytes < options.pack_below_run_bytes;
}

std::vector<int64_t> LandingOffsets(const plan::Plan& plan, int32_t rank,
                                    const SendProgramOptions& options, int64_t* bytes) {
  std::vector<int64_t> offsets(plan.transfers().size(), -1);
  int64_t total = 0;
  for (auto [it, end] = plan.receives(rank); it != end; ++it) {
    const Transfer& t = plan.transfers()[*it];
    if (!IsPacked(plan, t, options)) continue;
    offsets[*it] = total;
    total += plan.region(t.region).bytes;
  }
  if (bytes != nullptr) *bytes = total;
  return offsets;
}

SendProgram BuildSendProgram(const plan::Plan& plan, int32_t rank,
                             const SendProgramOptions& options) {
  const auto& transfers = plan.transfers();
  const auto world = static_cast<size_t>(plan.world_size());
  SendProgram p;
  p.rank = rank;
  p.expected_from.assign(world, 0);
  p.landing_offset = LandingOffsets(plan, rank, options, &p.landing_bytes);
  std::vector<bool> is_peer(world, false);
  for (auto [it, end] = plan.receives(rank); it != end; ++it) {
    const Transfer& t = transfers[*it];
    if (!Executes(t, options)) continue;
    p.received.push_back(*it);
    if (t.from_rank == rank) continue;
    p.expected_from[t.from_rank]++;
    is_peer[t.from_rank] = true;
  }

  // Descriptors grouped by receiver (a counting sort keeps plan order within a receiver).
  std::vector<std::vector<uint32_t>> by_peer(world);
  for (auto [it, end] = plan.sends(rank); it != end; ++it) {
    const Transfer& t = transfers[*it];
    if (!Executes(t, options)) continue;
    by_peer[t.to_rank].push_back(*it);
    if (t.to_rank != rank) is_peer[t.to_rank] = true;
  }
  // Landing offsets at each receiver, computed only for receivers of packed streams.
  std::vector<std::vector<int64_t>> remote_landing(world);
  p.peer_begin.assign(world + 1, 0);
  for (size_t r = 0; r < world; ++r) {
    p.peer_begin[r] = static_cast<uint32_t>(p.descs.size());
    for (uint32_t ti : by_peer[r]) {
      const Transfer& t = transfers[ti];
      const plan::Region& region = plan.region(t.region);
      SendDesc d;
      d.transfer = ti;
      d.peer = t.to_rank;
      d.from_buffer = plan.buffer_of(t.tensor, t.from_side);
      d.to_buffer = plan.buffer_of(t.tensor, t.to_side);
      d.bytes = region.bytes;
      d.run_begin = static_cast<uint32_t>(p.runs.size());
      const int64_t chunk =
          options.chunk_bytes > 0 && t.to_rank != rank ? options.chunk_bytes : INT64_MAX;
      auto add = [&](int64_t local, int64_t remote, int64_t bytes) {
        for (int64_t done = 0; done < bytes; done += chunk) {
          p.runs.push_back(SendRun{local + done, remote + done, std::min(chunk, bytes - done)});
        }
      };
      if (IsPacked(plan, t, options)) {
        if (remote_landing[r].empty()) {
          remote_landing[r] = LandingOffsets(plan, static_cast<int32_t>(r), options, nullptr);
        }
        d.packed = true;
        d.send_offset = p.send_scratch_bytes;
        d.landing_offset = remote_landing[r][ti];
        p.send_scratch_bytes += region.bytes;
        add(d.send_offset, 0, region.bytes);
      } else {
        plan::ForEachRun(region, plan.region_dims(region), add);
      }
      d.run_end = static_cast<uint32_t>(p.runs.size());
      p.dependencies.Add(t.after, static_cast<uint32_t>(p.descs.size()));
      p.descs.push_back(d);
    }
  }
  p.peer_begin[world] = static_cast<uint32_t>(p.descs.size());
  p.dependencies.Finish();
  for (size_t r = 0; r < world; ++r) {
    if (is_peer[r] && static_cast<int32_t>(r) != rank) p.peers.push_back(static_cast<int32_t>(r));
  }
  return p;
}

}  // namespace reshard::net
