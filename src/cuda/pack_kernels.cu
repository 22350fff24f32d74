// The pack and unpack kernels, and the strided-to-strided copy kernel. A block takes a tile of
// consecutive units; its first thread finds the tile's first and last entries by binary search,
// and every thread then moves units of the tile with a stride of the block size, so neighbouring
// threads touch neighbouring bytes of the stream and, inside a run, of the strided buffer
// (coalesced on both sides). A tile inside one region (the common case) needs no further search
// and moves with one width, all of a thread's loads issued before its stores.
//
// It includes pack_index.h and the CUDA runtime, nothing else (nvcc time stays small).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "src/cuda/pack_index.h"
#include "src/cuda/pack_kernels.h"

namespace reshard::cuda::internal {
namespace {

constexpr int kThreads = 256;
constexpr uint64_t kTileUnits = kThreads * 8;

template <int kWidth>
struct Vector;
template <>
struct Vector<16> {
  using Type = uint4;
};
template <>
struct Vector<8> {
  using Type = uint2;
};
template <>
struct Vector<4> {
  using Type = uint32_t;
};
template <>
struct Vector<2> {
  using Type = uint16_t;
};
template <>
struct Vector<1> {
  using Type = uint8_t;
};

template <int kWidth>
__device__ __forceinline__ void Move(const uint8_t* from, uint8_t* to) {
  using T = typename Vector<kWidth>::Type;
  *reinterpret_cast<T*>(to) = *reinterpret_cast<const T*>(from);
}

constexpr int kUnitsPerThread = static_cast<int>(kTileUnits / kThreads);

// A tile inside one entry (the common case: one width for the whole tile): every thread first
// loads all its units, then stores them, so each thread keeps kUnitsPerThread loads in flight.
template <int kWidth, bool kPack>
__device__ __forceinline__ void MoveTileOfOneEntry(const PackEntry& e, uint64_t tile,
                                                   uint64_t tile_end, uint8_t* __restrict__ strided,
                                                   uint8_t* __restrict__ packed) {
  using T = typename Vector<kWidth>::Type;
  T value[kUnitsPerThread];
  uint8_t* to[kUnitsPerThread];
#pragma unroll
  for (int j = 0; j < kUnitsPerThread; ++j) {
    const uint64_t u = tile + threadIdx.x + static_cast<uint64_t>(j) * kThreads;
    to[j] = nullptr;
    if (u < tile_end) {
      const UnitAddress a = LocatePackUnit(e, u - e.units_begin);
      const uint8_t* from = kPack ? strided + a.strided_offset : packed + a.packed_offset;
      to[j] = kPack ? packed + a.packed_offset : strided + a.strided_offset;
      value[j] = *reinterpret_cast<const T*>(from);
    }
  }
#pragma unroll
  for (int j = 0; j < kUnitsPerThread; ++j) {
    if (to[j] != nullptr) *reinterpret_cast<T*>(to[j]) = value[j];
  }
}

template <bool kPack>
__global__ void __launch_bounds__(kThreads)
    PackKernel(const PackEntry* __restrict__ entries, int32_t num_entries, uint64_t total_units,
               uint8_t* __restrict__ strided, uint8_t* __restrict__ packed) {
  __shared__ int32_t first, last;
  for (uint64_t tile = blockIdx.x * kTileUnits; tile < total_units;
       tile += static_cast<uint64_t>(gridDim.x) * kTileUnits) {
    const uint64_t tile_end = min(tile + kTileUnits, total_units);
    if (threadIdx.x == 0) {
      first = FindPackEntry(entries, 0, num_entries - 1, tile);
      last = FindPackEntry(entries, first, num_entries - 1, tile_end - 1);
    }
    __syncthreads();
    const int32_t lo = first, hi = last;
    if (lo == hi) {
      const PackEntry& e = entries[lo];
      switch (e.width) {
        case 16:
          MoveTileOfOneEntry<16, kPack>(e, tile, tile_end, strided, packed);
          break;
        case 8:
          MoveTileOfOneEntry<8, kPack>(e, tile, tile_end, strided, packed);
          break;
        case 4:
          MoveTileOfOneEntry<4, kPack>(e, tile, tile_end, strided, packed);
          break;
        case 2:
          MoveTileOfOneEntry<2, kPack>(e, tile, tile_end, strided, packed);
          break;
        default:
          MoveTileOfOneEntry<1, kPack>(e, tile, tile_end, strided, packed);
          break;
      }
    } else {
      // A tile across regions: each unit finds its own entry among [lo, hi].
      for (uint64_t u = tile + threadIdx.x; u < tile_end; u += kThreads) {
        const PackEntry& e = entries[FindPackEntry(entries, lo, hi, u)];
        const UnitAddress a = LocatePackUnit(e, u - e.units_begin);
        uint8_t* s = strided + a.strided_offset;
        uint8_t* p = packed + a.packed_offset;
        const uint8_t* from = kPack ? s : p;
        uint8_t* to = kPack ? p : s;
        switch (a.width) {
          case 16:
            Move<16>(from, to);
            break;
          case 8:
            Move<8>(from, to);
            break;
          case 4:
            Move<4>(from, to);
            break;
          case 2:
            Move<2>(from, to);
            break;
          default:
            Move<1>(from, to);
            break;
        }
      }
    }
    __syncthreads();  // Everyone has read first/last before thread 0 writes the next tile's.
  }
}

// The strided-to-strided copy: the same tiling as PackKernel, both addresses from CopyEntry.
template <int kWidth>
__device__ __forceinline__ void CopyTileOfOneEntry(const CopyEntry& e, uint64_t tile,
                                                   uint64_t tile_end,
                                                   const uint8_t* __restrict__ from,
                                                   uint8_t* __restrict__ to) {
  using T = typename Vector<kWidth>::Type;
  T value[kUnitsPerThread];
  uint8_t* dst[kUnitsPerThread];
#pragma unroll
  for (int j = 0; j < kUnitsPerThread; ++j) {
    const uint64_t u = tile + threadIdx.x + static_cast<uint64_t>(j) * kThreads;
    dst[j] = nullptr;
    if (u < tile_end) {
      const CopyUnitAddress a = LocateCopyUnit(e, u - e.units_begin);
      dst[j] = to + a.to_offset;
      value[j] = *reinterpret_cast<const T*>(from + a.from_offset);
    }
  }
#pragma unroll
  for (int j = 0; j < kUnitsPerThread; ++j) {
    if (dst[j] != nullptr) *reinterpret_cast<T*>(dst[j]) = value[j];
  }
}

__global__ void __launch_bounds__(kThreads)
    CopyKernel(const CopyEntry* __restrict__ entries, int32_t num_entries, uint64_t total_units,
               const uint8_t* __restrict__ from, uint8_t* __restrict__ to) {
  __shared__ int32_t first, last;
  for (uint64_t tile = blockIdx.x * kTileUnits; tile < total_units;
       tile += static_cast<uint64_t>(gridDim.x) * kTileUnits) {
    const uint64_t tile_end = min(tile + kTileUnits, total_units);
    if (threadIdx.x == 0) {
      first = FindCopyEntry(entries, 0, num_entries - 1, tile);
      last = FindCopyEntry(entries, first, num_entries - 1, tile_end - 1);
    }
    __syncthreads();
    const int32_t lo = first, hi = last;
    if (lo == hi) {
      const CopyEntry& e = entries[lo];
      switch (e.width) {
        case 16:
          CopyTileOfOneEntry<16>(e, tile, tile_end, from, to);
          break;
        case 8:
          CopyTileOfOneEntry<8>(e, tile, tile_end, from, to);
          break;
        case 4:
          CopyTileOfOneEntry<4>(e, tile, tile_end, from, to);
          break;
        case 2:
          CopyTileOfOneEntry<2>(e, tile, tile_end, from, to);
          break;
        default:
          CopyTileOfOneEntry<1>(e, tile, tile_end, from, to);
          break;
      }
    } else {
      for (uint64_t u = tile + threadIdx.x; u < tile_end; u += kThreads) {
        const CopyEntry& e = entries[FindCopyEntry(entries, lo, hi, u)];
        const CopyUnitAddress a = LocateCopyUnit(e, u - e.units_begin);
        const uint8_t* f = from + a.from_offset;
        uint8_t* t = to + a.to_offset;
        switch (a.width) {
          case 16:
            Move<16>(f, t);
            break;
          case 8:
            Move<8>(f, t);
            break;
          case 4:
            Move<4>(f, t);
            break;
          case 2:
            Move<2>(f, t);
            break;
          default:
            Move<1>(f, t);
            break;
        }
      }
    }
    __syncthreads();
  }
}

}  // namespace

int PackKernelBlocksPerSm(int* blocks) {
  return static_cast<int>(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, PackKernel<true>, kThreads, 0));
}

int LaunchPackKernel(bool pack, const PackEntry* entries, int32_t num_entries, uint64_t total_units,
                     uint8_t* strided, uint8_t* packed, uint64_t max_blocks, void* stream) {
  if (total_units == 0) return 0;
  const uint64_t tiles = (total_units + kTileUnits - 1) / kTileUnits;
  const unsigned blocks = static_cast<unsigned>(tiles < max_blocks ? tiles : max_blocks);
  auto* st = static_cast<cudaStream_t>(stream);
  if (pack) {
    PackKernel<true>
        <<<blocks, kThreads, 0, st>>>(entries, num_entries, total_units, strided, packed);
  } else {
    PackKernel<false>
        <<<blocks, kThreads, 0, st>>>(entries, num_entries, total_units, strided, packed);
  }
  return static_cast<int>(cudaGetLastError());
}

int CopyKernelBlocksPerSm(int* blocks) {
  return static_cast<int>(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, CopyKernel, kThreads, 0));
}

int LaunchCopyKernel(const CopyEntry* entries, int32_t num_entries, uint64_t total_units,
                     const uint8_t* from, uint8_t* to, uint64_t max_blocks, void* stream) {
  if (total_units == 0) return 0;
  const uint64_t tiles = (total_units + kTileUnits - 1) / kTileUnits;
  const unsigned blocks = static_cast<unsigned>(tiles < max_blocks ? tiles : max_blocks);
  CopyKernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(entries, num_entries,
                                                                         total_units, from, to);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace reshard::cuda::internal
