#include "src/net/landing_rounds.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "src/plan/region.h"

namespace reshard::net {

bool IsRoundPiece(const plan::Plan& plan, const plan::Transfer& t, bool delta, RoundMode to) {
  // Packed streams too: a round holds a piece's bytes in run order, as its packed stream.
  if (to == RoundMode::kNone || t.from_rank == t.to_rank || delta || t.after >= 0) return false;
  const plan::Region& region = plan.region(t.region);
  return region.bytes > 0 && (to == RoundMode::kAll || region.bytes > region.run_bytes);
}

absl::StatusOr<LandingRounds> PlanLandingRounds(const plan::Plan& plan, const SendProgram& program,
                                                const std::vector<RoundMode>& modes, int64_t budget,
                                                int64_t round_bytes) {
  LandingRounds out;
  out.sender_of_slot.assign(program.received.size(), -1);
  out.modes = modes;
  // Slots are in plan order (ascending world index), the order each sender posts its pieces.
  std::vector<std::vector<uint32_t>> by_sender(static_cast<size_t>(plan.world_size()));
  for (uint32_t slot = 0; slot < program.received.size(); ++slot) {
    const plan::Transfer& t = plan.transfers()[program.received[slot]];
    const uint32_t to = plan.buffer_of(t.tensor, t.to_side);
    if (IsRoundPiece(plan, t, program.delta_elem_bytes[slot] != 0, ModeOf(modes, to))) {
      by_sender[static_cast<size_t>(t.from_rank)].push_back(slot);
    }
  }
  int64_t all = 0;
  for (int32_t r = 0; r < plan.world_size(); ++r) {
    if (by_sender[r].empty()) continue;
    RoundSender s;
    s.rank = r;
    s.piece_begin = static_cast<uint32_t>(out.pieces.size());
    for (uint32_t slot : by_sender[r]) {
      const int64_t bytes = plan.region(plan.transfers()[program.received[slot]].region).bytes;
      out.sender_of_slot[slot] = static_cast<int32_t>(out.senders.size());
      out.pieces.push_back(RoundPiece{slot, s.total, bytes});
      s.total += bytes;
    }
    s.piece_end = static_cast<uint32_t>(out.pieces.size());
    all += s.total;
    out.senders.push_back(s);
  }
  if (out.senders.empty()) return out;
  if (budget < kMinRoundQuota) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d: stage_landing_bytes is %d, below the least round of %d bytes",
                        program.rank, budget, kMinRoundQuota));
  }
  if (round_bytes < kMinRoundQuota) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d: stage_round_bytes is %d, below the least round of %d bytes",
                        program.rank, round_bytes, kMinRoundQuota));
  }
  const bool everything = all <= budget;
  const int64_t largest = round_bytes / 256 * 256;
  for (RoundSender& s : out.senders) {
    if (everything) {
      // Every round has its place: all are granted with the epoch.
      s.quota = std::min(s.total, largest);
      s.rounds = static_cast<int32_t>((s.total + s.quota - 1) / s.quota);
      s.slots = s.rounds;
    } else {
      // A share of the budget in proportion to the stream, in places of whole 256-byte units:
      // at least two rounds of at least kMinRoundQuota bytes.
      const auto share =
          static_cast<int64_t>(static_cast<double>(budget) * (static_cast<double>(s.total) / all));
      s.quota =
          std::min(s.total, std::max(kMinRoundQuota, std::min(largest, share / 2 / 256 * 256)));
      s.rounds = static_cast<int32_t>((s.total + s.quota - 1) / s.quota);
      s.slots =
          static_cast<int32_t>(std::min<int64_t>(s.rounds, std::max<int64_t>(2, share / s.quota)));
    }
    s.offset = out.area_bytes;
    out.area_bytes += s.SliceBytes();
  }
  if (out.area_bytes > budget) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "rank %d: stage_landing_bytes of %d bytes cannot hold two rounds of at least %d bytes for "
        "each of the %d ranks that send into its CUDA destinations (it needs %d); raise it",
        program.rank, budget, kMinRoundQuota, out.senders.size(), out.area_bytes));
  }
  return out;
}

absl::StatusOr<RoundScatters> PlanRoundScatters(const plan::Plan& plan, const SendProgram& program,
                                                const LandingRounds& rounds,
                                                const std::vector<int64_t>& shift,
                                                int64_t base_align) {
  RoundScatters out;
  cuda::PackBatchOptions options;
  options.strided_base_align = base_align;
  options.packed_base_align = cuda::kMaxPackWidth;  // The area is a device allocation.
  std::vector<cuda::StridedRegion> slabs;
  for (const RoundSender& s : rounds.senders) {
    out.first.push_back(static_cast<int32_t>(out.batches.size()));
    uint32_t p = s.piece_begin;
    for (int32_t r = 0; r < s.rounds; ++r) {
      const int64_t begin = s.RoundBegin(r), end = s.RoundEnd(r);
      cuda::PackBatch batch;
      batch.strided_base_align = options.strided_base_align;
      batch.packed_base_align = options.packed_base_align;
      // The pieces with bytes in the round (the last one may go on into the next).
      for (uint32_t k = p; k < s.piece_end && rounds.pieces[k].base < end; ++k) {
        const RoundPiece& piece = rounds.pieces[k];
        const plan::Transfer& t = plan.transfers()[program.received[piece.slot]];
        const plan::Region& region = plan.region(t.region);
        const uint32_t to = plan.buffer_of(t.tensor, t.to_side);
        const int64_t from = std::max(begin, piece.base);
        slabs.clear();
        plan::ForEachSlab(
            region, plan.region_dims(region), from - piece.base,
            std::min(end, piece.base + piece.bytes) - piece.base,
            [&](int64_t, int64_t to_off, int64_t width, int64_t rows, int64_t, int64_t to_pitch) {
              cuda::StridedRegion slab;
              slab.offset = shift[to] + to_off;
              slab.run_bytes = width;
              slab.ndims = rows > 1 ? 1 : 0;
              slab.count[0] = rows;
              slab.stride[0] = to_pitch;
              slabs.push_back(slab);
            });
        options.packed_begin = s.AreaOffset(from);
        absl::StatusOr<cuda::PackBatch> part = cuda::BuildPackBatch(slabs, options);
        absl::Status appended = part.ok() ? cuda::AppendPackBatch(*part, &batch) : part.status();
        if (!appended.ok()) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "rank %d: the scatter of landing round %d from rank %d (tensor \"%s\"): %s",
              program.rank, r, s.rank, plan.spec().tensors[t.tensor].name, appended.message()));
        }
        if (piece.base + piece.bytes <= end) p = k + 1;
      }
      out.batches.push_back(std::move(batch));
    }
  }
  return out;
}

void CompactLandingArea(const LandingRounds& rounds, SendProgram* p) {
  if (rounds.empty()) return;
  // Each block's streams, in slot order, with the bytes each took (up to the next one's offset,
  // or the block's end).
  std::vector<std::vector<uint32_t>> by_block(p->landing_blocks.size());
  for (uint32_t slot = 0; slot < p->received.size(); ++slot) {
    const int64_t at = p->landing_offset[slot];
    if (at < 0) continue;
    auto block = std::upper_bound(p->landing_blocks.begin(), p->landing_blocks.end(), at,
                                  [](int64_t x, const LandingBlock& b) { return x < b.offset; });
    by_block[static_cast<size_t>(block - p->landing_blocks.begin() - 1)].push_back(slot);
  }
  std::vector<LandingBlock> blocks;
  int64_t end = 0;
  for (size_t b = 0; b < by_block.size(); ++b) {
    const LandingBlock& old = p->landing_blocks[b];
    const std::vector<uint32_t>& slots = by_block[b];
    LandingBlock kept{old.rank, end, 0};
    for (size_t k = 0; k < slots.size(); ++k) {
      const uint32_t slot = slots[k];
      const int64_t next =
          k + 1 < slots.size() ? p->landing_offset[slots[k + 1]] : old.offset + old.bytes;
      const int64_t bytes = next - p->landing_offset[slot];
      if (rounds.sender_of_slot[slot] >= 0) {
        p->landing_offset[slot] = -1;
        continue;
      }
      p->landing_offset[slot] = end + kept.bytes;
      kept.bytes += bytes;
    }
    if (kept.bytes == 0) continue;
    end += kept.bytes;
    blocks.push_back(kept);
  }
  p->landing_blocks = std::move(blocks);
  p->landing_bytes = end;
}

void CompactLandingBlock(int32_t peer, const std::vector<int64_t>& round_base, SendProgram* p) {
  auto entry = std::lower_bound(p->packed_to.begin(), p->packed_to.end(), peer,
                                [](const LandingBlock& b, int32_t r) { return b.rank < r; });
  if (entry == p->packed_to.end() || entry->rank != peer) return;
  // The packed descriptors to `peer` in its landing area (delta streams are not), in order
  // (their offsets ascend), and the bytes each took.
  std::vector<uint32_t> packed;
  for (uint32_t i = p->peer_begin[peer]; i < p->peer_begin[peer + 1]; ++i) {
    if (p->descs[i].packed && p->descs[i].landing_offset >= 0) packed.push_back(i);
  }
  int64_t kept = 0;
  for (size_t k = 0; k < packed.size(); ++k) {
    SendDesc& d = p->descs[packed[k]];
    const int64_t next =
        k + 1 < packed.size() ? p->descs[packed[k + 1]].landing_offset : entry->bytes;
    const int64_t bytes = next - d.landing_offset;
    if (round_base[packed[k]] >= 0) {
      d.landing_offset = -1;
      continue;
    }
    d.landing_offset = kept;
    kept += bytes;
  }
  if (kept == 0) {
    p->packed_to.erase(entry);
  } else {
    entry->bytes = kept;
  }
}

std::vector<int64_t> RoundStreamBases(const plan::Plan& plan, const SendProgram& program,
                                      int32_t peer, const std::vector<RoundMode>& peer_modes,
                                      int64_t* total) {
  std::vector<int64_t> bases(program.descs.size(), -1);
  *total = 0;
  for (uint32_t i = program.peer_begin[peer]; i < program.peer_begin[peer + 1]; ++i) {
    const SendDesc& d = program.descs[i];
    const plan::Transfer& t = plan.transfers()[d.transfer];
    if (IsRoundPiece(plan, t, d.delta_elem_bytes > 0, ModeOf(peer_modes, d.to_buffer))) {
      bases[i] = *total;
      *total += d.bytes;
    }
  }
  return bases;
}

absl::StatusOr<std::vector<int64_t>> CheckedRoundStreamBases(
    const plan::Plan& plan, const SendProgram& program, int32_t peer,
    const std::vector<RoundMode>& peer_modes, int64_t published_total) {
  int64_t total = 0;
  std::vector<int64_t> bases = RoundStreamBases(plan, program, peer, peer_modes, &total);
  if (total != published_total) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "rank %d expects %d bytes of landing rounds from rank %d, which sends %d there (the "
        "ranks disagree on the plan, pack_below_run_bytes or the delivery)",
        peer, published_total, program.rank, total));
  }
  return bases;
}

}  // namespace reshard::net
