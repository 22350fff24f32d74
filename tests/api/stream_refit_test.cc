// Stream-ordered refits on a GPU (label gpu: skips without a device): two forked ranks on one
// GPU, each a source and a destination of a 64 x 96 i32 tensor (rows -> columns), CUDA buffers.
// Every step each rank queues on its own stream a kernel that spins for 30 ms and then writes
// its sources, a memset that poisons its destinations, StartOnStream on that stream,
// RecordCompletion on it, and a kernel that copies the destinations into a snapshot; then it
// Waits. The snapshot must hold exactly the step's values: the refit read the sources only after
// the slow kernel, wrote the destinations only after the poisoning memset, and the copy ran only
// after the refit. Finally rank 0 starts a refit its peer never joins: Wait fails at its
// deadline, and the stream waiting on that refit's completion runs on all the same.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "reshard/reshard.h"
#include "src/rendezvous/file_store.h"
#include "tests/api/forked_ranks.h"
#include "tests/api/stream_test_kernels.h"
#include "tests/testing/multiprocess.h"

namespace reshard {
namespace {

using forked::Callbacks;
using forked::StoreDir;

constexpr int32_t kWorld = 2;
constexpr int64_t kRows = 64;
constexpr int64_t kCols = 96;
constexpr int32_t kSteps = 3;

int32_t Base(int32_t step) { return step * 1000003; }

// Waits (polling, with a deadline) until `stream` has run everything queued on it.
bool Drain(cudaStream_t stream, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    const cudaError_t err = cudaStreamQuery(stream);
    if (err == cudaSuccess) return true;
    if (err != cudaErrorNotReady) return false;
    absl::SleepFor(absl::Microseconds(200));
  }
  return false;
}

int RankMain(int32_t rank, const std::string& dir) {
  CHILD_EXPECT(cudaSetDevice(0) == cudaSuccess);
  auto store = rendezvous::FileStore::Open(dir);
  CHILD_EXPECT(store.ok(), store.status().ToString());
  auto comm = Communicator::FromCallbacks(Callbacks(store->get()), rank, kWorld);
  CHILD_EXPECT(comm.ok(), comm.status().ToString());
  RefitSpec spec;
  spec.AddTensor("w", DType::kI32, {kRows, kCols}, Layout(Mesh::Range(0, kWorld), {Shard(0)}),
                 Layout(Mesh::Range(0, kWorld), {Shard(1)}));
  const int64_t src_rows = kRows / kWorld;
  const int64_t dst_cols = kCols / kWorld;
  const int64_t src_n = src_rows * kCols;
  const int64_t dst_n = kRows * dst_cols;
  int32_t* src = nullptr;
  int32_t* dst = nullptr;
  int32_t* snapshot = nullptr;
  CHILD_EXPECT(cudaMalloc(reinterpret_cast<void**>(&src), src_n * 4) == cudaSuccess);
  CHILD_EXPECT(cudaMalloc(reinterpret_cast<void**>(&dst), dst_n * 4) == cudaSuccess);
  CHILD_EXPECT(cudaMalloc(reinterpret_cast<void**>(&snapshot), dst_n * 4) == cudaSuccess);
  cudaStream_t stream = nullptr;
  CHILD_EXPECT(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  LocalBuffers buffers;
  buffers.Source("w", src, src_n * 4, MemoryKind::kCuda)
      .Destination("w", dst, dst_n * 4, MemoryKind::kCuda);
  HandleOptions options;
  options.setup_timeout = absl::Seconds(60);
  auto handle = RefitHandle::Create(*comm, spec, std::move(buffers), options);
  CHILD_EXPECT(handle.ok(), handle.status().ToString());
  std::vector<int32_t> got(static_cast<size_t>(dst_n));
  for (int32_t step = 1; step <= kSteps; ++step) {
    testing::LaunchSpin(stream, 30'000'000);
    testing::LaunchFillRows(stream, src, src_rows, kCols, rank * src_rows, kCols, Base(step));
    CHILD_EXPECT(cudaMemsetAsync(dst, 0xff, dst_n * 4, stream) == cudaSuccess);
    absl::Status st = handle->StartOnStream(stream);
    CHILD_EXPECT(st.ok(), st.ToString());
    st = handle->RecordCompletion(stream);
    CHILD_EXPECT(st.ok(), st.ToString());
    testing::LaunchCopy(stream, dst, snapshot, dst_n);
    CHILD_EXPECT(cudaGetLastError() == cudaSuccess);
    st = handle->Wait(absl::Now() + absl::Seconds(60));
    CHILD_EXPECT(st.ok(), st.ToString());
    CHILD_EXPECT(Drain(stream, absl::Seconds(30)), "the stream did not run on after the refit");
    CHILD_EXPECT(cudaMemcpy(got.data(), snapshot, dst_n * 4, cudaMemcpyDeviceToHost) ==
                 cudaSuccess);
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t c = 0; c < dst_cols; ++c) {
        const int32_t want = Base(step) + static_cast<int32_t>(r * kCols + rank * dst_cols + c);
        CHILD_EXPECT(got[r * dst_cols + c] == want,
                     absl::StrCat("step ", step, " element (", r, ", ", rank * dst_cols + c,
                                  ") is ", got[r * dst_cols + c], ", expected ", want));
      }
    }
  }
  if (rank == 0) {
    // A refit rank 1 never joins: it fails at its deadline, and the stream queued behind it
    // runs on anyway.
    absl::Status st = handle->StartOnStream(stream);
    CHILD_EXPECT(st.ok(), st.ToString());
    st = handle->RecordCompletion(stream);
    CHILD_EXPECT(st.ok(), st.ToString());
    testing::LaunchCopy(stream, dst, snapshot, dst_n);
    st = handle->Wait(absl::Now() + absl::Seconds(2));
    CHILD_EXPECT(!st.ok(), "a refit without its peer succeeded");
    CHILD_EXPECT(Drain(stream, absl::Seconds(30)), "a failed refit left its stream waiting");
  }
  handle = absl::CancelledError("destroyed before the buffers it refits are freed");
  cudaStreamDestroy(stream);
  cudaFree(src);
  cudaFree(dst);
  cudaFree(snapshot);
  return 0;
}

TEST(StreamRefitCudaTest, KernelsBeforeAndAfterTheRefitOnOneStream) {
  std::string why;
  if (testing::ProbeCudaDevices(&why) == 0) GTEST_SKIP() << "no usable GPU: " << why;
  const std::string dir = StoreDir("stream", "cuda");
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(kWorld), [&](int32_t rank) { return RankMain(rank, dir); },
      forked::Transport("sm"));
  for (int32_t r = 0; r < kWorld; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

}  // namespace
}  // namespace reshard
