// The batch planner of the engine's two GPU pipelines, a pure function tested on the CPU with
// real send programs (tests/net/batch_plan_test.cc):
//  - the pipelined GPU delta encode (docs/delta.md, "The GPU encode pipeline"): each piece is a
//    delta segment's stream capacity; pieces are never split;
//  - the staging ring of staged CUDA sources (docs/data-plane.md, "The staging ring"): each
//    piece is a descriptor's packed stream, which may be split at its run boundaries (`cuts`)
//    when it is larger than a slot.
// The engine fills the batches on the GPU ahead of posting them, in the order it will post them:
// batch b goes into pinned slot b % slots (each of slot_bytes), so it can be filled once batch
// b - slots has been consumed (and, for the ring, every send reading it completed): while the
// NIC sends one batch the GPU fills the next.
//
// Thread-compatible; plain data.
#pragma once

#include <cstdint>
#include <vector>

namespace reshard::cuda {

// One piece to place: an id of the caller's (the engine's segment or descriptor) and its bytes,
// in the order the pieces will be posted. `cuts`: ascending offsets in (0, bytes) where the
// piece may be split when it does not fit in one slot (empty: never split).
struct BatchPiece {
  uint32_t id = 0;
  int64_t bytes = 0;
  std::vector<int64_t> cuts = {};
};

struct BatchPlan {
  // One part of a piece: bytes [begin, begin + bytes) of piece `id`, at `offset` in its batch's
  // slot. A piece that is not split is one entry with begin 0.
  struct Entry {
    uint32_t id = 0;
    int64_t begin = 0;
    int64_t bytes = 0;
    int64_t offset = 0;  // In its batch's slot; a multiple of kBatchAlign.
  };
  std::vector<Entry> entries;         // Every piece's parts in order, pieces in the given order.
  std::vector<uint32_t> batch_begin;  // Batch b is entries [batch_begin[b], batch_begin[b + 1]).
  int32_t slots = 0;
  int64_t slot_bytes = 0;  // Bytes of one slot: its largest batch's (0 without pieces).

  int32_t batches() const {
    return batch_begin.empty() ? 0 : static_cast<int32_t>(batch_begin.size()) - 1;
  }
  int64_t pinned_bytes() const { return static_cast<int64_t>(slots) * slot_bytes; }
};

// Parts start at multiples of this in a slot (the kernels store up to 16 bytes per thread, the
// delta kernels' plain pieces up to 8; 256 also keeps copies on cache-line boundaries).
inline constexpr int64_t kBatchAlign = 256;
// The delta encode pipeline's pinned budget, all slots together, and its slot count.
inline constexpr int64_t kDeltaBatchBudget = 64 << 20;
inline constexpr int32_t kDeltaBatchSlots = 2;
// The staging ring's default budget (RefitEngineOptions::stage_ring_bytes) and slot count:
// eight slots (32 MiB each by default), so the first put waits for an eighth of the budget to
// be packed, not half of it, and the GPU packs up to seven batches ahead of the wire.
inline constexpr int64_t kStageRingBudget = int64_t{256} << 20;
inline constexpr int32_t kStageRingSlots = 8;

// The slot size for `budget_bytes` in `slots` slots (below 1 counts as 1): budget / slots,
// rounded down to kBatchAlign (at least kBatchAlign).
int64_t SlotBytes(int64_t budget_bytes, int32_t slots);

// Cuts `pieces` (in posting order) into consecutive batches of SlotBytes(budget, slots) each:
// a batch takes whole pieces while their aligned bytes fit in its slot; a piece that does not
// fit in what is left starts the next batch. A piece larger than a whole slot is split at its
// cuts: each part is the longest run of bytes up to a cut that fits in what the current batch
// has left (the first part fills the batch before, when anything fits there), the rest goes on
// in the next batches. Only a piece (or, between two cuts, a part) that no slot can hold raises
// slot_bytes to its aligned size, in a batch of its own: the one case where the pinned memory
// exceeds the budget (the engine cuts ring runs at the slot size, so it never happens there).
// Then slot_bytes shrinks to the largest batch's and `slots` to the number of batches, so a
// rank that sends 1 MiB pins 1 MiB, not the budget.
BatchPlan PlanBatches(const std::vector<BatchPiece>& pieces, int64_t budget_bytes, int32_t slots);

}  // namespace reshard::cuda
