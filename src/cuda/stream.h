// The CUDA calls behind stream-ordered refits (RefitHandle::StartOnStream, RecordCompletion),
// behind a small interface so that the refit's state machine (src/api/stream_order.h) runs on
// the CPU against a fake in its unit test, and against the CUDA runtime everywhere else.
//
// Streams are the caller's cudaStream_t values passed as void* (0: the legacy default stream,
// as in CUDA); events and flags belong to the implementation.
//
// Completion flags: 32-bit words in pinned host memory mapped into the device's address space.
// A stream made to wait on a flag (WaitFlag) runs its later work once the host has stored a
// value v with (int32_t)(v - value) >= 0 there: the host writes the word, no host thread waits
// and no kernel spins. Flags are never freed while the process lives, and a flag's value only
// ever grows (cyclically): a wait enqueued long ago on a slow stream can never read freed memory
// or see a smaller value again after its flag was released and reused by another handle.
//
// Thread safety: the real implementation (CudaStreamOps) is thread-safe.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace reshard::cuda {

class StreamOps {
 public:
  virtual ~StreamOps() = default;

  // OK when streams can be ordered in this process: FailedPrecondition naming why not (a build
  // without CUDA, no usable device, a driver without stream memory operations).
  [[nodiscard]] virtual absl::Status Available() = 0;

  // An event to record on caller streams (cudaEventCreateWithFlags(cudaEventDisableTiming)).
  [[nodiscard]] virtual absl::StatusOr<void*> CreateEvent() = 0;
  virtual void DestroyEvent(void* event) = 0;
  // Captures the work queued on `stream` so far (cudaEventRecord). InvalidArgument for a stream
  // the runtime refuses.
  [[nodiscard]] virtual absl::Status RecordEvent(void* event, void* stream) = 0;
  // Without waiting: true once the captured work finished, false while it runs; an error when
  // it failed (cudaEventQuery's error: a kernel before it faulted, say).
  [[nodiscard]] virtual absl::StatusOr<bool> EventDone(void* event) = 0;

  // A completion flag (see above), its value as it stands. ReleaseFlag hands it back for reuse.
  [[nodiscard]] virtual absl::StatusOr<uint32_t*> AcquireFlag() = 0;
  virtual void ReleaseFlag(uint32_t* flag) = 0;
  // Enqueues on `stream` a wait until (int32_t)(*flag - value) >= 0; work queued on `stream`
  // after it runs only then (and sees device memory written before the host stored the value,
  // remote writes by NICs included where the device can flush them).
  [[nodiscard]] virtual absl::Status WaitFlag(void* stream, uint32_t* flag, uint32_t value) = 0;
};

// The process's implementation over the CUDA runtime (CUDA::cudart; the driver's
// cuStreamWaitValue32 is reached through cudaGetDriverEntryPoint, never by linking libcuda). In
// builds without CUDA every call reports FailedPrecondition.
StreamOps& CudaStreamOps();

}  // namespace reshard::cuda
