// A scripted fake of the CUDA calls behind stream-ordered refits (cuda::StreamOps), for the
// unit tests of src/api/stream_order.h and for forked ranks that stand in for a GPU process
// (installed with internal::SetStreamOpsForTesting). Not thread-safe; one per process or test.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/cuda/stream.h"

namespace reshard::testing {

// What a CUDA stream would do, scripted: the event recorded on a stream completes after
// `polls_before_done` queries, running `on_done` first (the kernel that writes the sources).
class FakeStreamOps final : public cuda::StreamOps {
 public:
  static inline void* const kRefused = reinterpret_cast<void*>(0xbad);

  absl::Status available;
  int polls_before_done = 0;
  std::function<void()> on_done;
  absl::Status event_error;
  int events_created = 0;
  int events_destroyed = 0;
  int records = 0;
  int queries = 0;
  uint32_t flag_word = 0;
  bool flag_acquired = false;
  bool flag_released = false;
  std::vector<std::pair<void*, uint32_t>> waits;  // WaitFlag's streams and values.

  // Whether the i-th wait's stream runs on (the device's cyclic comparison).
  bool Released(size_t i) const {
    return static_cast<int32_t>(flag_word - waits.at(i).second) >= 0;
  }

  absl::Status Available() override { return available; }
  absl::StatusOr<void*> CreateEvent() override {
    if (!available.ok()) return available;
    ++events_created;
    return static_cast<void*>(&events_created);
  }
  void DestroyEvent(void* event) override {
    if (event != nullptr) ++events_destroyed;
  }
  absl::Status RecordEvent(void*, void* stream) override {
    if (stream == kRefused) return absl::InvalidArgumentError("fake: invalid resource handle");
    ++records;
    pending_ = true;
    left_ = polls_before_done;
    return absl::OkStatus();
  }
  absl::StatusOr<bool> EventDone(void*) override {
    ++queries;
    if (!event_error.ok()) return event_error;
    if (!pending_) return true;
    if (left_ > 0) {
      --left_;
      return false;
    }
    pending_ = false;
    if (on_done) std::exchange(on_done, nullptr)();
    return true;
  }
  absl::StatusOr<uint32_t*> AcquireFlag() override {
    flag_acquired = true;
    return &flag_word;
  }
  void ReleaseFlag(uint32_t* flag) override {
    if (flag != nullptr) flag_released = flag == &flag_word;
  }
  absl::Status WaitFlag(void* stream, uint32_t*, uint32_t value) override {
    if (stream == kRefused) return absl::InvalidArgumentError("fake: invalid resource handle");
    waits.emplace_back(stream, value);
    return absl::OkStatus();
  }

 private:
  bool pending_ = false;
  int left_ = 0;
};

}  // namespace reshard::testing
