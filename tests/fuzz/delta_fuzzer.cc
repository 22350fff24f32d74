// Fuzzes the delta codec (src/common/delta_codec.h): a receiver decodes streams its peers sent
// (docs/delta.md), on the host and, with the same code, in the CUDA kernels, straight into its
// destination elements.
//
// Input: byte 0 picks the element size (bits 0-1: 1, 2, 4 or 8 bytes) and the mode (bit 2);
// bytes 1-2 the piece's elements (u16, 1 to three chunks and a part); byte 3 the version the
// receiver holds (0-3); byte 4 how Apply is cut into runs (see Cuts). Then:
//  - hostile mode (bit 2 clear): the rest is a stream, as a peer may send it. Decoder::Init
//    must never read past it (it is copied to a buffer of exactly its length, so ASan sees an
//    overread) and, when it accepts it, Apply must write only the piece's elements: the
//    destination lies between guard zones, and applying in the cut runs must give the same
//    elements as applying in one call; a kFull stream must leave exactly its payload.
//  - round-trip mode (bit 2 set): the rest changes elements of a pseudo-random base (pairs of
//    a u16 element index and a byte; a byte >= 0xf0 starts a run of that many low bits of
//    changed elements). EncodePiece against the base must write a stream within
//    StreamCapacity that Decoder::Init accepts at the base's version, which applied to the base
//    in the cut runs gives exactly the changed elements (kDelta, or kFull when not smaller).
// A violation aborts, which is a finding. FUZZ_DELTA_VERBOSE=1 prints each input's outcome.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "src/common/delta_codec.h"

namespace {

namespace delta = reshard::delta;

constexpr size_t kGuard = 64;
constexpr uint8_t kGuardByte = 0xCD;
constexpr int64_t kMaxElems = 3 * delta::kChunkElems + 777;
const bool verbose = std::getenv("FUZZ_DELTA_VERBOSE") != nullptr;

[[noreturn]] void Fail(const char* what, int64_t elems, int es) {
  std::fprintf(stderr, "fuzz_delta: %s (%lld elements of %d bytes)\n", what,
               static_cast<long long>(elems), es);
  std::abort();
}

// A destination of `bytes` between guard zones.
struct Guarded {
  explicit Guarded(size_t bytes) : memory(kGuard + bytes + kGuard, kGuardByte), bytes(bytes) {}
  uint8_t* data() { return memory.data() + kGuard; }
  bool GuardsIntact() const {
    for (size_t i = 0; i < kGuard; ++i) {
      if (memory[i] != kGuardByte || memory[kGuard + bytes + i] != kGuardByte) return false;
    }
    return true;
  }
  std::vector<uint8_t> memory;
  size_t bytes;
};

uint64_t Next(uint64_t* s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

// The base values: pseudo-random, the same for every input of a shape.
std::vector<uint8_t> Base(int64_t elems, int es) {
  std::vector<uint8_t> base(static_cast<size_t>(elems * es));
  uint64_t s = 0x9E3779B97F4A7C15ULL ^ static_cast<uint64_t>(elems * 8 + es);
  for (uint8_t& b : base) b = static_cast<uint8_t>(Next(&s));
  return base;
}

// Applies an accepted stream to `dst` in runs whose lengths `cut` picks (1 .. 4096 + 1
// elements, cycling), so runs start and end inside chunks, bitmap words and runs of the stream.
void ApplyInRuns(delta::Decoder decoder, uint8_t* dst, int64_t elems, int es, uint8_t cut) {
  static constexpr int64_t kLengths[8] = {
      1, 7, 63, 64, 65, 1000, delta::kChunkElems, delta::kChunkElems + 1};
  int64_t done = 0;
  for (int i = 0; done < elems; ++i) {
    int64_t n = kLengths[(cut + i) % 8] + (cut >> 3);
    if (n > elems - done) n = elems - done;
    decoder.Apply(dst + done * es, n);
    done += n;
  }
}

void Hostile(const uint8_t* data, size_t size, int64_t elems, int es, uint64_t held, uint8_t cut) {
  // Exactly the stream's bytes, so that a read past them is a heap overflow.
  const std::vector<uint8_t> stream(data, data + size);
  const uint8_t* at = stream.data();
  delta::Decoder decoder;
  const delta::DecodeError error = decoder.Init(at, static_cast<int64_t>(size), elems, es, held);
  if (verbose) {
    std::fprintf(stderr, "hostile: %zu bytes for %lld elements of %d bytes at version %llu: %s%s\n",
                 size, static_cast<long long>(elems), es, static_cast<unsigned long long>(held),
                 delta::DecodeErrorName(error),
                 error != delta::DecodeError::kOk ? ""
                 : decoder.mode() == delta::kFull ? " (kFull)"
                                                  : " (kDelta)");
  }
  if (error != delta::DecodeError::kOk) return;  // Refused before any write.
  if (decoder.bytes() > static_cast<int64_t>(size)) {
    Fail("accepted a stream longer than sent", elems, es);
  }
  const std::vector<uint8_t> base = Base(elems, es);
  const size_t bytes = base.size();
  Guarded one(bytes), cut_runs(bytes);
  if (bytes > 0) {
    std::memcpy(one.data(), base.data(), bytes);
    std::memcpy(cut_runs.data(), base.data(), bytes);
  }
  delta::Decoder whole = decoder;
  whole.Apply(one.data(), elems);
  ApplyInRuns(decoder, cut_runs.data(), elems, es, cut);
  if (!one.GuardsIntact() || !cut_runs.GuardsIntact()) {
    Fail("applying an accepted stream wrote outside the piece", elems, es);
  }
  if (one.memory != cut_runs.memory) Fail("applying in runs differs from one call", elems, es);
  if (decoder.mode() == delta::kFull && bytes > 0 &&
      std::memcmp(one.data(), at + sizeof(delta::StreamHeader), bytes) != 0) {
    Fail("a kFull stream did not leave its payload", elems, es);
  }
}

void RoundTrip(const uint8_t* data, size_t size, int64_t elems, int es, uint64_t held,
               uint8_t cut) {
  if (held == 0) held = 1;  // A kDelta stream builds on a version the receiver holds.
  const std::vector<uint8_t> base = Base(elems, es);
  std::vector<uint8_t> now = base;
  for (size_t i = 0; i + 3 <= size && elems > 0; i += 3) {
    const int64_t e = (data[i] | (data[i + 1] << 8)) % elems;
    const uint8_t v = data[i + 2];
    const int64_t run = v >= 0xf0 ? (v & 0x0f) + 1 : 1;
    for (int64_t k = e; k < elems && k < e + run; ++k) {
      now[static_cast<size_t>(k * es)] ^= static_cast<uint8_t>(v | 1);
    }
  }
  const int64_t capacity = delta::StreamCapacity(elems, es);
  std::vector<uint8_t> shadow = base;
  std::vector<uint8_t> out(static_cast<size_t>(capacity) + kGuard, kGuardByte);
  const delta::EncodeResult r =
      delta::EncodePiece(now.data(), shadow.data(), elems, es, held, /*delta=*/true, out.data());
  for (size_t i = static_cast<size_t>(capacity); i < out.size(); ++i) {
    if (out[i] != kGuardByte) Fail("EncodePiece wrote past StreamCapacity", elems, es);
  }
  if (verbose) {
    std::fprintf(stderr,
                 "round trip: %lld elements of %d bytes, %lld changed: %s of %lld bytes (chunks: "
                 "%lld same, %lld bitmap, %lld runs, %lld raw)\n",
                 static_cast<long long>(elems), es, static_cast<long long>(r.changed),
                 r.mode == delta::kDelta ? "kDelta" : "kFull", static_cast<long long>(r.bytes),
                 static_cast<long long>(r.chunks[0]), static_cast<long long>(r.chunks[1]),
                 static_cast<long long>(r.chunks[2]), static_cast<long long>(r.chunks[3]));
  }
  if (r.bytes > capacity) Fail("a stream longer than StreamCapacity", elems, es);
  if (shadow != now) Fail("EncodePiece did not update the shadow", elems, es);
  const int64_t full = static_cast<int64_t>(sizeof(delta::StreamHeader)) + elems * es;
  if ((r.mode == delta::kDelta) != (r.bytes < full)) Fail("kDelta not chosen by size", elems, es);
  // The receiver gets exactly the stream's bytes.
  const std::vector<uint8_t> stream(out.begin(), out.begin() + r.bytes);
  delta::Decoder decoder;
  if (decoder.Init(stream.data(), r.bytes, elems, es, held) != delta::DecodeError::kOk) {
    Fail("Decoder::Init refused what EncodePiece wrote", elems, es);
  }
  if (r.mode == delta::kDelta &&
      delta::Decoder().Init(stream.data(), r.bytes, elems, es, held + 1) !=
          delta::DecodeError::kBaseEpoch) {
    Fail("a kDelta stream was accepted on another version", elems, es);
  }
  Guarded dst(base.size());
  if (!base.empty()) std::memcpy(dst.data(), base.data(), base.size());
  ApplyInRuns(decoder, dst.data(), elems, es, cut);
  if (!dst.GuardsIntact()) Fail("applying a round trip wrote outside the piece", elems, es);
  if (!now.empty() && std::memcmp(dst.data(), now.data(), now.size()) != 0) {
    Fail("a round trip did not give the new values", elems, es);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  static constexpr int kSizes[4] = {1, 2, 4, 8};
  const int es = kSizes[data[0] & 3];
  const int64_t elems = (data[1] | (data[2] << 8)) % (kMaxElems + 1);
  // Empty pieces never travel as delta streams (DeltaElemBytes), so nothing encodes or decodes
  // them (their buffers may be null).
  if (elems == 0) return 0;
  const uint64_t held = data[3] & 3;
  const uint8_t cut = data[4];
  if ((data[0] & 4) != 0) {
    RoundTrip(data + 5, size - 5, elems, es, held, cut);
  } else {
    Hostile(data + 5, size - 5, elems, es, held, cut);
  }
  return 0;
}
