#include "src/net/send_program.h"

#include <algorithm>

#include "src/common/delta_codec.h"
#include "src/common/status.h"
#include "src/net/wire.h"

namespace reshard::net {

using plan::Transfer;
using plan::TransferKind;

bool Executes(const Transfer& t, const SendProgramOptions& options) {
  return t.kind != TransferKind::kFanout || options.execute_fanout;
}

int DeltaElemBytes(const plan::Plan& plan, const Transfer& t, const SendProgramOptions& options) {
  return options.delta ? plan::DeltaElemBytes(plan, t) : 0;
}

int64_t PackedBytes(const plan::Plan& plan, const Transfer& t, const SendProgramOptions& options) {
  const int64_t bytes = plan.region(t.region).bytes;
  const int es = DeltaElemBytes(plan, t, options);
  return es > 0 ? delta::PieceCapacity(bytes / es, es) : bytes;
}

bool IsPacked(const plan::Plan& plan, const Transfer& t, const SendProgramOptions& options) {
  if (t.from_rank == t.to_rank || !Executes(t, options)) return false;
  if (DeltaElemBytes(plan, t, options) > 0) return true;
  const plan::Region& r = plan.region(t.region);
  return r.ndims > 0 && r.run_bytes < options.pack_below_run_bytes;
}

int64_t SendProgram::Slot(uint32_t id) const {
  auto it = std::lower_bound(received_ids.begin(), received_ids.end(), id);
  return it != received_ids.end() && *it == id ? it - received_ids.begin() : -1;
}

SendProgram BuildSendProgram(const plan::Plan& plan, int32_t rank,
                             const SendProgramOptions& options) {
  RESHARD_CHECK(plan.rank() < 0 || plan.rank() == rank);
  const auto& transfers = plan.transfers();
  const auto world = static_cast<size_t>(plan.world_size());
  SendProgram p;
  p.rank = rank;
  p.expected_from.assign(world, 0);
  std::vector<bool> is_peer(world, false);

  // Receiving side. Packed streams first get their offset inside their sender's block; the
  // blocks are then laid out in ascending sender order.
  std::vector<int64_t> block(world, 0);  // Bytes by sender, then the block's offset.
  for (auto [it, end] = plan.receives(rank); it != end; ++it) {
    const Transfer& t = transfers[*it];
    if (!Executes(t, options)) continue;
    p.received.push_back(*it);
    p.received_ids.push_back(plan.transfer_id(*it));
    const int es = DeltaElemBytes(plan, t, options);
    p.delta_elem_bytes.push_back(static_cast<uint8_t>(es));
    // With active messages a delta stream is applied from its message: no landing space.
    if (IsPacked(plan, t, options) && (es == 0 || options.chunk_bytes == 0)) {
      p.landing_offset.push_back(block[t.from_rank]);
      block[t.from_rank] += PackedBytes(plan, t, options);
    } else {
      p.landing_offset.push_back(-1);
    }
    if (t.from_rank == rank) continue;
    p.expected_from[t.from_rank]++;
    is_peer[t.from_rank] = true;
  }
  for (size_t s = 0; s < world; ++s) {
    if (block[s] == 0) continue;
    p.landing_blocks.push_back({static_cast<int32_t>(s), p.landing_bytes, block[s]});
    const int64_t bytes = block[s];
    block[s] = p.landing_bytes;
    p.landing_bytes += bytes;
  }
  for (size_t k = 0; k < p.received.size(); ++k) {
    if (p.landing_offset[k] >= 0) p.landing_offset[k] += block[transfers[p.received[k]].from_rank];
  }

  // Descriptors grouped by receiver (a counting sort keeps plan order within a receiver).
  std::vector<std::vector<uint32_t>> by_peer(world);
  for (auto [it, end] = plan.sends(rank); it != end; ++it) {
    const Transfer& t = transfers[*it];
    if (!Executes(t, options)) continue;
    by_peer[t.to_rank].push_back(*it);
    if (t.to_rank != rank) is_peer[t.to_rank] = true;
  }
  p.peer_begin.assign(world + 1, 0);
  for (size_t r = 0; r < world; ++r) {
    p.peer_begin[r] = static_cast<uint32_t>(p.descs.size());
    int64_t packed_bytes = 0;  // This rank's block at receiver r so far.
    for (uint32_t ti : by_peer[r]) {
      const Transfer& t = transfers[ti];
      const plan::Region& region = plan.region(t.region);
      SendDesc d;
      d.transfer = ti;
      d.id = plan.transfer_id(ti);
      d.peer = t.to_rank;
      d.from_buffer = plan.buffer_of(t.tensor, t.from_side);
      d.to_buffer = plan.buffer_of(t.tensor, t.to_side);
      d.bytes = region.bytes;
      d.run_begin = static_cast<uint32_t>(p.runs.size());
      if (t.to_rank == rank) {
        const int64_t slot = p.Slot(d.id);
        RESHARD_CHECK(slot >= 0);  // A local copy both leaves and lands here.
        d.slot = static_cast<uint32_t>(slot);
      }
      if (plan::IsRelay(t)) {
        // A relay reads what its feed brought here: of the same part (the schedule's relay
        // chains), so the same region, whose order both pieces' runs follow.
        // A delta relay forwards the streams of a delta piece, a plain one a plain piece
        // (plan::DeltaElemBytes: the schedule's relay chains start at a source piece).
        d.relay_feed = p.Slot(static_cast<uint32_t>(t.after));
        RESHARD_CHECK(d.relay_feed >= 0 &&
                      plan.region(transfers[p.received[d.relay_feed]].region).bytes ==
                          region.bytes &&
                      p.delta_elem_bytes[d.relay_feed] == DeltaElemBytes(plan, t, options));
      }
      // A delta stream's segment is one run, never cut: one put, or one data message.
      const bool delta = DeltaElemBytes(plan, t, options) > 0;
      int64_t chunk =
          options.chunk_bytes > 0 && t.to_rank != rank && !delta ? options.chunk_bytes : INT64_MAX;
      if (options.max_run_bytes > 0 && !delta) chunk = std::min(chunk, options.max_run_bytes);
      // A relay's own runs too: it posts each once its feed's bytes are in place.
      if (options.progress_steps && (t.feeds_relay || plan::IsRelay(t)) && !delta &&
          t.to_rank != rank) {
        chunk = std::min(chunk, wire::ProgressStep(region.bytes));
      }
      auto add = [&](int64_t local, int64_t remote, int64_t bytes) {
        for (int64_t done = 0; done < bytes; done += chunk) {
          p.runs.push_back(SendRun{local + done, remote + done, std::min(chunk, bytes - done)});
        }
      };
      if (IsPacked(plan, t, options)) {
        const int64_t stream = PackedBytes(plan, t, options);
        const int es = DeltaElemBytes(plan, t, options);
        const bool in_ring = es == 0 && d.from_buffer < options.ring_sources.size() &&
                             options.ring_sources[d.from_buffer];
        d.packed = true;
        d.send_offset = in_ring ? 0 : p.send_scratch_bytes;
        if (!in_ring) p.send_scratch_bytes += stream;
        if (es == 0 || options.chunk_bytes == 0) {
          d.landing_offset = packed_bytes;
          packed_bytes += stream;
        } else {
          d.landing_offset = -1;
        }
        if (es > 0) {
          d.delta_elem_bytes = static_cast<uint8_t>(es);
          if (d.relay_feed < 0) {  // A relay has no shadow: it forwards the streams it got.
            d.shadow_offset = p.shadow_bytes;
            p.shadow_bytes += region.bytes;
          }
          const int64_t elems = region.bytes / es;
          d.segment_begin = p.segments;
          d.segments = static_cast<uint32_t>(delta::NumSegments(elems, es));
          p.segments += d.segments;
          p.gather_bytes =
              std::max(p.gather_bytes, std::min(elems, delta::SegmentElems(es)) * es);
          // Each segment's runs on their own: a run never crosses into the next segment's
          // stream, so the sender cuts it at its segment's actual length.
          for (int64_t k = 0; k < d.segments; ++k) {
            const int64_t at = k * delta::SegmentStride(es);
            add(d.send_offset + at, at,
                delta::StreamCapacity(delta::SegmentLength(elems, es, k), es));
          }
        } else {
          add(d.send_offset, 0, stream);
        }
      } else {
        plan::ForEachRun(region, plan.region_dims(region), add);
      }
      d.run_end = static_cast<uint32_t>(p.runs.size());
      p.dependencies.Add(t.after, static_cast<uint32_t>(p.descs.size()));
      p.descs.push_back(d);
    }
    if (packed_bytes > 0) p.packed_to.push_back({static_cast<int32_t>(r), 0, packed_bytes});
  }
  p.peer_begin[world] = static_cast<uint32_t>(p.descs.size());
  p.dependencies.Finish();
  for (size_t r = 0; r < world; ++r) {
    if (is_peer[r] && static_cast<int32_t>(r) != rank) p.peers.push_back(static_cast<int32_t>(r));
  }
  return p;
}

}  // namespace reshard::net
