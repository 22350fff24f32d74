#include "src/cuda/runtime.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "src/common/status.h"

#if RESHARD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace reshard::cuda {

namespace {
// DevicesEmulatedOnHost (tests).
std::atomic<bool> g_emulated{false};
std::atomic<bool> g_emulated_registered{false};

void HostCopy2D(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch, int64_t width,
                int64_t rows) {
  for (int64_t i = 0; i < rows; ++i) {
    std::memcpy(static_cast<char*>(dst) + i * dst_pitch,
                static_cast<const char*>(src) + i * src_pitch, static_cast<size_t>(width));
  }
}
}  // namespace

#if RESHARD_HAVE_CUDA

absl::Status CudaError(int err, const char* call) {
  return absl::InternalError(
      absl::StrCat(call, ": ", cudaGetErrorString(static_cast<cudaError_t>(err))));
}

bool BuiltWithCuda() { return true; }

static int DeviceCount(std::string* why) {
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

static absl::StatusOr<void*> DeviceAllocPinned(size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t err = cudaHostAlloc(&ptr, bytes == 0 ? 1 : bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) return CudaError(err, "cudaHostAlloc");
  return ptr;
}

static void DeviceFreePinned(void* ptr) {
  if (ptr != nullptr) cudaFreeHost(ptr);
}

static absl::StatusOr<void*> DeviceAllocMappedPinned(size_t bytes, void** device) {
  void* ptr = nullptr;
  cudaError_t err =
      cudaHostAlloc(&ptr, bytes == 0 ? 1 : bytes, cudaHostAllocPortable | cudaHostAllocMapped);
  if (err != cudaSuccess) return CudaError(err, "cudaHostAlloc(mapped)");
  err = cudaHostGetDevicePointer(device, ptr, 0);
  if (err != cudaSuccess) {
    cudaFreeHost(ptr);
    return CudaError(err, "cudaHostGetDevicePointer");
  }
  return ptr;
}

static absl::StatusOr<void*> DeviceAllocDevice(size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t err = cudaMalloc(&ptr, bytes == 0 ? 1 : bytes);
  if (err != cudaSuccess) return CudaError(err, "cudaMalloc");
  return ptr;
}

static void DeviceFreeDevice(void* ptr) {
  if (ptr != nullptr) cudaFree(ptr);
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

static absl::Status DeviceCopy2D(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                                 int64_t width, int64_t rows) {
  absl::StatusOr<cudaStream_t> stream = CopyStream();
  if (!stream.ok()) return stream.status();
  RESHARD_RETURN_IF_ERROR(EnqueueCopy2D(dst, dst_pitch, src, src_pitch, width, rows, *stream));
  const cudaError_t err = cudaStreamSynchronize(*stream);
  if (err != cudaSuccess) return CudaError(err, "cudaStreamSynchronize");
  return absl::OkStatus();
}

static absl::Status CreateQueueStream(void** stream_out) {
  cudaStream_t stream = nullptr;
  const cudaError_t err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) return CudaError(err, "cudaStreamCreateWithFlags(copy queue)");
  *stream_out = stream;
  return absl::OkStatus();
}

static void DestroyQueue(void* stream, const std::vector<void*>& events) {
  if (stream != nullptr) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
    cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  }
  for (void* e : events) cudaEventDestroy(static_cast<cudaEvent_t>(e));
}

static absl::Status QueueCopy2D(void* stream, void* dst, int64_t dst_pitch, const void* src,
                                int64_t src_pitch, int64_t width, int64_t rows) {
  return EnqueueCopy2D(dst, dst_pitch, src, src_pitch, width, rows,
                       static_cast<cudaStream_t>(stream));
}

static absl::StatusOr<int32_t> QueueRecord(void* stream, std::vector<void*>& events,
                                           std::vector<int32_t>& free_ids) {
  if (free_ids.empty()) {
    cudaEvent_t e = nullptr;
    const cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (err != cudaSuccess) return CudaError(err, "cudaEventCreateWithFlags(copy queue)");
    events.push_back(e);
    free_ids.push_back(static_cast<int32_t>(events.size()) - 1);
  }
  const int32_t id = free_ids.back();
  const cudaError_t err =
      cudaEventRecord(static_cast<cudaEvent_t>(events[id]), static_cast<cudaStream_t>(stream));
  if (err != cudaSuccess) return CudaError(err, "cudaEventRecord(copy queue)");
  free_ids.pop_back();
  return id;
}

static absl::StatusOr<bool> QueueDone(const std::vector<void*>& events, int32_t id) {
  return QueryEvent(events[id], "cudaEventQuery(copy queue)");
}

#else  // !RESHARD_HAVE_CUDA

namespace {
absl::Status NoCuda() {
  return absl::FailedPreconditionError(
      "device memory needs CUDA, and reshard was built without it");
}
}  // namespace

bool BuiltWithCuda() { return false; }
static int DeviceCount(std::string* why) {
  if (why != nullptr) *why = "reshard was built without CUDA";
  return 0;
}
static absl::StatusOr<void*> DeviceAllocPinned(size_t) { return NoCuda(); }
static absl::StatusOr<void*> DeviceAllocMappedPinned(size_t, void**) { return NoCuda(); }
static void DeviceFreePinned(void*) {}
static absl::StatusOr<void*> DeviceAllocDevice(size_t) { return NoCuda(); }
static void DeviceFreeDevice(void*) {}
static absl::Status DeviceCopy2D(void*, int64_t, const void*, int64_t, int64_t, int64_t) {
  return NoCuda();
}
static absl::Status CreateQueueStream(void**) { return NoCuda(); }
static void DestroyQueue(void*, const std::vector<void*>&) {}
static absl::Status QueueCopy2D(void*, void*, int64_t, const void*, int64_t, int64_t, int64_t) {
  return NoCuda();
}
static absl::StatusOr<int32_t> QueueRecord(void*, std::vector<void*>&, std::vector<int32_t>&) {
  return NoCuda();
}
static absl::StatusOr<bool> QueueDone(const std::vector<void*>&, int32_t) { return NoCuda(); }

#endif

// The public calls: the host emulation (tests), else the device.

void EmulateDevicesOnHost(bool on, bool ucx_registers_them) {
  g_emulated.store(on);
  g_emulated_registered.store(on && ucx_registers_them);
}
bool DevicesEmulatedOnHost() { return g_emulated.load(std::memory_order_relaxed); }
bool EmulatedDeviceMemoryRegistered() {
  return g_emulated_registered.load(std::memory_order_relaxed);
}

int CudaDeviceCount(std::string* why) { return DevicesEmulatedOnHost() ? 1 : DeviceCount(why); }

// Devices emulated on the host: pinned and "device" memory are both zeroed host memory.
static absl::StatusOr<void*> HostAlloc(size_t bytes, const char* call) {
  void* ptr = std::calloc(bytes == 0 ? 1 : bytes, 1);
  if (ptr == nullptr)
    return absl::ResourceExhaustedError(absl::StrCat(call, " (emulated): out of memory"));
  return ptr;
}

absl::StatusOr<void*> AllocPinned(size_t bytes) {
  return DevicesEmulatedOnHost() ? HostAlloc(bytes, "AllocPinned") : DeviceAllocPinned(bytes);
}

absl::StatusOr<void*> AllocMappedPinned(size_t bytes, void** device) {
  if (!DevicesEmulatedOnHost()) return DeviceAllocMappedPinned(bytes, device);
  RESHARD_ASSIGN_OR_RETURN(void* ptr, HostAlloc(bytes, "AllocMappedPinned"));
  *device = ptr;
  return ptr;
}

void FreePinned(void* ptr) { DevicesEmulatedOnHost() ? std::free(ptr) : DeviceFreePinned(ptr); }

absl::StatusOr<void*> AllocDevice(size_t bytes) {
  return DevicesEmulatedOnHost() ? HostAlloc(bytes, "AllocDevice") : DeviceAllocDevice(bytes);
}

void FreeDevice(void* ptr) { DevicesEmulatedOnHost() ? std::free(ptr) : DeviceFreeDevice(ptr); }

absl::Status CudaCopy(void* dst, const void* src, size_t bytes) {
  return CudaCopy2D(dst, 0, src, 0, static_cast<int64_t>(bytes), 1);
}

absl::Status CudaCopy2D(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                        int64_t width, int64_t rows) {
  if (width <= 0 || rows <= 0) return absl::OkStatus();
  if (!DevicesEmulatedOnHost()) return DeviceCopy2D(dst, dst_pitch, src, src_pitch, width, rows);
  HostCopy2D(dst, dst_pitch, src, src_pitch, width, rows);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CopyQueue>> CopyQueue::Create() {
  std::unique_ptr<CopyQueue> q(new CopyQueue());
  q->emulated_ = DevicesEmulatedOnHost();
  if (!q->emulated_) RESHARD_RETURN_IF_ERROR(CreateQueueStream(&q->stream_));
  return q;
}

CopyQueue::~CopyQueue() {
  if (!emulated_) DestroyQueue(stream_, events_);
}

absl::Status CopyQueue::Copy2D(void* dst, int64_t dst_pitch, const void* src, int64_t src_pitch,
                               int64_t width, int64_t rows) {
  if (width <= 0 || rows <= 0) return absl::OkStatus();
  if (!emulated_) return QueueCopy2D(stream_, dst, dst_pitch, src, src_pitch, width, rows);
  host_copies_.push_back(HostCopy{dst, dst_pitch, src, src_pitch, width, rows});
  return absl::OkStatus();
}

void CopyQueue::EnqueueOnHost(HostWork work, const void* context, int64_t index, const void* src,
                              void* dst) {
  RESHARD_CHECK(emulated_);
  host_copies_.push_back(HostCopy{dst, 0, src, 0, index, 0, work, context});
}

absl::StatusOr<int32_t> CopyQueue::Record() {
  if (!emulated_) return QueueRecord(stream_, events_, free_);
  if (free_.empty()) {
    host_event_end_.push_back(0);
    host_event_asked_.push_back(0);
    free_.push_back(static_cast<int32_t>(host_event_end_.size()) - 1);
  }
  const int32_t id = free_.back();
  free_.pop_back();
  host_event_end_[id] = host_base_ + static_cast<int64_t>(host_copies_.size());
  host_event_asked_[id] = 0;
  return id;
}

absl::StatusOr<bool> CopyQueue::Done(int32_t id) {
  if (!emulated_) return QueueDone(events_, id);
  if (host_event_asked_[id] != 0) return true;
  // The copies before the event run now, and the event completes at the next question.
  RunHostCopies(host_event_end_[id]);
  host_event_asked_[id] = 1;
  return false;
}

void CopyQueue::RunHostCopies(int64_t end) {
  // In order, as a stream runs them; copies already run are dropped.
  const int64_t run = std::max<int64_t>(0, end - host_base_);
  for (int64_t i = 0; i < run; ++i) {
    const HostCopy& c = host_copies_[i];
    if (c.work != nullptr) {
      c.work(c.context, c.width, c.src, c.dst);
    } else {
      HostCopy2D(c.dst, c.dst_pitch, c.src, c.src_pitch, c.width, c.rows);
    }
  }
  host_copies_.erase(host_copies_.begin(), host_copies_.begin() + run);
  host_base_ += run;
}

}  // namespace reshard::cuda
