// A rendezvous store over TCP: one TcpStoreServer (run in-process by rank 0 or by the launcher)
// and any number of TcpStore clients, each presenting a shared secret token.
//
// Wire protocol (version 1), every message a frame: u32 little-endian body length, then body.
//   request  body: u8 op, fields        response body: u8 code, fields
//   str = u32 length + bytes
//   HELLO(1) u32 version, str token  -> OK | DENIED str message       (must be the first frame)
//   SET(2)   str key, str value      -> OK
//   GET(3)   str key, u64 wait_ms    -> OK str value | TIMEOUT   (server parks the request)
//   LIST(4)  str prefix              -> OK u32 n, n x (str key, str value), sorted by key
//   DELETE(5) str key                -> OK                       (absent keys too)
// A wrong token is refused: the server answers DENIED, logs the peer address on stderr, and
// closes the connection; the client returns PermissionDenied. Frames are limited to 256 MiB, and
// to 4 KiB before a client authenticated (so an unauthenticated peer cannot make the server
// buffer more); a LIST answer that would exceed the limit is refused (BadRequest, "list a
// narrower prefix"). An authenticated client must finish a frame it started within 60 s. At
// most 8,192 connections are served at once (more are closed at accept); when accept runs out of
// descriptors the server pauses accepting for 100 ms instead of spinning.
//
// The server's side of the protocol, without sockets, is StoreProtocol (store_protocol.h).
//
// Failure model: every socket operation on both sides has a deadline. A client whose server
// has died (connection reset or closed) returns Unavailable; a server that stops answering turns
// into Unavailable when the operation's deadline passes, never a hang.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "src/rendezvous/store.h"

namespace reshard::rendezvous {

// Serves the store on one thread with poll(). Thread-safe: Start/Stop/port may be called from
// any thread. Destruction stops the server and closes every client connection (clients then
// see Unavailable).
class TcpStoreServer {
 public:
  // Binds `bind_host` (numeric address or name; "0.0.0.0" for every interface) on `port`
  // (0 picks an ephemeral port, see port()) and starts serving clients that present `token`.
  // Errors: InvalidArgument for an empty token or bad address, Unavailable when bind fails.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(
      const std::string& bind_host, int port, const std::string& token);

  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // The port actually bound.
  int port() const { return port_; }

  // Number of connections refused for a wrong token so far (for tests and reports).
  int refused_clients() const { return refused_.load(); }

  // Stops serving, closes every connection and joins the thread. Idempotent.
  void Stop();

 private:
  TcpStoreServer(int listen_fd, int wake_read_fd, int wake_write_fd, int port, std::string token);
  void Serve();

  int listen_fd_;
  int wake_read_fd_;
  int wake_write_fd_;
  int port_;
  std::string token_;
  std::atomic<int> refused_{0};
  std::atomic<bool> stopped_{false};
  std::thread thread_;
};

// A client. Thread-safe: concurrent calls use separate pooled connections, so a thread blocked
// in Get never delays another thread's Set.
class TcpStore final : public Store {
 public:
  // Connects to `host:port` and authenticates with `token`, retrying refused connections until
  // `deadline` (the server may still be starting). Errors: PermissionDenied for a wrong token,
  // Unavailable when the server cannot be reached before the deadline.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<TcpStore>> Connect(const std::string& host,
                                                                         int port,
                                                                         const std::string& token,
                                                                         absl::Time deadline);

  ~TcpStore() override;
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  // Set and List wait at most op_timeout() for the server (default 30 s).
  [[nodiscard]] absl::Status Set(const std::string& key, const std::string& value) override;
  // Bounded by the earlier of `deadline` and the operation timeout.
  [[nodiscard]] absl::Status SetBefore(const std::string& key, const std::string& value,
                                       absl::Time deadline) override;
  [[nodiscard]] absl::StatusOr<std::string> Get(const std::string& key,
                                                absl::Time deadline) override;
  [[nodiscard]] absl::Status Delete(const std::string& key) override;
  [[nodiscard]] absl::StatusOr<std::vector<std::pair<std::string, std::string>>> List(
      const std::string& prefix) override;

  absl::Duration op_timeout() const { return op_timeout_; }
  void set_op_timeout(absl::Duration timeout) { op_timeout_ = timeout; }

 private:
  TcpStore(std::string host, int port, std::string token);

  // One authenticated connection taken from the pool (or newly opened) for one request.
  // Refused connections are retried until `deadline` only when `retry_refused` (at Connect,
  // while the server may still be starting); later a refused connection means it is gone.
  [[nodiscard]] absl::StatusOr<int> Acquire(absl::Time deadline, bool retry_refused = false);
  void Release(int fd);
  // Sends `request` and reads one response body; closes `fd` on any transport error.
  [[nodiscard]] absl::StatusOr<std::string> RoundTrip(int fd, const std::string& request,
                                                      absl::Time deadline);

  std::string host_;
  int port_;
  std::string token_;
  absl::Duration op_timeout_ = absl::Seconds(30);
  // A std::mutex, not absl::Mutex: Debian's Abseil is not built with ThreadSanitizer, which then
  // cannot see absl::Mutex and reports what it guards as races (docs/testing.md).
  std::mutex mu_;
  std::vector<int> idle_;  // guarded by mu_
};

// Connects to the store named by RESHARD_STORE=host:port with RESHARD_STORE_TOKEN, waiting up
// to RESHARD_TIMEOUT_MS (default 30000) for the server. InvalidArgument when a variable is
// missing or malformed.
[[nodiscard]] absl::StatusOr<std::unique_ptr<Store>> ConnectStoreFromEnv();

// Splits "host:port" (or "[v6addr]:port"). InvalidArgument when malformed.
[[nodiscard]] absl::StatusOr<std::pair<std::string, int>> ParseHostPort(const std::string& text);

}  // namespace reshard::rendezvous
