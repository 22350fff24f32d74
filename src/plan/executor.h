// The in-process executor: every rank's buffers in one process ("virtual ranks").
//
// It runs a plan region by region with memcpy, the reference the network engine is compared
// against, and verifies every destination element against the strong fill. Also checks that no
// destination byte outside the destination views was written.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "src/plan/plan.h"

namespace reshard::plan {

class LocalWorld {
 public:
  // Allocates every rank's buffers. ResourceExhausted when they would exceed `max_bytes`.
  [[nodiscard]] static absl::StatusOr<LocalWorld> Create(const Plan& plan, int64_t max_bytes);

  uint8_t* buffer(int32_t rank, uint32_t id) { return buffers_[rank][id].data(); }
  int64_t total_bytes() const { return total_bytes_; }

  // Fills every source tile with the fill of `epoch` and poisons every destination buffer.
  void Prepare(uint64_t epoch);
  // Executes every transfer of the plan (fan-outs after the transfer they depend on).
  void Execute();
  // Checks every destination element, then that bytes outside destination views still hold the
  // poison. DataLoss naming tensor, rank and global index on the first failure.
  [[nodiscard]] absl::Status Verify(uint64_t epoch) const;

 private:
  explicit LocalWorld(const Plan& plan) : plan_(&plan) {}
  const Plan* plan_;
  std::vector<std::vector<std::vector<uint8_t>>> buffers_;  // [rank][buffer id]
  int64_t total_bytes_ = 0;
};

// Plans, executes in process and verifies one epoch.
[[nodiscard]] absl::Status VerifyPlanInProcess(const Plan& plan, int64_t max_bytes);

}  // namespace reshard::plan
