#include "src/cuda/queued_kernels.h"

#include <cstdint>

#include "absl/strings/str_format.h"
#include "src/common/status.h"
#include "src/cuda/staging_ring.h"

namespace reshard::cuda {

absl::StatusOr<std::unique_ptr<QueuedKernels>> QueuedKernels::Create(
    absl::Span<const PackBatch> scatters, absl::Span<const CopyBatch> copies) {
  std::unique_ptr<QueuedKernels> k(new QueuedKernels());
  if (DevicesEmulatedOnHost()) {
    k->emulated_ = true;
    k->host_scatters_.assign(scatters.begin(), scatters.end());
    k->host_copies_.assign(copies.begin(), copies.end());
    return k;
  }
  if (!PackKernelsBuilt()) {
    return absl::FailedPreconditionError("this build has no pack kernels (CUDA was not found)");
  }
  if (!scatters.empty()) {
    RESHARD_ASSIGN_OR_RETURN(k->device_scatters_, DevicePackBatches::Create(scatters));
  }
  if (!copies.empty()) {
    RESHARD_ASSIGN_OR_RETURN(k->device_copies_, DeviceCopyBatches::Create(copies));
  }
  k->num_scatters_ = scatters.size();
  k->num_copies_ = copies.size();
  return k;
}

namespace {
absl::Status OutOfRange(const char* what, size_t i, size_t n) {
  return absl::InvalidArgumentError(absl::StrFormat("%s batch %d of %d", what, i, n));
}
}  // namespace

absl::Status QueuedKernels::Unpack(CopyQueue& queue, size_t i, const void* packed,
                                   void* strided) const {
  if (i >= scatters()) return OutOfRange("scatter", i, scatters());
  if (!emulated_) return device_scatters_->Unpack(i, packed, strided, queue.stream());
  queue.EnqueueOnHost(
      [](const void* context, int64_t index, const void* src, void* dst) {
        const auto* self = static_cast<const QueuedKernels*>(context);
        UnpackOnHost(self->host_scatters_[static_cast<size_t>(index)],
                     static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst));
      },
      this, static_cast<int64_t>(i), packed, strided);
  return absl::OkStatus();
}

absl::Status QueuedKernels::Copy(CopyQueue& queue, size_t i, const void* from, void* to) const {
  if (i >= copies()) return OutOfRange("copy", i, copies());
  if (!emulated_) return device_copies_->Copy(i, from, to, queue.stream());
  queue.EnqueueOnHost(
      [](const void* context, int64_t index, const void* src, void* dst) {
        const auto* self = static_cast<const QueuedKernels*>(context);
        CopyOnHost(self->host_copies_[static_cast<size_t>(index)], static_cast<const uint8_t*>(src),
                   static_cast<uint8_t*>(dst));
      },
      this, static_cast<int64_t>(i), from, to);
  return absl::OkStatus();
}

}  // namespace reshard::cuda
