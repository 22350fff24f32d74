// The staging ring of CUDA sources that UCX cannot register (docs/data-plane.md, "The staging
// ring"): `slots` slots of pinned host memory, mapped into the device's address space, that the
// pack kernel (pack.h) fills batch by batch on the ring's own stream, each batch followed by its
// slot's event. The engine plans the batches (batch_plan.h), registers the ring's memory with UCX
// once, posts puts from a slot once its event completed (SlotDone, polled, never a synchronise)
// and fills a slot again only when every send reading it completed.
//
// Built with the pack kernels when the build found CUDA; otherwise Create returns
// FailedPrecondition (callers choose by capability: PackKernelsBuilt()). With devices emulated
// on the host (tests: DevicesEmulatedOnHost(), src/cuda/runtime.h) every build has a ring whose
// slots are host memory and whose packs run the kernels' arithmetic (pack_index.h) on the host
// when SlotDone is first asked after them, which then answers "not yet" once, as a GPU would.
//
// Thread-compatible. Runs with the device that was current at Create.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

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
  // `device_memory`: the slots are device memory (cudaMalloc) instead of mapped pinned host
  // memory, for a CUDA-aware UCX that registers and reads device memory itself (the pack then
  // never crosses PCIe); slot() is then a device address, never read by the host.
  // Allocates the slots, a stream and an event per slot, and uploads `batches` (each built with
  // stream offsets inside one slot, PackBatch::packed_end <= slot_bytes) to the device once.
  // FailedPrecondition without the kernels or a device; InvalidArgument for slots outside
  // [1, kMaxSlots], a negative size or a batch longer than a slot; Internal naming the CUDA call.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<StagingRing>> Create(
      int32_t slots, int64_t slot_bytes, absl::Span<const PackBatch> batches,
      bool device_memory = false);
  // Waits for the ring's stream (work enqueued before a failed epoch) before freeing the slots.
  ~StagingRing();
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  // The memory of `slot` (slot_bytes of it: pinned host memory, or device memory when
  // on_device()), valid to read once SlotDone(slot) is true.
  uint8_t* slot(int32_t slot) const { return host_ + slot * slot_bytes_; }
  bool on_device() const { return on_device_; }
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
  // DevicesEmulatedOnHost(): runs slot `slot`'s pending pack.
  void PackOnHost(int32_t slot);
  // The device's side of Create (after the checks), the destructor, Pack and SlotDone.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<StagingRing>> CreateOnDevice(
      int32_t slots, int64_t slot_bytes, absl::Span<const PackBatch> batches, bool device_memory);
  void DestroyOnDevice();
  [[nodiscard]] absl::Status PackOnDevice(int32_t batch, int32_t slot, const void* strided);
  [[nodiscard]] absl::StatusOr<bool> SlotDoneOnDevice(int32_t slot);

  int32_t slots_ = 0;
  int64_t slot_bytes_ = 0;
  uint8_t* host_ = nullptr;  // Pinned host, mapped (or the device address when on_device_).
  bool on_device_ = false;
  [[maybe_unused]] uint8_t* device_ = nullptr;  // The same memory's device address.
  [[maybe_unused]] void* stream_ = nullptr;     // cudaStream_t.
  [[maybe_unused]] void* events_[kMaxSlots] = {};
  std::unique_ptr<DevicePackBatches> batches_;
  // Emulated devices: the batches, the slots' memory, and by slot the pack enqueued and not yet
  // run (its strided base, null: none, and its batch).
  bool emulated_ = false;
  std::vector<PackBatch> host_batches_;
  std::vector<uint8_t> host_slots_;
  const uint8_t* pending_[kMaxSlots] = {};
  int32_t pending_batch_[kMaxSlots] = {};
};

}  // namespace reshard::cuda
