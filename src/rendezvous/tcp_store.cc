#include "src/rendezvous/tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/common/log.h"
#include "src/common/status.h"
#include "src/rendezvous/store_protocol.h"

namespace reshard::rendezvous {
namespace {

using namespace store_wire;  // NOLINT: the wire format shared with the server's protocol.

// Connections beyond this are accepted and closed at once (the server never runs out of fds for
// the ranks it serves because of a flood).
constexpr size_t kMaxConnections = 8192;
// accept4 failing for lack of descriptors (EMFILE, ENFILE, ENOBUFS, ENOMEM): stop polling the
// listening socket this long instead of spinning on it.
constexpr absl::Duration kAcceptBackoff = absl::Milliseconds(100);
// Extra time a Get waits for the server's answer beyond its own deadline.
constexpr absl::Duration kReplyGrace = absl::Seconds(5);

int RemainingMs(absl::Time deadline) {
  absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
}

std::string PeerName(const sockaddr_storage& addr) {
  char host[NI_MAXHOST] = "?";
  char serv[NI_MAXSERV] = "?";
  getnameinfo(reinterpret_cast<const sockaddr*>(&addr), sizeof(addr), host, sizeof(host), serv,
              sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV);
  return absl::StrCat(host, ":", serv);
}

// --- client-side blocking I/O with deadlines ---------------------------------------------

absl::Status SendAll(int fd, const std::string& data, absl::Time deadline,
                     const std::string& where) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(
          absl::StrCat("store server at ", where, " is gone: send: ", std::strerror(errno)));
    }
    pollfd p{fd, POLLOUT, 0};
    int ms = RemainingMs(deadline);
    if (ms == 0) {
      return absl::UnavailableError(
          absl::StrCat("store server at ", where, " did not accept data before the deadline"));
    }
    if (poll(&p, 1, ms) < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

absl::Status RecvExact(int fd, char* buf, size_t len, absl::Time deadline,
                       const std::string& where) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = recv(fd, buf + done, len - done, MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      return absl::UnavailableError(
          absl::StrCat("store server at ", where, " closed the connection"));
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return absl::UnavailableError(
          absl::StrCat("store server at ", where, " is gone: recv: ", std::strerror(errno)));
    }
    pollfd p{fd, POLLIN, 0};
    int ms = RemainingMs(deadline);
    if (ms == 0) {
      return absl::UnavailableError(
          absl::StrCat("store server at ", where, " did not answer before the deadline"));
    }
    if (poll(&p, 1, ms) < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

// One non-blocking TCP connection to host:port, retrying while the server is not listening yet.
absl::StatusOr<int> OpenSocket(const std::string& host, int port, absl::Time deadline,
                               bool retry_refused) {
  const std::string where = absl::StrCat(host, ":", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("store address ", where, " does not resolve: ", gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> owner(res, &freeaddrinfo);
  std::string last_error = "no address";
  absl::Duration backoff = absl::Milliseconds(10);
  while (true) {
    for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
      int fd =
          socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
      if (fd < 0) {
        last_error = absl::StrCat("socket: ", std::strerror(errno));
        continue;
      }
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      int err = 0;
      if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        err = errno;
        if (err == EINPROGRESS) {
          pollfd p{fd, POLLOUT, 0};
          int ms = std::max(RemainingMs(deadline), 1);
          int pr = poll(&p, 1, ms);
          if (pr == 0) {
            err = ETIMEDOUT;
          } else {
            socklen_t len = sizeof(err);
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
          }
        }
      }
      if (err == 0) return fd;
      close(fd);
      last_error = std::strerror(err);
    }
    if (!retry_refused || absl::Now() + backoff >= deadline) break;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
  return absl::UnavailableError(
      absl::StrCat("cannot reach the store server at ", where, ": ", last_error));
}

}  // namespace

absl::StatusOr<std::pair<std::string, int>> ParseHostPort(const std::string& text) {
  std::string host;
  std::string port_text;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return absl::InvalidArgumentError(
          absl::StrCat("store address \"", text, "\" is not [host]:port"));
    }
    host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("store address \"", text, "\" is not host:port"));
    }
    host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  int port = 0;
  if (!absl::SimpleAtoi(port_text, &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("store address \"", text, "\" has no valid port (1..65535)"));
  }
  return std::make_pair(host, port);
}

// --- server --------------------------------------------------------------------------------

TcpStoreServer::TcpStoreServer(int listen_fd, int wake_read_fd, int wake_write_fd, int port,
                               std::string token)
    : listen_fd_(listen_fd),
      wake_read_fd_(wake_read_fd),
      wake_write_fd_(wake_write_fd),
      port_(port),
      token_(std::move(token)) {}

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const std::string& bind_host,
                                                                      int port,
                                                                      const std::string& token) {
  if (token.empty()) return absl::InvalidArgumentError("store server needs a non-empty token");
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("store port ", port, " is out of range"));
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(bind_host.empty() ? nullptr : bind_host.c_str(),
                       std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("store bind address ", bind_host, " does not resolve: ", gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> owner(res, &freeaddrinfo);
  int fd =
      socket(res->ai_family, res->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, res->ai_protocol);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, res->ai_addr, res->ai_addrlen) < 0 || listen(fd, 1024) < 0) {
    int err = errno;
    close(fd);
    return absl::UnavailableError(absl::StrCat("store server cannot listen on ", bind_host, ":",
                                               port, ": ", std::strerror(err)));
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int bound = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                         : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_NONBLOCK | O_CLOEXEC) < 0) {
    int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(err)));
  }
  std::unique_ptr<TcpStoreServer> server(
      new TcpStoreServer(fd, pipe_fds[0], pipe_fds[1], bound, token));
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

TcpStoreServer::~TcpStoreServer() { Stop(); }

void TcpStoreServer::Stop() {
  if (stopped_.exchange(true)) return;
  char b = 1;
  while (write(wake_write_fd_, &b, 1) < 0 && errno == EINTR) {
  }
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
  close(wake_read_fd_);
  close(wake_write_fd_);
}

void TcpStoreServer::Serve() {
  StoreProtocol protocol(token_);
  absl::Time accept_paused_until = absl::InfinitePast();
  int64_t rejected_over_cap = 0;

  std::vector<pollfd> fds;
  std::vector<char> buf(1 << 16);
  while (true) {
    fds.clear();
    absl::Time now = absl::Now();
    absl::Time next_event = std::min(now + absl::Seconds(1), protocol.NextDeadline());
    fds.push_back({wake_read_fd_, POLLIN, 0});
    const bool accepting = now >= accept_paused_until;
    fds.push_back({listen_fd_, static_cast<short>(accepting ? POLLIN : 0), 0});
    if (!accepting) next_event = std::min(next_event, accept_paused_until);
    for (int fd : protocol.ids()) {
      short events = protocol.closing(fd) ? 0 : POLLIN;
      if (!protocol.output(fd).empty()) events |= POLLOUT;
      fds.push_back({fd, events, 0});
    }
    int rc = poll(fds.data(), fds.size(), RemainingMs(next_event));
    if (rc < 0 && errno != EINTR) {
      RESHARD_LOG(kError, "store: poll failed: %s", std::strerror(errno));
      break;
    }
    if (fds[0].revents != 0) break;  // Stop()
    std::vector<int> to_close;
    if (fds[1].revents & POLLIN) {
      while (true) {
        sockaddr_storage addr{};
        socklen_t len = sizeof(addr);
        int cfd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len,
                          SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) {
          if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            RESHARD_LOG(kWarning, "store: accept failed (%s); pausing new connections for %s",
                        std::strerror(errno), absl::FormatDuration(kAcceptBackoff));
            accept_paused_until = absl::Now() + kAcceptBackoff;
          }
          break;
        }
        if (protocol.connections() >= kMaxConnections) {
          if (rejected_over_cap++ % 1000 == 0) {
            RESHARD_LOG(kWarning, "store: refused client %s: %d connections are open already",
                        PeerName(addr), protocol.connections());
          }
          close(cfd);
          continue;
        }
        int one = 1;
        setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        protocol.Open(cfd, PeerName(addr), absl::Now());
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      const int fd = fds[i].fd;
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      // Frames are answered as they complete, so the protocol never holds more than one frame
      // of the size the client's state allows (a handshake before authentication).
      while (!protocol.closing(fd)) {
        ssize_t n = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
        if (n > 0) {
          if (!protocol.Receive(fd, std::string_view(buf.data(), static_cast<size_t>(n)),
                                absl::Now())) {
            to_close.push_back(fd);
            break;
          }
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) to_close.push_back(fd);
        break;
      }
    }
    refused_.store(protocol.refused());
    protocol.Tick(absl::Now(), &to_close);
    // Flush pending output (including answers to waiters woken by another client's Set and
    // TIMEOUT answers of the Tick above).
    for (int fd : protocol.ids()) {
      std::string& out = protocol.output(fd);
      while (!out.empty()) {
        ssize_t n = send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
          out.erase(0, static_cast<size_t>(n));
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) to_close.push_back(fd);
        break;
      }
      if (out.empty() && protocol.closing(fd)) to_close.push_back(fd);
    }
    std::sort(to_close.begin(), to_close.end());
    to_close.erase(std::unique(to_close.begin(), to_close.end()), to_close.end());
    for (int fd : to_close) {
      protocol.Close(fd);
      close(fd);
    }
  }
  for (int fd : protocol.ids()) close(fd);
}

// --- client --------------------------------------------------------------------------------

TcpStore::TcpStore(std::string host, int port, std::string token)
    : host_(std::move(host)), port_(port), token_(std::move(token)) {}

TcpStore::~TcpStore() {
  std::lock_guard<std::mutex> lock(mu_);
  for (int fd : idle_) close(fd);
  idle_.clear();
}

absl::StatusOr<std::unique_ptr<TcpStore>> TcpStore::Connect(const std::string& host, int port,
                                                            const std::string& token,
                                                            absl::Time deadline) {
  if (token.empty()) return absl::InvalidArgumentError("store token is empty");
  std::unique_ptr<TcpStore> store(new TcpStore(host, port, token));
  RESHARD_ASSIGN_OR_RETURN(int fd, store->Acquire(deadline, /*retry_refused=*/true));
  store->Release(fd);
  return store;
}

absl::StatusOr<int> TcpStore::Acquire(absl::Time deadline, bool retry_refused) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!idle_.empty()) {
      int fd = idle_.back();
      idle_.pop_back();
      return fd;
    }
  }
  RESHARD_ASSIGN_OR_RETURN(int fd, OpenSocket(host_, port_, deadline, retry_refused));
  std::string hello(1, static_cast<char>(kHello));
  PutU32(&hello, kProtocolVersion);
  PutStr(&hello, token_);
  absl::Time hello_deadline = std::max(deadline, absl::Now() + absl::Seconds(1));
  RESHARD_ASSIGN_OR_RETURN(std::string response, RoundTrip(fd, hello, hello_deadline));
  uint8_t code = static_cast<uint8_t>(response[0]);
  if (code == kOk) return fd;
  close(fd);
  Reader r(response);
  uint8_t ignored;
  std::string message;
  r.U8(&ignored);
  r.Str(&message);
  const std::string where = absl::StrCat(host_, ":", port_);
  if (code == kDenied) {
    return absl::PermissionDeniedError(
        absl::StrCat("store server at ", where, " refused this client: ", message));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("store server at ", where, " rejected the handshake: ", message));
}

void TcpStore::Release(int fd) {
  std::lock_guard<std::mutex> lock(mu_);
  idle_.push_back(fd);
}

absl::StatusOr<std::string> TcpStore::RoundTrip(int fd, const std::string& request,
                                                absl::Time deadline) {
  const std::string where = absl::StrCat(host_, ":", port_);
  auto fail = [fd](absl::Status status) {
    close(fd);
    return status;
  };
  absl::Status s = SendAll(fd, Frame(request), deadline, where);
  if (!s.ok()) return fail(s);
  char header[4];
  s = RecvExact(fd, header, 4, deadline, where);
  if (!s.ok()) return fail(s);
  uint32_t len = LoadU32(header);
  if (len == 0 || len > kMaxFrame) {
    return fail(absl::DataLossError(
        absl::StrCat("store server at ", where, " sent a malformed frame (", len, " bytes)")));
  }
  std::string body(len, '\0');
  s = RecvExact(fd, body.data(), len, deadline, where);
  if (!s.ok()) return fail(s);
  return body;
}

absl::Status TcpStore::Set(const std::string& key, const std::string& value) {
  return SetBefore(key, value, absl::InfiniteFuture());
}

absl::Status TcpStore::SetBefore(const std::string& key, const std::string& value,
                                 absl::Time until) {
  const absl::Time deadline = std::min(until, absl::Now() + op_timeout_);
  RESHARD_ASSIGN_OR_RETURN(int fd, Acquire(deadline));
  std::string request(1, static_cast<char>(kSet));
  PutStr(&request, key);
  PutStr(&request, value);
  RESHARD_ASSIGN_OR_RETURN(std::string response, RoundTrip(fd, request, deadline));
  Release(fd);
  if (static_cast<uint8_t>(response[0]) != kOk) {
    return absl::InternalError(absl::StrCat("store server rejected Set of key \"", key, "\""));
  }
  return absl::OkStatus();
}

absl::Status TcpStore::Delete(const std::string& key) {
  absl::Time deadline = absl::Now() + op_timeout_;
  RESHARD_ASSIGN_OR_RETURN(int fd, Acquire(deadline));
  std::string request(1, static_cast<char>(kDelete));
  PutStr(&request, key);
  RESHARD_ASSIGN_OR_RETURN(std::string response, RoundTrip(fd, request, deadline));
  Release(fd);
  if (static_cast<uint8_t>(response[0]) != kOk) {
    return absl::InternalError(absl::StrCat("store server rejected Delete of key \"", key, "\""));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> TcpStore::Get(const std::string& key, absl::Time deadline) {
  RESHARD_ASSIGN_OR_RETURN(int fd, Acquire(std::max(deadline, absl::Now() + absl::Seconds(1))));
  std::string request(1, static_cast<char>(kGet));
  PutStr(&request, key);
  absl::Duration wait = std::max(deadline - absl::Now(), absl::ZeroDuration());
  PutU64(&request, static_cast<uint64_t>(absl::ToInt64Milliseconds(wait)));
  RESHARD_ASSIGN_OR_RETURN(std::string response,
                           RoundTrip(fd, request, absl::Now() + wait + kReplyGrace));
  Release(fd);
  Reader r(response);
  uint8_t code = 0;
  r.U8(&code);
  if (code == kTimeout) {
    return absl::DeadlineExceededError(
        absl::StrCat("store key \"", key, "\" was not set before the deadline"));
  }
  std::string value;
  if (code != kOk || !r.Str(&value) || !r.Done()) {
    return absl::DataLossError(
        absl::StrCat("store server sent a malformed answer for \"", key, "\""));
  }
  return value;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> TcpStore::List(
    const std::string& prefix) {
  absl::Time deadline = absl::Now() + op_timeout_;
  RESHARD_ASSIGN_OR_RETURN(int fd, Acquire(deadline));
  std::string request(1, static_cast<char>(kList));
  PutStr(&request, prefix);
  RESHARD_ASSIGN_OR_RETURN(std::string response, RoundTrip(fd, request, deadline));
  Release(fd);
  Reader r(response);
  uint8_t code = 0;
  uint32_t n = 0;
  if (!r.U8(&code) || code != kOk || !r.U32(&n)) {
    return absl::DataLossError("store server sent a malformed List answer");
  }
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    std::string k, v;
    if (!r.Str(&k) || !r.Str(&v)) {
      return absl::DataLossError("store server sent a truncated List answer");
    }
    out.emplace_back(std::move(k), std::move(v));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Store>> ConnectStoreFromEnv() {
  const char* address = std::getenv("RESHARD_STORE");
  const char* token = std::getenv("RESHARD_STORE_TOKEN");
  if (address == nullptr || *address == '\0') {
    return absl::InvalidArgumentError("RESHARD_STORE is not set (expected host:port)");
  }
  if (token == nullptr || *token == '\0') {
    return absl::InvalidArgumentError("RESHARD_STORE_TOKEN is not set");
  }
  int64_t timeout_ms = 30000;
  if (const char* t = std::getenv("RESHARD_TIMEOUT_MS"); t != nullptr && *t != '\0') {
    if (!absl::SimpleAtoi(t, &timeout_ms) || timeout_ms <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("RESHARD_TIMEOUT_MS=\"", t, "\" is not a positive number of ms"));
    }
  }
  RESHARD_ASSIGN_OR_RETURN(auto host_port, ParseHostPort(address));
  RESHARD_ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> store,
                           TcpStore::Connect(host_port.first, host_port.second, token,
                                             absl::Now() + absl::Milliseconds(timeout_ms)));
  store->set_op_timeout(absl::Milliseconds(timeout_ms));
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace reshard::rendezvous
