// Glue between the public API (src/api/reshard/) and the layers below. Not installed.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "reshard/communicator.h"
#include "reshard/spec.h"
#include "src/rendezvous/store.h"
#include "src/plan/plan.h"
#include "src/plan/spec.h"

namespace reshard {

class Communicator::Impl {
 public:
  virtual ~Impl() = default;
  int rank = 0;
  int world_size = 0;
  absl::Duration timeout = absl::Seconds(30);
  std::string description;
  // Next default handle name ("h<N>").
  int64_t NextHandleNumber() { return next_handle_.fetch_add(1); }
  virtual rendezvous::Store& store() = 0;

 private:
  std::atomic<int64_t> next_handle_{0};
};

namespace internal {

plan::RefitSpec ToPlanSpec(const RefitSpec& spec);

// The source and destination buffers `rank` holds under `plan` (staging excluded), with the
// tensors living in each.
std::vector<BufferRequirement> Requirements(const plan::Plan& plan, int32_t rank);

}  // namespace internal
}  // namespace reshard
