// The delta kernels on a device (cuda::DeviceDeltaCodec) against the host codec, byte for byte:
// random pieces (tests/cuda/delta_test_util.h: element sizes 1/2/4/8, sizes around chunk
// boundaries, change fractions 0 to 1, scattered and in runs, strided sources and destinations)
// encoded against a device shadow into the stream delta::EncodePiece writes, with the same result
// and shadow, and applied to a device destination as delta::Decoder::Apply applies them; refused
// streams write nothing; 8 MiB bf16 pieces over many refits with one shadow; arguments the
// kernels cannot take are InvalidArgument; the pipelined encode (EnqueueEncode in batches of
// PlanBatches, streams into pinned slots, events polled) writes the same streams, and its
// plain streams (EnqueuePlain) the host's kFull ones. Every test skips without a usable GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "src/common/delta_codec.h"
#include "src/cuda/batch_plan.h"
#include "src/cuda/delta.h"
#include "src/cuda/runtime.h"
#include "tests/cuda/delta_test_util.h"
#include "tests/cuda/skip_without_gpu.h"

namespace reshard::cuda {
namespace {

// Device memory holding `bytes`, freed at scope exit.
class DeviceBytes {
 public:
  explicit DeviceBytes(const std::vector<uint8_t>& bytes) : size_(bytes.size()) {
    EXPECT_EQ(cudaMalloc(&ptr_, size_ == 0 ? 1 : size_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr_, bytes.data(), size_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceBytes() { cudaFree(ptr_); }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  uint8_t* get() const { return static_cast<uint8_t*>(ptr_); }
  std::vector<uint8_t> Read() const {
    std::vector<uint8_t> out(size_);
    EXPECT_EQ(cudaMemcpy(out.data(), ptr_, size_, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

std::vector<uint8_t> ReadShadow(const DeviceDeltaCodec& codec, int64_t offset, int64_t bytes) {
  std::vector<uint8_t> out(static_cast<size_t>(bytes));
  EXPECT_EQ(cudaMemcpy(out.data(), codec.shadow() + offset, out.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return out;
}

TEST(DeltaKernelTest, RandomPiecesEqualTheHostCodec) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kShadow = 13000 * 8 + 64, kShadowOffset = 64;
  auto codec = DeviceDeltaCodec::Create(kShadow, 13000 * 8);
  ASSERT_TRUE(codec.ok()) << codec.status();
  DeviceDeltaCodec& c = **codec;
  std::mt19937_64 rng(2016);
  int refused = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const testing::DeltaCase dc = testing::MakeDeltaCase(rng, iter);
    SCOPED_TRACE(::testing::Message() << "iter " << iter << " " << dc.what);
    const int es = dc.src.piece.elem_size;
    const int64_t elems = dc.src.piece.elems, bytes = elems * es;
    const auto capacity = static_cast<size_t>(delta::StreamCapacity(elems, es));
    std::vector<uint8_t> host_shadow = dc.old, want(capacity);
    const delta::EncodeResult w = delta::EncodePiece(dc.now.data(), host_shadow.data(), elems, es,
                                                     dc.base, dc.delta, want.data());
    ASSERT_EQ(cudaMemcpy(c.shadow() + kShadowOffset, dc.old.data(), dc.old.size(),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    const DeviceBytes source(dc.source);
    std::vector<uint8_t> got(capacity, 0x11);
    absl::StatusOr<delta::EncodeResult> r =
        c.Encode(dc.src.piece, source.get(), kShadowOffset, dc.base, dc.delta, got.data());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->bytes, w.bytes);
    ASSERT_EQ(r->mode, w.mode);
    ASSERT_EQ(r->changed, w.changed);
    for (int k = 0; k < 4; ++k) ASSERT_EQ(r->chunks[k], w.chunks[k]) << "tag " << k;
    ASSERT_TRUE(std::equal(want.begin(), want.begin() + w.bytes, got.begin()));
    ASSERT_EQ(ReadShadow(c, kShadowOffset, bytes), host_shadow);

    const std::vector<uint8_t> before = testing::DestinationHolding(rng, dc.dst, dc.old);
    const DeviceBytes destination(before);
    const uint64_t held = rng() % 16 == 0 ? dc.base + 1 : dc.base;
    delta::Decoder decoder;
    if (decoder.Init(want.data(), w.bytes, elems, es, held) != delta::DecodeError::kOk) {
      absl::StatusOr<delta::Mode> applied =
          c.Apply(dc.dst.piece, got.data(), r->bytes, held, destination.get());
      ASSERT_FALSE(applied.ok());
      EXPECT_EQ(applied.status().code(), absl::StatusCode::kDataLoss) << applied.status();
      EXPECT_EQ(destination.Read(), before);  // Nothing written.
      ++refused;
      continue;
    }
    std::vector<uint8_t> want_dst = before;
    for (int64_t at : dc.dst.runs) decoder.Apply(&want_dst[at], dc.dst.run_bytes / es);
    // From the host stream (copied up), and from the encoder's device stream.
    absl::StatusOr<delta::Mode> applied =
        c.Apply(dc.dst.piece, got.data(), r->bytes, held, destination.get());
    ASSERT_TRUE(applied.ok()) << applied.status();
    EXPECT_EQ(*applied, w.mode);
    ASSERT_EQ(destination.Read(), want_dst);
    const DeviceBytes again(before);
    applied = c.Apply(dc.dst.piece, got.data(), r->bytes, held, again.get(), c.stream());
    ASSERT_TRUE(applied.ok()) << applied.status();
    ASSERT_EQ(again.Read(), want_dst);
  }
  EXPECT_GT(refused, 5);
}

// One shadow over many refits of an 8 MiB bf16 piece (1024 chunks), each changing a random
// fraction: the stream each refit equals the host codec's, and a device destination kept by
// applying them holds every refit's values.
TEST(DeltaKernelTest, ManyRefitsOfALargePieceKeepShadowAndDestinationExact) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kElems = 4 << 20, kBytes = kElems * 2;
  auto codec = DeviceDeltaCodec::Create(kBytes, kBytes);
  ASSERT_TRUE(codec.ok()) << codec.status();
  DeviceDeltaCodec& c = **codec;
  std::mt19937_64 rng(2017);
  std::vector<uint8_t> values(kBytes), host_shadow(kBytes, 0), destination_host(kBytes, 0);
  for (auto& b : values) b = static_cast<uint8_t>(rng());
  const DeltaPiece piece = ContiguousDeltaPiece(kElems, 2);
  void* destination = nullptr;
  ASSERT_EQ(cudaMalloc(&destination, kBytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(destination, 0, kBytes), cudaSuccess);
  const auto capacity = static_cast<size_t>(delta::StreamCapacity(kElems, 2));
  std::vector<uint8_t> want(capacity), got(capacity);
  std::uniform_real_distribution<double> unit(0, 1);
  for (int refit = 1; refit <= 12; ++refit) {
    const double f = refit == 2 ? 0.0 : (refit == 3 ? 1.0 : (refit % 2 == 0 ? 0.05 : unit(rng)));
    SCOPED_TRACE(::testing::Message() << "refit " << refit << " f " << f);
    for (int64_t e = 0; e < kElems; ++e) {
      if (unit(rng) < f)
        values[static_cast<size_t>(2 * e)] ^= static_cast<uint8_t>(1 + rng() % 255);
    }
    const bool base = refit > 1;  // The first refit has nothing to build on.
    const delta::EncodeResult w = delta::EncodePiece(values.data(), host_shadow.data(), kElems, 2,
                                                     refit - 1, base, want.data());
    const DeviceBytes source(values);
    absl::StatusOr<delta::EncodeResult> r =
        c.Encode(piece, source.get(), 0, refit - 1, base, got.data());
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->bytes, w.bytes);
    ASSERT_EQ(r->mode, w.mode);
    ASSERT_TRUE(std::equal(want.begin(), want.begin() + w.bytes, got.begin()));
    absl::StatusOr<delta::Mode> applied =
        c.Apply(piece, got.data(), r->bytes, refit - 1, destination);
    ASSERT_TRUE(applied.ok()) << applied.status();
    ASSERT_EQ(cudaMemcpy(destination_host.data(), destination, kBytes, cudaMemcpyDeviceToHost),
              cudaSuccess);
    ASSERT_EQ(destination_host, values);
  }
  ASSERT_EQ(ReadShadow(c, 0, kBytes), host_shadow);
  cudaFree(destination);
}

// The pipeline as the engine runs it: random pieces, each against its own shadow range, encoded
// in batches of a small budget (so several batches share each of the two pinned slots), a batch
// enqueued once the batch two before it was consumed, events polled (never a synchronise):
// every stream and result equals the host codec's, and every third piece's plain stream
// (EnqueuePlain, for a receiver at another version) equals the host's kFull stream.
TEST(DeltaKernelTest, PipelinedBatchesEqualTheHostCodec) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(2026);
  constexpr int kPieces = 120;
  std::vector<testing::DeltaCase> cases;
  std::vector<int64_t> shadow_at;
  std::vector<BatchPiece> pieces;
  int64_t shadow_bytes = 0;
  for (int i = 0; i < kPieces; ++i) {
    cases.push_back(testing::MakeDeltaCase(rng, i));
    const DeltaPiece& p = cases.back().src.piece;
    shadow_at.push_back(shadow_bytes);
    shadow_bytes += (p.elems * p.elem_size + 15) / 16 * 16;
    pieces.push_back({static_cast<uint32_t>(i), delta::StreamCapacity(p.elems, p.elem_size)});
  }
  auto codec = DeviceDeltaCodec::Create(shadow_bytes, 13000 * 8);
  ASSERT_TRUE(codec.ok()) << codec.status();
  DeviceDeltaCodec& c = **codec;
  const BatchPlan plan = PlanBatches(pieces, 256 << 10, 2);
  ASSERT_GT(plan.batches(), 4);
  ASSERT_TRUE(
      c.ReservePipeline(plan.slots, plan.slot_bytes, static_cast<int64_t>(plan.entries.size()))
          .ok());
  std::vector<std::unique_ptr<DeviceBytes>> sources;
  for (int i = 0; i < kPieces; ++i) {
    ASSERT_EQ(cudaMemcpy(c.shadow() + shadow_at[i], cases[i].old.data(), cases[i].old.size(),
                         cudaMemcpyHostToDevice),
              cudaSuccess);
    sources.push_back(std::make_unique<DeviceBytes>(cases[i].source));
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(120);
  auto wait = [&](int32_t slot) {
    for (;;) {
      absl::StatusOr<bool> done = c.SlotDone(slot);
      if (!done.ok() || *done) return done.status();
      if (absl::Now() > deadline) return absl::DeadlineExceededError("slot never finished");
    }
  };
  int32_t enqueued = 0, plain = 0;
  for (int32_t b = 0; b < plan.batches(); ++b) {
    SCOPED_TRACE(::testing::Message() << "batch " << b);
    // Slots free up as batches are consumed: keep one batch ahead.
    for (; enqueued < plan.batches() && enqueued <= b + 1; ++enqueued) {
      uint8_t* slot = c.pinned_slot(enqueued % plan.slots);
      for (uint32_t e = plan.batch_begin[enqueued]; e < plan.batch_begin[enqueued + 1]; ++e) {
        const testing::DeltaCase& dc = cases[plan.entries[e].id];
        ASSERT_TRUE(c.EnqueueEncode(dc.src.piece, sources[plan.entries[e].id]->get(),
                                    shadow_at[plan.entries[e].id], dc.base, dc.delta,
                                    slot + plan.entries[e].offset, e)
                        .ok());
      }
      ASSERT_TRUE(c.RecordSlot(enqueued % plan.slots).ok());
    }
    ASSERT_TRUE(wait(b % plan.slots).ok());
    for (uint32_t e = plan.batch_begin[b]; e < plan.batch_begin[b + 1]; ++e) {
      const uint32_t i = plan.entries[e].id;
      const testing::DeltaCase& dc = cases[i];
      SCOPED_TRACE(::testing::Message() << "piece " << i << " " << dc.what);
      const int es = dc.src.piece.elem_size;
      const int64_t elems = dc.src.piece.elems;
      std::vector<uint8_t> host_shadow = dc.old;
      std::vector<uint8_t> want(static_cast<size_t>(delta::StreamCapacity(elems, es)));
      const delta::EncodeResult w = delta::EncodePiece(dc.now.data(), host_shadow.data(), elems, es,
                                                       dc.base, dc.delta, want.data());
      const delta::EncodeResult& r = c.pinned_result(e);
      ASSERT_EQ(r.bytes, w.bytes);
      ASSERT_EQ(r.mode, w.mode);
      ASSERT_EQ(r.changed, w.changed);
      uint8_t* stream = c.pinned_slot(b % plan.slots) + plan.entries[e].offset;
      ASSERT_TRUE(std::equal(want.begin(), want.begin() + w.bytes, stream));
      if (i % 3 != 0) continue;
      ASSERT_TRUE(c.EnqueuePlain(elems, es, shadow_at[i], stream).ok());
      ASSERT_TRUE(c.RecordSlot(b % plan.slots).ok());
      ASSERT_TRUE(wait(b % plan.slots).ok());
      std::vector<uint8_t> old = dc.old;
      const delta::EncodeResult full =
          delta::EncodePiece(dc.now.data(), old.data(), elems, es, dc.base, false, want.data());
      ASSERT_TRUE(std::equal(want.begin(), want.begin() + full.bytes, stream));
      ++plain;
    }
  }
  EXPECT_GT(plain, 30);
  for (int i = 0; i < kPieces; ++i) {
    EXPECT_EQ(ReadShadow(c, shadow_at[i], static_cast<int64_t>(cases[i].now.size())), cases[i].now)
        << "piece " << i;
  }
  // Outside the reservation: nothing enqueued.
  EXPECT_EQ(c.EnqueueEncode(cases[0].src.piece, sources[0]->get(), shadow_at[0], 1, true,
                            c.pinned_slot(0) + plan.pinned_bytes(), 0)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c.RecordSlot(plan.slots).code(), absl::StatusCode::kInvalidArgument);
}

TEST(DeltaKernelTest, ArgumentsTheKernelsCannotTakeAreInvalid) {
  SKIP_WITHOUT_GPU();
  auto codec = DeviceDeltaCodec::Create(4096, 4096);
  ASSERT_TRUE(codec.ok()) << codec.status();
  DeviceDeltaCodec& c = **codec;
  const DeviceBytes buffer(std::vector<uint8_t>(8192, 1));
  std::vector<uint8_t> out(static_cast<size_t>(delta::StreamCapacity(4096, 1)));
  auto code = [](const absl::StatusOr<delta::EncodeResult>& r) { return r.status().code(); };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  // Larger than the codec's pieces; shadow range outside or misaligned; misaligned source.
  EXPECT_EQ(code(c.Encode(ContiguousDeltaPiece(4097, 1), buffer.get(), 0, 1, true, out.data())),
            kInvalid);
  EXPECT_EQ(
      code(c.Encode(ContiguousDeltaPiece(100, 4), buffer.get(), 4096 - 396, 1, true, out.data())),
      kInvalid);
  EXPECT_EQ(code(c.Encode(ContiguousDeltaPiece(100, 4), buffer.get(), 2, 1, true, out.data())),
            kInvalid);
  EXPECT_EQ(code(c.Encode(ContiguousDeltaPiece(100, 4), buffer.get() + 2, 0, 1, true, out.data())),
            kInvalid);
  DeltaPiece odd = ContiguousDeltaPiece(10, 3);
  EXPECT_EQ(code(c.Encode(odd, buffer.get(), 0, 1, true, out.data())), kInvalid);
  // Apply: a stream for another piece is refused before anything is written.
  absl::StatusOr<delta::EncodeResult> r =
      c.Encode(ContiguousDeltaPiece(1000, 2), buffer.get(), 0, 0, false, out.data());
  ASSERT_TRUE(r.ok()) << r.status();
  absl::StatusOr<delta::Mode> applied =
      c.Apply(ContiguousDeltaPiece(1001, 2), out.data(), r->bytes, 0, buffer.get() + 4096);
  EXPECT_EQ(applied.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(buffer.Read(), std::vector<uint8_t>(8192, 1));
}

}  // namespace
}  // namespace reshard::cuda
