// The launch side of delta_kernels.cu, for delta.cc only: no CUDA or absl types. Every function
// enqueues on `stream` (a cudaStream_t) and returns cudaGetLastError() as int (0 is success).
#pragma once

#include <cstdint>

#include "src/common/delta_codec.h"
#include "src/cuda/delta_index.h"

namespace reshard::cuda::internal {

// Device scratch of one encode or apply, sized for the codec's largest piece.
struct DeltaScratch {
  uint64_t* masks = nullptr;        // kWordsPerChunk words per chunk.
  uint32_t* chunk_words = nullptr;  // Per chunk.
  int32_t* changed = nullptr;       // Per chunk.
  int64_t* offsets = nullptr;       // Per chunk: payload offset (exclusive prefix sum).
  delta::EncodeResult* result = nullptr;
};

// The encode of piece `p` (elements in `now`) against `shadow` (the piece's elements,
// contiguous, updated to `now`) into `out` (StreamCapacity bytes): the mask, scan and write
// passes; scratch.result receives what delta::EncodePiece would return.
int LaunchDeltaEncode(const DeltaPiece& p, const uint8_t* now, uint8_t* shadow, uint64_t base_epoch,
                      bool delta, const DeltaScratch& scratch, uint8_t* out, void* stream);

// The copy of the stream an encode wrote at `in` (its length: result->bytes, known on the device
// only) into `out` (pinned host memory mapped into the device, or device memory), whole 8-byte
// words (CopyWords, delta_index.h): `in` and `out` 8-byte aligned, room for `capacity` bytes
// rounded up to 8 on both sides.
int LaunchStreamCopy(const uint8_t* in, const delta::EncodeResult* result, int64_t capacity,
                     uint8_t* out, void* stream);

// The apply of a validated stream (device memory, `mode` its header's) to the elements of piece
// `p` in `dst`: the table's scan (kDelta), then every chunk.
int LaunchDeltaApply(const DeltaPiece& p, const uint8_t* in, uint8_t mode,
                     const DeltaScratch& scratch, uint8_t* dst, void* stream);

}  // namespace reshard::cuda::internal
