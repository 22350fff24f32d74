// Pack-kernel scatters and strided copies launched on a CopyQueue's stream (runtime.h), in order
// with its copies and completed by its events: how the refit engine scatters a landing round out
// of a device round area, and copies a local piece between two device buffers, in one launch
// each instead of one copy-engine call per slab or run (docs/data-plane.md).
//
// Create uploads every batch once (set-up); launches only name a batch by its index. With devices
// emulated on the host (runtime.h) the batches stay on the host and each launch runs the
// kernels' host twins (pack_batch.h) when the queue runs a copy enqueued at that point, as late.
//
// Thread-compatible; runs with the device that was current at Create. The queue passed to a
// launch must have been created on that device.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "src/cuda/pack.h"
#include "src/cuda/pack_batch.h"
#include "src/cuda/runtime.h"

namespace reshard::cuda {

class QueuedKernels {
 public:
  // `scatters` are launched with Unpack, `copies` with Copy (either may be empty).
  // FailedPrecondition without the kernels (PackKernelsBuilt(), staging_ring.h) or a device;
  // Internal naming the CUDA call when the upload fails.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<QueuedKernels>> Create(
      absl::Span<const PackBatch> scatters, absl::Span<const CopyBatch> copies);
  QueuedKernels(const QueuedKernels&) = delete;
  QueuedKernels& operator=(const QueuedKernels&) = delete;

  // Enqueues on `queue` the scatter of batch `i` (< scatters) from the stream at `packed` into
  // its regions of `strided` (the base their offsets count from). `packed` must stay unchanged
  // until an event recorded after it completed. InvalidArgument for an index out of range or a
  // misaligned base; Internal naming the failing launch.
  [[nodiscard]] absl::Status Unpack(CopyQueue& queue, size_t i, const void* packed,
                                    void* strided) const;
  // Enqueues copy batch `i` (< copies): every region from `from` to `to` (device memory; the two
  // must not overlap). Errors as Unpack.
  [[nodiscard]] absl::Status Copy(CopyQueue& queue, size_t i, const void* from, void* to) const;

  size_t scatters() const { return emulated_ ? host_scatters_.size() : num_scatters_; }
  size_t copies() const { return emulated_ ? host_copies_.size() : num_copies_; }

 private:
  QueuedKernels() = default;

  bool emulated_ = false;
  std::unique_ptr<DevicePackBatches> device_scatters_;
  std::unique_ptr<DeviceCopyBatches> device_copies_;
  size_t num_scatters_ = 0, num_copies_ = 0;
  // Emulated devices: the batches themselves.
  std::vector<PackBatch> host_scatters_;
  std::vector<CopyBatch> host_copies_;
};

}  // namespace reshard::cuda
