// Delta encode and apply of pieces in GPU memory (docs/delta.md), byte for byte what
// delta::EncodePiece and delta::Decoder do on the host: the kernels of delta_kernels.cu (their
// per-element, per-word and per-chunk arithmetic is delta_index.h, tested on the CPU) compare a
// piece with its shadow in device memory and write the stream in device memory, or apply a
// stream to a piece of a device buffer in place.
//
// Built with the kernels when the build found CUDA (RESHARD_HAVE_CUDA_KERNELS); otherwise Create
// returns FailedPrecondition, so callers choose by capability, never by #ifdef.
//
// Thread-compatible: one DeviceDeltaCodec per thread; it runs with the device that was current at
// Create (its memory lives there). Encode, EncodeOnDevice and Apply block until the device has
// finished; the pipeline's calls (EnqueueEncode, EnqueuePlain, RecordSlot, SlotDone) never wait
// for the device: they enqueue on the codec's stream, or poll.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/common/delta_codec.h"
#include "src/cuda/delta_index.h"

namespace reshard::cuda {

class DeviceDeltaCodec {
 public:
  // A shadow of `shadow_bytes` (zeroed) and scratch for pieces of up to `max_piece_bytes`, in
  // device memory, and a stream, on the current device. FailedPrecondition without CUDA
  // kernels or a usable device; InvalidArgument for negative sizes; Internal naming the CUDA
  // call when allocation fails.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DeviceDeltaCodec>> Create(
      int64_t shadow_bytes, int64_t max_piece_bytes);
  ~DeviceDeltaCodec();
  DeviceDeltaCodec(const DeviceDeltaCodec&) = delete;
  DeviceDeltaCodec& operator=(const DeviceDeltaCodec&) = delete;

  // Encodes `piece` of the device buffer `source` against the shadow's bytes at `shadow_offset`
  // (the piece's elements, contiguous) into the device stream (stream(), valid until the next
  // encode), as delta::EncodePiece(now, shadow, elems, elem_size, base_epoch, delta, out) does,
  // shadow update included, and returns what it returns. InvalidArgument (nothing touched) for
  // an element size other than 1/2/4/8, a piece larger than the codec's maximum, a shadow range
  // outside the shadow, or a source address, offset or stride that is not a multiple of the
  // element size; Internal naming the CUDA call on failure. Blocks until done.
  [[nodiscard]] absl::StatusOr<delta::EncodeResult> EncodeOnDevice(const DeltaPiece& piece,
                                                                   const void* source,
                                                                   int64_t shadow_offset,
                                                                   uint64_t base_epoch, bool delta);
  // The same, then the stream's bytes copied to `out` (host memory, result.bytes of it).
  [[nodiscard]] absl::StatusOr<delta::EncodeResult> Encode(const DeltaPiece& piece,
                                                           const void* source,
                                                           int64_t shadow_offset,
                                                           uint64_t base_epoch, bool delta,
                                                           uint8_t* out);

  // Validates `stream` (host memory, `length` bytes) for `piece` at a destination that holds
  // version `held_epoch` (delta::Decoder::Init), then applies it to the piece's elements of the
  // device buffer `destination`. The stream is copied to the device first, unless
  // `device_stream` (8-byte aligned) already holds the same bytes there. A refused stream is
  // DataLoss naming the reason, and nothing is written; InvalidArgument as for Encode (destination
  // instead of source). Returns the stream's mode. Blocks until done.
  [[nodiscard]] absl::StatusOr<delta::Mode> Apply(const DeltaPiece& piece, const uint8_t* stream,
                                                  int64_t length, uint64_t held_epoch,
                                                  void* destination,
                                                  const void* device_stream = nullptr);

  // The pipelined encode (docs/delta.md, "The GPU encode pipeline"; the batches are planned by
  // PlanBatches, batch_plan.h). ReservePipeline allocates `slots` slots of `slot_bytes` of
  // pinned host memory (mapped into the device's address space), an event per slot and pinned
  // room for `results` encode results; it replaces an earlier reservation (call it with no work
  // enqueued). FailedPrecondition without kernels; InvalidArgument for negative sizes or slots
  // outside [1, kMaxPipelineSlots]; Internal naming the CUDA call.
  static constexpr int32_t kMaxPipelineSlots = 8;
  [[nodiscard]] absl::Status ReservePipeline(int32_t slots, int64_t slot_bytes, int64_t results);
  // Pinned host memory of `slot` (slot_bytes of it), and pipeline result `i` (pinned): valid to
  // read once SlotDone of the slot whose work wrote them returned true.
  uint8_t* pinned_slot(int32_t slot) const { return pinned_ + slot * pinned_slot_bytes_; }
  const delta::EncodeResult& pinned_result(int64_t i) const { return host_results_[i]; }
  int64_t pinned_bytes() const { return pinned_slots_ * pinned_slot_bytes_; }
  // Enqueues, without waiting, what EncodeOnDevice does, then a copy of the stream (its length,
  // as the kernels computed it) into `host_out` (inside a pinned slot, 8-byte aligned, room for
  // StreamCapacity of the piece rounded up to 8 bytes) and of the result into
  // pinned_result(`result`). InvalidArgument as for EncodeOnDevice, and for a destination outside
  // the slots or a result index outside the reservation (nothing enqueued); Internal naming the
  // CUDA call.
  [[nodiscard]] absl::Status EnqueueEncode(const DeltaPiece& piece, const void* source,
                                           int64_t shadow_offset, uint64_t base_epoch, bool delta,
                                           uint8_t* host_out, int64_t result);
  // Enqueues, without waiting, the plain stream of a piece encoded before (EnqueueEncode) into
  // `host_out` (as there): the header of a kFull stream of `elems` elements of `elem_size`
  // bytes, written here, and the piece's values copied from its shadow (which the encode set to
  // them). Errors as for EnqueueEncode.
  [[nodiscard]] absl::Status EnqueuePlain(int64_t elems, int elem_size, int64_t shadow_offset,
                                          uint8_t* host_out);
  // Records `slot`'s event after the work enqueued so far.
  [[nodiscard]] absl::Status RecordSlot(int32_t slot);
  // Without waiting (cudaEventQuery): true once the work before `slot`'s last RecordSlot
  // finished (or none was recorded), false while it runs; Internal when it failed.
  [[nodiscard]] absl::StatusOr<bool> SlotDone(int32_t slot);

  uint8_t* shadow() const { return shadow_; }  // Device memory.
  int64_t shadow_bytes() const { return shadow_bytes_; }
  const uint8_t* stream() const { return stream_; }  // Device memory.
  int64_t max_piece_bytes() const { return max_piece_bytes_; }

 private:
  DeviceDeltaCodec() = default;
  // InvalidArgument when `piece` at `base` cannot run on this codec (`what`: source or
  // destination).
  absl::Status CheckPiece(const DeltaPiece& piece, const void* base, const char* what) const;
  // Launches the three encode kernels of `piece` on the codec's stream (checked by the caller).
  absl::Status LaunchEncode(const DeltaPiece& piece, const void* source, int64_t shadow_offset,
                            uint64_t base_epoch, bool delta);

  int64_t shadow_bytes_ = 0;
  int64_t max_piece_bytes_ = 0;
  // Unused in builds without CUDA kernels, where Create never returns an object.
  [[maybe_unused]] void* cuda_stream_ = nullptr;
  [[maybe_unused]] uint8_t* shadow_ = nullptr;
  [[maybe_unused]] uint8_t* stream_ = nullptr;        // Encode's stream.
  [[maybe_unused]] uint8_t* apply_stream_ = nullptr;  // Apply's copy of its stream.
  [[maybe_unused]] uint64_t* masks_ = nullptr;
  [[maybe_unused]] uint32_t* chunk_words_ = nullptr;
  [[maybe_unused]] int32_t* changed_ = nullptr;
  [[maybe_unused]] int64_t* offsets_ = nullptr;
  [[maybe_unused]] delta::EncodeResult* result_ = nullptr;       // Device.
  [[maybe_unused]] delta::EncodeResult* host_result_ = nullptr;  // Pinned host.
  // The pipeline (ReservePipeline).
  int32_t pinned_slots_ = 0;
  int64_t pinned_slot_bytes_ = 0;
  int64_t results_ = 0;
  uint8_t* pinned_ = nullptr;                              // Pinned host, mapped.
  [[maybe_unused]] uint8_t* pinned_device_ = nullptr;      // The same memory's device address.
  delta::EncodeResult* host_results_ = nullptr;            // Pinned host.
  [[maybe_unused]] void* events_[kMaxPipelineSlots] = {};  // cudaEvent_t by slot.
  // Frees the pipeline's memory and events.
  void FreePipeline();
};

}  // namespace reshard::cuda
