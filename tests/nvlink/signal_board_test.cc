// A peer's signal board is shared memory another process writes (docs/fanout.md): the failure
// epoch and reason a rank reads from it must be bounded and printable whatever bytes are there.
#include "src/nvlink/signal_board.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "gtest/gtest.h"

namespace reshard::nvlink {
namespace {

TEST(SignalBoardFailure, PublishedReasonIsCutAndMadePrintable) {
  absl::StatusOr<SignalBoard> board = SignalBoard::Create("failure-test", 4);
  ASSERT_TRUE(board.ok()) << board.status();
  absl::StatusOr<PeerBoard> peer = PeerBoard::Open(board->name(), 4);
  ASSERT_TRUE(peer.ok()) << peer.status();
  std::string reason;
  EXPECT_EQ(peer->FailedEpoch(&reason), 0u);
  EXPECT_TRUE(reason.empty());
  std::string long_reason = "line one\nline\ttwo\x7f";
  long_reason.append(1000, 'x');
  board->PublishFailure(7, long_reason);
  EXPECT_EQ(peer->FailedEpoch(&reason), 7u);
  EXPECT_EQ(reason.size(), static_cast<size_t>(kFailureReasonBytes - 1));
  EXPECT_EQ(reason.substr(0, 19), "line one line two x");
  board->Unlink();
}

// A hostile or broken owner overwrote everything after the board's first 64 bytes (magic and
// slot count) with one byte value, the reason's terminator included: the reader stays inside
// the reason's bytes (ASan would catch an overread) and gets a printable line.
TEST(SignalBoardFailure, ReasonWithoutTerminatorStaysInsideTheBoard) {
  absl::StatusOr<SignalBoard> board = SignalBoard::Create("hostile-test", 4);
  ASSERT_TRUE(board.ok()) << board.status();
  absl::StatusOr<PeerBoard> peer = PeerBoard::Open(board->name(), 4);
  ASSERT_TRUE(peer.ok()) << peer.status();
  const int fd = shm_open(board->name().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  struct stat st {};
  ASSERT_EQ(fstat(fd, &st), 0);
  void* p =
      mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_NE(p, MAP_FAILED);
  std::memset(static_cast<uint8_t*>(p) + 64, 0x01, static_cast<size_t>(st.st_size) - 64);
  std::string reason;
  EXPECT_NE(peer->FailedEpoch(&reason), 0u);
  EXPECT_LE(reason.size(), static_cast<size_t>(kFailureReasonBytes));
  EXPECT_EQ(reason, std::string(reason.size(), ' '));
  munmap(p, static_cast<size_t>(st.st_size));
  close(fd);
  board->Unlink();
}

}  // namespace
}  // namespace reshard::nvlink
