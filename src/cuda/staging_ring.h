// The staging ring of CUDA sources that UCX cannot register (docs/data-plane.md, "The staging
// ring"): `slots` slots of pinned host memory, mapped into the device's address space, that the
// pack kernel (pack.h) fills batch by batch on the ring's own stream, each batch followed by its
// slot's event. The engine plans the batches (batch_plan.h), registers the ring's memory with UCX
// once, posts puts from a slot once its event completed (SlotDone, polled, never a synchronise)
// and fills a slot again only when every send reading it completed.
//
// Built with the pack kernels when the build found CUDA; otherwise Create returns
// FailedPrecondition (callers choose by capability: PackKernelsBuilt()).
//
// Thread-compatible. Runs with the device that was current at Create.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "src/cuda/pack.h"
#include "src/cuda/pack_batch.h"

namespace reshard::cuda {

// Whether this build has the pack kernels (DevicePackBatch::Create can succeed).
bool PackKernelsBuilt();

class StagingRing {
 public:
  static constexpr int32_t kMaxSlots = 8;
  // Allocates the slots, a stream and an event per slot, and uploads `batches` (each built with
  // stream offsets inside one slot, PackBatch::packed_end <= slot_bytes) to the device once.
  // FailedPrecondition without the kernels or a device; InvalidArgument for slots outside
  // [1, kMaxSlots], a negative size or a batch longer than a slot; Internal naming the CUDA call.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<StagingRing>> Create(
      int32_t slots, int64_t slot_bytes, absl::Span<const PackBatch> batches);
  // Waits for the ring's stream (work enqueued before a failed epoch) before freeing the slots.
  ~StagingRing();
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  // Pinned host memory of `slot` (slot_bytes of it), valid to read once SlotDone(slot) is true.
  uint8_t* slot(int32_t slot) const { return host_ + slot * slot_bytes_; }
  uint8_t* data() const { return host_; }
  int64_t bytes() const { return static_cast<int64_t>(slots_) * slot_bytes_; }
  int32_t slots() const { return slots_; }
  int64_t slot_bytes() const { return slot_bytes_; }

  // Enqueues, without waiting, the pack of batch `batch` from `strided` (device memory, the base
  // the batch's offsets count from) into slot `slot`, then records the slot's event.
  // InvalidArgument for a batch or slot out of range or a misaligned base; Internal naming the
  // CUDA call.
  [[nodiscard]] absl::Status Pack(int32_t batch, int32_t slot, const void* strided);
  // Without waiting (cudaEventQuery): true once the work before `slot`'s last event finished (or
  // none was recorded), false while it runs; Internal when it failed (a kernel fault).
  [[nodiscard]] absl::StatusOr<bool> SlotDone(int32_t slot);

 private:
  StagingRing() = default;

  int32_t slots_ = 0;
  int64_t slot_bytes_ = 0;
  uint8_t* host_ = nullptr;                     // Pinned host, mapped.
  [[maybe_unused]] uint8_t* device_ = nullptr;  // The same memory's device address.
  [[maybe_unused]] void* stream_ = nullptr;     // cudaStream_t.
  [[maybe_unused]] void* events_[kMaxSlots] = {};
  std::unique_ptr<DevicePackBatches> batches_;
};

}  // namespace reshard::cuda
