// Process and host identities used to watch same-host peers (src/common/process.h).
#include "src/common/process.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace reshard {
namespace {

TEST(ProcessTest, SelfIsAliveAndRoundTrips) {
  const ProcessId self = ProcessId::Self();
  EXPECT_EQ(self.pid, getpid());
  EXPECT_GT(self.start_time, 0u);
  EXPECT_TRUE(ProcessAlive(self));
  absl::StatusOr<ProcessId> back = ProcessId::Decode(self.Encode());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->pid, self.pid);
  EXPECT_EQ(back->start_time, self.start_time);
  EXPECT_FALSE(HostIdentity().empty());
}

TEST(ProcessTest, ReusedPidOrGarbageIsNotAlive) {
  ProcessId other_start = ProcessId::Self();
  other_start.start_time += 1;  // Same pid, another process's start time: a reused pid.
  EXPECT_FALSE(ProcessAlive(other_start));
  EXPECT_FALSE(ProcessAlive(ProcessId{int64_t{1} << 40, 1}));  // No such pid.
}

TEST(ProcessTest, ExitedChildIsGoneBeforeAndAfterItIsReaped) {
  const pid_t child = fork();
  if (child == 0) {
    // Gone with the test binary, or after a minute, if a failed assertion skips the kill below:
    // a child left paused would hold ctest's output pipe open.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    alarm(60);
    pause();
    _exit(0);
  }
  ASSERT_GT(child, 0);
  absl::StatusOr<ProcessId> id = ProcessId::Of(child);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_TRUE(ProcessAlive(*id));
  kill(child, SIGKILL);
  for (int i = 0; i < 200 && ProcessAlive(*id); ++i) usleep(5000);
  EXPECT_FALSE(ProcessAlive(*id));  // Killed, not yet reaped: a zombie counts as gone.
  EXPECT_TRUE(ProcessId::Of(child).ok()) << "the zombie should still be in /proc";
  waitpid(child, nullptr, 0);
  EXPECT_FALSE(ProcessAlive(*id));
  EXPECT_EQ(ProcessId::Of(child).status().code(), absl::StatusCode::kNotFound);
}

TEST(ProcessTest, HostileIdsAreRejected) {
  for (const char* bad :
       {"", "12", "x:1", "1:y", "-5:3", "0:1", "1:2:3", "99999999999999999999999:1"}) {
    absl::StatusOr<ProcessId> id = ProcessId::Decode(bad);
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace reshard
