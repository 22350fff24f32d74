// QueuedKernels (src/cuda/queued_kernels.h) with devices emulated on the host: scatters and
// strided copies enqueued on a CopyQueue run only when the queue runs its work (the first Done
// after them, which answers "not yet" once, as a GPU would), in order with its copies, and then
// leave the destination byte for byte as the in-process executor's copy does, over random
// batches of random regions (the kernels' run-at-a-time host twins, PackOnHost, UnpackOnHost and
// CopyOnHost, checked against it). On a device the same calls launch the kernels; the
// launch itself is tested by GpuStaging (gpu label).
#include "src/cuda/queued_kernels.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "src/cuda/pack_batch.h"
#include "src/cuda/runtime.h"
#include "tests/cuda/pack_test_util.h"

namespace reshard::cuda {
namespace {

using testing::AppendRuns;
using testing::CopyRegionsOf;
using testing::ExecutorCopy;
using testing::MakeRandomBatch;
using testing::RandomBatch;
using testing::Rng;

constexpr uint64_t kQueuedSeed = 0x51ed7e4b3a1c0de5ULL;
constexpr int kQueuedRegions = 2000;

class QueuedKernelsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { EmulateDevicesOnHost(true); }
};

// Runs the queue's work up to a new event: false at the first question, true at the second.
void Drain(CopyQueue& queue) {
  absl::StatusOr<int32_t> event = queue.Record();
  ASSERT_TRUE(event.ok()) << event.status();
  absl::StatusOr<bool> done = queue.Done(*event);
  ASSERT_TRUE(done.ok() && !*done);
  done = queue.Done(*event);
  ASSERT_TRUE(done.ok() && *done);
  queue.Release(*event);
}

TEST_F(QueuedKernelsTest, ScattersAndCopiesRunLateInQueueOrderAndMatchTheExecutor) {
  Rng rng(kQueuedSeed);
  absl::StatusOr<std::unique_ptr<CopyQueue>> queue = CopyQueue::Create();
  ASSERT_TRUE(queue.ok()) << queue.status();
  int regions = 0;
  while (regions < kQueuedRegions) {
    const RandomBatch c = MakeRandomBatch(rng, 30);
    const int group = static_cast<int>(c.regions.size());
    absl::StatusOr<PackBatch> pack = BuildPackBatch(c.from_side, c.options);
    absl::StatusOr<PackBatch> scatter = BuildPackBatch(c.to_side, c.options);
    CopyBatchOptions co;
    co.from_base_align = c.options.strided_base_align;
    co.to_base_align = c.options.packed_base_align;
    absl::StatusOr<CopyBatch> copy = BuildCopyBatch(CopyRegionsOf(c), co);
    ASSERT_TRUE(pack.ok() && scatter.ok() && copy.ok());
    absl::StatusOr<std::unique_ptr<QueuedKernels>> kernels =
        QueuedKernels::Create({*scatter}, {*copy});
    ASSERT_TRUE(kernels.ok()) << kernels.status();
    ASSERT_EQ((*kernels)->scatters(), 1u);
    ASSERT_EQ((*kernels)->copies(), 1u);

    std::vector<uint8_t> source(c.from_size);
    for (auto& b : source) b = static_cast<uint8_t>(rng.Next());
    std::vector<uint8_t> expected(c.to_size, 0xA5), stream_expected(pack->packed_end, 0x5A);
    for (int i = 0; i < group; ++i) {
      const auto& rr = c.regions[i];
      ExecutorCopy(rr.region, rr.dims.data(), source.data() + c.from_base[i],
                   expected.data() + c.to_base[i]);
      AppendRuns(rr.region, rr.dims.data(), source.data(), c.from_base[i],
                 stream_expected.data() + pack->packed_offsets[i]);
    }
    // The host twin of the pack kernel yields the stream the scatter reads.
    std::vector<uint8_t> stream(pack->packed_end, 0x5A);
    PackOnHost(*pack, source.data(), stream.data());
    ASSERT_EQ(stream, stream_expected) << "pack, after " << regions << " regions";

    std::vector<uint8_t> scattered(c.to_size, 0xA5), copied(c.to_size, 0xA5);
    ASSERT_TRUE((*kernels)->Unpack(**queue, 0, stream.data(), scattered.data()).ok());
    ASSERT_TRUE((*kernels)->Copy(**queue, 0, source.data(), copied.data()).ok());
    // Nothing ran yet: the destinations are as they were.
    ASSERT_EQ(scattered, std::vector<uint8_t>(c.to_size, 0xA5));
    ASSERT_EQ(copied, std::vector<uint8_t>(c.to_size, 0xA5));
    Drain(**queue);
    ASSERT_EQ(scattered, expected) << "scatter, after " << regions << " regions";
    ASSERT_EQ(copied, expected) << "copy, after " << regions << " regions";
    regions += group;
  }
}

TEST_F(QueuedKernelsTest, WorkRunsInOrderWithTheQueuesCopies) {
  // A copy into the stream, then a scatter of it: the scatter sees the copy's bytes.
  StridedRegion r;
  r.run_bytes = 4;
  r.ndims = 1;
  r.count[0] = 4;
  r.stride[0] = 8;
  absl::StatusOr<PackBatch> scatter = BuildPackBatch({r});
  ASSERT_TRUE(scatter.ok());
  absl::StatusOr<std::unique_ptr<QueuedKernels>> kernels = QueuedKernels::Create({*scatter}, {});
  ASSERT_TRUE(kernels.ok());
  absl::StatusOr<std::unique_ptr<CopyQueue>> queue = CopyQueue::Create();
  ASSERT_TRUE(queue.ok());
  std::vector<uint8_t> input(16), stream(16, 0), out(32, 0);
  for (int i = 0; i < 16; ++i) input[i] = static_cast<uint8_t>(i + 1);
  ASSERT_TRUE((*queue)->Copy2D(stream.data(), 16, input.data(), 16, 16, 1).ok());
  ASSERT_TRUE((*kernels)->Unpack(**queue, 0, stream.data(), out.data()).ok());
  Drain(**queue);
  for (int k = 0; k < 4; ++k) {
    for (int b = 0; b < 4; ++b) EXPECT_EQ(out[k * 8 + b], input[k * 4 + b]);
    for (int b = 4; b < 8; ++b) EXPECT_EQ(out[k * 8 + b], 0);
  }
}

TEST_F(QueuedKernelsTest, ABatchOutOfRangeIsRefused) {
  absl::StatusOr<std::unique_ptr<QueuedKernels>> kernels = QueuedKernels::Create({}, {});
  ASSERT_TRUE(kernels.ok());
  absl::StatusOr<std::unique_ptr<CopyQueue>> queue = CopyQueue::Create();
  ASSERT_TRUE(queue.ok());
  uint8_t a[1], b[1];
  EXPECT_EQ((*kernels)->Unpack(**queue, 0, a, b).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*kernels)->Copy(**queue, 3, a, b).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace reshard::cuda
