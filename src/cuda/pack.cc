#include "src/cuda/pack.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/common/status.h"

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

namespace {

// Enough resident blocks of a kernel (`per_sm` from its occupancy query) to fill the device.
absl::StatusOr<uint64_t> ResidentBlocks(int (*blocks_per_sm)(int*), const char* kernel) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "the ", kernel, " kernel needs a CUDA device: cudaGetDevice: ", cudaGetErrorString(err)));
  }
  int sms = 0;
  err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return CudaError(err, "cudaDeviceGetAttribute(multiprocessor count)");
  int per_sm = 0;
  if (int e = blocks_per_sm(&per_sm); e != 0) {
    return CudaError(e, "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  }
  return static_cast<uint64_t>(std::max(1, sms) * std::max(1, per_sm));
}

// Uploads `entries` into one new device allocation (nullptr when empty).
template <typename Entry>
absl::StatusOr<Entry*> UploadEntries(const std::vector<Entry>& entries, const char* what) {
  if (entries.empty()) return nullptr;
  const size_t bytes = entries.size() * sizeof(Entry);
  void* device = nullptr;
  cudaError_t err = cudaMalloc(&device, bytes);
  if (err != cudaSuccess) return CudaError(err, absl::StrCat("cudaMalloc(", what, ")").c_str());
  err = cudaMemcpy(device, entries.data(), bytes, cudaMemcpyHostToDevice);
  if (err != cudaSuccess) {
    cudaFree(device);
    return CudaError(err, absl::StrCat("cudaMemcpy(", what, ")").c_str());
  }
  return static_cast<Entry*>(device);
}

bool Misaligned(const void* ptr, int64_t align) {
  return reinterpret_cast<uintptr_t>(ptr) % static_cast<uintptr_t>(align) != 0;
}

}  // namespace

absl::StatusOr<std::unique_ptr<DevicePackBatches>> DevicePackBatches::Create(
    absl::Span<const PackBatch> batches) {
  std::unique_ptr<DevicePackBatches> out(new DevicePackBatches());
  RESHARD_ASSIGN_OR_RETURN(out->max_blocks_,
                           ResidentBlocks(internal::PackKernelBlocksPerSm, "pack"));
  std::vector<PackEntry> all;
  for (const PackBatch& b : batches) {
    Slice s;
    s.first = static_cast<int64_t>(all.size());
    s.num_entries = static_cast<int32_t>(b.entries.size());
    s.total_units = b.total_units;
    s.strided_base_align = b.strided_base_align;
    s.packed_base_align = b.packed_base_align;
    out->slices_.push_back(s);
    all.insert(all.end(), b.entries.begin(), b.entries.end());
  }
  RESHARD_ASSIGN_OR_RETURN(out->entries_, UploadEntries(all, "pack batch descriptors"));
  return out;
}

DevicePackBatches::~DevicePackBatches() {
  if (entries_ != nullptr) cudaFree(entries_);
}

absl::Status DevicePackBatches::Launch(size_t i, bool pack, const void* strided, const void* packed,
                                       void* stream) const {
  const Slice& s = slices_.at(i);
  if (Misaligned(strided, s.strided_base_align) || Misaligned(packed, s.packed_base_align)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s of batch %d needs the strided base (%p) %d-byte aligned and the stream (%p) %d-byte "
        "aligned, as the batch was built for",
        pack ? "pack" : "unpack", i, strided, s.strided_base_align, packed, s.packed_base_align));
  }
  const int err = internal::LaunchPackKernel(pack, entries_ + s.first, s.num_entries, s.total_units,
                                             static_cast<uint8_t*>(const_cast<void*>(strided)),
                                             static_cast<uint8_t*>(const_cast<void*>(packed)),
                                             max_blocks_, stream);
  if (err != 0) return CudaError(err, pack ? "pack kernel launch" : "unpack kernel launch");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DeviceCopyBatches>> DeviceCopyBatches::Create(
    absl::Span<const CopyBatch> batches) {
  std::unique_ptr<DeviceCopyBatches> out(new DeviceCopyBatches());
  RESHARD_ASSIGN_OR_RETURN(out->max_blocks_,
                           ResidentBlocks(internal::CopyKernelBlocksPerSm, "copy"));
  std::vector<CopyEntry> all;
  for (const CopyBatch& b : batches) {
    Slice s;
    s.first = static_cast<int64_t>(all.size());
    s.num_entries = static_cast<int32_t>(b.entries.size());
    s.total_units = b.total_units;
    s.from_base_align = b.from_base_align;
    s.to_base_align = b.to_base_align;
    out->slices_.push_back(s);
    all.insert(all.end(), b.entries.begin(), b.entries.end());
  }
  RESHARD_ASSIGN_OR_RETURN(out->entries_, UploadEntries(all, "copy batch descriptors"));
  return out;
}

DeviceCopyBatches::~DeviceCopyBatches() {
  if (entries_ != nullptr) cudaFree(entries_);
}

absl::Status DeviceCopyBatches::Copy(size_t i, const void* from, void* to, void* stream) const {
  const Slice& s = slices_.at(i);
  if (Misaligned(from, s.from_base_align) || Misaligned(to, s.to_base_align)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "copy batch %d needs the source (%p) %d-byte aligned and the destination (%p) %d-byte "
        "aligned, as it was built for",
        i, from, s.from_base_align, to, s.to_base_align));
  }
  const int err = internal::LaunchCopyKernel(entries_ + s.first, s.num_entries, s.total_units,
                                             static_cast<const uint8_t*>(from),
                                             static_cast<uint8_t*>(to), max_blocks_, stream);
  if (err != 0) return CudaError(err, "copy kernel launch");
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

absl::StatusOr<std::unique_ptr<DevicePackBatches>> DevicePackBatches::Create(
    absl::Span<const PackBatch>) {
  return absl::FailedPreconditionError(
      "the pack kernels need CUDA, and reshard was built without it");
}
DevicePackBatches::~DevicePackBatches() = default;
absl::Status DevicePackBatches::Launch(size_t, bool, const void*, const void*, void*) const {
  return absl::FailedPreconditionError(
      "the pack kernels need CUDA, and reshard was built without it");
}

absl::StatusOr<std::unique_ptr<DeviceCopyBatches>> DeviceCopyBatches::Create(
    absl::Span<const CopyBatch>) {
  return absl::FailedPreconditionError(
      "the copy kernel needs CUDA, and reshard was built without it");
}
DeviceCopyBatches::~DeviceCopyBatches() = default;
absl::Status DeviceCopyBatches::Copy(size_t, const void*, void*, void*) const {
  return absl::FailedPreconditionError(
      "the copy kernel needs CUDA, and reshard was built without it");
}

#endif

DevicePackBatch::~DevicePackBatch() { Free(); }

absl::Status DevicePackBatch::Pack(const void* strided, void* packed, void* stream) const {
  return Launch(true, strided, packed, stream);
}

absl::Status DevicePackBatch::Unpack(const void* packed, void* strided, void* stream) const {
  return Launch(false, strided, packed, stream);
}

absl::Status DevicePackBatches::Pack(size_t i, const void* strided, void* packed,
                                     void* stream) const {
  return Launch(i, true, strided, packed, stream);
}

absl::Status DevicePackBatches::Unpack(size_t i, const void* packed, void* strided,
                                       void* stream) const {
  return Launch(i, false, strided, packed, stream);
}

}  // namespace reshard::cuda
