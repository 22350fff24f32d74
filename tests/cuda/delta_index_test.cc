// The delta kernels' arithmetic (src/cuda/delta_index.h) on the CPU: the kernels' passes
// composed as delta_kernels.cu composes them (a block per chunk, blocks and threads in a random
// order, a warp's mask word from two 32-lane ballots, the scan over chunks) produce exactly the
// stream delta::EncodePiece writes, byte for byte, with the same result and shadow, and the
// apply writes exactly what delta::Decoder::Apply writes run by run, over random pieces: change
// fractions from 0 to 1, scattered and in runs, element sizes 1/2/4/8, sizes around chunk and
// word boundaries, contiguous and strided sources and destinations. Without a device,
// DeviceDeltaCodec::Create is a FailedPrecondition.
#include "src/cuda/delta_index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "src/common/delta_codec.h"
#include "src/cuda/delta.h"
#include "src/cuda/runtime.h"
#include "tests/cuda/delta_test_util.h"

namespace reshard::cuda {
namespace {

constexpr int kThreads = 256;  // delta_kernels.cu's block.

// Thread ids 0..kThreads-1 in a random order: the order in which a block's threads write.
std::vector<int> ThreadOrder(std::mt19937_64& rng) {
  std::vector<int> t(kThreads);
  std::iota(t.begin(), t.end(), 0);
  std::shuffle(t.begin(), t.end(), rng);
  return t;
}
std::vector<int64_t> BlockOrder(std::mt19937_64& rng, int64_t blocks) {
  std::vector<int64_t> b(static_cast<size_t>(blocks));
  std::iota(b.begin(), b.end(), 0);
  std::shuffle(b.begin(), b.end(), rng);
  return b;
}

// delta_kernels.cu's encode: MaskKernel, EncodeScanKernel, WriteKernel.
template <typename T>
delta::EncodeResult EmulateEncode(std::mt19937_64& rng, const DeltaPiece& p, const uint8_t* now,
                                  uint8_t* shadow, uint64_t base_epoch, bool delta, uint8_t* out) {
  constexpr int64_t es = sizeof(T);
  const int64_t kWords = delta::kWordsPerChunk;
  std::vector<uint64_t> masks(static_cast<size_t>(p.chunks * kWords));
  std::vector<uint32_t> chunk_words(static_cast<size_t>(p.chunks));
  std::vector<int32_t> changed(static_cast<size_t>(p.chunks));
  int32_t value_before[kWords + 1], runs_before[kWords + 1];
  // Mask: per block (chunk), per warp (word), per lane.
  for (int64_t c : BlockOrder(rng, p.chunks)) {
    const int64_t first = c * delta::kChunkElems, n = ChunkLength(p.elems, c);
    const int num_words = static_cast<int>((n + 63) / 64);
    uint64_t* words = masks.data() + c * kWords;
    for (int w = 0; w < num_words; ++w) {
      uint32_t low = 0, high = 0;
      for (int lane = 0; lane < 32; ++lane) {
        const int64_t i = int64_t{w} * 64 + lane;
        if (i < n && ElementChanged<T>(p, now, shadow, first + i)) low |= 1u << lane;
        if (i + 32 < n && ElementChanged<T>(p, now, shadow, first + i + 32)) high |= 1u << lane;
      }
      words[w] = WordOfLanes(low, high);
    }
    ChunkPrefixes(words, num_words, value_before, runs_before);
    chunk_words[c] = delta::ChunkWord(n, value_before[num_words], runs_before[num_words], es);
    changed[c] = value_before[num_words];
  }
  // Scan.
  std::vector<int64_t> offsets(static_cast<size_t>(p.chunks));
  DeltaTotals t;
  for (int64_t c = 0; c < p.chunks; ++c) {
    offsets[c] = t.payload;
    t.payload += chunk_words[c] >> 2;
    t.chunks[chunk_words[c] & 3]++;
    t.changed += changed[c];
  }
  const delta::EncodeResult r = EncodeResultOf(t, p.elems, static_cast<int>(es), delta);
  const delta::StreamHeader h = HeaderOf(r, p.elems, static_cast<int>(es), base_epoch);
  std::memcpy(out, &h, sizeof(h));
  if (r.mode == delta::kDelta) {
    for (int64_t c = 0; c < p.chunks; ++c) {
      delta::Store<uint32_t>(out + sizeof(h) + 4 * c, chunk_words[c]);
    }
  }
  // Write: per block, per thread.
  for (int64_t c : BlockOrder(rng, p.chunks)) {
    const int64_t first = c * delta::kChunkElems, n = ChunkLength(p.elems, c);
    const int num_words = static_cast<int>((n + 63) / 64);
    uint8_t* payload = out + PayloadStart(r.mode, p.chunks, c, offsets[c], static_cast<int>(es));
    const std::vector<int> threads = ThreadOrder(rng);
    auto value = [&](int64_t i) { return LoadElement<T>(now + ElementOffset(p, first + i)); };
    if (r.mode != delta::kDelta) {
      for (int th : threads) {
        for (int64_t i = th; i < n; i += kThreads) StoreElement<T>(payload + i * es, value(i));
      }
      continue;
    }
    const uint32_t word = chunk_words[c];
    const uint32_t tag = word & 3;
    if (tag == delta::kSame) continue;
    if (tag == delta::kRaw) {
      for (int th : threads) {
        for (int64_t i = th; i < n; i += kThreads) delta::Store<T>(payload + i * es, value(i));
      }
      continue;
    }
    const uint64_t* words = masks.data() + c * kWords;
    ChunkPrefixes(words, num_words, value_before, runs_before);
    for (int th : threads) {
      if (tag == delta::kBitmap && th < num_words) WriteBitmapWord(words, th, payload);
      for (int64_t i = th; i < n; i += kThreads) {
        if (((words[i / 64] >> (i % 64)) & 1) == 0) continue;
        EncodeElement<T>(word, words, value_before, runs_before, num_words, n, i, value(i),
                         payload);
      }
    }
  }
  return r;
}

// delta_kernels.cu's apply of a validated stream: ApplyScanKernel, ApplyKernel.
template <typename T>
void EmulateApply(std::mt19937_64& rng, const DeltaPiece& p, const uint8_t* in, uint8_t mode,
                  uint8_t* dst) {
  constexpr int64_t es = sizeof(T);
  const int64_t kHeader = sizeof(delta::StreamHeader);
  std::vector<int64_t> offsets(static_cast<size_t>(p.chunks));
  if (mode == delta::kDelta) {
    int64_t running = 0;
    for (int64_t c = 0; c < p.chunks; ++c) {
      offsets[c] = running;
      running += delta::Load<uint32_t>(in + kHeader + 4 * c) >> 2;
    }
  }
  uint64_t words[delta::kWordsPerChunk];
  int32_t value_before[delta::kWordsPerChunk + 1], runs_before[delta::kWordsPerChunk + 1];
  for (int64_t c : BlockOrder(rng, p.chunks)) {
    const int64_t first = c * delta::kChunkElems, n = ChunkLength(p.elems, c);
    const int num_words = static_cast<int>((n + 63) / 64);
    const std::vector<int> threads = ThreadOrder(rng);
    auto store = [&](int64_t i, T v) { StoreElement<T>(dst + ElementOffset(p, first + i), v); };
    if (mode != delta::kDelta) {
      const uint8_t* payload = in + PayloadStart(mode, p.chunks, c, 0, static_cast<int>(es));
      for (int th : threads) {
        for (int64_t i = th; i < n; i += kThreads) store(i, LoadElement<T>(payload + i * es));
      }
      continue;
    }
    const uint32_t word = delta::Load<uint32_t>(in + kHeader + 4 * c);
    const uint32_t tag = word & 3;
    if (tag == delta::kSame) continue;
    const uint8_t* payload = in + PayloadStart(mode, p.chunks, c, offsets[c], static_cast<int>(es));
    if (tag == delta::kRaw) {
      for (int th : threads) {
        for (int64_t i = th; i < n; i += kThreads) store(i, delta::Load<T>(payload + i * es));
      }
      continue;
    }
    int64_t runs = 0;
    if (tag == delta::kBitmap) {
      for (int w = 0; w < num_words; ++w) words[w] = delta::Load<uint64_t>(payload + 8 * w);
    } else {
      std::fill(words, words + num_words, 0);
      runs = RunsInChunk(payload, word >> 2, static_cast<int>(es));
      for (int64_t r : BlockOrder(rng, runs)) {  // Threads over runs, in any order.
        const int64_t start = delta::Load<uint16_t>(payload + 4 * r);
        const int64_t length = delta::Load<uint16_t>(payload + 4 * r + 2);
        for (int64_t w = start / 64; w <= (start + length - 1) / 64; ++w) {
          words[w] |= RunWordBits(start, length, w);
        }
      }
    }
    ChunkPrefixes(words, num_words, value_before, runs_before);
    const uint8_t* values = payload + ValuesStart(tag, num_words, runs);
    for (int th : threads) {
      for (int64_t i = th; i < n; i += kThreads) {
        T v;
        if (DecodeElement<T>(tag, words, value_before, values, i, &v)) store(i, v);
      }
    }
  }
}

delta::EncodeResult Encode(std::mt19937_64& rng, const DeltaPiece& p, const uint8_t* now,
                           uint8_t* shadow, uint64_t base_epoch, bool delta, uint8_t* out) {
  switch (p.elem_size) {
    case 1:
      return EmulateEncode<uint8_t>(rng, p, now, shadow, base_epoch, delta, out);
    case 2:
      return EmulateEncode<uint16_t>(rng, p, now, shadow, base_epoch, delta, out);
    case 4:
      return EmulateEncode<uint32_t>(rng, p, now, shadow, base_epoch, delta, out);
    default:
      return EmulateEncode<uint64_t>(rng, p, now, shadow, base_epoch, delta, out);
  }
}
void Apply(std::mt19937_64& rng, const DeltaPiece& p, const uint8_t* in, uint8_t mode,
           uint8_t* dst) {
  switch (p.elem_size) {
    case 1:
      return EmulateApply<uint8_t>(rng, p, in, mode, dst);
    case 2:
      return EmulateApply<uint16_t>(rng, p, in, mode, dst);
    case 4:
      return EmulateApply<uint32_t>(rng, p, in, mode, dst);
    default:
      return EmulateApply<uint64_t>(rng, p, in, mode, dst);
  }
}

TEST(DeltaIndex, KernelStepsEqualTheHostCodecByteForByte) {
  std::mt19937_64 rng(2015);
  int pieces = 0, deltas = 0, fulls = 0, refused = 0;
  int64_t by_tag[4] = {0, 0, 0, 0};
  for (int iter = 0; iter < 2200; ++iter) {
    const testing::DeltaCase dc = testing::MakeDeltaCase(rng, iter);
    const testing::Layout& src = dc.src;
    const testing::Layout& dst = dc.dst;
    const std::vector<uint8_t>& source = dc.source;
    const std::vector<uint8_t>& now = dc.now;
    const std::vector<uint8_t>& old = dc.old;
    const int es = src.piece.elem_size;
    const int64_t elems = src.piece.elems;
    const bool delta = dc.delta;
    const uint64_t base = dc.base;
    SCOPED_TRACE(::testing::Message() << "iter " << iter << " " << dc.what);
    const auto capacity = static_cast<size_t>(delta::StreamCapacity(elems, es));

    std::vector<uint8_t> host_shadow = old, host_out(capacity, 0xEE);
    const delta::EncodeResult want =
        delta::EncodePiece(now.data(), host_shadow.data(), elems, es, base, delta, host_out.data());
    std::vector<uint8_t> kernel_shadow = old, kernel_out(capacity, 0x11);
    const delta::EncodeResult got =
        Encode(rng, src.piece, source.data(), kernel_shadow.data(), base, delta, kernel_out.data());
    ASSERT_EQ(got.bytes, want.bytes);
    ASSERT_EQ(got.mode, want.mode);
    ASSERT_EQ(got.changed, want.changed);
    for (int k = 0; k < 4; ++k) ASSERT_EQ(got.chunks[k], want.chunks[k]) << "tag " << k;
    ASSERT_TRUE(std::equal(host_out.begin(), host_out.begin() + want.bytes, kernel_out.begin()));
    ASSERT_EQ(kernel_shadow, host_shadow);
    ++pieces;
    (want.mode == delta::kDelta ? deltas : fulls)++;
    for (int k = 0; k < 4; ++k) by_tag[k] += want.chunks[k];

    // Apply to a destination that holds the old values (or, now and then, another version).
    const std::vector<uint8_t> before = testing::DestinationHolding(rng, dst, old);
    const uint64_t held = rng() % 16 == 0 ? base + 1 : base;
    delta::Decoder decoder;
    const delta::DecodeError error = decoder.Init(host_out.data(), want.bytes, elems, es, held);
    if (error != delta::DecodeError::kOk) {
      ASSERT_EQ(want.mode, delta::kDelta);
      ASSERT_NE(held, base);
      ++refused;  // Nothing is launched for a refused stream.
      continue;
    }
    std::vector<uint8_t> want_dst = before;
    for (int64_t at : dst.runs) decoder.Apply(&want_dst[at], dst.run_bytes / es);
    std::vector<uint8_t> got_dst = before;
    Apply(rng, dst.piece, host_out.data(), decoder.mode(), got_dst.data());
    ASSERT_EQ(got_dst, want_dst);
    if (held == base) {
      // The destination's piece now holds the new values.
      std::vector<uint8_t> piece;
      for (int64_t at : dst.runs) {
        piece.insert(piece.end(), &got_dst[at], &got_dst[at] + dst.run_bytes);
      }
      ASSERT_EQ(piece, now);
    }
  }
  EXPECT_GE(pieces, 2000);
  // Every chunk encoding and both modes were exercised, and refused streams too.
  EXPECT_GT(deltas, 500);
  EXPECT_GT(fulls, 200);
  EXPECT_GT(refused, 10);
  for (int k = 0; k < 4; ++k) EXPECT_GT(by_tag[k], 100) << "tag " << k;
}

TEST(DeltaIndex, RunBitsCoverExactlyTheRun) {
  for (int64_t start : {0, 1, 63, 64, 65, 100, 4000}) {
    for (int64_t length : {1, 2, 63, 64, 65, 96}) {
      if (start + length > delta::kChunkElems) continue;
      for (int64_t w = 0; w < delta::kWordsPerChunk; ++w) {
        const uint64_t bits = RunWordBits(start, length, w);
        for (int i = 0; i < 64; ++i) {
          const int64_t e = w * 64 + i;
          EXPECT_EQ((bits >> i) & 1, static_cast<uint64_t>(e >= start && e < start + length))
              << start << " " << length << " " << e;
        }
      }
    }
  }
}

// Without a usable device (or without the kernels) the codec says so at Create instead of
// failing later; with a device, Create succeeds unless the build lacks the kernels, and then
// says that. Every machine checks one of the two.
// The pipeline's stream copy (LaunchStreamCopy) moves CopyWords(length) whole words: every byte
// of any stream length the encode can report, and never past the piece's capacity rounded up to
// a word, which is what the codec's device stream and a pipeline slot's entry hold.
TEST(DeltaIndex, StreamCopyWordsCoverTheStreamInsideItsRoundedCapacity) {
  for (const int es : {1, 2, 4, 8}) {
    for (const int64_t elems :
         {int64_t{1}, int64_t{3}, int64_t{4095}, int64_t{4097}, int64_t{12289}}) {
      const int64_t capacity = delta::StreamCapacity(elems, es);
      const int64_t header = static_cast<int64_t>(sizeof(delta::StreamHeader));
      for (int64_t bytes = header; bytes <= capacity; ++bytes) {
        const int64_t words = CopyWords(bytes);
        ASSERT_GE(words * 8, bytes) << "es " << es << " elems " << elems << " bytes " << bytes;
        ASSERT_LT(words * 8, bytes + 8);
        ASSERT_LE(words * 8, (capacity + 7) / 8 * 8);
      }
    }
  }
}

TEST(DeltaIndex, DeviceCodecIsAFailedPreconditionWithoutADevice) {
  const absl::StatusOr<std::unique_ptr<DeviceDeltaCodec>> codec =
      DeviceDeltaCodec::Create(1 << 20, 1 << 20);
  if (CudaDeviceCount() == 0) {
    ASSERT_FALSE(codec.ok());
    EXPECT_EQ(codec.status().code(), absl::StatusCode::kFailedPrecondition) << codec.status();
  } else if (!codec.ok()) {
    EXPECT_EQ(codec.status().code(), absl::StatusCode::kFailedPrecondition) << codec.status();
    EXPECT_NE(codec.status().message().find("this build has no CUDA delta kernels"),
              absl::string_view::npos)
        << codec.status();
  }
}

}  // namespace
}  // namespace reshard::cuda
