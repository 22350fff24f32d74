// The delta encoding of one piece (docs/delta.md), compiled for host and device.
//
// A source keeps a shadow of what it last sent for a piece. Each refit it compares the piece's
// new values with the shadow element by element (elements of 1, 2, 4 or 8 bytes, compared as
// bits) and writes a stream:
//
//   StreamHeader (32 bytes)
//   kFull:  the piece's bytes.
//   kDelta: one 32-bit word per chunk of kChunkElems elements (tag in the low 2 bits, payload
//           bytes above), then the chunks' payloads back to back:
//             kSame    nothing changed: no payload;
//             kBitmap  ceil(n / 64) 64-bit words, bit i set when element i changed, then the
//                      changed elements' values in order;
//             kRuns    (start, length) as two 16-bit words per run of changed elements, then
//                      their values in order;
//             kRaw     the chunk's n elements.
// Each chunk takes the smallest of its encodings (ties: kBitmap, then kRuns, then kRaw), and a
// piece whose kDelta stream is not smaller than its kFull stream travels as kFull. A stream is
// never longer than StreamCapacity(). Nothing is aligned: every multi-byte field is read and
// written with memcpy, so a stream may start at any byte of a landing area.
//
// A receiver applies a stream in place over the piece's destination elements, which must hold
// exactly the values the shadow held (version `base_epoch`): Decoder walks the stream in
// element order, so it applies a piece scattered over many contiguous runs run by run.
// Decoder::Init validates the whole stream against what the receiver expects (magic, mode,
// element size and count, base epoch, every chunk word, run and bitmap count, the total
// length) before any byte is written; a malformed stream writes nothing.
//
// Every function is RESHARD_HD, so CUDA encode/decode kernels can run the same code per chunk
// or per piece (tests/common/delta_codec_test.cc checks it on the CPU); the inner loops are
// branch-free over 64 elements (a mask per 64 elements), and the copies of changed values cost per
// changed element or per run, not per element of the chunk.
#pragma once

#include <cstdint>
#include <cstring>

#include "src/common/host_device.h"

namespace reshard::delta {

constexpr uint32_t kMagic = 0x544c4544;  // "DELT"
constexpr int64_t kChunkElems = 4096;    // A u16 holds every start and length.
constexpr int64_t kWordsPerChunk = kChunkElems / 64;

enum Mode : uint8_t { kFull = 0, kDelta = 1 };
// Why a kFull stream went plain, as its sender says (StreamHeader::why_full; statistics only,
// the decoder ignores it): the kDelta stream was not smaller (what the codec writes), the
// sender had no base version, or the receiver held another version than the sender's. A relay
// forwards the reason with the stream.
enum WhyFull : uint8_t { kNotSmaller = 0, kNoBase = 1, kReceiverVersion = 2 };
enum ChunkTag : uint32_t { kSame = 0, kBitmap = 1, kRuns = 2, kRaw = 3 };

struct StreamHeader {
  uint32_t magic = kMagic;
  uint8_t mode = kFull;
  uint8_t elem_size = 0;
  uint8_t why_full = kNotSmaller;  // kFull: a WhyFull.
  uint8_t reserved = 0;
  uint64_t elems = 0;       // Elements of the piece.
  uint64_t bytes = 0;       // The whole stream, header included.
  uint64_t base_epoch = 0;  // kDelta: the version of the values it applies to.
};
static_assert(sizeof(StreamHeader) == 32);

RESHARD_HD inline int64_t NumChunks(int64_t elems) {
  return (elems + kChunkElems - 1) / kChunkElems;
}
// The shortest stream: a kDelta header and one chunk word (nothing changed in a piece of one
// chunk). A piece of at most this many bytes never gains from a stream (plan::DeltaElemBytes
// sends it plain).
constexpr int64_t kShortestStream = sizeof(StreamHeader) + 4;
// The largest stream of a piece of `elems` elements of `elem_size` bytes (what a landing area
// reserves for it).
RESHARD_HD inline int64_t StreamCapacity(int64_t elems, int elem_size) {
  return static_cast<int64_t>(sizeof(StreamHeader)) + 4 * NumChunks(elems) + elems * elem_size;
}

// A piece travels as consecutive segments of at most SegmentElems(elem_size) elements (the
// last may be shorter), each its own stream (header, chunk table, payloads) at a fixed offset:
// segment k's stream starts at k * SegmentStride(elem_size) bytes of the piece's reserved area,
// whatever the earlier segments' lengths. So a sender encodes segment k+1 while segment k is
// on the wire, and a receiver applies segment k as soon as all of it is here, instead of
// encoding and applying the whole piece before its first byte leaves and after its last lands.
// A segment is a whole number of chunks (for every element size), so segmenting changes no
// chunk's encoding, only the headers and which segments fall back to kFull.
constexpr int64_t kSegmentBytes = int64_t{256} << 10;
RESHARD_HD inline int64_t SegmentElems(int elem_size) { return kSegmentBytes / elem_size; }
static_assert(kSegmentBytes / 8 % kChunkElems == 0);
RESHARD_HD inline int64_t NumSegments(int64_t elems, int elem_size) {
  const int64_t s = SegmentElems(elem_size);
  return (elems + s - 1) / s;
}
RESHARD_HD inline int64_t SegmentStride(int elem_size) {
  return StreamCapacity(SegmentElems(elem_size), elem_size);
}
// First element and element count of segment k.
RESHARD_HD inline int64_t SegmentFirst(int64_t k, int elem_size) {
  return k * SegmentElems(elem_size);
}
RESHARD_HD inline int64_t SegmentLength(int64_t elems, int elem_size, int64_t k) {
  const int64_t rest = elems - SegmentFirst(k, elem_size);
  return rest < SegmentElems(elem_size) ? rest : SegmentElems(elem_size);
}
// The bytes reserved for a piece's segments (what its landing area and send scratch hold).
RESHARD_HD inline int64_t PieceCapacity(int64_t elems, int elem_size) {
  const int64_t n = NumSegments(elems, elem_size);
  if (n == 0) return 0;
  return (n - 1) * SegmentStride(elem_size) +
         StreamCapacity(SegmentLength(elems, elem_size, n - 1), elem_size);
}

RESHARD_HD inline int Popcount64(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __popcll(x);
#else
  return __builtin_popcountll(x);
#endif
}
RESHARD_HD inline int Ctz64(uint64_t x) {  // x != 0.
#if defined(__CUDA_ARCH__)
  return __ffsll(static_cast<long long>(x)) - 1;
#else
  return __builtin_ctzll(x);
#endif
}
// Bits [lo, hi) of a 64-bit word, 0 <= lo <= hi <= 64.
RESHARD_HD inline uint64_t BitRange(int lo, int hi) {
  const uint64_t below_hi = hi >= 64 ? ~uint64_t{0} : (uint64_t{1} << hi) - 1;
  return below_hi & ~((uint64_t{1} << lo) - 1);
}

template <typename T>
RESHARD_HD inline T Load(const uint8_t* p) {
  T v;
  memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
RESHARD_HD inline void Store(uint8_t* p, T v) {
  memcpy(p, &v, sizeof(T));
}

// The change mask of one chunk: words[w] bit i set when element 64w + i differs. `n` <=
// kChunkElems. Returns the number of changed elements; `*runs` gets the number of runs.
template <typename T>
RESHARD_HD inline int64_t ChunkMask(const uint8_t* now, const uint8_t* shadow, int64_t n,
                                    uint64_t* words, int64_t* runs) {
  int64_t changed = 0, run_count = 0;
  uint64_t carry = 0;  // Bit 63 of the previous word, as bit 0.
  const int64_t full_words = n / 64;
  for (int64_t w = 0; w < full_words; ++w) {
    T a[64], b[64];
    memcpy(a, now + w * 64 * sizeof(T), sizeof(a));
    memcpy(b, shadow + w * 64 * sizeof(T), sizeof(b));
    // One byte per element (a vectorised compare), then 8 bytes of 0/1 to 8 bits with one
    // multiply: byte j of `v` lands on bit 56 + j, and no partial product carries into them.
    uint8_t ne[64];
    for (int i = 0; i < 64; ++i) ne[i] = a[i] != b[i];
    uint64_t m = 0;
    for (int k = 0; k < 8; ++k) {
      const uint64_t v = Load<uint64_t>(ne + 8 * k);
      m |= ((v * 0x0102040810204080ull) >> 56) << (8 * k);
    }
    words[w] = m;
  }
  if (n % 64 != 0) {
    uint64_t m = 0;
    for (int64_t i = 0; i < n % 64; ++i) {
      const int64_t e = full_words * 64 + i;
      m |= static_cast<uint64_t>(Load<T>(now + e * sizeof(T)) != Load<T>(shadow + e * sizeof(T)))
           << i;
    }
    words[full_words] = m;
  }
  const int64_t num_words = (n + 63) / 64;
  for (int64_t w = 0; w < num_words; ++w) {
    const uint64_t m = words[w];
    changed += Popcount64(m);
    run_count += Popcount64(m & ~((m << 1) | carry));
    carry = m >> 63;
  }
  *runs = run_count;
  return changed;
}

// Payload bytes of each chunk encoding.
RESHARD_HD inline int64_t BitmapBytes(int64_t n, int64_t changed, int es) {
  return (n + 63) / 64 * 8 + changed * es;
}
RESHARD_HD inline int64_t RunsBytes(int64_t runs, int64_t changed, int es) {
  return runs * 4 + changed * es;
}

// The chunk word of a chunk of `n` elements of `es` bytes with `changed` changed elements in
// `runs` runs: its smallest encoding (ties: kBitmap, then kRuns, then kRaw) and payload bytes.
RESHARD_HD inline uint32_t ChunkWord(int64_t n, int64_t changed, int64_t runs, int es) {
  if (changed == 0) return kSame;
  const int64_t bitmap = BitmapBytes(n, changed, es), run_bytes = RunsBytes(runs, changed, es),
                raw = n * es;
  if (bitmap <= run_bytes && bitmap < raw) return kBitmap | static_cast<uint32_t>(bitmap << 2);
  if (run_bytes < raw) return kRuns | static_cast<uint32_t>(run_bytes << 2);
  return kRaw | static_cast<uint32_t>(raw << 2);
}

// One past the last element of the run of changed elements that starts at `start` (its bit is
// set) in a chunk of `n` elements whose mask is `words`: the next clear bit, or n.
RESHARD_HD inline int64_t RunEnd(const uint64_t* words, int64_t n, int64_t start) {
  const int64_t num_words = (n + 63) / 64;
  int64_t w = start / 64;
  uint64_t z = ~words[w] & ~BitRange(0, static_cast<int>(start % 64));
  while (z == 0 && ++w < num_words) z = ~words[w];
  return z == 0 ? n : (w * 64 + Ctz64(z) < n ? w * 64 + Ctz64(z) : n);
}

// Encodes one chunk of `n` elements into `out` (room for n * sizeof(T) bytes); returns its
// chunk word (tag | payload bytes << 2). `words` is the chunk's mask (ChunkMask).
template <typename T>
RESHARD_HD inline uint32_t EncodeChunk(const uint8_t* now, int64_t n, const uint64_t* words,
                                       int64_t changed, int64_t runs, uint8_t* out) {
  constexpr int es = sizeof(T);
  const int64_t num_words = (n + 63) / 64;
  const uint32_t word = ChunkWord(n, changed, runs, es);
  if ((word & 3) == kBitmap) {
    memcpy(out, words, static_cast<size_t>(num_words * 8));
    uint8_t* values = out + num_words * 8;
    for (int64_t w = 0; w < num_words; ++w) {
      for (uint64_t m = words[w]; m != 0; m &= m - 1) {
        const int64_t e = w * 64 + Ctz64(m);
        memcpy(values, now + e * es, es);
        values += es;
      }
    }
    return word;
  }
  if ((word & 3) == kRuns) {
    uint8_t* pairs = out;
    uint8_t* values = out + runs * 4;
    int64_t e = 0;
    while (e < n) {
      // The next set bit at or after e.
      int64_t w = e / 64;
      uint64_t m = words[w] & ~BitRange(0, static_cast<int>(e % 64));
      while (m == 0 && ++w < num_words) m = words[w];
      if (m == 0) break;
      const int64_t start = w * 64 + Ctz64(m);
      const int64_t end = RunEnd(words, n, start);
      Store<uint16_t>(pairs, static_cast<uint16_t>(start));
      Store<uint16_t>(pairs + 2, static_cast<uint16_t>(end - start));
      pairs += 4;
      memcpy(values, now + start * es, static_cast<size_t>((end - start) * es));
      values += (end - start) * es;
      e = end;
    }
    return word;
  }
  if ((word & 3) == kRaw) memcpy(out, now, static_cast<size_t>(n * es));
  return word;
}

// What EncodePiece did, for statistics.
struct EncodeResult {
  int64_t bytes = 0;  // Stream length.
  Mode mode = kFull;
  int64_t changed = 0;               // Changed elements (kDelta), or every element (kFull).
  int64_t chunks[4] = {0, 0, 0, 0};  // By ChunkTag (kDelta).
};

// Writes the header of a kFull stream of `elems` elements of `elem_size` bytes at `out`, whose
// plain elements follow it (the caller writes them at out + sizeof(StreamHeader)), and returns
// what EncodePiece returns for such a stream.
RESHARD_HD inline EncodeResult FullHeader(int64_t elems, int elem_size, uint8_t* out) {
  StreamHeader h;
  h.mode = kFull;
  h.elem_size = static_cast<uint8_t>(elem_size);
  h.elems = static_cast<uint64_t>(elems);
  h.bytes = sizeof(StreamHeader) + static_cast<uint64_t>(elems * elem_size);
  memcpy(out, &h, sizeof(h));
  EncodeResult r;
  r.bytes = static_cast<int64_t>(h.bytes);
  r.mode = kFull;
  r.changed = elems;
  return r;
}

template <typename T>
RESHARD_HD inline EncodeResult EncodePieceT(const uint8_t* now, uint8_t* shadow, int64_t elems,
                                            uint64_t base_epoch, bool delta, uint8_t* out) {
  constexpr int es = sizeof(T);
  EncodeResult r;
  const int64_t raw = elems * es;
  const int64_t full_bytes = static_cast<int64_t>(sizeof(StreamHeader)) + raw;
  StreamHeader h;
  h.elem_size = es;
  h.elems = static_cast<uint64_t>(elems);
  if (delta) {
    const int64_t chunks = NumChunks(elems);
    uint8_t* table = out + sizeof(StreamHeader);
    uint8_t* payload = table + 4 * chunks;
    int64_t length = payload - out;
    uint64_t words[kWordsPerChunk];
    for (int64_t c = 0; c < chunks && length < full_bytes; ++c) {
      const int64_t first = c * kChunkElems;
      const int64_t n = elems - first < kChunkElems ? elems - first : kChunkElems;
      int64_t runs = 0;
      const int64_t changed = ChunkMask<T>(now + first * es, shadow + first * es, n, words, &runs);
      const uint32_t word = EncodeChunk<T>(now + first * es, n, words, changed, runs, payload);
      Store<uint32_t>(table + 4 * c, word);
      r.chunks[word & 3]++;
      r.changed += changed;
      payload += word >> 2;
      length += word >> 2;
    }
    if (length < full_bytes) {
      h.mode = kDelta;
      h.bytes = static_cast<uint64_t>(length);
      h.base_epoch = base_epoch;
      memcpy(out, &h, sizeof(h));
      memcpy(shadow, now, static_cast<size_t>(raw));
      r.bytes = length;
      r.mode = kDelta;
      return r;
    }
  }
  memcpy(out + sizeof(h), now, static_cast<size_t>(raw));
  memcpy(shadow, now, static_cast<size_t>(raw));
  return FullHeader(elems, es, out);
}

// Encodes the piece `now` (elems elements of elem_size bytes, contiguous) against `shadow`
// into `out` (StreamCapacity bytes) and copies `now` into `shadow`. `delta` false: a kFull
// stream (no shadow version to build on). A kDelta stream records `base_epoch`, the version of
// the values the shadow held.
RESHARD_HD inline EncodeResult EncodePiece(const void* now, void* shadow, int64_t elems,
                                           int elem_size, uint64_t base_epoch, bool delta,
                                           void* out) {
  auto* n = static_cast<const uint8_t*>(now);
  auto* s = static_cast<uint8_t*>(shadow);
  auto* o = static_cast<uint8_t*>(out);
  switch (elem_size) {
    case 1:
      return EncodePieceT<uint8_t>(n, s, elems, base_epoch, delta, o);
    case 2:
      return EncodePieceT<uint16_t>(n, s, elems, base_epoch, delta, o);
    case 4:
      return EncodePieceT<uint32_t>(n, s, elems, base_epoch, delta, o);
    default:
      return EncodePieceT<uint64_t>(n, s, elems, base_epoch, delta, o);
  }
}

// Why Decoder::Init refused a stream.
enum class DecodeError {
  kOk,
  kShort,      // Shorter than its header, or than the header says.
  kMagic,      // Not a delta stream.
  kShape,      // Element size or count is not the piece's.
  kLength,     // The header's length is not what its contents need.
  kBaseEpoch,  // A kDelta stream built on another version than the receiver holds.
  kChunk,      // A chunk word, run or bitmap that does not fit its chunk.
};
RESHARD_HD inline const char* DecodeErrorName(DecodeError e) {
  switch (e) {
    case DecodeError::kOk:
      return "ok";
    case DecodeError::kShort:
      return "stream shorter than its header says";
    case DecodeError::kMagic:
      return "not a delta stream (bad magic or mode)";
    case DecodeError::kShape:
      return "element size or count differs from the piece's";
    case DecodeError::kLength:
      return "stream length disagrees with its chunks";
    case DecodeError::kBaseEpoch:
      return "delta built on another version than this rank holds";
    case DecodeError::kChunk:
      return "malformed chunk (tag, run or bitmap)";
  }
  return "?";
}

// Applies one stream to the piece's destination elements, in element order over any number of
// contiguous runs (Apply with each run in turn). Thread-compatible; holds pointers into the
// stream, which must outlive it.
class Decoder {
 public:
  // Validates the whole stream (`length` bytes available) for a piece of `elems` elements of
  // `elem_size` bytes at the receiver, whose destination holds version `held_epoch`.
  RESHARD_HD DecodeError Init(const uint8_t* stream, int64_t length, int64_t elems, int elem_size,
                              uint64_t held_epoch) {
    if (length < static_cast<int64_t>(sizeof(StreamHeader))) return DecodeError::kShort;
    memcpy(&h_, stream, sizeof(h_));
    if (h_.magic != kMagic || h_.mode > kDelta) return DecodeError::kMagic;
    if (h_.elem_size != elem_size || h_.elems != static_cast<uint64_t>(elems)) {
      return DecodeError::kShape;
    }
    if (h_.bytes > static_cast<uint64_t>(length)) return DecodeError::kShort;
    es_ = elem_size;
    elems_ = elems;
    stream_ = stream;
    if (h_.mode == kFull) {
      if (h_.bytes != sizeof(StreamHeader) + static_cast<uint64_t>(elems * elem_size)) {
        return DecodeError::kLength;
      }
      return DecodeError::kOk;
    }
    if (h_.base_epoch != held_epoch || held_epoch == 0) return DecodeError::kBaseEpoch;
    const int64_t chunks = NumChunks(elems);
    table_ = stream + sizeof(StreamHeader);
    int64_t pos = static_cast<int64_t>(sizeof(StreamHeader)) + 4 * chunks;
    if (pos > static_cast<int64_t>(h_.bytes)) return DecodeError::kLength;
    for (int64_t c = 0; c < chunks; ++c) {
      const uint32_t word = Load<uint32_t>(table_ + 4 * c);
      const int64_t bytes = word >> 2;
      const int64_t n =
          elems - c * kChunkElems < kChunkElems ? elems - c * kChunkElems : kChunkElems;
      if (pos + bytes > static_cast<int64_t>(h_.bytes)) return DecodeError::kLength;
      if (!ValidChunk(word & 3, stream + pos, bytes, n)) return DecodeError::kChunk;
      pos += bytes;
    }
    if (pos != static_cast<int64_t>(h_.bytes)) return DecodeError::kLength;
    chunk_ = -1;
    NextChunk();
    return DecodeError::kOk;
  }

  RESHARD_HD Mode mode() const { return static_cast<Mode>(h_.mode); }
  RESHARD_HD int64_t bytes() const { return static_cast<int64_t>(h_.bytes); }

  // Applies the next `n` elements of the piece to `dst` (n contiguous elements).
  RESHARD_HD void Apply(uint8_t* dst, int64_t n) {
    if (h_.mode == kFull) {
      memcpy(dst, stream_ + sizeof(StreamHeader) + done_ * es_, static_cast<size_t>(n * es_));
      done_ += n;
      return;
    }
    while (n > 0) {
      const int64_t m = n < chunk_n_ - at_ ? n : chunk_n_ - at_;
      switch (tag_) {
        case kSame:
          break;
        case kRaw:
          memcpy(dst, payload_ + at_ * es_, static_cast<size_t>(m * es_));
          break;
        case kBitmap:
          ApplyBitmap(dst, m);
          break;
        case kRuns:
          ApplyRuns(dst, m);
          break;
      }
      at_ += m;
      dst += m * es_;
      n -= m;
      done_ += m;
      if (at_ == chunk_n_) NextChunk();
    }
  }

 private:
  RESHARD_HD bool ValidChunk(uint32_t tag, const uint8_t* p, int64_t bytes, int64_t n) const {
    switch (tag) {
      case kSame:
        return bytes == 0;
      case kRaw:
        return bytes == n * es_;
      case kBitmap: {
        const int64_t words = (n + 63) / 64;
        if (bytes < words * 8) return false;
        int64_t changed = 0;
        for (int64_t w = 0; w < words; ++w) {
          uint64_t m = Load<uint64_t>(p + 8 * w);
          if (w == words - 1 && n % 64 != 0 && (m & ~BitRange(0, static_cast<int>(n % 64)))) {
            return false;
          }
          changed += Popcount64(m);
        }
        return bytes == words * 8 + changed * es_;
      }
      case kRuns: {
        // Runs ascend without touching, inside the chunk; values follow them.
        int64_t end = -1, changed = 0, runs = 0;
        for (int64_t off = 0; off + 4 <= bytes - changed * es_; off += 4) {
          const int64_t start = Load<uint16_t>(p + off), len = Load<uint16_t>(p + off + 2);
          if (len == 0 || start <= end || start + len > n) return false;
          end = start + len;
          changed += len;
          ++runs;
        }
        return runs > 0 && bytes == runs * 4 + changed * es_;
      }
    }
    return false;
  }

  RESHARD_HD void NextChunk() {
    ++chunk_;
    at_ = 0;
    if (chunk_ >= NumChunks(elems_)) return;
    const int64_t first = chunk_ * kChunkElems;
    chunk_n_ = elems_ - first < kChunkElems ? elems_ - first : kChunkElems;
    const uint32_t word = Load<uint32_t>(table_ + 4 * chunk_);
    tag_ = word & 3;
    payload_ = chunk_ == 0 ? table_ + 4 * NumChunks(elems_) : next_payload_;
    next_payload_ = payload_ + (word >> 2);
    values_used_ = 0;
    run_ = 0;
    if (tag_ == kRuns) {
      // Count the runs: the payload is 4 bytes per run plus one value per run element.
      int64_t runs = 0, changed = 0;
      const int64_t bytes = word >> 2;
      for (int64_t off = 0; off + 4 <= bytes - changed * es_; off += 4) {
        changed += Load<uint16_t>(payload_ + off + 2);
        ++runs;
      }
      runs_ = runs;
    }
  }

  RESHARD_HD void ApplyBitmap(uint8_t* dst, int64_t m) {
    const int64_t words = (chunk_n_ + 63) / 64;
    const uint8_t* values = payload_ + words * 8;
    const int64_t lo = at_, hi = at_ + m;
    for (int64_t w = lo / 64; w * 64 < hi; ++w) {
      const int a = static_cast<int>(lo > w * 64 ? lo - w * 64 : 0);
      const int b = static_cast<int>(hi < w * 64 + 64 ? hi - w * 64 : 64);
      for (uint64_t bits = Load<uint64_t>(payload_ + 8 * w) & BitRange(a, b); bits != 0;
           bits &= bits - 1) {
        const int64_t e = w * 64 + Ctz64(bits);
        memcpy(dst + (e - lo) * es_, values + values_used_ * es_, static_cast<size_t>(es_));
        ++values_used_;
      }
    }
  }

  RESHARD_HD void ApplyRuns(uint8_t* dst, int64_t m) {
    const uint8_t* values = payload_ + runs_ * 4;
    const int64_t lo = at_, hi = at_ + m;
    while (run_ < runs_) {
      const int64_t start = Load<uint16_t>(payload_ + 4 * run_);
      const int64_t end = start + Load<uint16_t>(payload_ + 4 * run_ + 2);
      if (start >= hi) return;
      const int64_t a = start > lo ? start : lo, b = end < hi ? end : hi;
      if (a < b) {
        // values_used_ counts the values of runs before run_; a - start more precede `a`.
        memcpy(dst + (a - lo) * es_, values + (values_used_ + a - start) * es_,
               static_cast<size_t>((b - a) * es_));
      }
      if (end > hi) return;  // The run continues in the next call.
      values_used_ += end - start;
      ++run_;
    }
  }

  StreamHeader h_;
  int es_ = 1;
  int64_t elems_ = 0, done_ = 0;
  const uint8_t* stream_ = nullptr;
  const uint8_t* table_ = nullptr;
  int64_t chunk_ = 0, chunk_n_ = 0, at_ = 0;
  uint32_t tag_ = kSame;
  const uint8_t* payload_ = nullptr;
  const uint8_t* next_payload_ = nullptr;
  int64_t values_used_ = 0, run_ = 0, runs_ = 0;
};

}  // namespace reshard::delta
