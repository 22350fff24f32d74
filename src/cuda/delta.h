// Delta encode and apply of pieces in GPU memory (docs/delta.md), byte for byte what
// delta::EncodePiece and delta::Decoder do on the host: the kernels of delta_kernels.cu (their
// per-element, per-word and per-chunk arithmetic is delta_index.h, tested on the CPU) compare a
// piece with its shadow in device memory and write the stream in device memory, or apply a
// stream to a piece of a device buffer in place.
//
// Built with the kernels when the build found CUDA (RESHARD_HAVE_CUDA_KERNELS); otherwise Create
// returns FailedPrecondition, so callers choose by capability, never by #ifdef.
//
// Thread-compatible: one DeviceDeltaCodec per thread; its calls block until the device has
// finished and run with the device that was current at Create (its memory lives there).
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

  uint8_t* shadow() const { return shadow_; }  // Device memory.
  int64_t shadow_bytes() const { return shadow_bytes_; }
  const uint8_t* stream() const { return stream_; }  // Device memory.
  int64_t max_piece_bytes() const { return max_piece_bytes_; }

 private:
  DeviceDeltaCodec() = default;
  // InvalidArgument when `piece` at `base` cannot run on this codec (`what`: source or
  // destination).
  absl::Status CheckPiece(const DeltaPiece& piece, const void* base, const char* what) const;

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
};

}  // namespace reshard::cuda
