#include "src/api/stream_order.h"

#include <atomic>

#include "src/common/status.h"

namespace reshard::internal {

StreamOrder::~StreamOrder() {
  Release();
  ops_.DestroyEvent(event_);
  ops_.ReleaseFlag(flag_);
}

absl::Status StreamOrder::Gate(void* stream) {
  if (event_ == nullptr) {
    RESHARD_ASSIGN_OR_RETURN(event_, ops_.CreateEvent());
  }
  RESHARD_RETURN_IF_ERROR(ops_.RecordEvent(event_, stream));
  gated_ = true;
  return absl::OkStatus();
}

absl::StatusOr<bool> StreamOrder::Open() {
  if (!gated_) return true;
  RESHARD_ASSIGN_OR_RETURN(const bool done, ops_.EventDone(event_));
  if (done) gated_ = false;
  return done;
}

absl::Status StreamOrder::AddCompletionStream(void* stream) {
  if (flag_ == nullptr) {
    RESHARD_RETURN_IF_ERROR(ops_.Available());
    RESHARD_ASSIGN_OR_RETURN(flag_, ops_.AcquireFlag());
  }
  // The device reads the flag while the host writes it: atomic on the host side.
  std::atomic_ref<uint32_t> flag(*flag_);
  const uint32_t target = waiting_ > 0 ? target_ : flag.load(std::memory_order_relaxed) + 1;
  RESHARD_RETURN_IF_ERROR(ops_.WaitFlag(stream, flag_, target));
  target_ = target;
  ++waiting_;
  return absl::OkStatus();
}

void StreamOrder::Release() {
  if (waiting_ == 0) return;
  // Release: whatever the refit wrote before (as far as the host ordered it) precedes the flag.
  std::atomic_ref<uint32_t>(*flag_).store(target_, std::memory_order_release);
  waiting_ = 0;
}

}  // namespace reshard::internal
