// The delta encoding (src/common/delta_codec.h): encode against a shadow, apply in place over
// any split into runs, byte-exact, and every malformed stream refused before a byte is written.
#include "src/common/delta_codec.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace reshard::delta {
namespace {

struct Piece {
  std::vector<uint8_t> old_values, new_values;
};

// `old` random; a fraction `f` of the elements changed, scattered, or in runs of `run` elements.
Piece MakePiece(std::mt19937_64& rng, int64_t elems, int es, double f, int64_t run = 1) {
  Piece p;
  p.old_values.resize(static_cast<size_t>(elems * es));
  for (auto& b : p.old_values) b = static_cast<uint8_t>(rng());
  p.new_values = p.old_values;
  std::uniform_real_distribution<double> u(0, 1);
  for (int64_t e = 0; e < elems; e += run) {
    if (u(rng) >= f) continue;
    for (int64_t k = e; k < std::min(elems, e + run); ++k) {
      // At least one ulp: the low byte of a little-endian element holds the low mantissa bits.
      p.new_values[static_cast<size_t>(k * es)] ^= static_cast<uint8_t>(1 + rng() % 15);
    }
  }
  return p;
}

// Encodes, checks the shadow, then applies to a copy of the old values split into random runs.
EncodeResult RoundTrip(std::mt19937_64& rng, const Piece& p, int64_t elems, int es, bool delta) {
  std::vector<uint8_t> shadow = p.old_values;
  std::vector<uint8_t> out(static_cast<size_t>(StreamCapacity(elems, es)) + 1, 0xEE);
  const EncodeResult r =
      EncodePiece(p.new_values.data(), shadow.data(), elems, es, 7, delta, out.data());
  EXPECT_LE(r.bytes, StreamCapacity(elems, es));
  EXPECT_LE(r.bytes, static_cast<int64_t>(sizeof(StreamHeader)) + elems * es);
  EXPECT_EQ(out[static_cast<size_t>(StreamCapacity(elems, es))], 0xEE);  // Nothing past it.
  EXPECT_EQ(shadow, p.new_values);
  std::vector<uint8_t> dst = p.old_values;
  Decoder d;
  EXPECT_EQ(d.Init(out.data(), r.bytes, elems, es, 7), DecodeError::kOk);
  int64_t done = 0;
  while (done < elems) {
    const int64_t n = std::min<int64_t>(elems - done, 1 + static_cast<int64_t>(rng() % 9000));
    d.Apply(dst.data() + done * es, n);
    done += n;
  }
  EXPECT_EQ(dst, p.new_values);
  return r;
}

TEST(DeltaCodec, RandomFractionsSizesAndElementSizesRoundTrip) {
  std::mt19937_64 rng(15);
  const int64_t sizes[] = {1, 63, 64, 65, 4095, 4096, 4097, 8192, 12289, 20000};
  for (int es : {1, 2, 4, 8}) {
    for (int64_t elems : sizes) {
      for (double f : {0.0, 0.001, 0.01, 0.05, 0.2, 0.5, 0.9, 1.0}) {
        SCOPED_TRACE(testing::Message() << "es " << es << " elems " << elems << " f " << f);
        const Piece p = MakePiece(rng, elems, es, f);
        RoundTrip(rng, p, elems, es, true);
        const EncodeResult full = RoundTrip(rng, p, elems, es, false);
        EXPECT_EQ(full.mode, kFull);
      }
    }
  }
}

TEST(DeltaCodec, ClusteredChangesRoundTrip) {
  std::mt19937_64 rng(16);
  for (int64_t run : {2, 17, 64, 300, 5000}) {
    for (double f : {0.01, 0.1, 0.6}) {
      const Piece p = MakePiece(rng, 30011, 2, f, run);
      RoundTrip(rng, p, 30011, 2, true);
    }
  }
}

TEST(DeltaCodec, EachChunkTakesItsSmallestEncoding) {
  std::mt19937_64 rng(17);
  const int64_t elems = 4 * kChunkElems;
  Piece p = MakePiece(rng, elems, 2, 0.0);
  // Chunk 0 unchanged; chunk 1: 5% scattered (bitmap); chunk 2: one run of 100 (runs);
  // chunk 3: everything (raw).
  for (int64_t e = kChunkElems; e < 2 * kChunkElems; e += 20) p.new_values[e * 2] ^= 1;
  for (int64_t e = 2 * kChunkElems + 10; e < 2 * kChunkElems + 110; ++e) p.new_values[e * 2] ^= 1;
  for (int64_t e = 3 * kChunkElems; e < 4 * kChunkElems; ++e) p.new_values[e * 2] ^= 1;
  const EncodeResult r = RoundTrip(rng, p, elems, 2, true);
  EXPECT_EQ(r.mode, kDelta);
  EXPECT_EQ(r.chunks[kSame], 1);
  EXPECT_EQ(r.chunks[kBitmap], 1);
  EXPECT_EQ(r.chunks[kRuns], 1);
  EXPECT_EQ(r.chunks[kRaw], 1);
  EXPECT_EQ(r.changed, kChunkElems / 20 + (kChunkElems % 20 != 0) + 100 + kChunkElems);
}

TEST(DeltaCodec, NothingChangedIsHeaderAndTableOnlyEverythingChangedIsFull) {
  std::mt19937_64 rng(18);
  const int64_t elems = 10000;
  const Piece same = MakePiece(rng, elems, 2, 0.0);
  const EncodeResult none = RoundTrip(rng, same, elems, 2, true);
  EXPECT_EQ(none.mode, kDelta);
  EXPECT_EQ(none.bytes, static_cast<int64_t>(sizeof(StreamHeader)) + 4 * NumChunks(elems));
  EXPECT_EQ(none.changed, 0);
  const Piece all = MakePiece(rng, elems, 2, 1.0);
  const EncodeResult every = RoundTrip(rng, all, elems, 2, true);
  EXPECT_EQ(every.mode, kFull);  // Not smaller as a delta: the plain piece.
  EXPECT_EQ(every.bytes, static_cast<int64_t>(sizeof(StreamHeader)) + elems * 2);
}

TEST(DeltaCodec, MalformedStreamsAreRefusedBeforeAnyWrite) {
  std::mt19937_64 rng(19);
  const int64_t elems = 9000;
  const Piece p = MakePiece(rng, elems, 2, 0.05);
  std::vector<uint8_t> shadow = p.old_values;
  std::vector<uint8_t> out(static_cast<size_t>(StreamCapacity(elems, 2)));
  const EncodeResult r =
      EncodePiece(p.new_values.data(), shadow.data(), elems, 2, 7, true, out.data());
  ASSERT_EQ(r.mode, kDelta);
  Decoder d;
  EXPECT_EQ(d.Init(out.data(), r.bytes, elems, 2, 6), DecodeError::kBaseEpoch);
  EXPECT_EQ(d.Init(out.data(), r.bytes, elems, 2, 0), DecodeError::kBaseEpoch);
  EXPECT_EQ(d.Init(out.data(), r.bytes - 1, elems, 2, 7), DecodeError::kShort);
  EXPECT_EQ(d.Init(out.data(), 16, elems, 2, 7), DecodeError::kShort);
  EXPECT_EQ(d.Init(out.data(), r.bytes, elems + 1, 2, 7), DecodeError::kShape);
  EXPECT_EQ(d.Init(out.data(), r.bytes, elems, 4, 7), DecodeError::kShape);
  auto corrupt = [&](size_t at, uint8_t x) {
    std::vector<uint8_t> bad = out;
    bad[at] ^= x;
    return d.Init(bad.data(), r.bytes, elems, 2, 7);
  };
  EXPECT_EQ(corrupt(0, 1), DecodeError::kMagic);
  EXPECT_EQ(corrupt(4, 7), DecodeError::kMagic);  // Mode 6.
  // The first chunk word: another tag, or one more payload byte.
  EXPECT_NE(corrupt(sizeof(StreamHeader), 3), DecodeError::kOk);
  EXPECT_NE(corrupt(sizeof(StreamHeader), 4), DecodeError::kOk);
  // A bit of the first bitmap word: the values no longer match the count.
  const size_t bitmap = sizeof(StreamHeader) + 4 * static_cast<size_t>(NumChunks(elems));
  EXPECT_EQ(corrupt(bitmap, 1), DecodeError::kChunk);
  // A header that claims more bytes than the stream has.
  std::vector<uint8_t> longer = out;
  StreamHeader h;
  std::memcpy(&h, longer.data(), sizeof(h));
  h.bytes += 8;
  std::memcpy(longer.data(), &h, sizeof(h));
  EXPECT_EQ(d.Init(longer.data(), r.bytes, elems, 2, 7), DecodeError::kShort);
  EXPECT_EQ(d.Init(longer.data(), r.bytes + 8, elems, 2, 7), DecodeError::kLength);
}

TEST(DeltaCodec, RunsPastTheLastElementOfAPartialChunkAreRefused) {
  // A hand-built kRuns chunk for a 100-element piece whose run ends at element 101.
  const int64_t elems = 100;
  std::vector<uint8_t> s(sizeof(StreamHeader) + 4 + 4 + 2 * 2);
  StreamHeader h;
  h.mode = kDelta;
  h.elem_size = 2;
  h.elems = elems;
  h.bytes = s.size();
  h.base_epoch = 3;
  std::memcpy(s.data(), &h, sizeof(h));
  const uint32_t word = kRuns | (8u << 2);
  std::memcpy(s.data() + sizeof(h), &word, 4);
  const uint16_t run[2] = {99, 2};
  std::memcpy(s.data() + sizeof(h) + 4, run, 4);
  Decoder d;
  EXPECT_EQ(d.Init(s.data(), static_cast<int64_t>(s.size()), elems, 2, 3), DecodeError::kChunk);
  const uint16_t inside[2] = {98, 2};
  std::memcpy(s.data() + sizeof(h) + 4, inside, 4);
  EXPECT_EQ(d.Init(s.data(), static_cast<int64_t>(s.size()), elems, 2, 3), DecodeError::kOk);
}

}  // namespace
}  // namespace reshard::delta
