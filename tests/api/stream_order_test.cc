// Stream-ordered refits without a GPU: the state machine of src/api/stream_order.h against a
// fake cuda::StreamOps, and RefitHandle::StartOnStream / RecordCompletion on a one-rank world
// (real engine, local copies) with that fake in place of the CUDA runtime: the refit reads its
// sources only once the fake stream's work is done, completion streams are released on every
// way a refit ends, and a failing or late stream fails the refit with nothing written. The
// real CUDA calls run in the gpu test api_stream_refit_test.
#include "src/api/stream_order.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "reshard/reshard.h"
#include "reshard/reshard_c.h"
#include "tests/api/fake_stream_ops.h"
#include "tests/api/memory_store.h"

namespace reshard {
namespace {

using testing::FakeStreamOps;

void* Stream(uintptr_t n) { return reinterpret_cast<void*>(n); }

TEST(StreamOrderTest, GateStaysClosedUntilTheStreamsWorkIsDone) {
  FakeStreamOps ops;
  {
    internal::StreamOrder order(ops);
    ASSERT_TRUE(*order.Open());  // No gate: open, and no CUDA call made.
    EXPECT_EQ(ops.events_created, 0);
    ops.polls_before_done = 2;
    int ran = 0;
    ops.on_done = [&] { ++ran; };
    ASSERT_TRUE(order.Gate(Stream(7)).ok());
    EXPECT_FALSE(*order.Open());
    EXPECT_FALSE(*order.Open());
    EXPECT_EQ(ran, 0);
    EXPECT_TRUE(*order.Open());
    EXPECT_EQ(ran, 1);
    const int queries = ops.queries;
    EXPECT_TRUE(*order.Open());  // Stays open without asking the device again.
    EXPECT_EQ(ops.queries, queries);
    // The next refit records on the same event; ClearGate (Start without a stream) opens it.
    ASSERT_TRUE(order.Gate(nullptr).ok());
    EXPECT_EQ(ops.events_created, 1);
    EXPECT_EQ(ops.records, 2);
    order.ClearGate();
    EXPECT_TRUE(*order.Open());
  }
  EXPECT_EQ(ops.events_destroyed, 1);
}

TEST(StreamOrderTest, GateErrorsLeaveTheOrderUngated) {
  FakeStreamOps ops;
  internal::StreamOrder order(ops);
  ops.available = absl::FailedPreconditionError("fake: no GPU");
  EXPECT_EQ(order.Gate(Stream(1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(*order.Open());
  ops.available = absl::OkStatus();
  EXPECT_EQ(order.Gate(FakeStreamOps::kRefused).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(*order.Open());
  // The stream's work failed: Open reports it (the refit then fails).
  ops.polls_before_done = 5;
  ASSERT_TRUE(order.Gate(Stream(1)).ok());
  ops.event_error = absl::InternalError("fake: an illegal memory access was encountered");
  EXPECT_EQ(order.Open().status().code(), absl::StatusCode::kInternal);
}

TEST(StreamOrderTest, CompletionStreamsRunOnOnlyAfterRelease) {
  FakeStreamOps ops;
  ops.flag_word = 41;  // Another handle used this flag before: values only grow.
  {
    internal::StreamOrder order(ops);
    order.Release();  // Nothing waiting: nothing acquired or written.
    EXPECT_FALSE(ops.flag_acquired);
    ASSERT_TRUE(order.AddCompletionStream(Stream(1)).ok());
    ASSERT_TRUE(order.AddCompletionStream(Stream(2)).ok());
    EXPECT_EQ(order.AddCompletionStream(FakeStreamOps::kRefused).code(),
              absl::StatusCode::kInvalidArgument);
    ASSERT_EQ(ops.waits.size(), 2u);
    EXPECT_EQ(ops.waits[0].second, 42u);
    EXPECT_EQ(ops.waits[1].second, 42u);
    EXPECT_EQ(order.waiting_streams(), 2);
    EXPECT_FALSE(ops.Released(0));
    EXPECT_FALSE(ops.Released(1));
    order.Release();
    EXPECT_TRUE(ops.Released(0));
    EXPECT_TRUE(ops.Released(1));
    EXPECT_EQ(ops.flag_word, 42u);
    order.Release();  // Idempotent.
    EXPECT_EQ(ops.flag_word, 42u);
    // The next refit waits for the next value; the earlier waits stay released.
    ASSERT_TRUE(order.AddCompletionStream(Stream(1)).ok());
    EXPECT_EQ(ops.waits[2].second, 43u);
    EXPECT_FALSE(ops.Released(2));
    EXPECT_TRUE(ops.Released(0));
    // Destroyed with a stream waiting (a handle destroyed mid-refit): released, flag returned.
  }
  EXPECT_TRUE(ops.Released(2));
  EXPECT_TRUE(ops.flag_released);
  // Across the 2^32 wrap the device's comparison is cyclic: still released.
  ops.flag_word = 0xffffffffu;
  internal::StreamOrder wrapped(ops);
  ASSERT_TRUE(wrapped.AddCompletionStream(Stream(3)).ok());
  EXPECT_EQ(ops.waits.back().second, 0u);
  EXPECT_FALSE(ops.Released(ops.waits.size() - 1));
  wrapped.Release();
  EXPECT_TRUE(ops.Released(ops.waits.size() - 1));
}

TEST(StreamOrderTest, CompletionWithoutCudaFails) {
  FakeStreamOps ops;
  ops.available = absl::FailedPreconditionError("fake: no GPU");
  internal::StreamOrder order(ops);
  EXPECT_EQ(order.AddCompletionStream(Stream(1)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(order.waiting_streams(), 0);
}

constexpr int32_t kPoison = -7;

// Rank 0 refits a 4x6 i32 tensor from its source into its destination: a local copy through the
// engine, which an ungated Start runs at once.
class HandleStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    previous_ = internal::SetStreamOpsForTesting(&ops_);
    auto comm = Communicator::FromCallbacks(store_.Callbacks(), 0, 1);
    ASSERT_TRUE(comm.ok()) << comm.status();
    RefitSpec spec;
    spec.AddTensor("w", DType::kI32, {4, 6}, Layout(Mesh({0}), {Replicate()}),
                   Layout(Mesh({0}), {Shard(1)}));
    src_.assign(24, 0);
    dst_.assign(24, kPoison);
    LocalBuffers b;
    b.Source("w", src_.data(), 96).Destination("w", dst_.data(), 96);
    auto handle = RefitHandle::Create(*comm, spec, std::move(b));
    ASSERT_TRUE(handle.ok()) << handle.status();
    handle_.emplace(*std::move(handle));
  }
  void TearDown() override {
    handle_.reset();
    internal::SetStreamOpsForTesting(previous_);
  }
  void Fill(int32_t step) {
    for (int i = 0; i < 24; ++i) src_[i] = step * 100 + i;
  }
  bool Holds(int32_t step) const {
    for (int i = 0; i < 24; ++i) {
      if (dst_[i] != step * 100 + i) return false;
    }
    return true;
  }
  bool Untouched() const {
    for (int32_t v : dst_) {
      if (v != kPoison) return false;
    }
    return true;
  }

  FakeStreamOps ops_;
  cuda::StreamOps* previous_ = nullptr;
  testing::MemoryStore store_;
  std::vector<int32_t> src_, dst_;
  std::optional<RefitHandle> handle_;
};

TEST_F(HandleStreamTest, SourcesAreReadOnlyAfterTheStreamsWork) {
  for (int32_t step = 1; step <= 3; ++step) {
    Fill(step - 1);  // Stale until the stream's "kernel" runs.
    std::fill(dst_.begin(), dst_.end(), kPoison);
    ops_.polls_before_done = 3 * step;
    bool untouched_when_done = false;
    ops_.on_done = [&] {
      untouched_when_done = Untouched();
      Fill(step);
    };
    ASSERT_TRUE(handle_->StartOnStream(Stream(5)).ok());
    ASSERT_TRUE(handle_->RecordCompletion(Stream(6)).ok());
    ASSERT_TRUE(handle_->RecordCompletion(Stream(7)).ok());
    EXPECT_TRUE(Untouched());  // Nothing copied in Start.
    const size_t w = ops_.waits.size();
    EXPECT_FALSE(ops_.Released(w - 1));
    ASSERT_TRUE(handle_->Wait(absl::Now() + absl::Seconds(20)).ok());
    EXPECT_TRUE(untouched_when_done) << "step " << step;
    EXPECT_TRUE(Holds(step)) << "step " << step;
    EXPECT_TRUE(ops_.Released(w - 1));
    EXPECT_TRUE(ops_.Released(w - 2));
    EXPECT_EQ(handle_->stats().pieces_received, handle_->stats().pieces_expected);
  }
  EXPECT_EQ(ops_.flag_word, 3u);
  // Start without a stream afterwards: no gate, the sources as they are.
  Fill(9);
  ASSERT_TRUE(handle_->Execute(absl::Seconds(20)).ok());
  EXPECT_TRUE(Holds(9));
  EXPECT_EQ(handle_->epoch(), 4u);
}

TEST_F(HandleStreamTest, RefusedStreamDoesNotStartTheRefit) {
  ops_.available = absl::FailedPreconditionError("fake: no GPU");
  absl::Status st = handle_->StartOnStream(Stream(1));
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(st.message().find("did not start"), std::string::npos) << st;
  EXPECT_NE(st.message().find("fake: no GPU"), std::string::npos) << st;
  EXPECT_EQ(handle_->epoch(), 0u);
  EXPECT_EQ(handle_->RecordCompletion(Stream(1)).code(), absl::StatusCode::kFailedPrecondition);
  ops_.available = absl::OkStatus();
  st = handle_->StartOnStream(FakeStreamOps::kRefused);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_EQ(handle_->epoch(), 0u);
  EXPECT_FALSE(handle_->failed());
  Fill(1);
  ASSERT_TRUE(handle_->Execute(absl::Seconds(20)).ok());
  EXPECT_TRUE(Holds(1));
  // A completion stream the driver refuses leaves the refit in flight unaffected.
  Fill(2);
  ASSERT_TRUE(handle_->Start().ok());
  EXPECT_EQ(handle_->RecordCompletion(FakeStreamOps::kRefused).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(handle_->Wait(absl::Now() + absl::Seconds(20)).ok());
  EXPECT_TRUE(Holds(2));
}

TEST_F(HandleStreamTest, FailedStreamWorkFailsTheRefitWithNothingWritten) {
  Fill(1);
  ops_.polls_before_done = 1000000;
  ASSERT_TRUE(handle_->StartOnStream(Stream(5)).ok());
  ASSERT_TRUE(handle_->RecordCompletion(Stream(6)).ok());
  ops_.event_error = absl::InternalError("fake: an illegal memory access was encountered");
  absl::Status st = handle_->Wait(absl::Now() + absl::Seconds(20));
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
  EXPECT_NE(st.message().find("CUDA stream"), std::string::npos) << st;
  EXPECT_TRUE(Untouched());
  EXPECT_TRUE(ops_.Released(0));  // The failure releases the stream.
  EXPECT_TRUE(handle_->failed());
  handle_->Reset();
  ops_.event_error = absl::OkStatus();

  // Work that outlasts the deadline: DeadlineExceeded, nothing written, stream released.
  ops_.polls_before_done = 1000000000;
  ASSERT_TRUE(handle_->StartOnStream(Stream(5)).ok());
  ASSERT_TRUE(handle_->RecordCompletion(Stream(6)).ok());
  st = handle_->Wait(absl::Now() + absl::Milliseconds(50));
  EXPECT_EQ(st.code(), absl::StatusCode::kDeadlineExceeded) << st;
  EXPECT_TRUE(Untouched());
  EXPECT_TRUE(ops_.Released(1));
  handle_->Reset();

  // The handle refits again afterwards.
  ops_.polls_before_done = 0;
  ASSERT_TRUE(handle_->StartOnStream(Stream(5)).ok());
  ASSERT_TRUE(handle_->Wait(absl::Now() + absl::Seconds(20)).ok());
  EXPECT_TRUE(Holds(1));
}

TEST_F(HandleStreamTest, ResetAndDestructionReleaseWaitingStreams) {
  Fill(1);
  ops_.polls_before_done = 1000000000;
  ASSERT_TRUE(handle_->StartOnStream(Stream(5)).ok());
  ASSERT_TRUE(handle_->RecordCompletion(Stream(6)).ok());
  handle_->Reset();  // Forgets the refit in flight.
  EXPECT_TRUE(ops_.Released(0));
  EXPECT_TRUE(Untouched());
  ops_.polls_before_done = 1000000000;
  ASSERT_TRUE(handle_->StartOnStream(Stream(5)).ok());
  ASSERT_TRUE(handle_->RecordCompletion(Stream(6)).ok());
  EXPECT_FALSE(ops_.Released(1));
  handle_.reset();  // Destroyed mid-refit.
  EXPECT_TRUE(ops_.Released(1));
  EXPECT_TRUE(ops_.flag_released);
  EXPECT_TRUE(Untouched());
}

// A one-rank C handle (rank 0 serving the store; a port in use is an error, so try a few).
struct CHandle {
  reshard_spec_t* spec = nullptr;
  reshard_comm_t* comm = nullptr;
  reshard_handle_t* handle = nullptr;
  std::vector<int32_t> src = std::vector<int32_t>(24, 0), dst = std::vector<int32_t>(24, kPoison);
  absl::Status Create(const char* name) {
    if (reshard_spec_from_json(
            "{\"tensors\": [{\"name\": \"w\", \"dtype\": \"i32\", \"shape\": [4, 6],"
            " \"src\": {\"mesh\": [0], \"placements\": [\"R\"]},"
            " \"dst\": {\"mesh\": [0], \"placements\": [\"R\"]}}]}",
            &spec) != RESHARD_OK) {
      return absl::InternalError(reshard_last_error());
    }
    reshard_status_t st = RESHARD_UNAVAILABLE;
    for (int attempt = 0; attempt < 20 && st != RESHARD_OK; ++attempt) {
      const std::string address =
          "127.0.0.1:" + std::to_string(30000 + (getpid() * 11 + attempt * 137) % 20000);
      st = reshard_comm_connect(address.c_str(), "tok", 0, 1, 1, 10000, &comm);
    }
    if (st != RESHARD_OK) return absl::InternalError(reshard_last_error());
    reshard_buffer_t buffers[2] = {{"w", RESHARD_SOURCE, src.data(), 96, RESHARD_MEMORY_HOST},
                                   {"w", RESHARD_DESTINATION, dst.data(), 96, RESHARD_MEMORY_HOST}};
    if (reshard_handle_create(comm, spec, buffers, 2, name, 0, &handle) != RESHARD_OK) {
      return absl::InternalError(reshard_last_error());
    }
    return absl::OkStatus();
  }
  ~CHandle() {
    reshard_handle_destroy(handle);
    reshard_comm_destroy(comm);
    reshard_spec_destroy(spec);
  }
};

TEST_F(HandleStreamTest, CApiStartsOnStreamAndRecordsCompletion) {
  CHandle c;
  ASSERT_TRUE(c.Create("c-stream").ok());
  EXPECT_EQ(reshard_handle_start_on_stream(nullptr, nullptr), RESHARD_INVALID_ARGUMENT);
  EXPECT_EQ(reshard_handle_record_completion(nullptr, nullptr), RESHARD_INVALID_ARGUMENT);
  EXPECT_EQ(reshard_handle_record_completion(c.handle, Stream(6)), RESHARD_FAILED_PRECONDITION);
  EXPECT_NE(std::string(reshard_last_error()).find("between Start() and Wait()"), std::string::npos)
      << reshard_last_error();
  ops_.polls_before_done = 4;
  ops_.on_done = [&] {
    for (int i = 0; i < 24; ++i) c.src[i] = 3 * i + 1;
  };
  ASSERT_EQ(reshard_handle_start_on_stream(c.handle, nullptr), RESHARD_OK) << reshard_last_error();
  ASSERT_EQ(reshard_handle_record_completion(c.handle, Stream(6)), RESHARD_OK)
      << reshard_last_error();
  EXPECT_FALSE(ops_.Released(0));
  ASSERT_EQ(reshard_handle_wait(c.handle, 20000), RESHARD_OK) << reshard_last_error();
  EXPECT_TRUE(ops_.Released(0));
  EXPECT_EQ(c.dst, c.src);
  EXPECT_EQ(c.src[1], 4);
}

// The library's own CUDA calls: without CUDA in the build or a usable GPU, StartOnStream is
// FailedPrecondition and the handle refits as before; with a GPU, host buffers refit the same
// on the legacy default stream.
TEST(HandleStreamRealTest, WithoutAGpuStartOnStreamIsRefusedCleanly) {
  CHandle c;
  ASSERT_TRUE(c.Create("c-real").ok());
  for (int i = 0; i < 24; ++i) c.src[i] = 5 * i;
  const reshard_status_t st = reshard_handle_start_on_stream(c.handle, nullptr);
  if (st == RESHARD_OK) {
    ASSERT_EQ(reshard_handle_record_completion(c.handle, nullptr), RESHARD_OK)
        << reshard_last_error();
    ASSERT_EQ(reshard_handle_wait(c.handle, 20000), RESHARD_OK) << reshard_last_error();
  } else {
    ASSERT_EQ(st, RESHARD_FAILED_PRECONDITION) << reshard_last_error();
    EXPECT_NE(std::string(reshard_last_error()).find("did not start"), std::string::npos)
        << reshard_last_error();
    EXPECT_EQ(c.dst, std::vector<int32_t>(24, kPoison));
    ASSERT_EQ(reshard_handle_execute(c.handle, 20000), RESHARD_OK) << reshard_last_error();
  }
  EXPECT_EQ(c.dst, c.src);
  reshard_stats_t stats;
  ASSERT_EQ(reshard_handle_stats(c.handle, &stats), RESHARD_OK);
  EXPECT_EQ(stats.epoch, 1u);
}

}  // namespace
}  // namespace reshard
