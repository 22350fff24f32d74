// The launch side of pack_kernels.cu, for pack.cc only: no CUDA or absl types, so that the one
// .cu file includes nothing but pack_index.h and the CUDA runtime (nvcc time stays small).
// Every function returns a cudaError_t as int (0 is success).
#pragma once

#include <cstdint>

#include "src/cuda/pack_index.h"

namespace reshard::cuda::internal {

// Resident blocks of the pack kernel per multiprocessor
// (cudaOccupancyMaxActiveBlocksPerMultiprocessor).
int PackKernelBlocksPerSm(int* blocks);

// Enqueues one pack (pack = true: strided -> packed) or unpack launch over `total_units` units of
// `num_entries` device-resident entries, with at most `max_blocks` blocks, on `stream`
// (a cudaStream_t). Returns cudaGetLastError() after the launch.
int LaunchPackKernel(bool pack, const PackEntry* entries, int32_t num_entries, uint64_t total_units,
                     uint8_t* strided, uint8_t* packed, uint64_t max_blocks, void* stream);

// The strided-to-strided copy kernel (CopyEntry, pack_index.h): resident blocks per
// multiprocessor, and one launch over `total_units` units of `num_entries` device-resident
// entries from `from` to `to`.
int CopyKernelBlocksPerSm(int* blocks);
int LaunchCopyKernel(const CopyEntry* entries, int32_t num_entries, uint64_t total_units,
                     const uint8_t* from, uint8_t* to, uint64_t max_blocks, void* stream);

}  // namespace reshard::cuda::internal
