// FP8 quantization of tiles whose source lives in GPU memory, bit for bit what plan::QuantizeTile
// computes on the host (docs/quantization.md; for a requantized FP8 source, what
// plan::DequantizeTile then plan::QuantizeTile compute): the kernels of quant_kernels.cu (an
// amax pass, the blocks' scales, a quantize pass; their per-element arithmetic is quant_index.h,
// tested on the CPU) write the FP8 bytes and scales into device memory, which is then copied to
// the caller's host memory (the refit puts them from there, as it puts every staged GPU source).
//
// Built with the kernels when the build found CUDA (RESHARD_HAVE_CUDA_KERNELS); otherwise Create
// returns FailedPrecondition, so callers choose by capability, never by #ifdef.
//
// Thread-compatible: one DeviceQuantizer per tile shape and thread; its calls block until the
// device has finished and run with the device that was current at Create.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "src/cuda/quant_index.h"

namespace reshard::cuda {

class DeviceQuantizer {
 public:
  // Device memory for tiles of `shape` (its FP8 bytes, scales, amaxes and factors) and a stream,
  // on the current device. FailedPrecondition without CUDA kernels or a usable device; Internal
  // naming the CUDA call when allocation fails.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<DeviceQuantizer>> Create(
      const QuantShape& shape);
  ~DeviceQuantizer();
  DeviceQuantizer(const DeviceQuantizer&) = delete;
  DeviceQuantizer& operator=(const DeviceQuantizer&) = delete;

  // Quantizes the tile whose first source element is at device address `src` (elements as the
  // shape's strides place them) into host memory: `out` receives the FP8 bytes row-major
  // (shape.elements), `scales` the scales row-major over the blocks (num_blocks fp32 or E8M0).
  // With `amax` (host, num_blocks floats), each block's amax is taken from there instead (the
  // amax exchange). For an FP8 source (IsFp8Source(shape.source): requantized), `src_scales` is
  // the device address of the scale of the tile's first source block (fp32 ones 4-byte
  // aligned), and each element is dequantized with its source block's scale as it is read.
  // Blocks until done; Internal naming the CUDA call on failure.
  [[nodiscard]] absl::Status Quantize(const void* src, uint8_t* out, uint8_t* scales,
                                      const float* amax = nullptr,
                                      const void* src_scales = nullptr);
  // Only the amax pass: each block's amax over the tile's finite elements (0 when none) to host
  // `amax` (num_blocks floats), as plan::BlockAmax. Blocks until done.
  [[nodiscard]] absl::Status Amax(const void* src, float* amax, const void* src_scales = nullptr);

  const QuantShape& shape() const { return shape_; }

 private:
  DeviceQuantizer() = default;

  QuantShape shape_;
  // Unused in builds without CUDA kernels, where Create never returns an object.
  [[maybe_unused]] void* stream_ = nullptr;
  [[maybe_unused]] uint8_t* out_ = nullptr;
  [[maybe_unused]] uint8_t* scales_ = nullptr;
  [[maybe_unused]] uint32_t* amax_bits_ = nullptr;
  [[maybe_unused]] float* factors_ = nullptr;
  [[maybe_unused]] int max_blocks_ = 1;
};

}  // namespace reshard::cuda
