// The few CUDA runtime calls the layers above need (device count, pinned host memory, copies),
// written once for net (staging device memory through pinned host buffers when UCX cannot
// register it: Debian's UCX 1.13 has no CUDA support), nvlink (backend viability) and the CLI.
//
// Compiled against the CUDA runtime (CUDA::cudart, never libcuda) when the build found CUDA
// (RESHARD_HAVE_CUDA); otherwise every call returns FailedPrecondition. Callers check
// CudaDeviceCount() at run time: no driver or no device reads as 0 devices, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace reshard::cuda {

// Whether this build links the CUDA runtime.
bool BuiltWithCuda();

// Tests only: "device memory" is host memory. Then, in every build, CudaDeviceCount() is 1,
// AllocPinned is plain host memory, CudaCopy and CudaCopy2D are memcpy, and a CopyQueue runs
// its copies only when Done is first asked about an event after them, which then answers "not
// yet" once (so a caller that changes a source before the event completed, or never polls, gets
// wrong bytes, as on a device), and the staging ring (staging_ring.h) packs its slots on the host
// with the kernels' arithmetic, as late. The refit engine then stages CUDA buffers (UCX cannot
// register them; no delta kernels exist), so its staging paths run on machines without a GPU
// (tests/net/staged_emulation_test.cc, bench/put_bench --emulate-devices). With
// `ucx_registers_them`, the emulated devices stand for a CUDA-aware UCX instead
// (EmulatedDeviceMemoryRegistered(): net::Runtime::supports_cuda_memory() is true and the engine
// registers "device" buffers with UCX as the host memory they are), so the engine's paths for
// registered device memory run on such machines too. Set once, before any other call of this
// header; never by the library itself.
void EmulateDevicesOnHost(bool on, bool ucx_registers_them = false);
bool DevicesEmulatedOnHost();
bool EmulatedDeviceMemoryRegistered();

// A failed CUDA runtime call as a Status: Internal "<call>: <cudaGetErrorString(err)>". `err` is
// a cudaError_t (an int here, so this header needs no CUDA header). Defined in builds with CUDA
// only, for the code that calls the runtime itself (pack.cc, quantize.cc).
absl::Status CudaError(int err, const char* call);
// Without waiting, whether the work before `event` (a cudaEvent_t) finished: cudaEventQuery,
// its "not ready" cleared from the thread's last error; Internal naming `call` when the work
// failed. Defined in builds with CUDA only (the pipelines of delta.cc, staging_ring.cc, here).
absl::StatusOr<bool> QueryEvent(void* event, const char* call);

// Number of usable CUDA devices; 0 when the build has no CUDA, there is no driver, or the
// runtime reports an error (`why`, when given, receives the reason).
int CudaDeviceCount(std::string* why = nullptr);

// Page-locked host memory (cudaHostAlloc); FailedPrecondition without CUDA.
[[nodiscard]] absl::StatusOr<void*> AllocPinned(size_t bytes);
// The same, mapped into the current device's address space (cudaHostAllocMapped): `*device`
// receives the address kernels read and write it at (cudaHostGetDevicePointer; the same host
// memory while devices are emulated). Freed with FreePinned.
[[nodiscard]] absl::StatusOr<void*> AllocMappedPinned(size_t bytes, void** device);
void FreePinned(void* ptr);
// Device memory on the current device (cudaMalloc; calloc while devices are emulated);
// FailedPrecondition without CUDA, ResourceExhausted or Internal naming the call otherwise.
[[nodiscard]] absl::StatusOr<void*> AllocDevice(size_t bytes);
void FreeDevice(void* ptr);

// A synchronous copy between any two addresses the CUDA runtime understands (host, pinned or
// device; cudaMemcpyAsync on a private stream, then synchronise).
[[nodiscard]] absl::Status CudaCopy(void* dst, const void* src, size_t bytes);
// The same for `rows` pieces of `width` bytes, the i-th from src + i * src_pitch to
// dst + i * dst_pitch: one cudaMemcpy2DAsync (a copy engine walks the rows) when both pitches
// hold a row, else one cudaMemcpyAsync per row; one synchronise either way.
[[nodiscard]] absl::Status CudaCopy2D(void* dst, int64_t dst_pitch, const void* src,
                                      int64_t src_pitch, int64_t width, int64_t rows);

// Asynchronous copies on a private stream, each group of copies followed by an event that is
// polled, never waited for (the engine moves landed pieces of staged destinations to the device
// with it: docs/data-plane.md). Events are recycled. Thread-compatible; runs with the device
// that was current at Create.
class CopyQueue {
 public:
  // FailedPrecondition without CUDA; Internal naming the CUDA call.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<CopyQueue>> Create();
  // Waits for the stream (copies of a failed epoch) before destroying it and the events.
  ~CopyQueue();
  CopyQueue(const CopyQueue&) = delete;
  CopyQueue& operator=(const CopyQueue&) = delete;

  // Enqueues what CudaCopy2D copies (one cudaMemcpy2DAsync when both pitches hold a row, one
  // cudaMemcpyAsync when rows is 1), without waiting. The source must stay unchanged until the
  // event recorded after it completed.
  [[nodiscard]] absl::Status Copy2D(void* dst, int64_t dst_pitch, const void* src,
                                    int64_t src_pitch, int64_t width, int64_t rows);
  // The queue's stream (a cudaStream_t), for kernels launched on it in order with its copies
  // (queued_kernels.h); null while devices are emulated.
  void* stream() const { return stream_; }
  // Devices emulated on the host only: `work(context, index, src, dst)` runs on the host in
  // queue order, when a copy enqueued now would (the emulated kernels of queued_kernels.h).
  using HostWork = void (*)(const void* context, int64_t index, const void* src, void* dst);
  void EnqueueOnHost(HostWork work, const void* context, int64_t index, const void* src, void* dst);
  // Records an event after the copies enqueued so far; returns its id.
  [[nodiscard]] absl::StatusOr<int32_t> Record();
  // Without waiting (cudaEventQuery): true once the copies before event `id` finished; Internal
  // when one failed.
  [[nodiscard]] absl::StatusOr<bool> Done(int32_t id);
  // Event `id` may be recorded again.
  void Release(int32_t id) { free_.push_back(id); }

 private:
  CopyQueue() = default;
  [[maybe_unused]] void* stream_ = nullptr;  // cudaStream_t.
  std::vector<void*> events_;                // cudaEvent_t by id.
  std::vector<int32_t> free_;
  // DevicesEmulatedOnHost(): the copies not yet run (host_copies_[i] is the copy numbered
  // host_base_ + i), and by event id the number of copies before it and whether Done answered.
  struct HostCopy {
    void* dst;
    int64_t dst_pitch;
    const void* src;
    int64_t src_pitch, width, rows;
    HostWork work = nullptr;  // Instead of the copy: work(context, width, src, dst).
    const void* context = nullptr;
  };
  bool emulated_ = false;
  std::vector<HostCopy> host_copies_;
  int64_t host_base_ = 0;
  std::vector<int64_t> host_event_end_;
  std::vector<uint8_t> host_event_asked_;
  void RunHostCopies(int64_t end);
};

}  // namespace reshard::cuda
