// What the delta kernels (delta_kernels.cu) compute per element, per 64-element word and per
// chunk, compiled for host and device (RESHARD_HD) so that the CPU tests it: composed as the
// kernels compose it (tests/cuda/delta_index_test.cc), the encode produces exactly the stream
// delta::EncodePiece writes, byte for byte, and the apply writes exactly what delta::Decoder
// writes. The stream format and the per-chunk choice are delta_codec.h's (ChunkWord, RunEnd,
// the header); this file only cuts the work so that every chunk, word and element is
// independent once two prefix sums are known:
//
//   encode  1. mask: per chunk, one bit per element (ElementChanged, folded 32 lanes at a time
//              into 64-bit words), the shadow updated where the bit is set; the chunk's changed
//              elements and runs (RunStartBits) give its chunk word (delta::ChunkWord);
//           2. scan: the chunk words' payload bytes, prefix-summed over the piece, give each
//              chunk's payload offset, the stream's length and its mode (EncodeResultOf;
//              kFull when the kDelta stream would not be smaller), then the header and table;
//           3. write: per chunk, per element: where its value goes (ValueIndex: the set bits
//              before it), per run start its (start, length) pair (RunIndex, RunEnd).
//   apply   1. scan: the same prefix sum over the validated stream's table;
//           2. per chunk, the mask (a kBitmap chunk's words, or a kRuns chunk's runs set bit
//              by bit: RunWordBits), then per element its value (ValueIndex) into place.
// Elements of the piece lie in their buffer as a PackEntry of one region places its units
// (pack_index.h, width = element size): any plan region, not only contiguous pieces.
#pragma once

#include <cstdint>
#include <cstring>

#include "src/common/delta_codec.h"
#include "src/common/host_device.h"
#include "src/cuda/pack_index.h"

namespace reshard::cuda {

// One piece as the kernels see it: `elems` elements of `elem_size` bytes (1, 2, 4 or 8), element
// e at byte ElementOffset(*this, e) of its buffer (the source when encoding, the destination
// when applying); `chunks` = delta::NumChunks(elems).
struct DeltaPiece {
  PackEntry layout;  // units: the whole piece's elements; width = elem_size; run_units.
  int64_t elems = 0;
  int32_t elem_size = 1;
  int64_t chunks = 0;
  // A segment of a piece (SegmentOf): its elements are the piece's [first, first + elems).
  int64_t first = 0;
};

// A piece of `run_bytes`-long runs at `offset`, repeated over `ndims` outer dims of `count`
// runs at byte `stride`s (outermost first): one side of a plan::Region. run_bytes and every
// offset and stride must be multiples of elem_size (the caller checks).
inline DeltaPiece MakeDeltaPiece(int64_t offset, int64_t run_bytes, int32_t ndims,
                                 const int64_t* count, const int64_t* stride, int elem_size) {
  DeltaPiece p;
  p.elem_size = elem_size;
  p.layout.width = elem_size;
  p.layout.strided_offset = offset;
  p.layout.run_units = static_cast<uint64_t>(run_bytes / elem_size);
  p.layout.ndims = ndims;
  int64_t runs = 1;
  for (int32_t d = 0; d < ndims; ++d) {
    p.layout.count[d] = count[d];
    p.layout.stride[d] = stride[d];
    runs *= count[d];
  }
  p.elems = run_bytes / elem_size * runs;
  p.layout.units = static_cast<uint64_t>(p.elems);
  p.chunks = delta::NumChunks(p.elems);
  return p;
}

// `elems` contiguous elements from byte 0.
inline DeltaPiece ContiguousDeltaPiece(int64_t elems, int elem_size) {
  return MakeDeltaPiece(0, elems * elem_size, 0, nullptr, nullptr, elem_size);
}

// Segment [first, first + elems) of `piece` (delta::SegmentFirst / SegmentLength): a piece of
// its own for the kernels, whose elements lie where the piece's do.
inline DeltaPiece SegmentOf(DeltaPiece piece, int64_t first, int64_t elems) {
  piece.first += first;
  piece.elems = elems;
  piece.chunks = delta::NumChunks(elems);
  return piece;
}

// Byte offset of element `e` of the piece in its buffer.
RESHARD_HD inline int64_t ElementOffset(const DeltaPiece& p, int64_t e) {
  return LocatePackUnit(p.layout, static_cast<uint64_t>(p.first + e)).strided_offset;
}

// Elements of chunk `c`.
RESHARD_HD inline int64_t ChunkLength(int64_t elems, int64_t c) {
  const int64_t first = c * delta::kChunkElems;
  return elems - first < delta::kChunkElems ? elems - first : delta::kChunkElems;
}

// An element of the piece's buffers (source, destination, shadow), which the kernels address at
// its natural alignment (the launch checks it); the host reads it with memcpy. Stream bytes are
// never aligned: they go through delta::Load and delta::Store.
template <typename T>
RESHARD_HD inline T LoadElement(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const T*>(p);
#else
  return delta::Load<T>(p);
#endif
}
template <typename T>
RESHARD_HD inline void StoreElement(uint8_t* p, T v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<T*>(p) = v;
#else
  delta::Store<T>(p, v);
#endif
}

// Mask step, per element: whether element `e` of the piece (in `now`) differs from the shadow
// (`shadow`, the piece's elements contiguous), and then the shadow holds the new value.
template <typename T>
RESHARD_HD inline bool ElementChanged(const DeltaPiece& p, const uint8_t* now, uint8_t* shadow,
                                      int64_t e) {
  const T a = LoadElement<T>(now + ElementOffset(p, e));
  uint8_t* s = shadow + e * static_cast<int64_t>(sizeof(T));
  const bool changed = a != LoadElement<T>(s);
  if (changed) StoreElement<T>(s, a);
  return changed;
}

// The word of elements 64w .. 64w + 63 from two 32-lane ballots: lane l holds element 64w + l in
// `low` and 64w + 32 + l in `high`.
RESHARD_HD inline uint64_t WordOfLanes(uint32_t low, uint32_t high) {
  return static_cast<uint64_t>(low) | static_cast<uint64_t>(high) << 32;
}

// The bits of mask word `m` that start a run of changed elements; `prev` is the chunk's
// previous word (0 for its first: runs never continue across chunks).
RESHARD_HD inline uint64_t RunStartBits(uint64_t m, uint64_t prev) {
  return m & ~((m << 1) | (prev >> 63));
}

// Per chunk, after its mask: the exclusive prefix sums over its words of set bits
// (`value_before`) and of run starts (`runs_before`), num_words + 1 entries each (the last is
// the chunk's total), from words[0, num_words).
RESHARD_HD inline void ChunkPrefixes(const uint64_t* words, int num_words, int32_t* value_before,
                                     int32_t* runs_before) {
  int32_t values = 0, runs = 0;
  uint64_t prev = 0;
  for (int w = 0; w < num_words; ++w) {
    value_before[w] = values;
    runs_before[w] = runs;
    values += delta::Popcount64(words[w]);
    runs += delta::Popcount64(RunStartBits(words[w], prev));
    prev = words[w];
  }
  value_before[num_words] = values;
  runs_before[num_words] = runs;
}

// Element i of a chunk whose bit is set: the index of its value among the chunk's values.
RESHARD_HD inline int64_t ValueIndex(const uint64_t* words, const int32_t* value_before,
                                     int64_t i) {
  return value_before[i / 64] +
         delta::Popcount64(words[i / 64] & delta::BitRange(0, static_cast<int>(i % 64)));
}

// Element i of a chunk that starts a run: the index of its run among the chunk's runs.
RESHARD_HD inline int64_t RunIndex(const uint64_t* words, const int32_t* runs_before, int64_t i) {
  const int64_t w = i / 64;
  const uint64_t starts = RunStartBits(words[w], w == 0 ? 0 : words[w - 1]);
  return runs_before[w] + delta::Popcount64(starts & delta::BitRange(0, static_cast<int>(i % 64)));
}

// Scan step: what the whole piece adds up to.
struct DeltaTotals {
  int64_t payload = 0;  // Payload bytes of every chunk (the chunk words' sum).
  int64_t changed = 0;
  int64_t chunks[4] = {0, 0, 0, 0};  // By delta::ChunkTag.
};

// The stream the totals make, as delta::EncodePiece reports it: kDelta when `delta` (a base to
// build on) and its stream is shorter than the plain piece's, else kFull.
RESHARD_HD inline delta::EncodeResult EncodeResultOf(const DeltaTotals& t, int64_t elems,
                                                     int elem_size, bool delta) {
  delta::EncodeResult r;
  const int64_t header = static_cast<int64_t>(sizeof(delta::StreamHeader));
  const int64_t full_bytes = header + elems * elem_size;
  const int64_t delta_bytes = header + 4 * delta::NumChunks(elems) + t.payload;
  if (delta && delta_bytes < full_bytes) {
    r.bytes = delta_bytes;
    r.mode = delta::kDelta;
    r.changed = t.changed;
    for (int k = 0; k < 4; ++k) r.chunks[k] = t.chunks[k];
  } else {
    r.bytes = full_bytes;
    r.mode = delta::kFull;
    r.changed = elems;
  }
  return r;
}

// The stream's header for result `r` (kDelta ones record `base_epoch`).
RESHARD_HD inline delta::StreamHeader HeaderOf(const delta::EncodeResult& r, int64_t elems,
                                               int elem_size, uint64_t base_epoch) {
  delta::StreamHeader h;
  h.mode = r.mode;
  h.elem_size = static_cast<uint8_t>(elem_size);
  h.elems = static_cast<uint64_t>(elems);
  h.bytes = static_cast<uint64_t>(r.bytes);
  h.base_epoch = r.mode == delta::kDelta ? base_epoch : 0;
  return h;
}

// The 8-byte words that carry a stream of `bytes` (the pipeline's copy of a stream to the host,
// LaunchStreamCopy): the last one partly past the stream, inside the rounded-up capacity.
RESHARD_HD inline int64_t CopyWords(int64_t bytes) { return (bytes + 7) / 8; }

// Where chunk c's payload starts in the stream: after the header and the table at its prefix
// offset (kDelta), or at its elements in the plain piece (kFull).
RESHARD_HD inline int64_t PayloadStart(uint8_t mode, int64_t chunks, int64_t c,
                                       int64_t payload_offset, int elem_size) {
  const int64_t header = static_cast<int64_t>(sizeof(delta::StreamHeader));
  return mode == delta::kDelta ? header + 4 * chunks + payload_offset
                               : header + c * delta::kChunkElems * elem_size;
}

// Write step, per element i (value `v`) of a chunk of `n` elements encoded as `word` at
// `payload`, with its mask and prefixes: the value and, at a run start, the run's pair. A
// kBitmap chunk's words themselves are written by WriteBitmapWord.
template <typename T>
RESHARD_HD inline void EncodeElement(uint32_t word, const uint64_t* words,
                                     const int32_t* value_before, const int32_t* runs_before,
                                     int num_words, int64_t n, int64_t i, T v, uint8_t* payload) {
  constexpr int64_t es = sizeof(T);
  const uint32_t tag = word & 3;
  if (tag == delta::kRaw) {
    delta::Store<T>(payload + i * es, v);
    return;
  }
  if (tag == delta::kSame || ((words[i / 64] >> (i % 64)) & 1) == 0) return;
  if (tag == delta::kBitmap) {
    delta::Store<T>(payload + num_words * 8 + ValueIndex(words, value_before, i) * es, v);
    return;
  }
  const int64_t runs = runs_before[num_words];
  delta::Store<T>(payload + runs * 4 + ValueIndex(words, value_before, i) * es, v);
  const int64_t w = i / 64;
  const uint64_t starts = RunStartBits(words[w], w == 0 ? 0 : words[w - 1]);
  if ((starts >> (i % 64)) & 1) {
    uint8_t* pair = payload + 4 * RunIndex(words, runs_before, i);
    delta::Store<uint16_t>(pair, static_cast<uint16_t>(i));
    delta::Store<uint16_t>(pair + 2, static_cast<uint16_t>(delta::RunEnd(words, n, i) - i));
  }
}
RESHARD_HD inline void WriteBitmapWord(const uint64_t* words, int w, uint8_t* payload) {
  delta::Store<uint64_t>(payload + 8 * w, words[w]);
}

// Apply, per kRuns chunk: its number of runs, walked as delta::Decoder walks them (the pairs,
// then one value per run element) over its `bytes` of payload.
RESHARD_HD inline int64_t RunsInChunk(const uint8_t* payload, int64_t bytes, int elem_size) {
  int64_t runs = 0, changed = 0;
  for (int64_t off = 0; off + 4 <= bytes - changed * elem_size; off += 4) {
    changed += delta::Load<uint16_t>(payload + off + 2);
    ++runs;
  }
  return runs;
}

// The bits of mask word w that the run (start, length) covers.
RESHARD_HD inline uint64_t RunWordBits(int64_t start, int64_t length, int64_t w) {
  const int64_t lo = start > w * 64 ? start - w * 64 : 0;
  const int64_t end = start + length - w * 64;
  if (end <= 0 || lo >= 64) return 0;
  return delta::BitRange(static_cast<int>(lo), static_cast<int>(end < 64 ? end : 64));
}

// Where a chunk's values start in its payload (after a kBitmap chunk's words or a kRuns chunk's
// pairs; at once for kRaw).
RESHARD_HD inline int64_t ValuesStart(uint32_t tag, int num_words, int64_t runs) {
  return tag == delta::kBitmap ? num_words * 8 : (tag == delta::kRuns ? runs * 4 : 0);
}

// Apply step, per element i of a chunk: whether the stream changes it and, if so, its new value
// in `*v`. kRaw: every element; kBitmap, kRuns: the elements whose bit is set in `words`.
template <typename T>
RESHARD_HD inline bool DecodeElement(uint32_t tag, const uint64_t* words,
                                     const int32_t* value_before, const uint8_t* values, int64_t i,
                                     T* v) {
  constexpr int64_t es = sizeof(T);
  if (tag == delta::kRaw) {
    *v = delta::Load<T>(values + i * es);
    return true;
  }
  if (tag == delta::kSame || ((words[i / 64] >> (i % 64)) & 1) == 0) return false;
  *v = delta::Load<T>(values + ValueIndex(words, value_before, i) * es);
  return true;
}

}  // namespace reshard::cuda
