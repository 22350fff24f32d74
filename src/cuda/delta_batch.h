// The batch plan of the pipelined GPU delta encode (docs/delta.md, "The GPU encode pipeline"): a
// pure function, tested on the CPU with real send programs (tests/net/delta_batch_test.cc).
//
// The engine encodes the delta pieces of its CUDA sources on the GPU ahead of posting them, in
// the order it will post them, batch by batch: a batch's pieces are encoded one after another
// on the codec's stream, each stream copied into the batch's slot of pinned host memory at the
// offset planned here, and the batch ends with an event the engine polls. The pinned memory is
// `slots` slots of `slot_bytes`; batch b uses slot b % slots, so it can be enqueued once batch
// b - slots has been posted (drained): while the NIC sends one batch the GPU encodes the next.
//
// Thread-compatible; plain data.
#pragma once

#include <cstdint>
#include <vector>

namespace reshard::cuda {

// One piece to encode: an id of the caller's (the engine's descriptor) and its stream capacity
// (delta::StreamCapacity), in the order the pieces will be posted.
struct DeltaBatchPiece {
  uint32_t id = 0;
  int64_t capacity = 0;
};

struct DeltaBatchPlan {
  struct Entry {
    uint32_t id = 0;
    int64_t offset = 0;    // In its batch's slot; a multiple of kDeltaBatchAlign.
    int64_t capacity = 0;  // The piece's stream capacity.
  };
  std::vector<Entry> entries;         // Every piece once, in the order given.
  std::vector<uint32_t> batch_begin;  // Batch b is entries [batch_begin[b], batch_begin[b + 1]).
  int32_t slots = 0;
  int64_t slot_bytes = 0;  // Pinned host bytes of one slot (0 without pieces).

  int32_t batches() const {
    return batch_begin.empty() ? 0 : static_cast<int32_t>(batch_begin.size()) - 1;
  }
  int64_t pinned_bytes() const { return static_cast<int64_t>(slots) * slot_bytes; }
};

// Streams start at multiples of this in a slot (the kernels store a plain piece's elements
// aligned, up to 8 bytes; 256 also keeps the copies' destinations on cache-line boundaries).
inline constexpr int64_t kDeltaBatchAlign = 256;
// The engine's pinned budget for the pipeline, all slots together, and its slot count.
inline constexpr int64_t kDeltaBatchBudget = 64 << 20;
inline constexpr int32_t kDeltaBatchSlots = 2;

// Cuts `pieces` (in posting order) into consecutive batches: each batch takes pieces while
// their aligned capacities fit in one slot of budget_bytes / slots (rounded down to
// kDeltaBatchAlign). A piece larger than that gets a batch of its own and raises slot_bytes to
// its aligned capacity (the only case where the pinned memory exceeds the budget). `slots` below
// 1 counts as 1.
DeltaBatchPlan PlanDeltaBatches(const std::vector<DeltaBatchPiece>& pieces, int64_t budget_bytes,
                                int32_t slots);

}  // namespace reshard::cuda
