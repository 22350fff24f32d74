// The CUDA-stream ordering of one refit handle (RefitHandle::StartOnStream, RecordCompletion):
// a host-side state machine over cuda::StreamOps, so that it runs against a fake in a CPU unit
// test (tests/api/stream_order_test.cc) and against the CUDA runtime in the library.
//
// Start gate: Gate(stream) records an event on the caller's stream; the refit session polls
// Open() in its progress loop and starts the refit's epoch (grants, staging, quantization, puts,
// local copies, delta encoding) only once the event completed, so nothing reads this rank's
// sources or writes its destinations before the work queued on the stream before Start. Never a
// device-wide synchronise and never a blocking wait: the session's deadline covers the gate.
//
// Completion: AddCompletionStream(stream) enqueues on the stream a wait on this handle's
// completion flag (cuda::StreamOps::WaitFlag) for a value one past the flag's current one;
// Release() stores that value, which lets every such stream run on. The handle calls Release()
// on every way a refit ends: Wait returning (done or failed), a failed Start, Reset(), and
// destruction, so no stream waits forever on a refit that is over. A stream released by a
// failed refit runs its later work on destinations that may be half-written: the failure is
// what Wait returns, and callers must not use the destinations then.
//
// Flags only grow (by one per released refit that had completion streams) and are handed back
// to the ops at destruction, never freed (src/cuda/stream.h says why that is safe).
//
// Thread-compatible, like the handle that owns it.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/cuda/stream.h"

namespace reshard::internal {

class StreamOrder {
 public:
  // `ops` outlives this object.
  explicit StreamOrder(cuda::StreamOps& ops) : ops_(ops) {}
  ~StreamOrder();
  StreamOrder(const StreamOrder&) = delete;
  StreamOrder& operator=(const StreamOrder&) = delete;

  // The next refit starts after the work queued on `stream` so far. On an error (no CUDA, a
  // stream the runtime refuses) nothing changed: the caller must not begin the refit.
  [[nodiscard]] absl::Status Gate(void* stream);
  // The next refit starts at once (Start without a stream).
  void ClearGate() { gated_ = false; }
  // Without waiting: true when the refit may start (no gate, or its work finished; the gate then
  // stays open until the next Gate), false while the stream's work runs; an error when that
  // work failed.
  [[nodiscard]] absl::StatusOr<bool> Open();

  // Makes `stream` wait until the next Release(). Errors leave the refit as it was.
  [[nodiscard]] absl::Status AddCompletionStream(void* stream);
  // The refit ended on this rank: every stream given to AddCompletionStream since the last
  // Release runs on. Idempotent; cheap when there is nothing to release.
  void Release();

  // Completion streams that wait for the next Release().
  int waiting_streams() const { return waiting_; }

 private:
  cuda::StreamOps& ops_;
  void* event_ = nullptr;  // Created at the first Gate.
  bool gated_ = false;
  uint32_t* flag_ = nullptr;  // Acquired at the first AddCompletionStream.
  uint32_t target_ = 0;       // The value Release() stores, while waiting_ > 0.
  int waiting_ = 0;
};

// The CUDA calls of stream-ordered refits: cuda::CudaStreamOps(), unless a unit test set its
// fake. A handle takes them at its first use of a stream and keeps them.
cuda::StreamOps& StreamOpsForHandles();
// For unit tests only: `ops` (null: the real ones) for handles that use a stream from now on;
// returns the previous override.
cuda::StreamOps* SetStreamOpsForTesting(cuda::StreamOps* ops);

}  // namespace reshard::internal
