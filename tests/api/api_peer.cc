// One rank of the API's multi-process tests (started by the launcher, identity from the
// environment). Refits an 8x6 row->column spec over ranks {0,1} -> {0,1} for --steps steps,
// verifying every destination element.
//   --die-after K   rank 1 kills itself (SIGKILL) after K refits; rank 0 then expects its next
//                   refit to fail with Unavailable or DeadlineExceeded, and the one after that
//                   with FailedPrecondition (no Reset). Prints "PEER_LOSS_REPORTED" then.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "reshard/reshard.h"

int main(int argc, char** argv) {
  int steps = 3, die_after = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--steps") == 0) steps = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--die-after") == 0) die_after = std::atoi(argv[i + 1]);
  }
  auto comm = reshard::Communicator::FromEnvironment();
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
    return 2;
  }
  using reshard::Layout;
  using reshard::Mesh;
  using reshard::Shard;
  reshard::RefitSpec spec;
  spec.AddTensor("w", reshard::DType::kI32, {8, 6}, Layout(Mesh::Range(0, 2), {Shard(0)}),
                 Layout(Mesh::Range(0, 2), {Shard(1)}));
  const int rank = comm->rank();
  std::vector<int32_t> src(24), dst(24);
  reshard::LocalBuffers buffers;
  buffers.Source("w", src.data(), 96).Destination("w", dst.data(), 96);
  auto handle = reshard::RefitHandle::Create(*comm, spec, std::move(buffers));
  if (!handle.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, handle.status().ToString().c_str());
    return 1;
  }
  for (int step = 1; step <= steps; ++step) {
    if (rank == 1 && step == die_after + 1) raise(SIGKILL);
    // Source rows [4r, 4r+4) x 6 cols; value = step * 1000 + global flat index.
    for (int i = 0; i < 24; ++i) src[i] = step * 1000 + rank * 24 + i;
    std::fill(dst.begin(), dst.end(), -1);
    absl::Status st = handle->Execute(absl::Seconds(10));
    if (die_after >= 0 && step == die_after + 1) {
      if (st.code() != absl::StatusCode::kUnavailable &&
          st.code() != absl::StatusCode::kDeadlineExceeded) {
        std::fprintf(stderr, "rank %d: expected Unavailable or DeadlineExceeded, got %s\n", rank,
                     st.ToString().c_str());
        return 1;
      }
      std::fprintf(stderr, "rank %d: peer loss reported: %s\n", rank, st.ToString().c_str());
      absl::Status again = handle->Execute(absl::Seconds(10));
      if (again.code() != absl::StatusCode::kFailedPrecondition || !handle->failed()) {
        std::fprintf(stderr, "rank %d: expected FailedPrecondition, got %s\n", rank,
                     again.ToString().c_str());
        return 1;
      }
      std::printf("PEER_LOSS_REPORTED %s\n", again.ToString().c_str());
      return 0;
    }
    if (!st.ok()) {
      std::fprintf(stderr, "rank %d step %d: %s\n", rank, step, st.ToString().c_str());
      return 1;
    }
    // Destination: all 8 rows x cols [3r, 3r+3).
    for (int r = 0; r < 8; ++r) {
      for (int c = 0; c < 3; ++c) {
        const int want = step * 1000 + r * 6 + 3 * rank + c;
        if (dst[r * 3 + c] != want) {
          std::fprintf(stderr, "rank %d step %d: w[%d][%d] = %d, expected %d\n", rank, step, r,
                       3 * rank + c, dst[r * 3 + c], want);
          return 1;
        }
      }
    }
    if (handle->stats().registrations_this_refit != 0) {
      std::fprintf(stderr, "rank %d: refit %d registered memory\n", rank, step);
      return 1;
    }
  }
  std::printf("OK rank %d transports %s\n", rank, handle->stats().transports.c_str());
  return 0;
}
