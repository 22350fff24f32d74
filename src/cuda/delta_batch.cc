#include "src/cuda/delta_batch.h"

#include <algorithm>

namespace reshard::cuda {
namespace {

int64_t Aligned(int64_t bytes) {
  return (bytes + kDeltaBatchAlign - 1) / kDeltaBatchAlign * kDeltaBatchAlign;
}

}  // namespace

DeltaBatchPlan PlanDeltaBatches(const std::vector<DeltaBatchPiece>& pieces, int64_t budget_bytes,
                                int32_t slots) {
  DeltaBatchPlan plan;
  plan.slots = std::max<int32_t>(slots, 1);
  if (pieces.empty()) return plan;
  const int64_t share = std::max<int64_t>(budget_bytes / plan.slots, 0);
  plan.slot_bytes = share / kDeltaBatchAlign * kDeltaBatchAlign;
  for (const DeltaBatchPiece& p : pieces) {
    plan.slot_bytes = std::max(plan.slot_bytes, Aligned(p.capacity));
  }
  plan.entries.reserve(pieces.size());
  int64_t used = 0;
  for (const DeltaBatchPiece& p : pieces) {
    const int64_t bytes = Aligned(p.capacity);
    if (plan.batch_begin.empty() || used + bytes > plan.slot_bytes) {
      plan.batch_begin.push_back(static_cast<uint32_t>(plan.entries.size()));
      used = 0;
    }
    plan.entries.push_back({p.id, used, p.capacity});
    used += bytes;
  }
  plan.batch_begin.push_back(static_cast<uint32_t>(plan.entries.size()));
  return plan;
}

}  // namespace reshard::cuda
