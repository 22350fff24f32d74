// The delta encode and apply kernels. Every value they compute comes from delta_index.h and
// delta_codec.h (host-tested, tests/cuda/delta_index_test.cc); these kernels only distribute the
// work: one block per 4096-element chunk for the mask, write and apply passes (a warp builds a
// 64-bit mask word from two ballots of 32 neighbouring elements, so loads are coalesced), and
// one block of 1024 threads for the prefix sum of the chunks' payload bytes (a piece of 1 GiB of
// bf16 has 131072 chunks: 128 rounds of a block-wide scan). A chunk's per-word prefix sums
// (64 words) are one thread's loop; everything per element is one thread per element.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "src/cuda/delta_index.h"
#include "src/cuda/delta_kernels.h"

namespace reshard::cuda::internal {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kScanThreads = 1024;
constexpr int kHeader = static_cast<int>(sizeof(delta::StreamHeader));

// Exclusive prefix sum of one value per thread over a block of kScanThreads; `*total` gets the
// block's sum (every thread).
__device__ int64_t BlockExclusiveScan(int64_t v, int64_t* total) {
  __shared__ int64_t warp_sums[kScanThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int64_t x = v;
  for (int d = 1; d < 32; d <<= 1) {
    const int64_t y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int64_t s = warp_sums[lane];
    for (int d = 1; d < 32; d <<= 1) {
      const int64_t y = __shfl_up_sync(0xffffffffu, s, d);
      if (lane >= d) s += y;
    }
    warp_sums[lane] = s;  // Inclusive.
  }
  __syncthreads();
  const int64_t before = (warp == 0 ? 0 : warp_sums[warp - 1]) + x - v;
  *total = warp_sums[kScanThreads / 32 - 1];
  __syncthreads();  // warp_sums is reused by the next round.
  return before;
}

// Encode, pass 1: the chunk's mask (to `masks`), the shadow updated, its chunk word and count.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    MaskKernel(const DeltaPiece p, const uint8_t* __restrict__ now, uint8_t* __restrict__ shadow,
               uint64_t* __restrict__ masks, uint32_t* __restrict__ chunk_words,
               int32_t* __restrict__ changed) {
  __shared__ uint64_t words[delta::kWordsPerChunk];
  __shared__ int32_t value_before[delta::kWordsPerChunk + 1];
  __shared__ int32_t runs_before[delta::kWordsPerChunk + 1];
  const int64_t c = blockIdx.x;
  const int64_t first = c * delta::kChunkElems;
  const int64_t n = ChunkLength(p.elems, c);
  const int num_words = static_cast<int>((n + 63) / 64);
  const int lane = threadIdx.x & 31;
  // Every lane of a warp runs the same words, so the ballots see all 32 lanes.
  for (int w = threadIdx.x >> 5; w < num_words; w += kWarps) {
    const int64_t i = static_cast<int64_t>(w) * 64 + lane;
    const bool low = i < n && ElementChanged<T>(p, now, shadow, first + i);
    const bool high = i + 32 < n && ElementChanged<T>(p, now, shadow, first + i + 32);
    const uint64_t m =
        WordOfLanes(__ballot_sync(0xffffffffu, low), __ballot_sync(0xffffffffu, high));
    if (lane == 0) {
      words[w] = m;
      masks[c * delta::kWordsPerChunk + w] = m;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    ChunkPrefixes(words, num_words, value_before, runs_before);
    chunk_words[c] = delta::ChunkWord(n, value_before[num_words], runs_before[num_words],
                                      static_cast<int>(sizeof(T)));
    changed[c] = value_before[num_words];
  }
}

// Encode, pass 2: payload offsets, totals, the result, the header and (kDelta) the table.
__global__ void __launch_bounds__(kScanThreads)
    EncodeScanKernel(const DeltaPiece p, uint64_t base_epoch, bool delta,
                     const uint32_t* __restrict__ chunk_words, const int32_t* __restrict__ changed,
                     int64_t* __restrict__ offsets, uint8_t* __restrict__ out,
                     delta::EncodeResult* __restrict__ result) {
  __shared__ unsigned long long counts[5];  // By tag, then changed elements.
  if (threadIdx.x < 5) counts[threadIdx.x] = 0;
  __syncthreads();
  unsigned long long tags[4] = {0, 0, 0, 0}, changed_here = 0;
  int64_t running = 0;
  for (int64_t base = 0; base < p.chunks; base += kScanThreads) {
    const int64_t c = base + threadIdx.x;
    const uint32_t word = c < p.chunks ? chunk_words[c] : 0;
    int64_t total = 0;
    const int64_t before = BlockExclusiveScan(word >> 2, &total);
    if (c < p.chunks) {
      offsets[c] = running + before;
      tags[word & 3]++;
      changed_here += static_cast<unsigned long long>(changed[c]);
    }
    running += total;
  }
  for (int k = 0; k < 4; ++k) {
    if (tags[k] != 0) atomicAdd(&counts[k], tags[k]);
  }
  if (changed_here != 0) atomicAdd(&counts[4], changed_here);
  __syncthreads();
  DeltaTotals t;
  t.payload = running;
  t.changed = static_cast<int64_t>(counts[4]);
  for (int k = 0; k < 4; ++k) t.chunks[k] = static_cast<int64_t>(counts[k]);
  const delta::EncodeResult r = EncodeResultOf(t, p.elems, p.elem_size, delta);
  if (threadIdx.x == 0) {
    *result = r;
    const delta::StreamHeader h = HeaderOf(r, p.elems, p.elem_size, base_epoch);
    memcpy(out, &h, sizeof(h));
  }
  if (r.mode != delta::kDelta) return;
  for (int64_t c = threadIdx.x; c < p.chunks; c += kScanThreads) {
    delta::Store<uint32_t>(out + kHeader + 4 * c, chunk_words[c]);
  }
}

// Encode, pass 3: the chunk's payload (kDelta), or its elements of the plain piece (kFull).
template <typename T>
__global__ void __launch_bounds__(kThreads)
    WriteKernel(const DeltaPiece p, const uint8_t* __restrict__ now,
                const uint64_t* __restrict__ masks, const uint32_t* __restrict__ chunk_words,
                const int64_t* __restrict__ offsets, const delta::EncodeResult* __restrict__ result,
                uint8_t* __restrict__ out) {
  __shared__ uint64_t words[delta::kWordsPerChunk];
  __shared__ int32_t value_before[delta::kWordsPerChunk + 1];
  __shared__ int32_t runs_before[delta::kWordsPerChunk + 1];
  constexpr int64_t es = sizeof(T);
  const int64_t c = blockIdx.x;
  const int64_t first = c * delta::kChunkElems;
  const int64_t n = ChunkLength(p.elems, c);
  const int num_words = static_cast<int>((n + 63) / 64);
  const uint8_t mode = result->mode;
  uint8_t* payload =
      out + PayloadStart(mode, p.chunks, c, mode == delta::kDelta ? offsets[c] : 0, es);
  if (mode != delta::kDelta) {
    // The plain piece: aligned, as the stream's base is and the header is 32 bytes.
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      StoreElement<T>(payload + i * es, LoadElement<T>(now + ElementOffset(p, first + i)));
    }
    return;
  }
  const uint32_t word = chunk_words[c];
  const uint32_t tag = word & 3;
  if (tag == delta::kSame) return;
  if (tag == delta::kRaw) {
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      delta::Store<T>(payload + i * es, LoadElement<T>(now + ElementOffset(p, first + i)));
    }
    return;
  }
  if (threadIdx.x < num_words) words[threadIdx.x] = masks[c * delta::kWordsPerChunk + threadIdx.x];
  __syncthreads();
  if (threadIdx.x == 0) ChunkPrefixes(words, num_words, value_before, runs_before);
  __syncthreads();
  if (tag == delta::kBitmap && threadIdx.x < num_words) {
    WriteBitmapWord(words, static_cast<int>(threadIdx.x), payload);
  }
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    if (((words[i / 64] >> (i % 64)) & 1) == 0) continue;
    EncodeElement<T>(word, words, value_before, runs_before, num_words, n, i,
                     LoadElement<T>(now + ElementOffset(p, first + i)), payload);
  }
}

// The pipeline's copy of an encoded stream to the host: its words, as many as its length
// (known here only) needs; grid-stride over blocks sized for the capacity.
__global__ void __launch_bounds__(kThreads)
    StreamCopyKernel(const uint64_t* __restrict__ in,
                     const delta::EncodeResult* __restrict__ result, uint64_t* __restrict__ out) {
  const int64_t words = CopyWords(result->bytes);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; i < words;
       i += stride) {
    out[i] = in[i];
  }
}

// Apply, pass 1: the payload offsets from a kDelta stream's table.
__global__ void __launch_bounds__(kScanThreads)
    ApplyScanKernel(int64_t chunks, const uint8_t* __restrict__ in, int64_t* __restrict__ offsets) {
  int64_t running = 0;
  for (int64_t base = 0; base < chunks; base += kScanThreads) {
    const int64_t c = base + threadIdx.x;
    const uint32_t word = c < chunks ? delta::Load<uint32_t>(in + kHeader + 4 * c) : 0;
    int64_t total = 0;
    const int64_t before = BlockExclusiveScan(word >> 2, &total);
    if (c < chunks) offsets[c] = running + before;
    running += total;
  }
}

// Apply, pass 2: the chunk's new values into the destination.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    ApplyKernel(const DeltaPiece p, const uint8_t* __restrict__ in, uint8_t mode,
                const int64_t* __restrict__ offsets, uint8_t* __restrict__ dst) {
  __shared__ unsigned long long words[delta::kWordsPerChunk];
  __shared__ int32_t value_before[delta::kWordsPerChunk + 1];
  __shared__ int32_t runs_before[delta::kWordsPerChunk + 1];
  __shared__ int64_t runs;
  constexpr int64_t es = sizeof(T);
  const int64_t c = blockIdx.x;
  const int64_t first = c * delta::kChunkElems;
  const int64_t n = ChunkLength(p.elems, c);
  const int num_words = static_cast<int>((n + 63) / 64);
  if (mode != delta::kDelta) {
    const uint8_t* payload = in + PayloadStart(mode, p.chunks, c, 0, es);
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      StoreElement<T>(dst + ElementOffset(p, first + i), LoadElement<T>(payload + i * es));
    }
    return;
  }
  const uint32_t word = delta::Load<uint32_t>(in + kHeader + 4 * c);
  const uint32_t tag = word & 3;
  if (tag == delta::kSame) return;
  const uint8_t* payload = in + PayloadStart(mode, p.chunks, c, offsets[c], es);
  if (tag == delta::kRaw) {
    for (int64_t i = threadIdx.x; i < n; i += kThreads) {
      StoreElement<T>(dst + ElementOffset(p, first + i), delta::Load<T>(payload + i * es));
    }
    return;
  }
  auto* mask = reinterpret_cast<uint64_t*>(words);
  if (tag == delta::kBitmap) {
    if (threadIdx.x < num_words)
      mask[threadIdx.x] = delta::Load<uint64_t>(payload + 8 * threadIdx.x);
    if (threadIdx.x == 0) runs = 0;
  } else {
    if (threadIdx.x < num_words) words[threadIdx.x] = 0;
    if (threadIdx.x == 0) runs = RunsInChunk(payload, word >> 2, static_cast<int>(es));
    __syncthreads();
    for (int64_t r = threadIdx.x; r < runs; r += kThreads) {
      const int64_t start = delta::Load<uint16_t>(payload + 4 * r);
      const int64_t length = delta::Load<uint16_t>(payload + 4 * r + 2);
      for (int64_t w = start / 64; w <= (start + length - 1) / 64; ++w) {
        atomicOr(&words[w], static_cast<unsigned long long>(RunWordBits(start, length, w)));
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) ChunkPrefixes(mask, num_words, value_before, runs_before);
  __syncthreads();
  const uint8_t* values = payload + ValuesStart(tag, num_words, runs);
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    T v;
    if (DecodeElement<T>(tag, mask, value_before, values, i, &v)) {
      StoreElement<T>(dst + ElementOffset(p, first + i), v);
    }
  }
}

template <typename T>
int EncodeAs(const DeltaPiece& p, const uint8_t* now, uint8_t* shadow, uint64_t base_epoch,
             bool delta, const DeltaScratch& s, uint8_t* out, cudaStream_t stream) {
  if (p.chunks > 0) {
    MaskKernel<T><<<static_cast<unsigned>(p.chunks), kThreads, 0, stream>>>(
        p, now, shadow, s.masks, s.chunk_words, s.changed);
  }
  EncodeScanKernel<<<1, kScanThreads, 0, stream>>>(p, base_epoch, delta, s.chunk_words, s.changed,
                                                   s.offsets, out, s.result);
  if (p.chunks > 0) {
    WriteKernel<T><<<static_cast<unsigned>(p.chunks), kThreads, 0, stream>>>(
        p, now, s.masks, s.chunk_words, s.offsets, s.result, out);
  }
  return static_cast<int>(cudaGetLastError());
}

template <typename T>
int ApplyAs(const DeltaPiece& p, const uint8_t* in, uint8_t mode, const DeltaScratch& s,
            uint8_t* dst, cudaStream_t stream) {
  if (p.chunks == 0) return static_cast<int>(cudaGetLastError());
  if (mode == delta::kDelta) {
    ApplyScanKernel<<<1, kScanThreads, 0, stream>>>(p.chunks, in, s.offsets);
  }
  ApplyKernel<T>
      <<<static_cast<unsigned>(p.chunks), kThreads, 0, stream>>>(p, in, mode, s.offsets, dst);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int LaunchDeltaEncode(const DeltaPiece& p, const uint8_t* now, uint8_t* shadow, uint64_t base_epoch,
                      bool delta, const DeltaScratch& scratch, uint8_t* out, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (p.elem_size) {
    case 1:
      return EncodeAs<uint8_t>(p, now, shadow, base_epoch, delta, scratch, out, s);
    case 2:
      return EncodeAs<uint16_t>(p, now, shadow, base_epoch, delta, scratch, out, s);
    case 4:
      return EncodeAs<uint32_t>(p, now, shadow, base_epoch, delta, scratch, out, s);
    default:
      return EncodeAs<uint64_t>(p, now, shadow, base_epoch, delta, scratch, out, s);
  }
}

int LaunchStreamCopy(const uint8_t* in, const delta::EncodeResult* result, int64_t capacity,
                     uint8_t* out, void* stream) {
  constexpr int64_t kMaxBlocks = 1024;
  const int64_t blocks = (CopyWords(capacity) + kThreads - 1) / kThreads;
  const auto grid =
      static_cast<unsigned>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
  StreamCopyKernel<<<grid, kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const uint64_t*>(in), result, reinterpret_cast<uint64_t*>(out));
  return static_cast<int>(cudaGetLastError());
}

int LaunchDeltaApply(const DeltaPiece& p, const uint8_t* in, uint8_t mode,
                     const DeltaScratch& scratch, uint8_t* dst, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  switch (p.elem_size) {
    case 1:
      return ApplyAs<uint8_t>(p, in, mode, scratch, dst, s);
    case 2:
      return ApplyAs<uint16_t>(p, in, mode, scratch, dst, s);
    case 4:
      return ApplyAs<uint32_t>(p, in, mode, scratch, dst, s);
    default:
      return ApplyAs<uint64_t>(p, in, mode, scratch, dst, s);
  }
}

}  // namespace reshard::cuda::internal
