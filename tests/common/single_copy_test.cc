// SingleCopyWriter: process_vm_writev of many runs per call, its short-count resumption and its
// errors. A process may write into itself, and a forked child is a real second address space.
#include "src/common/single_copy.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace reshard {
namespace {

uint64_t Address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

TEST(SingleCopyWriter, WritesManyRunsPerCallIntoItsOwnProcess) {
  // 2500 strided runs of 24 bytes (every other 24-byte slot): three calls of at most 1024 runs.
  constexpr size_t kRuns = 2500, kRun = 24;
  std::vector<uint8_t> from(kRuns * kRun), to(2 * kRuns * kRun, 0);
  std::iota(from.begin(), from.end(), uint8_t{1});
  SingleCopyWriter w(0, 1, getpid());
  for (size_t i = 0; i < kRuns; ++i) {
    ASSERT_TRUE(w.Add(&from[i * kRun], Address(&to[2 * i * kRun]), kRun).ok());
  }
  EXPECT_EQ(w.calls(), 2);  // Two full queues written while adding.
  ASSERT_TRUE(w.Write().ok());
  EXPECT_EQ(w.calls(), 3);
  EXPECT_EQ(w.bytes(), static_cast<int64_t>(kRuns * kRun));
  for (size_t i = 0; i < kRuns; ++i) {
    for (size_t b = 0; b < kRun; ++b) {
      ASSERT_EQ(to[2 * i * kRun + b], from[i * kRun + b]) << "run " << i;
      ASSERT_EQ(to[(2 * i + 1) * kRun + b], 0) << "gap after run " << i;
    }
  }
  // Empty runs are not queued, and writing an empty queue makes no call.
  ASSERT_TRUE(w.Add(from.data(), Address(to.data()), 0).ok());
  ASSERT_TRUE(w.Write().ok());
  EXPECT_EQ(w.calls(), 3);
}

TEST(SingleCopyWriter, WritesIntoAnotherProcess) {
  // A shared page tells the parent what the child's private buffer holds after the write.
  auto* shared = static_cast<uint8_t*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(shared, MAP_FAILED);
  std::vector<uint8_t> child_buffer(4096, 0);  // Same address in the forked child.
  // The token is created on first use: before the fork, so the child holds it too.
  const uint64_t token_address = Address(SingleCopyWriter::OwnToken());
  const uint64_t token = *SingleCopyWriter::OwnToken();
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  const pid_t child = fork();
  if (child == 0) {
    // Waits for the parent's go; a parent that failed and exited closes the pipe (EOF).
    close(go[1]);
    alarm(60);
    char c = 0;
    if (read(go[0], &c, 1) != 1) _exit(1);
    std::copy(child_buffer.begin(), child_buffer.end(), shared);
    _exit(0);
  }
  close(go[0]);
  // The child inherited this process's token at the same address: the probe reads it back.
  ASSERT_NE(token, 0u);
  ASSERT_TRUE(SingleCopyWriter::Probe(0, 1, child, token_address, token).ok());
  // A record naming this pid with another token (a reused pid, another namespace's process,
  // a forged record) is refused before any write.
  const absl::Status other = SingleCopyWriter::Probe(0, 1, child, token_address, token ^ 1);
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition) << other;
  EXPECT_NE(other.message().find("is another process"), std::string::npos) << other;
  // An address that is not mapped there is refused too (DataLoss, EFAULT), never a crash.
  const absl::Status unmapped = SingleCopyWriter::Probe(0, 1, child, 8, token);
  EXPECT_EQ(unmapped.code(), absl::StatusCode::kDataLoss) << unmapped;
  std::vector<uint8_t> from(100, 7);
  SingleCopyWriter w(0, 1, child);
  ASSERT_TRUE(w.Add(from.data(), Address(child_buffer.data() + 10), 50).ok());
  ASSERT_TRUE(w.Add(from.data() + 50, Address(child_buffer.data() + 1000), 50).ok());
  ASSERT_TRUE(w.Write().ok());
  EXPECT_EQ(child_buffer[10], 0) << "the parent's own buffer is not the child's";
  ASSERT_EQ(write(go[1], "x", 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  for (int i = 0; i < 4096; ++i) {
    const bool written = (i >= 10 && i < 60) || (i >= 1000 && i < 1050);
    ASSERT_EQ(shared[i], written ? 7 : 0) << "byte " << i;
  }
  munmap(shared, 4096);
  // The child is gone: probing and writing fail with Unavailable naming both ranks.
  const absl::Status probe = SingleCopyWriter::Probe(3, 5, child, token_address, token);
  EXPECT_EQ(probe.code(), absl::StatusCode::kUnavailable) << probe;
  EXPECT_NE(probe.message().find("rank 3 cannot write into rank 5"), std::string::npos) << probe;
  SingleCopyWriter gone(3, 5, child);
  ASSERT_TRUE(gone.Add(from.data(), Address(child_buffer.data()), 10).ok());
  const absl::Status written = gone.Write();
  EXPECT_EQ(written.code(), absl::StatusCode::kUnavailable) << written;
}

TEST(SingleCopyWriter, UnmappedTargetIsDataLossAndLaterRunsStayUnwritten) {
  // A page that is mapped, then unmapped: the second run faults.
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  ASSERT_EQ(munmap(page, 4096), 0);
  std::vector<uint8_t> from(64, 9), to(64, 0);
  SingleCopyWriter w(2, 4, getpid());
  ASSERT_TRUE(w.Add(from.data(), Address(to.data()), 16).ok());
  ASSERT_TRUE(w.Add(from.data(), Address(page), 16).ok());
  ASSERT_TRUE(w.Add(from.data(), Address(to.data() + 32), 16).ok());
  const absl::Status status = w.Write();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find("rank 2: a single-copy write of"), std::string::npos) << status;
  EXPECT_NE(status.message().find("into rank 4"), std::string::npos) << status;
  EXPECT_EQ(to[0], 9);
  EXPECT_EQ(to[32], 0) << "runs after the failing one are not written";
  // The queue is empty after a failure.
  ASSERT_TRUE(w.Write().ok());
}

}  // namespace
}  // namespace reshard
