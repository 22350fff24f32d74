#include "src/cuda/pack.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#if RESHARD_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "src/cuda/pack_kernels.h"
#include "src/cuda/runtime.h"
#endif

namespace reshard::cuda {

#if RESHARD_HAVE_CUDA

absl::StatusOr<std::unique_ptr<DevicePackBatch>> DevicePackBatch::Create(const PackBatch& batch) {
  std::unique_ptr<DevicePackBatch> out(new DevicePackBatch());
  out->num_entries_ = static_cast<int32_t>(batch.entries.size());
  out->total_units_ = batch.total_units;
  out->strided_base_align_ = batch.strided_base_align;
  out->packed_base_align_ = batch.packed_base_align;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) {
    cudaGetLastError();  // Clear the error so later runtime calls start clean.
    return absl::FailedPreconditionError(absl::StrCat(
        "the pack kernels need a CUDA device: cudaGetDevice: ", cudaGetErrorString(err)));
  }
  int sms = 0;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return CudaError(err, "cudaDeviceGetAttribute(multiprocessor count)");
  int per_sm = 0;
  if (int e = internal::PackKernelBlocksPerSm(&per_sm); e != 0) {
    return CudaError(e, "cudaOccupancyMaxActiveBlocksPerMultiprocessor(pack kernel)");
  }
  out->max_blocks_ = static_cast<uint64_t>(std::max(1, sms) * std::max(1, per_sm));
  if (batch.entries.empty()) return out;
  const size_t bytes = batch.entries.size() * sizeof(PackEntry);
  void* entries = nullptr;
  err = cudaMalloc(&entries, bytes);
  if (err != cudaSuccess) return CudaError(err, "cudaMalloc(pack batch descriptors)");
  out->entries_ = static_cast<PackEntry*>(entries);
  err = cudaMemcpy(entries, batch.entries.data(), bytes, cudaMemcpyHostToDevice);
  if (err != cudaSuccess) return CudaError(err, "cudaMemcpy(pack batch descriptors)");
  return out;
}

void DevicePackBatch::Free() {
  if (entries_ != nullptr) cudaFree(entries_);
  entries_ = nullptr;
}

absl::Status DevicePackBatch::Launch(bool pack, const void* strided, const void* packed,
                                     void* stream) const {
  const auto misaligned = [](const void* ptr, int64_t align) {
    return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(align) != 0;
  };
  if (misaligned(strided, strided_base_align_) || misaligned(packed, packed_base_align_)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s needs the strided buffer (%p) %d-byte aligned and the stream (%p) %d-byte aligned, "
        "as its batch was built for",
        pack ? "pack" : "unpack", strided, strided_base_align_, packed, packed_base_align_));
  }
  const int err = internal::LaunchPackKernel(
      pack, entries_, num_entries_, total_units_, static_cast<uint8_t*>(const_cast<void*>(strided)),
      static_cast<uint8_t*>(const_cast<void*>(packed)), max_blocks_, stream);
  if (err != 0) return CudaError(err, pack ? "pack kernel launch" : "unpack kernel launch");
  return absl::OkStatus();
}

#else  // !RESHARD_HAVE_CUDA

absl::StatusOr<std::unique_ptr<DevicePackBatch>> DevicePackBatch::Create(const PackBatch&) {
  return absl::FailedPreconditionError(
      "the pack kernels need CUDA, and reshard was built without it");
}

void DevicePackBatch::Free() {}

absl::Status DevicePackBatch::Launch(bool, const void*, const void*, void*) const {
  return absl::FailedPreconditionError(
      "the pack kernels need CUDA, and reshard was built without it");
}

#endif

DevicePackBatch::~DevicePackBatch() { Free(); }

absl::Status DevicePackBatch::Pack(const void* strided, void* packed, void* stream) const {
  return Launch(true, strided, packed, stream);
}

absl::Status DevicePackBatch::Unpack(const void* packed, void* strided, void* stream) const {
  return Launch(false, strided, packed, stream);
}

}  // namespace reshard::cuda
