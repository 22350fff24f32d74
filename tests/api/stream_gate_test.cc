// Stream-ordered refits between processes over real UCX, with the CUDA calls of the source rank
// replaced by the scripted fake (no GPU here): rank 0 starts every refit on a "stream" whose
// event completes only after a few polls, and its "kernel" writes the sources then; rank 1 must
// receive exactly those values. When the fake stream's work fails, rank 0's refit fails without
// reading anything, and rank 1, already waiting for its data, fails at once with Unavailable
// naming rank 0 (RefitSession::Abort told it), not at its 60 s deadline. After Reset on both,
// they refit again.
#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "reshard/reshard.h"
#include "src/api/stream_order.h"
#include "src/common/status.h"
#include "src/rendezvous/file_store.h"
#include "tests/api/fake_stream_ops.h"
#include "tests/api/forked_ranks.h"
#include "tests/testing/multiprocess.h"

namespace reshard {
namespace {

constexpr int32_t kGateWorld = 2;
constexpr int kGateElements = 8 * 6;

int32_t GateValue(int32_t step, int i) { return step * 1000 + i; }

int GatedRank(int32_t rank, const std::string& dir) {
  testing::FakeStreamOps ops;
  internal::SetStreamOpsForTesting(&ops);
  auto store = rendezvous::FileStore::Open(dir);
  CHILD_EXPECT(store.ok(), store.status().ToString());
  auto comm = Communicator::FromCallbacks(forked::Callbacks(store->get()), rank, kGateWorld);
  CHILD_EXPECT(comm.ok(), comm.status().ToString());
  RefitSpec spec;
  spec.AddTensor("w", DType::kI32, {8, 6}, Layout(Mesh({0}), {Replicate()}),
                 Layout(Mesh({1}), {Replicate()}));
  std::vector<int32_t> buffer(kGateElements, -1);
  LocalBuffers buffers;
  if (rank == 0) {
    buffers.Source("w", buffer.data(), kGateElements * 4);
  } else {
    buffers.Destination("w", buffer.data(), kGateElements * 4);
  }
  HandleOptions options;
  options.setup_timeout = absl::Seconds(60);
  auto handle = RefitHandle::Create(*comm, spec, std::move(buffers), options);
  CHILD_EXPECT(handle.ok(), handle.status().ToString());
  auto deadline = [] { return absl::Now() + absl::Seconds(60); };
  auto refit = [&](int32_t step) -> absl::Status {
    if (rank == 0) {
      std::fill(buffer.begin(), buffer.end(), GateValue(step - 1, 0));  // Stale until the "kernel".
      ops.polls_before_done = 20;
      ops.on_done = [&buffer, step] {
        for (int i = 0; i < kGateElements; ++i) buffer[i] = GateValue(step, i);
      };
      RESHARD_RETURN_IF_ERROR(handle->StartOnStream(reinterpret_cast<void*>(1)));
    } else {
      RESHARD_RETURN_IF_ERROR(handle->Start());
    }
    return handle->Wait(deadline());
  };
  for (int32_t step = 1; step <= 2; ++step) {
    const absl::Status st = refit(step);
    CHILD_EXPECT(st.ok(), st.ToString());
    if (rank == 1) {
      for (int i = 0; i < kGateElements; ++i) {
        CHILD_EXPECT(buffer[i] == GateValue(step, i),
                     absl::StrCat("step ", step, " element ", i, " is ", buffer[i]));
      }
    }
  }
  // Both ranks are between refits before rank 0's next one fails.
  absl::Status st = handle->Barrier(deadline());
  CHILD_EXPECT(st.ok(), st.ToString());
  if (rank == 0) {
    std::fill(buffer.begin(), buffer.end(), 0);
    ops.polls_before_done = 1000000000;
    st = handle->StartOnStream(reinterpret_cast<void*>(1));
    CHILD_EXPECT(st.ok(), st.ToString());
    ops.event_error = absl::InternalError("fake: an illegal memory access was encountered");
    st = handle->Wait(deadline());
    CHILD_EXPECT(st.code() == absl::StatusCode::kInternal, st.ToString());
    ops.event_error = absl::OkStatus();
  } else {
    // Rank 0's abort may arrive before this Start (which then fails) or after it (Wait does).
    st = handle->Start();
    if (st.ok()) st = handle->Wait(deadline());
    CHILD_EXPECT(st.code() == absl::StatusCode::kUnavailable, st.ToString());
    CHILD_EXPECT(
        absl::StrContains(st.message(), "rank 0") && absl::StrContains(st.message(), "CUDA stream"),
        st.ToString());
  }
  handle->Reset();
  st = refit(4);
  CHILD_EXPECT(st.ok(), st.ToString());
  if (rank == 1) {
    for (int i = 0; i < kGateElements; ++i) CHILD_EXPECT(buffer[i] == GateValue(4, i));
  }
  handle = absl::CancelledError("destroyed before the fake it uses");
  internal::SetStreamOpsForTesting(nullptr);
  return 0;
}

TEST(StreamGateTest, SourcesReadAfterTheStreamAndAFailedStreamFailsThePeerAtOnce) {
  const std::string dir = forked::StoreDir("stream-gate", "sm");
  std::map<int32_t, int> codes = testing::ForkRanks(
      testing::Ranks(kGateWorld), [&](int32_t rank) { return GatedRank(rank, dir); },
      forked::Transport("sm"));
  for (int32_t r = 0; r < kGateWorld; ++r) EXPECT_EQ(codes[r], 0) << "rank " << r;
}

}  // namespace
}  // namespace reshard
