#include "src/cuda/batch_plan.h"

#include <algorithm>

#include "src/common/status.h"

namespace reshard::cuda {
namespace {

int64_t Aligned(int64_t bytes) { return (bytes + kBatchAlign - 1) / kBatchAlign * kBatchAlign; }

}  // namespace

int64_t SlotBytes(int64_t budget_bytes, int32_t slots) {
  const int64_t share = std::max<int64_t>(budget_bytes / std::max<int32_t>(slots, 1), 0);
  return std::max(share / kBatchAlign * kBatchAlign, kBatchAlign);
}

BatchPlan PlanBatches(const std::vector<BatchPiece>& pieces, int64_t budget_bytes, int32_t slots) {
  BatchPlan plan;
  plan.slots = std::max<int32_t>(slots, 1);
  if (pieces.empty()) return plan;
  plan.slot_bytes = SlotBytes(budget_bytes, plan.slots);
  // What no slot holds: an unsplittable piece, or the bytes between two cuts of a piece.
  for (const BatchPiece& p : pieces) {
    if (p.bytes <= plan.slot_bytes) continue;
    int64_t at = 0;
    for (size_t i = 0; i <= p.cuts.size(); ++i) {
      const int64_t next = i < p.cuts.size() ? p.cuts[i] : p.bytes;
      plan.slot_bytes = std::max(plan.slot_bytes, Aligned(next - at));
      at = next;
    }
  }
  int64_t used = 0;
  auto place = [&](uint32_t id, int64_t begin, int64_t bytes) {
    if (plan.batch_begin.empty() || used + Aligned(bytes) > plan.slot_bytes) {
      plan.batch_begin.push_back(static_cast<uint32_t>(plan.entries.size()));
      used = 0;
    }
    plan.entries.push_back({id, begin, bytes, used});
    used += Aligned(bytes);
  };
  for (const BatchPiece& p : pieces) {
    if (p.bytes <= plan.slot_bytes || p.cuts.empty()) {
      place(p.id, 0, p.bytes);
      continue;
    }
    // Split: from `begin`, the furthest cut (or the end) whose bytes fit in what is left.
    int64_t begin = 0;
    size_t cut = 0;  // The first cut after `begin`.
    while (begin < p.bytes) {
      const int64_t room = plan.batch_begin.empty() ? plan.slot_bytes : plan.slot_bytes - used;
      int64_t end = -1;
      size_t next_cut = cut;
      for (size_t i = cut; i <= p.cuts.size(); ++i) {
        const int64_t at = i < p.cuts.size() ? p.cuts[i] : p.bytes;
        if (Aligned(at - begin) > room) break;
        end = at;
        next_cut = i + 1;
      }
      if (end < 0) {
        // Nothing fits in what is left of a batch that holds something: the part starts the
        // next batch (an empty slot holds every part, see slot_bytes above).
        RESHARD_CHECK(used > 0);
        plan.batch_begin.push_back(static_cast<uint32_t>(plan.entries.size()));
        used = 0;
        continue;
      }
      place(p.id, begin, end - begin);
      begin = end;
      cut = next_cut;
    }
  }
  plan.batch_begin.push_back(static_cast<uint32_t>(plan.entries.size()));
  // A rank that sends less than the budget pins less: slots as large as the largest batch, and
  // no more slots than batches.
  int64_t largest = 0;
  for (int32_t b = 0; b < plan.batches(); ++b) {
    const BatchPlan::Entry& last = plan.entries[plan.batch_begin[b + 1] - 1];
    largest = std::max(largest, last.offset + Aligned(last.bytes));
  }
  plan.slot_bytes = largest;
  plan.slots = std::min(plan.slots, plan.batches());
  return plan;
}

}  // namespace reshard::cuda
