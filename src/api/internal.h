// Glue between the public API (src/api/reshard/) and the layers below. Not installed.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "reshard/communicator.h"
#include "reshard/refit.h"
#include "reshard/spec.h"
#include "src/common/memory.h"
#include "src/net/runtime.h"
#include "src/rendezvous/store.h"
#include "src/plan/plan.h"
#include "src/plan/spec.h"

namespace reshard {

class Communicator::Impl {
 public:
  virtual ~Impl() = default;
  int rank = 0;
  int world_size = 0;
  int local_rank = -1;  // -1: unknown (only FromEnvironment learns it from a launcher).
  absl::Duration timeout = absl::Seconds(30);
  std::string description;
  // Next default handle name ("h<N>").
  int64_t NextHandleNumber() { return next_handle_.fetch_add(1); }
  virtual rendezvous::Store& store() = 0;
  // The UCX runtime (context, worker, active-message routing) every handle of this
  // communicator shares, created with the first handle.
  absl::StatusOr<std::shared_ptr<net::Runtime>> Runtime() {
    std::lock_guard<std::mutex> lock(mu_);
    if (runtime_ == nullptr) {
      absl::StatusOr<std::shared_ptr<net::Runtime>> created = net::Runtime::Create();
      if (!created.ok()) return created.status();
      runtime_ = *std::move(created);
    }
    return runtime_;
  }

 private:
  std::atomic<int64_t> next_handle_{0};
  // std::mutex, not absl::Mutex, which ThreadSanitizer cannot see here (docs/testing.md).
  std::mutex mu_;
  std::shared_ptr<net::Runtime> runtime_;  // guarded by mu_
};

namespace internal {

// The public memory kind below the API (same values, converted once here).
inline common::MemoryKind ToCommon(MemoryKind kind) {
  return kind == MemoryKind::kCuda ? common::MemoryKind::kCuda : common::MemoryKind::kHost;
}

plan::RefitSpec ToPlanSpec(const RefitSpec& spec);

// The source and destination buffers `rank` holds under `plan` (staging excluded), with the
// tensors living in each.
std::vector<BufferRequirement> Requirements(const plan::RefitSpec& spec,
                                            const plan::BufferTable& table, int32_t rank);

}  // namespace internal
}  // namespace reshard
