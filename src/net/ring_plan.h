// The staging ring's plan (docs/data-plane.md, "The staging ring"): which bytes of which
// descriptor go where in which slot, and the pack kernel's batch that puts them there. A pure
// function of the plan and the send program, tested on the CPU by running its pack batches with
// the kernels' host twin (tests/net/batch_plan_test.cc, RingPlan.*).
//
// Thread-compatible; plain data.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "src/cuda/batch_plan.h"
#include "src/cuda/pack_batch.h"
#include "src/net/send_program.h"
#include "src/plan/plan.h"

namespace reshard::net {

// A part of a descriptor: its runs [run_begin, run_end), whose bytes follow each other at
// `offset` in the slot of batch `batch`; they are bytes [begin, begin + bytes) of the
// descriptor's stream (its runs' bytes one after another).
struct RingPart {
  uint32_t desc = 0;
  uint32_t run_begin = 0, run_end = 0;
  int32_t batch = 0;
  int64_t offset = 0;
  int64_t begin = 0;
  int64_t bytes = 0;
};

struct RingPlan {
  std::vector<RingPart> parts;        // Batch after batch; a descriptor's parts consecutive.
  std::vector<int64_t> first_part;    // By descriptor: its first part, or -1.
  std::vector<uint32_t> batch_begin;  // Batch b is parts [batch_begin[b], batch_begin[b + 1]).
  std::vector<int64_t> batch_bytes;   // By batch: the bytes its launch packs.
  // By batch: the pack kernel's batch (see PlanRing); the engine drops them once uploaded.
  std::vector<cuda::PackBatch> pack;
  int32_t slots = 0;
  int64_t slot_bytes = 0;

  int32_t batches() const { return static_cast<int32_t>(batch_bytes.size()); }
  int64_t pinned_bytes() const { return static_cast<int64_t>(slots) * slot_bytes; }
  bool on_ring(uint32_t desc) const { return !first_part.empty() && first_part[desc] >= 0; }
};

// Plans the ring for the descriptors `selected` names (by descriptor: no delta streams, no
// `after`, at least one run; every run at most SlotBytes(budget, kStageRingSlots), as
// SendProgramOptions::max_run_bytes cuts them), in PostingOrder with local copies last, in
// kStageRingSlots slots of `budget_bytes` (shrunk to what the batches need, PlanBatches). Batch b's
// pack batch reads from one base address: `shift` (by buffer id) is the bytes from that base to
// each selected descriptor's source buffer, `base_align` the base's alignment (a power of two up to
// cuda::kMaxPackWidth); its stream offsets count from the slot's start. InvalidArgument naming the
// tensor when a pack batch cannot be built.
[[nodiscard]] absl::StatusOr<RingPlan> PlanRing(const plan::Plan& plan, const SendProgram& program,
                                                const std::vector<bool>& selected,
                                                const std::vector<int64_t>& shift,
                                                int64_t base_align, int64_t budget_bytes);

}  // namespace reshard::net
