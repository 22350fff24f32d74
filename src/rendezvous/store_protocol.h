// The TCP store's wire format (both sides) and the server's protocol without sockets.
//
// The protocol itself is described in tcp_store.h. StoreProtocol is everything the server does
// between the bytes it receives and the bytes it sends: framing and its limits, the handshake,
// the operations, parked Gets and the time limits. TcpStoreServer owns the sockets and feeds it;
// unit tests and tests/fuzz/store_fuzzer.cc drive it directly, with their own clock.
//
// Thread safety: StoreProtocol is thread-compatible (the server calls it from its one thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"

namespace reshard::rendezvous {

namespace store_wire {

inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr uint32_t kMaxFrame = 256u << 20;
// Before a client authenticated, only a handshake-sized frame is accepted (a token is small):
// an unauthenticated peer cannot make the server buffer more than this.
inline constexpr uint32_t kMaxHandshakeFrame = 4096;

enum Op : uint8_t { kHello = 1, kSet = 2, kGet = 3, kList = 4, kDelete = 5 };
enum Code : uint8_t { kOk = 0, kTimeout = 1, kDenied = 2, kBadRequest = 3 };

void PutU32(std::string* out, uint32_t v);
void PutU64(std::string* out, uint64_t v);
void PutStr(std::string* out, std::string_view s);
// Prefixes `body` with its length.
std::string Frame(std::string_view body);
uint32_t LoadU32(const char* p);

// Bounds-checked decoding of one frame body. Every method returns false, and reads nothing,
// when the body is too short.
class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}
  bool U8(uint8_t* v);
  bool U32(uint32_t* v);
  bool U64(uint64_t* v);
  bool Str(std::string* v);
  bool Done() const { return pos_ == s_.size(); }

 private:
  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace store_wire

class StoreProtocol {
 public:
  // A client must send its handshake within this time after it connected.
  static constexpr absl::Duration kAuthTimeout = absl::Seconds(10);
  // An authenticated client that started a frame must finish it within this time.
  static constexpr absl::Duration kPartialFrameTimeout = absl::Seconds(60);

  // Serves clients that present `token` (non-empty).
  explicit StoreProtocol(std::string token);

  // A connection `id` (the server's descriptor) opened at `now` by `peer` (for log lines).
  // Ids are unique among open connections.
  void Open(int id, std::string peer, absl::Time now);
  // Forgets connection `id` (closed by either side); a Get it parked is dropped.
  void Close(int id);

  // Bytes received on `id` at `now`: answers every frame they complete. Returns false when the
  // connection must be closed at once without a reply (a frame over the limit of its state).
  // After a malformed request or a refused handshake the connection is closing(): it is to be
  // closed once its output was sent, and its further input is ignored.
  [[nodiscard]] bool Receive(int id, std::string_view bytes, absl::Time now);

  // Applies the time limits at `now`: parked Gets past their deadline are answered TIMEOUT,
  // and the ids of connections to close at once (no handshake within kAuthTimeout, a frame left
  // unfinished for kPartialFrameTimeout) are appended to `drop`.
  void Tick(absl::Time now, std::vector<int>* drop);
  // The earliest time at which Tick has something to do (InfiniteFuture when nothing).
  absl::Time NextDeadline() const;

  // Bytes to send to `id`, whole frames appended in order; the caller erases what it sent.
  // Requires an open id.
  std::string& output(int id);
  bool closing(int id) const;
  bool authenticated(int id) const;
  // Bytes received on `id` that do not form a whole frame yet.
  size_t buffered(int id) const;
  bool is_open(int id) const { return conns_.count(id) != 0; }
  size_t connections() const { return conns_.size(); }
  // Ids of every open connection, ascending.
  std::vector<int> ids() const;
  // Handshakes refused so far (no handshake, wrong version, wrong token).
  int refused() const { return refused_; }
  // Bytes of keys and values stored (for tests and the fuzzer's memory bounds).
  size_t stored_bytes() const { return stored_bytes_; }

 private:
  struct Conn {
    std::string peer;
    std::string in;
    std::string out;
    bool authed = false;
    bool closing = false;
    absl::Time auth_deadline;
    bool waiting = false;
    std::string wait_key;
    absl::Time wait_deadline;
    absl::Time partial_since = absl::InfiniteFuture();  // A frame started and not finished.
  };

  void Handle(Conn& c, std::string_view body, absl::Time now);
  void Handshake(Conn& c, uint8_t op, store_wire::Reader& r);
  static void Reply(Conn& c, uint8_t code, std::string_view payload);

  std::string token_;
  std::map<int, Conn> conns_;
  std::map<std::string, std::string> data_;
  size_t stored_bytes_ = 0;
  int refused_ = 0;
};

}  // namespace reshard::rendezvous
