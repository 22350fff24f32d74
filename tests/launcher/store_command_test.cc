// End-to-end tests of `reshard store` (tools/reshard/cmd_store.cc): the CLI binary serving the
// rendezvous store, used through the store client. A binary of its own: the client comes from
// the internal rendezvous library, which libreshard.so (linked by the launcher's tests) holds
// too, and two copies of it in one process are an ODR violation that ASan reports.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "src/rendezvous/tcp_store.h"

namespace reshard {
namespace {

const std::string kBin = std::string(RESHARD_BINARY_DIR) + "/bin/";

// Runs `reshard ARGS` and returns its exit status (-1 when it did not exit).
int Reshard(const std::string& args) {
  FILE* f = popen((kBin + "reshard " + args).c_str(), "r");
  if (f == nullptr) return -1;
  char buf[4096];
  while (fread(buf, 1, sizeof(buf), f) > 0) {
  }
  int status = pclose(f);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// `reshard store`: the rendezvous store as a process of its own (issue 10: under mpirun the store
// lived in the trainer process). Clients with the token use it; SIGTERM stops it with status 0.
TEST(StoreCommandTest, ServesUntilSignalled) {
  const std::string dir = testing::TempDir() + "/reshard-store-cmd-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  const std::string ready = dir + "/ready";
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The server runs until signalled: gone with the test binary if a failed assertion below
    // skips the SIGTERM (it would hold ctest's output pipe open).
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    setenv("RESHARD_STORE_TOKEN", "store-command-token", 1);
    const std::string bin = kBin + "reshard";
    execl(bin.c_str(), bin.c_str(), "store", "--listen", "127.0.0.1:0", "--ready-file",
          ready.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  std::string address;
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (address.empty() && absl::Now() < deadline) {
    std::ifstream in(ready);
    std::getline(in, address);
    if (address.empty()) absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(absl::StartsWith(address, "127.0.0.1:")) << address;
  const int port = std::stoi(address.substr(10));
  auto client = rendezvous::TcpStore::Connect("127.0.0.1", port, "store-command-token", deadline);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Set("k", "v").ok());
  auto got = (*client)->Get("k", deadline);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "v");
  auto wrong = rendezvous::TcpStore::Connect("127.0.0.1", port, "wrong", deadline);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kPermissionDenied) << wrong.status();
  ASSERT_EQ(kill(child, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  std::filesystem::remove_all(dir);
}

TEST(StoreCommandTest, RefusesToServeWithoutAToken) {
  unsetenv("RESHARD_STORE_TOKEN");
  EXPECT_EQ(Reshard("store --listen 127.0.0.1:0 2>/dev/null"), 2);
}

}  // namespace
}  // namespace reshard
