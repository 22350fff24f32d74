#include "src/cuda/runtime.h"

#include "absl/strings/str_cat.h"
#include "src/common/status.h"

#if RESHARD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace reshard::cuda {

#if RESHARD_HAVE_CUDA

absl::Status CudaError(int err, const char* call) {
  return absl::InternalError(
      absl::StrCat(call, ": ", cudaGetErrorString(static_cast<cudaError_t>(err))));
}

bool BuiltWithCuda() { return true; }

int CudaDeviceCount(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why != nullptr) {
      *why = absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorString(err), " (error ",
                          static_cast<int>(err), ")");
    }
    cudaGetLastError();  // Clear the error so later runtime calls start clean.
    return 0;
  }
  if (count == 0 && why != nullptr) *why = "cudaGetDeviceCount reports no devices";
  return count;
}

absl::StatusOr<void*> AllocPinned(size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t err = cudaHostAlloc(&ptr, bytes == 0 ? 1 : bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) return CudaError(err, "cudaHostAlloc");
  return ptr;
}

void FreePinned(void* ptr) {
  if (ptr != nullptr) cudaFreeHost(ptr);
}

namespace {
// This thread's copy stream (created on first use).
absl::StatusOr<cudaStream_t> CopyStream() {
  static thread_local cudaStream_t stream = nullptr;
  if (stream == nullptr) {
    const cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) return CudaError(err, "cudaStreamCreateWithFlags");
  }
  return stream;
}
}  // namespace

absl::StatusOr<bool> QueryEvent(void* event, const char* call) {
  const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    cudaGetLastError();  // Not ready is not an error: keep later calls clean.
    return false;
  }
  return CudaError(err, call);
}

namespace {
// CudaCopy2D's copies, enqueued on `stream` without waiting.
absl::Status EnqueueCopy2D(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                           int64_t width, int64_t rows, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  if (rows == 1) {
    err = cudaMemcpyAsync(dst, src, static_cast<size_t>(width), cudaMemcpyDefault, stream);
    if (err != cudaSuccess) return CudaError(err, "cudaMemcpyAsync");
  } else if (dst_pitch >= width && src_pitch >= width) {
    err = cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_pitch), src,
                            static_cast<size_t>(src_pitch), static_cast<size_t>(width),
                            static_cast<size_t>(rows), cudaMemcpyDefault, stream);
    if (err != cudaSuccess) return CudaError(err, "cudaMemcpy2DAsync");
  } else {
    for (int64_t i = 0; i < rows; ++i) {
      err = cudaMemcpyAsync(static_cast<char*>(dst) + i * dst_pitch,
                            static_cast<const char*>(src) + i * src_pitch,
                            static_cast<size_t>(width), cudaMemcpyDefault, stream);
      if (err != cudaSuccess) return CudaError(err, "cudaMemcpyAsync");
    }
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status CudaCopy(void* dst, const void* src, size_t bytes) {
  return CudaCopy2D(dst, 0, src, 0, static_cast<int64_t>(bytes), 1);
}

absl::Status CudaCopy2D(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                        int64_t width, int64_t rows) {
  if (width <= 0 || rows <= 0) return absl::OkStatus();
  absl::StatusOr<cudaStream_t> stream = CopyStream();
  if (!stream.ok()) return stream.status();
  RESHARD_RETURN_IF_ERROR(EnqueueCopy2D(dst, dst_pitch, src, src_pitch, width, rows, *stream));
  const cudaError_t err = cudaStreamSynchronize(*stream);
  if (err != cudaSuccess) return CudaError(err, "cudaStreamSynchronize");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CopyQueue>> CopyQueue::Create() {
  std::unique_ptr<CopyQueue> q(new CopyQueue());
  cudaStream_t stream = nullptr;
  const cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) return CudaError(err, "cudaStreamCreateWithFlags(copy queue)");
  q->stream_ = stream;
  return q;
}

CopyQueue::~CopyQueue() {
  if (stream_ != nullptr) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

absl::Status CopyQueue::Copy2D(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                               int64_t width, int64_t rows) {
  if (width <= 0 || rows <= 0) return absl::OkStatus();
  return EnqueueCopy2D(dst, dst_pitch, src, src_pitch, width, rows,
                       static_cast<cudaStream_t>(stream_));
}

absl::StatusOr<int32_t> CopyQueue::Record() {
  if (free_.empty()) {
    cudaEvent_t e = nullptr;
    const cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (err != cudaSuccess) return CudaError(err, "cudaEventCreateWithFlags(copy queue)");
    events_.push_back(e);
    free_.push_back(static_cast<int32_t>(events_.size()) - 1);
  }
  const int32_t id = free_.back();
  const cudaError_t err =
      cudaEventRecord(static_cast<cudaEvent_t>(events_[id]), static_cast<cudaStream_t>(stream_));
  if (err != cudaSuccess) return CudaError(err, "cudaEventRecord(copy queue)");
  free_.pop_back();
  return id;
}

absl::StatusOr<bool> CopyQueue::Done(int32_t id) {
  return QueryEvent(events_[id], "cudaEventQuery(copy queue)");
}

#else  // !RESHARD_HAVE_CUDA

namespace {
absl::Status NoCuda() {
  return absl::FailedPreconditionError(
      "device memory needs CUDA, and reshard was built without it");
}
}  // namespace

bool BuiltWithCuda() { return false; }
int CudaDeviceCount(std::string* why) {
  if (why != nullptr) *why = "reshard was built without CUDA";
  return 0;
}
absl::StatusOr<void*> AllocPinned(size_t) { return NoCuda(); }
void FreePinned(void*) {}
absl::Status CudaCopy(void*, const void*, size_t) { return NoCuda(); }
absl::Status CudaCopy2D(void*, int64_t, const void*, int64_t, int64_t, int64_t) {
  return NoCuda();
}
absl::StatusOr<std::unique_ptr<CopyQueue>> CopyQueue::Create() { return NoCuda(); }
CopyQueue::~CopyQueue() = default;
absl::Status CopyQueue::Copy2D(void*, int64_t, const void*, int64_t, int64_t, int64_t) {
  return NoCuda();
}
absl::StatusOr<int32_t> CopyQueue::Record() { return NoCuda(); }
absl::StatusOr<bool> CopyQueue::Done(int32_t) { return NoCuda(); }

#endif

}  // namespace reshard::cuda
