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
#include <map>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/common/log.h"
#include "src/common/status.h"

namespace reshard::rendezvous {
namespace {

constexpr uint32_t kProtocolVersion = 1;
constexpr uint32_t kMaxFrame = 256u << 20;
// Before a client authenticated, only a handshake-sized frame is accepted (a token is small):
// an unauthenticated peer cannot make the server buffer more than this.
constexpr uint32_t kMaxHandshakeFrame = 4096;
constexpr absl::Duration kAuthTimeout = absl::Seconds(10);
// An authenticated client that started a frame must finish it within this time.
constexpr absl::Duration kPartialFrameTimeout = absl::Seconds(60);
// Connections beyond this are accepted and closed at once (the server never runs out of fds for
// the ranks it serves because of a flood).
constexpr size_t kMaxConnections = 8192;
// accept4 failing for lack of descriptors (EMFILE, ENFILE, ENOBUFS, ENOMEM): stop polling the
// listening socket this long instead of spinning on it.
constexpr absl::Duration kAcceptBackoff = absl::Milliseconds(100);
// Extra time a Get waits for the server's answer beyond its own deadline.
constexpr absl::Duration kReplyGrace = absl::Seconds(5);

enum Op : uint8_t { kHello = 1, kSet = 2, kGet = 3, kList = 4, kDelete = 5 };
enum Code : uint8_t { kOk = 0, kTimeout = 1, kDenied = 2, kBadRequest = 3 };

void PutU32(std::string* out, uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out->append(b, 4);
}
void PutU64(std::string* out, uint64_t v) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out->append(b, 8);
}
void PutStr(std::string* out, const std::string& s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s);
}
// Prefixes `body` with its length.
std::string Frame(const std::string& body) {
  std::string out;
  out.reserve(body.size() + 4);
  PutU32(&out, static_cast<uint32_t>(body.size()));
  out.append(body);
  return out;
}
uint32_t LoadU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

// Bounds-checked decoding of one frame body.
class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  bool U8(uint8_t* v) {
    if (pos_ + 1 > s_.size()) return false;
    *v = static_cast<uint8_t>(s_[pos_++]);
    return true;
  }
  bool U32(uint32_t* v) {
    if (pos_ + 4 > s_.size()) return false;
    *v = LoadU32(s_.data() + pos_);
    pos_ += 4;
    return true;
  }
  bool U64(uint64_t* v) {
    uint32_t lo, hi;
    if (!U32(&lo) || !U32(&hi)) return false;
    *v = (static_cast<uint64_t>(hi) << 32) | lo;
    return true;
  }
  bool Str(std::string* v) {
    uint32_t n;
    if (!U32(&n) || pos_ + n > s_.size()) return false;
    v->assign(s_, pos_, n);
    pos_ += n;
    return true;
  }
  bool Done() const { return pos_ == s_.size(); }

 private:
  const std::string& s_;
  size_t pos_ = 0;
};

bool TokensEqual(const std::string& presented, const std::string& expected) {
  // Time depends only on the presented token's length, not on where it differs.
  unsigned diff = presented.size() == expected.size() ? 0u : 1u;
  for (size_t i = 0; i < presented.size(); ++i) {
    uint8_t e = i < expected.size() ? static_cast<uint8_t>(expected[i]) : 0;
    diff |= static_cast<uint8_t>(presented[i]) ^ e;
  }
  return diff == 0 && !expected.empty();
}

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
  struct Conn {
    std::string peer;
    std::string in;
    std::string out;
    bool authed = false;
    bool closing = false;  // close once `out` is flushed
    absl::Time auth_deadline;
    bool waiting = false;
    std::string wait_key;
    absl::Time wait_deadline;
    absl::Time partial_since = absl::InfiniteFuture();  // A frame started and not finished.
  };
  std::map<int, Conn> conns;
  absl::Time accept_paused_until = absl::InfinitePast();
  int64_t rejected_over_cap = 0;
  std::map<std::string, std::string> data;

  auto reply = [](Conn& c, uint8_t code, const std::string& payload) {
    std::string body(1, static_cast<char>(code));
    body.append(payload);
    c.out.append(Frame(body));
  };
  auto str_payload = [](const std::string& s) {
    std::string p;
    PutStr(&p, s);
    return p;
  };

  // Handles one complete frame body from `c`.
  auto handle = [&](Conn& c, const std::string& body) {
    Reader r(body);
    uint8_t op = 0;
    if (!r.U8(&op)) {
      reply(c, kBadRequest, str_payload("empty request"));
      c.closing = true;
      return;
    }
    if (!c.authed) {
      uint32_t version = 0;
      std::string token;
      if (op != kHello || !r.U32(&version) || !r.Str(&token) || !r.Done()) {
        RESHARD_LOG(kWarning, "store: refused client %s: no handshake", c.peer);
        refused_.fetch_add(1);
        reply(c, kBadRequest, str_payload("the first request must be a handshake"));
        c.closing = true;
        return;
      }
      if (version != kProtocolVersion) {
        RESHARD_LOG(kWarning, "store: refused client %s: protocol version %u", c.peer, version);
        refused_.fetch_add(1);
        reply(
            c, kBadRequest,
            str_payload(absl::StrCat("protocol version ", version,
                                     " is not supported (server speaks ", kProtocolVersion, ")")));
        c.closing = true;
        return;
      }
      if (!TokensEqual(token, token_)) {
        RESHARD_LOG(kWarning, "store: refused client %s: wrong token", c.peer);
        refused_.fetch_add(1);
        reply(c, kDenied, str_payload("wrong store token"));
        c.closing = true;
        return;
      }
      c.authed = true;
      reply(c, kOk, "");
      return;
    }
    std::string key;
    switch (op) {
      case kSet: {
        std::string value;
        if (!r.Str(&key) || !r.Str(&value) || !r.Done()) break;
        reply(c, kOk, "");
        for (auto& [fd, other] : conns) {
          if (other.waiting && other.wait_key == key) {
            other.waiting = false;
            reply(other, kOk, str_payload(value));
          }
        }
        data[key] = std::move(value);
        return;
      }
      case kGet: {
        uint64_t wait_ms = 0;
        if (!r.Str(&key) || !r.U64(&wait_ms) || !r.Done()) break;
        auto it = data.find(key);
        if (it != data.end()) {
          reply(c, kOk, str_payload(it->second));
        } else if (wait_ms == 0) {
          reply(c, kTimeout, "");
        } else {
          c.waiting = true;
          c.wait_key = std::move(key);
          c.wait_deadline =
              absl::Now() + absl::Milliseconds(std::min<uint64_t>(wait_ms, 1ull << 40));
        }
        return;
      }
      case kDelete: {
        if (!r.Str(&key) || !r.Done()) break;
        data.erase(key);
        reply(c, kOk, "");
        return;
      }
      case kList: {
        std::string prefix;
        if (!r.Str(&prefix) || !r.Done()) break;
        std::string payload;
        uint32_t n = 0;
        std::string entries;
        for (auto it = data.lower_bound(prefix);
             it != data.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
          PutStr(&entries, it->first);
          PutStr(&entries, it->second);
          ++n;
        }
        PutU32(&payload, n);
        payload.append(entries);
        if (payload.size() + 1 > kMaxFrame) {
          reply(c, kBadRequest,
                str_payload(absl::StrCat("the LIST of prefix \"", prefix.substr(0, 64), "\" is ",
                                         payload.size(), " bytes, over the ", kMaxFrame,
                                         "-byte frame limit; list a narrower prefix")));
          return;
        }
        reply(c, kOk, payload);
        return;
      }
      default:
        break;
    }
    reply(c, kBadRequest, str_payload(absl::StrCat("malformed request (op ", op, ")")));
    c.closing = true;
  };

  std::vector<pollfd> fds;
  std::vector<char> buf(1 << 16);
  while (true) {
    fds.clear();
    absl::Time now = absl::Now();
    absl::Time next_event = now + absl::Seconds(1);
    fds.push_back({wake_read_fd_, POLLIN, 0});
    const bool accepting = now >= accept_paused_until;
    fds.push_back({listen_fd_, static_cast<short>(accepting ? POLLIN : 0), 0});
    if (!accepting) next_event = std::min(next_event, accept_paused_until);
    for (auto& [fd, c] : conns) {
      short events = c.closing ? 0 : POLLIN;
      if (!c.out.empty()) events |= POLLOUT;
      fds.push_back({fd, events, 0});
      if (!c.authed) next_event = std::min(next_event, c.auth_deadline);
      if (c.waiting) next_event = std::min(next_event, c.wait_deadline);
      next_event = std::min(next_event, c.partial_since + kPartialFrameTimeout);
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
        if (conns.size() >= kMaxConnections) {
          if (rejected_over_cap++ % 1000 == 0) {
            RESHARD_LOG(kWarning, "store: refused client %s: %d connections are open already",
                        PeerName(addr), conns.size());
          }
          close(cfd);
          continue;
        }
        int one = 1;
        setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        Conn c;
        c.peer = PeerName(addr);
        c.auth_deadline = absl::Now() + kAuthTimeout;
        conns.emplace(cfd, std::move(c));
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      int fd = fds[i].fd;
      auto it = conns.find(fd);
      if (it == conns.end()) continue;
      Conn& c = it->second;
      bool dead = false;
      if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        // Frames are taken out as they complete, so `in` never holds more than one frame of
        // the size the client's state allows (a handshake before authentication).
        while (!dead && !c.closing) {
          ssize_t n = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT);
          if (n > 0) {
            c.in.append(buf.data(), static_cast<size_t>(n));
          } else {
            if (n < 0 && errno == EINTR) continue;
            if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) dead = true;
            break;
          }
          while (!c.closing && c.in.size() >= 4) {
            const uint32_t len = LoadU32(c.in.data());
            const uint32_t limit = c.authed ? kMaxFrame : kMaxHandshakeFrame;
            if (len > limit) {
              RESHARD_LOG(kWarning, "store: dropped client %s: frame of %u bytes (limit %u%s)",
                          c.peer, len, limit, c.authed ? "" : " before authentication");
              dead = true;
              break;
            }
            if (c.in.size() < 4 + static_cast<size_t>(len)) break;
            std::string body = c.in.substr(4, len);
            c.in.erase(0, 4 + static_cast<size_t>(len));
            handle(c, body);
          }
          c.partial_since =
              c.in.empty() ? absl::InfiniteFuture() : std::min(c.partial_since, absl::Now());
        }
      }
      if (dead) {
        to_close.push_back(fd);
        continue;
      }
    }
    // Flush pending output (including answers to waiters woken by another client's Set).
    for (auto& [fd, c] : conns) {
      while (!c.out.empty()) {
        ssize_t n = send(fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
          c.out.erase(0, static_cast<size_t>(n));
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) to_close.push_back(fd);
        break;
      }
      if (c.out.empty() && c.closing) to_close.push_back(fd);
    }
    now = absl::Now();
    for (auto& [fd, c] : conns) {
      if (c.waiting && now >= c.wait_deadline) {
        c.waiting = false;
        reply(c, kTimeout, "");
      }
      if (c.authed && !c.closing && now >= c.partial_since + kPartialFrameTimeout) {
        RESHARD_LOG(kWarning, "store: dropped client %s: a frame left unfinished for %s", c.peer,
                    absl::FormatDuration(kPartialFrameTimeout));
        to_close.push_back(fd);
      }
      if (!c.authed && !c.closing && now >= c.auth_deadline) {
        RESHARD_LOG(kWarning, "store: dropped client %s: no handshake within %s", c.peer,
                    absl::FormatDuration(kAuthTimeout));
        to_close.push_back(fd);
      }
    }
    std::sort(to_close.begin(), to_close.end());
    to_close.erase(std::unique(to_close.begin(), to_close.end()), to_close.end());
    for (int fd : to_close) {
      conns.erase(fd);
      close(fd);
    }
  }
  for (auto& [fd, c] : conns) close(fd);
}

// --- client --------------------------------------------------------------------------------

TcpStore::TcpStore(std::string host, int port, std::string token)
    : host_(std::move(host)), port_(port), token_(std::move(token)) {}

TcpStore::~TcpStore() {
  absl::MutexLock lock(&mu_);
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
    absl::MutexLock lock(&mu_);
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
  absl::MutexLock lock(&mu_);
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
  absl::Time deadline = absl::Now() + op_timeout_;
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
