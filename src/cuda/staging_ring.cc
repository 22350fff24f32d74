#include "src/cuda/staging_ring.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "src/common/status.h"

#if RESHARD_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "src/cuda/runtime.h"
#endif

namespace reshard::cuda {

#if RESHARD_HAVE_CUDA

bool PackKernelsBuilt() { return true; }

absl::StatusOr<std::unique_ptr<StagingRing>> StagingRing::Create(
    int32_t slots, int64_t slot_bytes, absl::Span<const PackBatch> batches) {
  if (slots < 1 || slots > kMaxSlots || slot_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat("staging ring: ", slots, " slots of ",
                                                   slot_bytes, " bytes (1 to ", kMaxSlots,
                                                   " slots, no negative size)"));
  }
  for (size_t i = 0; i < batches.size(); ++i) {
    if (batches[i].packed_end > slot_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("staging ring: batch ", i, " needs ",
                                                     batches[i].packed_end, " bytes, a slot holds ",
                                                     slot_bytes));
    }
  }
  std::unique_ptr<StagingRing> ring(new StagingRing());
  RESHARD_ASSIGN_OR_RETURN(ring->batches_, DevicePackBatches::Create(batches));
  void* host = nullptr;
  cudaError_t err =
      cudaHostAlloc(&host, static_cast<size_t>(std::max<int64_t>(slots * slot_bytes, 1)),
                    cudaHostAllocPortable | cudaHostAllocMapped);
  if (err != cudaSuccess) return CudaError(err, "cudaHostAlloc(staging ring)");
  ring->host_ = static_cast<uint8_t*>(host);
  ring->slots_ = slots;
  ring->slot_bytes_ = slot_bytes;
  void* device = nullptr;
  err = cudaHostGetDevicePointer(&device, host, 0);
  if (err != cudaSuccess) return CudaError(err, "cudaHostGetDevicePointer(staging ring)");
  ring->device_ = static_cast<uint8_t*>(device);
  cudaStream_t stream = nullptr;
  err = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (err != cudaSuccess) return CudaError(err, "cudaStreamCreateWithFlags(staging ring)");
  ring->stream_ = stream;
  for (int32_t i = 0; i < slots; ++i) {
    cudaEvent_t e = nullptr;
    err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
    if (err != cudaSuccess) return CudaError(err, "cudaEventCreateWithFlags(staging ring)");
    ring->events_[i] = e;
  }
  return ring;
}

StagingRing::~StagingRing() {
  if (stream_ != nullptr) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
  for (void* e : events_) {
    if (e != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
  if (host_ != nullptr) cudaFreeHost(host_);
}

absl::Status StagingRing::Pack(int32_t batch, int32_t slot, const void* strided) {
  if (batch < 0 || static_cast<size_t>(batch) >= batches_->size() || slot < 0 || slot >= slots_) {
    return absl::InvalidArgumentError(absl::StrCat("staging ring: batch ", batch, " of ",
                                                   batches_->size(), " into slot ", slot, " of ",
                                                   slots_));
  }
  RESHARD_RETURN_IF_ERROR(
      batches_->Pack(static_cast<size_t>(batch), strided, device_ + slot * slot_bytes_, stream_));
  const cudaError_t err =
      cudaEventRecord(static_cast<cudaEvent_t>(events_[slot]), static_cast<cudaStream_t>(stream_));
  if (err != cudaSuccess) return CudaError(err, "cudaEventRecord(staging ring)");
  return absl::OkStatus();
}

absl::StatusOr<bool> StagingRing::SlotDone(int32_t slot) {
  if (slot < 0 || slot >= slots_) {
    return absl::InvalidArgumentError(absl::StrCat("staging ring: slot ", slot, " of ", slots_));
  }
  return QueryEvent(events_[slot], "cudaEventQuery(staging ring)");
}

#else  // No CUDA: Create says so; nothing else is reachable.

bool PackKernelsBuilt() { return false; }

absl::StatusOr<std::unique_ptr<StagingRing>> StagingRing::Create(int32_t, int64_t,
                                                                 absl::Span<const PackBatch>) {
  return absl::FailedPreconditionError(
      "the staging ring needs the CUDA pack kernels, which this build does not have");
}
StagingRing::~StagingRing() = default;
absl::Status StagingRing::Pack(int32_t, int32_t, const void*) {
  return absl::FailedPreconditionError("this build has no CUDA pack kernels");
}
absl::StatusOr<bool> StagingRing::SlotDone(int32_t) {
  return absl::FailedPreconditionError("this build has no CUDA pack kernels");
}

#endif

}  // namespace reshard::cuda
