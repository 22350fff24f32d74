// Shared-memory objects outlive a killed process; the sweep removes those whose creator is gone
// and only those (issue 10: killing `reshard run` left /dev/shm/reshard-* behind).
#include "src/common/shared_memory.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace reshard {
namespace {

bool Exists(const std::string& shm_name) {
  struct stat st;
  return stat(absl::StrCat("/dev/shm", shm_name).c_str(), &st) == 0;
}

TEST(SharedBuffer, NamesCarryTheCreatorAndItsPidNamespace) {
  absl::StatusOr<std::unique_ptr<SharedBuffer>> b = SharedBuffer::Allocate("names", 4096);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->name().rfind(absl::StrCat("/reshard-", SharedObjectOwner(), "-"), 0), 0u)
      << (*b)->name();
  EXPECT_EQ(SharedObjectOwner().rfind(absl::StrCat(getpid(), "."), 0), 0u);
}

TEST(SharedBuffer, SweepRemovesObjectsOfDeadCreatorsOnly) {
  absl::StatusOr<std::unique_ptr<SharedBuffer>> mine = SharedBuffer::Allocate("alive", 4096);
  ASSERT_TRUE(mine.ok()) << mine.status();
  // A child creates an object and dies without unlinking it (as SIGKILL would leave it).
  int pipe_fd[2];
  ASSERT_EQ(pipe(pipe_fd), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(pipe_fd[0]);
    absl::StatusOr<std::unique_ptr<SharedBuffer>> b = SharedBuffer::Allocate("orphan", 4096);
    const std::string name = b.ok() ? (*b)->name() : std::string();
    (void)!write(pipe_fd[1], name.data(), name.size());
    _exit(b.ok() ? 0 : 1);  // No destructors: the object stays in /dev/shm.
  }
  close(pipe_fd[1]);
  char buf[256];
  const ssize_t n = read(pipe_fd[0], buf, sizeof(buf));
  close(pipe_fd[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ASSERT_GT(n, 0);
  const std::string orphan(buf, static_cast<size_t>(n));
  ASSERT_TRUE(Exists(orphan)) << orphan;

  EXPECT_GE(RemoveSharedObjectsOfDeadProcesses(), 1);
  EXPECT_FALSE(Exists(orphan)) << orphan;
  EXPECT_TRUE(Exists((*mine)->name())) << "a live process's object must stay";
}

}  // namespace
}  // namespace reshard
