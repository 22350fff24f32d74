// The FP8 quantization kernels: an amax pass, the blocks' scales, a quantize pass. Every value
// they compute comes from quant_index.h (host-tested); these kernels only distribute elements
// over threads (grid-stride, neighbouring threads on neighbouring output bytes) and combine a
// block's amax: lanes of a warp that share a block reduce together (__match_any_sync,
// __reduce_max_sync), then one atomicMax per block and warp. An FP8 source of another scheme is
// dequantized as each element is loaded (LoadQuantElement, with its source block's scale from
// `src_scales`), so requantizing is the same two passes, reading 1 byte per element.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "src/cuda/quant_index.h"
#include "src/cuda/quant_kernels.h"

namespace reshard::cuda::internal {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t work, int max_blocks) {
  const int64_t needed = (work + kThreads - 1) / kThreads;
  return static_cast<int>(needed < 1 ? 1 : (needed > max_blocks ? max_blocks : needed));
}

__global__ void __launch_bounds__(kThreads)
    AmaxKernel(const QuantShape shape, const uint8_t* __restrict__ src,
               const uint8_t* __restrict__ src_scales, uint32_t* __restrict__ amax_bits) {
  const int lane = threadIdx.x & 31;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  // Every lane of a warp runs the same iterations (warp-aligned bases), so the warp's
  // collectives see all 32 lanes; lanes past the end take part with nothing.
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x + (threadIdx.x & ~31);
       base < shape.elements; base += stride) {
    const int64_t e = base + lane;
    uint32_t bits = 0;
    unsigned long long block = ~0ull;
    if (e < shape.elements) {
      const QuantElement at = LocateQuantElement(shape, e);
      bits = AmaxBits(LoadQuantElement(shape, src, src_scales, at));
      block = static_cast<unsigned long long>(at.block);
    }
    const unsigned group = __match_any_sync(0xffffffffu, block);
    const uint32_t group_max = __reduce_max_sync(group, bits);
    if (block != ~0ull && lane == __ffs(group) - 1 && group_max != 0) {
      atomicMax(amax_bits + block, group_max);
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    ScalesKernel(const QuantShape shape, const uint32_t* __restrict__ amax_bits,
                 uint8_t* __restrict__ scales, float* __restrict__ factors) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= shape.num_blocks) return;
  factors[b] = BlockScale(shape, quant::FloatFromBits(amax_bits[b]),
                          scales + b * (shape.mx ? 1 : 4));
}

__global__ void __launch_bounds__(kThreads)
    QuantizeKernel(const QuantShape shape, const uint8_t* __restrict__ src,
                   const uint8_t* __restrict__ src_scales, const float* __restrict__ factors,
                   uint8_t* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       e < shape.elements; e += stride) {
    const QuantElement at = LocateQuantElement(shape, e);
    out[e] = QuantizeElement(shape, LoadQuantElement(shape, src, src_scales, at),
                             factors[at.block]);
  }
}

}  // namespace

int LaunchQuantAmax(const QuantShape& shape, const uint8_t* src, const uint8_t* src_scales,
                    uint32_t* amax_bits, int max_blocks, void* stream) {
  AmaxKernel<<<Blocks(shape.elements, max_blocks), kThreads, 0,
               static_cast<cudaStream_t>(stream)>>>(shape, src, src_scales, amax_bits);
  return static_cast<int>(cudaGetLastError());
}

int LaunchQuantScales(const QuantShape& shape, const uint32_t* amax_bits, uint8_t* scales,
                      float* factors, void* stream) {
  const int64_t blocks = (shape.num_blocks + kThreads - 1) / kThreads;
  ScalesKernel<<<static_cast<unsigned>(blocks < 1 ? 1 : blocks), kThreads, 0,
                 static_cast<cudaStream_t>(stream)>>>(shape, amax_bits, scales, factors);
  return static_cast<int>(cudaGetLastError());
}

int LaunchQuantize(const QuantShape& shape, const uint8_t* src, const uint8_t* src_scales,
                   const float* factors, uint8_t* out, int max_blocks, void* stream) {
  QuantizeKernel<<<Blocks(shape.elements, max_blocks), kThreads, 0,
                   static_cast<cudaStream_t>(stream)>>>(shape, src, src_scales, factors, out);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace reshard::cuda::internal
