#include "src/cuda/stream.h"

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "src/common/status.h"
#include "src/cuda/runtime.h"

#if RESHARD_HAVE_CUDA
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#endif

namespace reshard::cuda {
namespace {

#if RESHARD_HAVE_CUDA

// Why a stream memory operation and not a kernel that spins on the flag: it occupies no SM, and
// it has no spin bound, which would let work behind it run on half-written weights whenever a
// refit outlasted the bound; the host writes the flag on every way a refit ends instead
// (src/api/stream_order.h).
class RealStreamOps final : public StreamOps {
 public:
  absl::Status Available() override {
    std::call_once(probed_, [this] { available_ = Probe(); });
    return available_;
  }

  absl::StatusOr<void*> CreateEvent() override {
    RESHARD_RETURN_IF_ERROR(Available());
    cudaEvent_t event = nullptr;
    const cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (err != cudaSuccess) return CudaError(err, "cudaEventCreateWithFlags");
    return static_cast<void*>(event);
  }

  void DestroyEvent(void* event) override {
    // Safe while work before it is still running: its resources go when that work is done.
    if (event != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }

  absl::Status RecordEvent(void* event, void* stream) override {
    const cudaError_t err =
        cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream));
    if (err == cudaSuccess) return absl::OkStatus();
    cudaGetLastError();  // Not sticky: later calls of this thread start clean.
    return absl::InvalidArgumentError(
        absl::StrCat("cudaEventRecord on the given stream: ", cudaGetErrorString(err),
                     " (is it a live stream of this process's current device?)"));
  }

  absl::StatusOr<bool> EventDone(void* event) override {
    const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (err == cudaSuccess) return true;
    if (err == cudaErrorNotReady) return false;
    return CudaError(err, "cudaEventQuery (the work queued on the stream before the refit)");
  }

  absl::StatusOr<uint32_t*> AcquireFlag() override {
    RESHARD_RETURN_IF_ERROR(Available());
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) {
      // One page of flags at a time, never freed (see the header): a few KiB per process.
      constexpr size_t kPage = 4096;
      void* page = nullptr;
      const cudaError_t err =
          cudaHostAlloc(&page, kPage, cudaHostAllocMapped | cudaHostAllocPortable);
      if (err != cudaSuccess) return CudaError(err, "cudaHostAlloc (completion flags)");
      auto* words = static_cast<uint32_t*>(page);
      for (size_t i = 0; i < kPage / sizeof(uint32_t); ++i) {
        words[i] = 0;
        free_.push_back(&words[i]);
      }
    }
    uint32_t* flag = free_.back();
    free_.pop_back();
    return flag;
  }

  void ReleaseFlag(uint32_t* flag) override {
    if (flag == nullptr) return;
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(flag);
  }

  absl::Status WaitFlag(void* stream, uint32_t* flag, uint32_t value) override {
    void* device_ptr = nullptr;
    cudaError_t err = cudaHostGetDevicePointer(&device_ptr, flag, 0);
    if (err != cudaSuccess) return CudaError(err, "cudaHostGetDevicePointer (completion flag)");
    int device = 0;
    int flush = 0;
    if (cudaGetDevice(&device) == cudaSuccess &&
        cudaDeviceGetAttribute(&flush, cudaDevAttrCanFlushRemoteWrites, device) != cudaSuccess) {
      flush = 0;
    }
    cudaGetLastError();
    unsigned int flags = CU_STREAM_WAIT_VALUE_GEQ;
    if (flush != 0) flags |= CU_STREAM_WAIT_VALUE_FLUSH;
    const CUresult res = wait_value_(
        static_cast<CUstream>(stream),
        static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(device_ptr)), value, flags);
    if (res == CUDA_SUCCESS) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "cuStreamWaitValue32 on the given stream failed with CUresult ", static_cast<int>(res),
        " (is it a live stream of this process's current device?)"));
  }

 private:
  absl::Status Probe() {
    std::string why;
    if (CudaDeviceCount(&why) == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("ordering a refit with CUDA streams needs a usable GPU: ", why));
    }
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000,
                                                             cudaEnableDefault, &found);
#else
    const cudaError_t err =
        cudaGetDriverEntryPoint("cuStreamWaitValue32", &fn, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
      cudaGetLastError();
      return absl::FailedPreconditionError(absl::StrCat(
          "ordering a refit with CUDA streams needs the driver's cuStreamWaitValue32, which "
          "cudaGetDriverEntryPoint did not find (",
          err != cudaSuccess ? cudaGetErrorString(err) : "symbol not found", ")"));
    }
    wait_value_ = reinterpret_cast<PFN_cuStreamWaitValue32_v11070>(fn);
    return absl::OkStatus();
  }

  std::once_flag probed_;
  absl::Status available_;
  PFN_cuStreamWaitValue32_v11070 wait_value_ = nullptr;
  std::mutex mu_;
  std::vector<uint32_t*> free_;  // guarded by mu_
};

#else  // !RESHARD_HAVE_CUDA

class RealStreamOps final : public StreamOps {
 public:
  absl::Status Available() override { return NoCuda(); }
  absl::StatusOr<void*> CreateEvent() override { return NoCuda(); }
  void DestroyEvent(void*) override {}
  absl::Status RecordEvent(void*, void*) override { return NoCuda(); }
  absl::StatusOr<bool> EventDone(void*) override { return NoCuda(); }
  absl::StatusOr<uint32_t*> AcquireFlag() override { return NoCuda(); }
  void ReleaseFlag(uint32_t*) override {}
  absl::Status WaitFlag(void*, uint32_t*, uint32_t) override { return NoCuda(); }

 private:
  static absl::Status NoCuda() {
    return absl::FailedPreconditionError(
        "ordering a refit with CUDA streams needs CUDA, and reshard was built without it");
  }
};

#endif

}  // namespace

StreamOps& CudaStreamOps() {
  static RealStreamOps* ops = new RealStreamOps();  // Never destroyed: flags outlive handles.
  return *ops;
}

}  // namespace reshard::cuda
