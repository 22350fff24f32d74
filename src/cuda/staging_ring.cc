#include "src/cuda/staging_ring.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "src/common/status.h"
#include "src/cuda/pack_index.h"
#include "src/cuda/runtime.h"

#if RESHARD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace reshard::cuda {

absl::StatusOr<std::unique_ptr<StagingRing>> StagingRing::Create(
    int32_t slots, int64_t slot_bytes, absl::Span<const PackBatch> batches, bool device_memory) {
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
  if (!DevicesEmulatedOnHost()) return CreateOnDevice(slots, slot_bytes, batches, device_memory);
  std::unique_ptr<StagingRing> ring(new StagingRing());
  ring->emulated_ = true;
  ring->on_device_ = device_memory;
  ring->host_batches_.assign(batches.begin(), batches.end());
  ring->host_slots_.assign(static_cast<size_t>(std::max<int64_t>(slots * slot_bytes, 1)), 0);
  ring->host_ = ring->host_slots_.data();
  ring->slots_ = slots;
  ring->slot_bytes_ = slot_bytes;
  return ring;
}

StagingRing::~StagingRing() {
  if (!emulated_) DestroyOnDevice();
}

absl::Status StagingRing::Pack(int32_t batch, int32_t slot, const void* strided) {
  const size_t batches = emulated_ ? host_batches_.size() : batches_->size();
  if (batch < 0 || static_cast<size_t>(batch) >= batches || slot < 0 || slot >= slots_) {
    return absl::InvalidArgumentError(absl::StrCat("staging ring: batch ", batch, " of ", batches,
                                                   " into slot ", slot, " of ", slots_));
  }
  if (!emulated_) return PackOnDevice(batch, slot, strided);
  PackOnHost(slot);  // A pack still pending in the slot ran before this one, as on a stream.
  pending_[slot] = static_cast<const uint8_t*>(strided);
  pending_batch_[slot] = batch;
  return absl::OkStatus();
}

absl::StatusOr<bool> StagingRing::SlotDone(int32_t slot) {
  if (slot < 0 || slot >= slots_) {
    return absl::InvalidArgumentError(absl::StrCat("staging ring: slot ", slot, " of ", slots_));
  }
  if (!emulated_) return SlotDoneOnDevice(slot);
  if (pending_[slot] == nullptr) return true;
  PackOnHost(slot);
  return false;  // It ran now: done at the next question.
}

void StagingRing::PackOnHost(int32_t slot) {
  const uint8_t* strided = pending_[slot];
  if (strided == nullptr) return;
  pending_[slot] = nullptr;
  cuda::PackOnHost(host_batches_[static_cast<size_t>(pending_batch_[slot])], strided,
                   slot_bytes_ > 0 ? host_ + slot * slot_bytes_ : host_);
}

#if RESHARD_HAVE_CUDA

bool PackKernelsBuilt() { return true; }

absl::StatusOr<std::unique_ptr<StagingRing>> StagingRing::CreateOnDevice(
    int32_t slots, int64_t slot_bytes, absl::Span<const PackBatch> batches, bool device_memory) {
  std::unique_ptr<StagingRing> ring(new StagingRing());
  RESHARD_ASSIGN_OR_RETURN(ring->batches_, DevicePackBatches::Create(batches));
  ring->slots_ = slots;
  ring->slot_bytes_ = slot_bytes;
  cudaError_t err = cudaSuccess;
  if (device_memory) {
    void* device = nullptr;
    err = cudaMalloc(&device, static_cast<size_t>(std::max<int64_t>(slots * slot_bytes, 1)));
    if (err != cudaSuccess) return CudaError(err, "cudaMalloc(staging ring)");
    ring->on_device_ = true;
    ring->host_ = ring->device_ = static_cast<uint8_t*>(device);
  } else {
    void* host = nullptr;
    err = cudaHostAlloc(&host, static_cast<size_t>(std::max<int64_t>(slots * slot_bytes, 1)),
                        cudaHostAllocPortable | cudaHostAllocMapped);
    if (err != cudaSuccess) return CudaError(err, "cudaHostAlloc(staging ring)");
    ring->host_ = static_cast<uint8_t*>(host);
    void* device = nullptr;
    err = cudaHostGetDevicePointer(&device, host, 0);
    if (err != cudaSuccess) return CudaError(err, "cudaHostGetDevicePointer(staging ring)");
    ring->device_ = static_cast<uint8_t*>(device);
  }
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

void StagingRing::DestroyOnDevice() {
  if (stream_ != nullptr) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
  for (void* e : events_) {
    if (e != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  }
  if (on_device_) {
    if (device_ != nullptr) cudaFree(device_);
  } else if (host_ != nullptr) {
    cudaFreeHost(host_);
  }
}

absl::Status StagingRing::PackOnDevice(int32_t batch, int32_t slot, const void* strided) {
  RESHARD_RETURN_IF_ERROR(
      batches_->Pack(static_cast<size_t>(batch), strided, device_ + slot * slot_bytes_, stream_));
  const cudaError_t err =
      cudaEventRecord(static_cast<cudaEvent_t>(events_[slot]), static_cast<cudaStream_t>(stream_));
  if (err != cudaSuccess) return CudaError(err, "cudaEventRecord(staging ring)");
  return absl::OkStatus();
}

absl::StatusOr<bool> StagingRing::SlotDoneOnDevice(int32_t slot) {
  return QueryEvent(events_[slot], "cudaEventQuery(staging ring)");
}

#else  // No kernels: CreateOnDevice says so; nothing else of the device's side is reachable.

bool PackKernelsBuilt() { return false; }

absl::StatusOr<std::unique_ptr<StagingRing>> StagingRing::CreateOnDevice(
    int32_t, int64_t, absl::Span<const PackBatch>, bool) {
  return absl::FailedPreconditionError(
      "the staging ring needs the CUDA pack kernels, which this build does not have");
}
void StagingRing::DestroyOnDevice() {}
absl::Status StagingRing::PackOnDevice(int32_t, int32_t, const void*) {
  return absl::FailedPreconditionError("this build has no CUDA pack kernels");
}
absl::StatusOr<bool> StagingRing::SlotDoneOnDevice(int32_t) {
  return absl::FailedPreconditionError("this build has no CUDA pack kernels");
}

#endif

}  // namespace reshard::cuda
