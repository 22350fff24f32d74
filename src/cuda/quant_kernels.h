// The launch side of quant_kernels.cu, for quantize.cc only: no CUDA or absl types. Every
// function enqueues on `stream` (a cudaStream_t) and returns cudaGetLastError() as int (0 is
// success).
#pragma once

#include <cstdint>

#include "src/cuda/quant_index.h"

namespace reshard::cuda::internal {

// `src_scales`: an FP8 source's scales (LoadQuantElement), else unused (may be null).
//
// The amax pass: amax_bits[b] = max(amax_bits[b], AmaxBits(x)) over the tile's elements x of
// block b (zero amax_bits first).
int LaunchQuantAmax(const QuantShape& shape, const uint8_t* src, const uint8_t* src_scales,
                    uint32_t* amax_bits, int max_blocks, void* stream);
// Each block's scale (to `scales`, row-major) and factor (to `factors`) from amax_bits.
int LaunchQuantScales(const QuantShape& shape, const uint32_t* amax_bits, uint8_t* scales,
                      float* factors, void* stream);
// The quantize pass: out[e] = QuantizeElement(x_e, factors[block of e]), row-major.
int LaunchQuantize(const QuantShape& shape, const uint8_t* src, const uint8_t* src_scales,
                   const float* factors, uint8_t* out, int max_blocks, void* stream);

}  // namespace reshard::cuda::internal
