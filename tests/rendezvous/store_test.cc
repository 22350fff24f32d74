// Tests for the rendezvous stores: the same contract for TcpStore and FileStore, then the TCP
// specifics (token, server death, unreachable or silent servers, environment).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "src/rendezvous/file_store.h"
#include "src/rendezvous/tcp_store.h"
#include "tests/testing/multiprocess.h"

namespace reshard::rendezvous {
namespace {

constexpr char kToken[] = "s3cret-token";

std::string TempDir() {
  const std::string dir = testing::ScratchDir("store-test");
  EXPECT_NE(dir, "");
  return dir;
}

// One backend under test: owns whatever the clients need (server, directory).
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::unique_ptr<Store> NewClient() = 0;
};

class TcpBackend : public Backend {
 public:
  TcpBackend() {
    auto server = TcpStoreServer::Start("127.0.0.1", 0, kToken);
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  std::unique_ptr<Store> NewClient() override {
    auto client =
        TcpStore::Connect("127.0.0.1", server_->port(), kToken, absl::Now() + absl::Seconds(5));
    EXPECT_TRUE(client.ok()) << client.status();
    return *std::move(client);
  }

 private:
  std::unique_ptr<TcpStoreServer> server_;
};

class FileBackend : public Backend {
 public:
  FileBackend() : dir_(TempDir()) {}
  ~FileBackend() override { std::system(absl::StrCat("rm -rf ", dir_).c_str()); }
  std::unique_ptr<Store> NewClient() override {
    auto client = FileStore::Open(dir_);
    EXPECT_TRUE(client.ok()) << client.status();
    return *std::move(client);
  }

 private:
  std::string dir_;
};

class StoreContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "tcp") {
      backend_ = std::make_unique<TcpBackend>();
    } else {
      backend_ = std::make_unique<FileBackend>();
    }
  }
  std::unique_ptr<Backend> backend_;
};

TEST_P(StoreContractTest, SetThenGetFromAnotherClient) {
  auto a = backend_->NewClient();
  auto b = backend_->NewClient();
  ASSERT_TRUE(a->Set("rank/0/addr", std::string("\0bin\xff", 5)).ok());
  auto value = b->Get("rank/0/addr", absl::Now() + absl::Seconds(1));
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, std::string("\0bin\xff", 5));
  ASSERT_TRUE(b->Set("rank/0/addr", "replaced").ok());
  EXPECT_EQ(*a->Get("rank/0/addr", absl::Now()), "replaced");
  ASSERT_TRUE(a->Set("empty", "").ok());
  EXPECT_EQ(*b->Get("empty", absl::Now()), "");
}

TEST_P(StoreContractTest, GetWaitsUntilAnotherClientSets) {
  auto a = backend_->NewClient();
  auto b = backend_->NewClient();
  std::thread setter([&] {
    absl::SleepFor(absl::Milliseconds(150));
    ASSERT_TRUE(b->Set("late", "arrived").ok());
  });
  absl::Time start = absl::Now();
  auto value = a->Get("late", absl::Now() + absl::Seconds(10));
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "arrived");
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(100));
}

TEST_P(StoreContractTest, GetOfMissingKeyReturnsDeadlineExceeded) {
  auto a = backend_->NewClient();
  absl::Time start = absl::Now();
  auto value = a->Get("never", absl::Now() + absl::Milliseconds(200));
  EXPECT_TRUE(absl::IsDeadlineExceeded(value.status())) << value.status();
  EXPECT_NE(std::string(value.status().message()).find("never"), std::string::npos);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(150));
  // A past deadline checks once without waiting.
  EXPECT_TRUE(absl::IsDeadlineExceeded(a->Get("never", absl::InfinitePast()).status()));
}

TEST_P(StoreContractTest, DeleteRemovesAKeyForEveryClientAndAbsentKeysAreFine) {
  auto a = backend_->NewClient();
  auto b = backend_->NewClient();
  ASSERT_TRUE(a->Set("gen/1/0", "1").ok());
  ASSERT_TRUE(a->Set("gen/2/0", "1").ok());
  ASSERT_TRUE(b->Delete("gen/1/0").ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(a->Get("gen/1/0", absl::InfinitePast()).status()));
  EXPECT_EQ(*a->Get("gen/2/0", absl::Now() + absl::Seconds(5)), "1");
  EXPECT_EQ(a->List("gen/")->size(), 1u);
  EXPECT_TRUE(a->Delete("gen/1/0").ok());  // Already gone.
  EXPECT_TRUE(a->Delete("never/set").ok());
}

TEST_P(StoreContractTest, ListReturnsSortedKeysWithPrefixOnly) {
  auto a = backend_->NewClient();
  ASSERT_TRUE(a->Set("ep/2", "c").ok());
  ASSERT_TRUE(a->Set("ep/0", "a").ok());
  ASSERT_TRUE(a->Set("ep/1", "b").ok());
  ASSERT_TRUE(a->Set("epoch", "x").ok());
  ASSERT_TRUE(a->Set("rkey/0", "y").ok());
  auto listed = a->List("ep/");
  ASSERT_TRUE(listed.ok()) << listed.status();
  std::vector<std::pair<std::string, std::string>> expected = {
      {"ep/0", "a"}, {"ep/1", "b"}, {"ep/2", "c"}};
  EXPECT_EQ(*listed, expected);
  EXPECT_EQ(a->List("ep")->size(), 4u);
  EXPECT_EQ(a->List("")->size(), 5u);
  EXPECT_TRUE(a->List("zzz")->empty());
}

TEST_P(StoreContractTest, ManyThreadsExchangeThroughOneClientEach) {
  constexpr int kThreads = 8;
  std::vector<std::unique_ptr<Store>> clients;
  for (int i = 0; i < kThreads; ++i) clients.push_back(backend_->NewClient());
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      if (!clients[i]->Set(absl::StrCat("t/", i), absl::StrCat("v", i)).ok()) return;
      for (int j = 0; j < kThreads; ++j) {
        auto v = clients[i]->Get(absl::StrCat("t/", j), absl::Now() + absl::Seconds(10));
        if (!v.ok() || *v != absl::StrCat("v", j)) return;
      }
      good.fetch_add(1);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), kThreads);
}

TEST_P(StoreContractTest, OneClientIsSafeAcrossThreadsWhileAGetBlocks) {
  auto shared = backend_->NewClient();
  std::thread waiter([&] {
    auto v = shared->Get("from-other-thread", absl::Now() + absl::Seconds(10));
    EXPECT_TRUE(v.ok()) << v.status();
  });
  absl::SleepFor(absl::Milliseconds(50));
  // Must not queue behind the blocked Get on the same client.
  ASSERT_TRUE(shared->Set("from-other-thread", "1").ok());
  waiter.join();
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreContractTest, ::testing::Values("tcp", "file"),
                         [](const auto& info) { return info.param; });

TEST(TcpStoreTest, WrongTokenIsRefusedAndCounted) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0, kToken);
  ASSERT_TRUE(server.ok()) << server.status();
  auto bad =
      TcpStore::Connect("127.0.0.1", (*server)->port(), "guess", absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(absl::IsPermissionDenied(bad.status())) << bad.status();
  auto prefix =
      TcpStore::Connect("127.0.0.1", (*server)->port(), "s3cret", absl::Now() + absl::Seconds(5));
  EXPECT_TRUE(absl::IsPermissionDenied(prefix.status())) << prefix.status();
  EXPECT_EQ((*server)->refused_clients(), 2);
  // The right token still works afterwards.
  auto good =
      TcpStore::Connect("127.0.0.1", (*server)->port(), kToken, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE((*good)->Set("k", "v").ok());
}

// A plain TCP connection to the loopback server, speaking no protocol yet; -1 on failure.
int RawConnect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

TEST(TcpStoreTest, RawClientWithoutHandshakeGetsNothing) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0, kToken);
  ASSERT_TRUE(server.ok());
  auto good =
      TcpStore::Connect("127.0.0.1", (*server)->port(), kToken, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE((*good)->Set("secret", "value").ok());
  // A LIST frame sent before any handshake must be refused, not answered with data.
  const int fd = RawConnect((*server)->port());
  ASSERT_GE(fd, 0);
  const char list_frame[] = {5, 0, 0, 0, 4, 0, 0, 0, 0};  // LIST ""
  ASSERT_EQ(send(fd, list_frame, sizeof(list_frame), 0), static_cast<ssize_t>(sizeof(list_frame)));
  std::string received;
  char buf[256];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) received.append(buf, static_cast<size_t>(n));
  close(fd);
  EXPECT_EQ(received.find("value"), std::string::npos);
  EXPECT_EQ((*server)->refused_clients(), 1);
}

// An unauthenticated client may not make the server buffer more than a handshake: announcing a
// 64 MiB frame (and streaming it) gets the connection closed at once, and nothing is answered.
TEST(TcpStoreTest, UnauthenticatedLargeFrameIsDroppedWithoutBuffering) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0, kToken);
  ASSERT_TRUE(server.ok());
  const int fd = RawConnect((*server)->port());
  ASSERT_GE(fd, 0);
  const uint32_t len = 64u << 20;
  char header[4] = {static_cast<char>(len & 0xff), static_cast<char>((len >> 8) & 0xff),
                    static_cast<char>((len >> 16) & 0xff), static_cast<char>(len >> 24)};
  ASSERT_EQ(send(fd, header, sizeof(header), MSG_NOSIGNAL), 4);
  std::string chunk(1 << 16, 'x');
  const absl::Time start = absl::Now();
  // The server closes the connection: sending fails (EPIPE / ECONNRESET) long before 64 MiB.
  int64_t sent = 0;
  while (sent < (int64_t{64} << 20)) {
    const ssize_t n = send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += n;
  }
  char buf[64];
  const ssize_t got = recv(fd, buf, sizeof(buf), 0);
  close(fd);
  EXPECT_LE(got, 0);  // Closed (0) or reset (-1): no answer.
  EXPECT_LT(sent, int64_t{64} << 20) << "the server kept reading an unauthenticated 64 MiB frame";
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // The server still serves proper clients.
  auto good =
      TcpStore::Connect("127.0.0.1", (*server)->port(), kToken, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_TRUE((*good)->Set("k", "v").ok());
}

TEST(TcpStoreTest, StoppedServerTurnsAParkedGetIntoUnavailable) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0, kToken);
  ASSERT_TRUE(server.ok());
  auto client =
      TcpStore::Connect("127.0.0.1", (*server)->port(), kToken, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(client.ok());
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(150));
    (*server)->Stop();
  });
  absl::Time start = absl::Now();
  auto value = (*client)->Get("never", absl::Now() + absl::Seconds(60));
  stopper.join();
  EXPECT_TRUE(absl::IsUnavailable(value.status())) << value.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(absl::IsUnavailable((*client)->Set("k", "v")));
}

TEST(TcpStoreTest, KilledServerProcessTurnsCallsIntoUnavailable) {
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Gone with the test binary, or after a minute, if a failed assertion skips the kill below:
    // a server left running would hold ctest's output pipe open.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    alarm(60);
    auto server = TcpStoreServer::Start("127.0.0.1", 0, kToken);
    int port = server.ok() ? (*server)->port() : -1;
    if (write(pipe_fds[1], &port, sizeof(port)) != sizeof(port)) _exit(3);
    pause();
    _exit(0);
  }
  int port = -1;
  ASSERT_EQ(read(pipe_fds[0], &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
  ASSERT_GT(port, 0);
  auto client = TcpStore::Connect("127.0.0.1", port, kToken, absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Set("before", "1").ok());
  std::thread killer([&] {
    absl::SleepFor(absl::Milliseconds(150));
    kill(child, SIGKILL);
  });
  absl::Time start = absl::Now();
  auto value = (*client)->Get("never", absl::Now() + absl::Seconds(60));
  killer.join();
  waitpid(child, nullptr, 0);
  close(pipe_fds[0]);
  close(pipe_fds[1]);
  EXPECT_TRUE(absl::IsUnavailable(value.status())) << value.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(absl::IsUnavailable((*client)->List("").status()));
}

TEST(TcpStoreTest, UnreachableServerIsUnavailableAtTheDeadline) {
  // Bind then close to find a port nobody listens on.
  int port;
  {
    auto server = TcpStoreServer::Start("127.0.0.1", 0, kToken);
    ASSERT_TRUE(server.ok());
    port = (*server)->port();
  }
  absl::Time start = absl::Now();
  auto client = TcpStore::Connect("127.0.0.1", port, kToken, absl::Now() + absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsUnavailable(client.status())) << client.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

TEST(TcpStoreTest, SilentServerDoesNotHangTheClient) {
  // A socket that listens (the kernel completes the TCP handshake) but never answers.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 4), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  absl::Time start = absl::Now();
  auto client = TcpStore::Connect("127.0.0.1", ntohs(addr.sin_port), kToken,
                                  absl::Now() + absl::Milliseconds(300));
  EXPECT_TRUE(absl::IsUnavailable(client.status())) << client.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  close(fd);
}

TEST(TcpStoreTest, ConnectFromEnvironment) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0, kToken);
  ASSERT_TRUE(server.ok());
  setenv("RESHARD_STORE", absl::StrCat("127.0.0.1:", (*server)->port()).c_str(), 1);
  setenv("RESHARD_STORE_TOKEN", kToken, 1);
  setenv("RESHARD_TIMEOUT_MS", "5000", 1);
  auto store = ConnectStoreFromEnv();
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE((*store)->Set("x", "1").ok());
  setenv("RESHARD_STORE_TOKEN", "wrong", 1);
  EXPECT_TRUE(absl::IsPermissionDenied(ConnectStoreFromEnv().status()));
  setenv("RESHARD_STORE", "no-port", 1);
  EXPECT_TRUE(absl::IsInvalidArgument(ConnectStoreFromEnv().status()));
  unsetenv("RESHARD_STORE");
  EXPECT_TRUE(absl::IsInvalidArgument(ConnectStoreFromEnv().status()));
  unsetenv("RESHARD_STORE_TOKEN");
  unsetenv("RESHARD_TIMEOUT_MS");
}

TEST(TcpStoreTest, ParseHostPort) {
  EXPECT_EQ(*ParseHostPort("10.251.0.1:2379"), std::make_pair(std::string("10.251.0.1"), 2379));
  EXPECT_EQ(*ParseHostPort("[::1]:80"), std::make_pair(std::string("::1"), 80));
  EXPECT_FALSE(ParseHostPort("host:0").ok());
  EXPECT_FALSE(ParseHostPort("host:70000").ok());
  EXPECT_FALSE(ParseHostPort(":80").ok());
  EXPECT_FALSE(ParseHostPort("host").ok());
}

// The clients are forked before the server's thread starts: a child forked from a process with
// another thread may inherit a lock that thread held (ASan's allocator has no fork handler, so a
// child's first allocation hung). They learn the port through a pipe, and the parent waits for
// them under a deadline.
TEST(TcpStoreTest, ProcessesRendezvousThroughTheServer) {
  constexpr int kProcs = 4;
  std::vector<pid_t> children;
  std::vector<int> port_pipes;
  for (int r = 0; r < kProcs; ++r) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      close(fds[1]);
      int port = 0;
      if (read(fds[0], &port, sizeof(port)) != static_cast<ssize_t>(sizeof(port))) _exit(3);
      auto c = TcpStore::Connect("127.0.0.1", port, kToken, absl::Now() + absl::Seconds(10));
      if (!c.ok() || !(*c)->Set(absl::StrCat("addr/", r), absl::StrCat("worker", r)).ok()) {
        _exit(1);
      }
      for (int p = 0; p < kProcs; ++p) {
        auto v = (*c)->Get(absl::StrCat("addr/", p), absl::Now() + absl::Seconds(10));
        if (!v.ok() || *v != absl::StrCat("worker", p)) _exit(2);
      }
      _exit(0);
    }
    close(fds[0]);
    children.push_back(pid);
    port_pipes.push_back(fds[1]);
  }
  auto server = TcpStoreServer::Start("127.0.0.1", 0, kToken);
  const int port = server.ok() ? (*server)->port() : 0;
  for (int fd : port_pipes) {
    if (server.ok()) {
      EXPECT_EQ(write(fd, &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
    }
    close(fd);  // Without a server the children read nothing and exit 3.
  }
  ASSERT_TRUE(server.ok()) << server.status();
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (pid_t pid : children) {
    int status = 0;
    pid_t done = 0;
    while ((done = waitpid(pid, &status, WNOHANG)) == 0 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    if (done == 0) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      ADD_FAILURE() << "client " << pid << " still running after 60 s";
      continue;
    }
    ASSERT_EQ(done, pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
}

// Issue 10: the single-host mpirun store (/dev/shm/reshard-mpi-<job>) trusted an existing
// directory whoever owned it. A file store is this user's directory that nobody else can open.
TEST(FileStoreTest, RefusesDirectoriesOthersCanReachOrControl) {
  const std::string root = TempDir();
  const std::string open_dir = root + "/open";
  ASSERT_EQ(mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 0755), 0);
  absl::StatusOr<std::unique_ptr<FileStore>> store = FileStore::Open(open_dir);
  ASSERT_EQ(store.status().code(), absl::StatusCode::kPermissionDenied) << store.status();
  EXPECT_NE(store.status().message().find("0755"), absl::string_view::npos) << store.status();

  const std::string link = root + "/link";
  ASSERT_EQ(symlink(open_dir.c_str(), link.c_str()), 0);
  store = FileStore::Open(link);
  EXPECT_EQ(store.status().code(), absl::StatusCode::kUnavailable) << store.status();

  if (geteuid() == 0) {  // Only root can give a directory away (CI runs as root).
    const std::string theirs = root + "/theirs";
    ASSERT_EQ(mkdir(theirs.c_str(), 0700), 0);
    ASSERT_EQ(chown(theirs.c_str(), 65534, 65534), 0);
    store = FileStore::Open(theirs);
    ASSERT_EQ(store.status().code(), absl::StatusCode::kPermissionDenied) << store.status();
    EXPECT_NE(store.status().message().find("uid 65534"), absl::string_view::npos);
  }

  const std::string fresh = root + "/fresh";
  store = FileStore::Open(fresh);
  ASSERT_TRUE(store.ok()) << store.status();
  struct stat st;
  ASSERT_EQ(stat(fresh.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  std::system(absl::StrCat("rm -rf ", root).c_str());
}

}  // namespace
}  // namespace reshard::rendezvous
