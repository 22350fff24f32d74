// Pack and unpack kernels: one launch gathers every region of a batch from a strided buffer into
// a contiguous stream, or scatters the stream back, moving 16, 8, 4, 2 or 1 bytes per thread as
// the batch's runs and alignments allow (the index arithmetic is pack_index.h).
//
// Built with the kernels of pack_kernels.cu when the build found CUDA; otherwise Create returns
// FailedPrecondition, so callers choose the GPU path by capability (CudaDeviceCount() > 0), never
// by #ifdef.
//
// Thread safety: a DevicePackBatch is immutable after Create; launches from several threads on
// different streams are safe. Launches are asynchronous on the given stream and must run with
// the device that was current at Create (its descriptors live there).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "src/cuda/pack_batch.h"

namespace reshard::cuda {

// A PackBatch copied to device memory on the current device, launched any number of times.
// Move-only owner of that memory.
class DevicePackBatch {
 public:
  // Copies `batch`'s entries to the current device (synchronously). FailedPrecondition when the
  // build has no CUDA or there is no usable device; Internal with the failing CUDA call when
  // allocation or the copy fails.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DevicePackBatch>> Create(
      const PackBatch& batch);
  ~DevicePackBatch();
  DevicePackBatch(const DevicePackBatch&) = delete;
  DevicePackBatch& operator=(const DevicePackBatch&) = delete;

  // Enqueues the gather of every region from `strided` into the stream at `packed` (byte
  // offsets as in the batch) on `stream` (a cudaStream_t; nullptr is the default stream).
  // Both pointers must be device-accessible and aligned as the batch assumed (InvalidArgument
  // otherwise); Internal names the CUDA call when the launch fails. Asynchronous: kernel faults
  // surface at the stream's next synchronisation.
  [[nodiscard]] absl::Status Pack(const void* strided, void* packed, void* stream) const;
  // The scatter back: the stream at `packed` into the regions of `strided`. The regions' bytes
  // must not overlap in `strided` (each destination byte written once).
  [[nodiscard]] absl::Status Unpack(const void* packed, void* strided, void* stream) const;

  uint64_t total_units() const { return total_units_; }
  int32_t num_entries() const { return num_entries_; }

 private:
  DevicePackBatch() = default;
  // Pack reads `strided` and writes `packed`; unpack the reverse.
  [[nodiscard]] absl::Status Launch(bool pack, const void* strided, const void* packed,
                                    void* stream) const;
  void Free();

  // Unused in builds without CUDA, where Create never returns an object.
  [[maybe_unused]] PackEntry* entries_ = nullptr;  // Device memory.
  int32_t num_entries_ = 0;
  uint64_t total_units_ = 0;
  [[maybe_unused]] int64_t strided_base_align_ = 1;
  [[maybe_unused]] int64_t packed_base_align_ = 1;
  [[maybe_unused]] uint64_t max_blocks_ = 1;  // Enough resident blocks to fill the device.
};

// Many pack batches uploaded in one device allocation (a fan-out backend's whole program, built
// once per handle), each launched on its own like a DevicePackBatch. Same thread safety and
// device rule as DevicePackBatch. Move-only owner of that memory.
class DevicePackBatches {
 public:
  // Copies every batch's entries to the current device (synchronously, one allocation).
  // Errors as DevicePackBatch::Create.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DevicePackBatches>> Create(
      absl::Span<const PackBatch> batches);
  ~DevicePackBatches();
  DevicePackBatches(const DevicePackBatches&) = delete;
  DevicePackBatches& operator=(const DevicePackBatches&) = delete;

  // DevicePackBatch::Pack / Unpack of batch `i` (< size()).
  [[nodiscard]] absl::Status Pack(size_t i, const void* strided, void* packed, void* stream) const;
  [[nodiscard]] absl::Status Unpack(size_t i, const void* packed, void* strided,
                                    void* stream) const;
  size_t size() const { return slices_.size(); }

 private:
  struct Slice {
    int64_t first = 0;  // Index of the batch's first entry in entries_.
    int32_t num_entries = 0;
    uint64_t total_units = 0;
    int64_t strided_base_align = 1;
    int64_t packed_base_align = 1;
  };
  DevicePackBatches() = default;
  [[nodiscard]] absl::Status Launch(size_t i, bool pack, const void* strided, const void* packed,
                                    void* stream) const;

  [[maybe_unused]] PackEntry* entries_ = nullptr;  // Device memory.
  std::vector<Slice> slices_;
  [[maybe_unused]] uint64_t max_blocks_ = 1;
};

// Batches of strided-to-strided copies (CopyBatch) uploaded in one device allocation; batch `i`
// copies every region of it from one base pointer to another in one launch. Same thread safety
// and device rule as DevicePackBatch. Move-only owner of that memory.
class DeviceCopyBatches {
 public:
  // Errors as DevicePackBatch::Create.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DeviceCopyBatches>> Create(
      absl::Span<const CopyBatch> batches);
  ~DeviceCopyBatches();
  DeviceCopyBatches(const DeviceCopyBatches&) = delete;
  DeviceCopyBatches& operator=(const DeviceCopyBatches&) = delete;

  // Enqueues batch `i` (< size()): every region from `from` to `to` (device-accessible, e.g. a
  // peer's buffer opened through CUDA IPC; the two must not overlap) on `stream`. InvalidArgument
  // when a pointer is not aligned as the batch assumed; Internal names the failing launch.
  [[nodiscard]] absl::Status Copy(size_t i, const void* from, void* to, void* stream) const;
  size_t size() const { return slices_.size(); }

 private:
  struct Slice {
    int64_t first = 0;
    int32_t num_entries = 0;
    uint64_t total_units = 0;
    int64_t from_base_align = 1;
    int64_t to_base_align = 1;
  };
  DeviceCopyBatches() = default;

  [[maybe_unused]] CopyEntry* entries_ = nullptr;  // Device memory.
  std::vector<Slice> slices_;
  [[maybe_unused]] uint64_t max_blocks_ = 1;
};

}  // namespace reshard::cuda
