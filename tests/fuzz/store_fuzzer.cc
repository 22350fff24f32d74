// Fuzzes the TCP store server's protocol (StoreProtocol, the socket-free core of TcpStoreServer):
// framing, the handshake, SET/GET/LIST/DELETE, parked Gets woken by other clients, and the time
// limits, over four connections and a clock of the harness's own.
//
// Input: a script of events. Each event starts with one byte: connection c = b & 3, action
// (b >> 2) & 7:
//   0-3  the next byte n, then n + 1 bytes (fewer at the end) arrive on c (opened if closed)
//   4    c closes (the client hung up)
//   5    the clock advances by the next byte x 1 s (the limits are 10 s and 60 s)
//   6    the clock advances by the next byte x 1 ms (parked Gets)
//   7    c (re)opens and sends a correct handshake, so mutations start from a usable session
// Properties checked after every event (a violation aborts, which is a finding):
// - every reply is a well-formed frame: length 1..kMaxFrame, a known code;
// - a connection buffers less than one frame of its state's limit (a handshake frame before it
//   authenticated), whatever arrived;
// - the bytes stored never exceed the bytes received (the accounting neither wraps nor leaks);
// - after Tick, no deadline is in the past (every due Get was answered, every late client gone).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "src/rendezvous/store_protocol.h"

namespace reshard::rendezvous {
namespace {

using namespace store_wire;  // NOLINT

constexpr char kToken[] = "fuzz-token";
constexpr int kConnections = 4;

[[noreturn]] void Fail(const char* what, int id) {
  std::fprintf(stderr, "fuzz_store: connection %d: %s\n", id, what);
  std::abort();
}

std::string Hello() {
  std::string body(1, static_cast<char>(kHello));
  PutU32(&body, kProtocolVersion);
  PutStr(&body, kToken);
  return Frame(body);
}

class Session {
 public:
  Session() : protocol_(kToken), now_(absl::FromUnixSeconds(1700000000)) {}

  void Run(std::string_view script) {
    size_t pos = 0;
    auto next = [&](uint8_t* b) {
      if (pos >= script.size()) return false;
      *b = static_cast<uint8_t>(script[pos++]);
      return true;
    };
    uint8_t b = 0;
    while (next(&b)) {
      const int id = b & 3;
      const int action = (b >> 2) & 7;
      uint8_t arg = 0;
      switch (action) {
        case 0:
        case 1:
        case 2:
        case 3: {
          if (!next(&arg)) return;
          const size_t n = std::min<size_t>(size_t{arg} + 1, script.size() - pos);
          Send(id, script.substr(pos, n));
          pos += n;
          break;
        }
        case 4:
          if (protocol_.is_open(id)) protocol_.Close(id);
          break;
        case 5:
          if (!next(&arg)) return;
          now_ += absl::Seconds(arg);
          break;
        case 6:
          if (!next(&arg)) return;
          now_ += absl::Milliseconds(arg);
          break;
        case 7:
          if (protocol_.is_open(id)) protocol_.Close(id);
          Send(id, Hello());
          break;
      }
      Settle();
    }
  }

 private:
  void Send(int id, std::string_view bytes) {
    if (!protocol_.is_open(id)) protocol_.Open(id, "fuzz-peer", now_);
    if (protocol_.closing(id)) return;  // The server no longer reads a closing connection.
    received_ += bytes.size();
    if (!protocol_.Receive(id, bytes, now_)) {
      protocol_.Close(id);
      return;
    }
    const size_t limit = protocol_.authenticated(id) ? kMaxFrame : kMaxHandshakeFrame;
    if (protocol_.buffered(id) >= 4 + size_t{limit}) Fail("buffers more than one frame", id);
  }

  // What the server does after reading: time limits, then flushing (and checking) every reply.
  void Settle() {
    std::vector<int> drop;
    protocol_.Tick(now_, &drop);
    for (int id : protocol_.ids()) {
      if (id < 0 || id >= kConnections) Fail("an id the harness never opened", id);
      CheckReplies(id, protocol_.output(id));
      protocol_.output(id).clear();
      if (protocol_.closing(id)) drop.push_back(id);
    }
    for (int id : drop) {
      if (protocol_.is_open(id)) protocol_.Close(id);
      if (protocol_.is_open(id)) Fail("still open after Close", id);
    }
    if (protocol_.NextDeadline() <= now_) Fail("a deadline in the past survived Tick", -1);
    if (protocol_.stored_bytes() > received_) Fail("stores more bytes than it received", -1);
  }

  static void CheckReplies(int id, std::string_view out) {
    while (!out.empty()) {
      if (out.size() < 4) Fail("a truncated reply frame", id);
      const uint32_t len = LoadU32(out.data());
      if (len == 0 || len > kMaxFrame || out.size() - 4 < len) Fail("a malformed reply frame", id);
      const uint8_t code = static_cast<uint8_t>(out[4]);
      if (code > kBadRequest) Fail("an unknown reply code", id);
      out.remove_prefix(4 + len);
    }
  }

  StoreProtocol protocol_;
  absl::Time now_;
  size_t received_ = 0;
};

}  // namespace
}  // namespace reshard::rendezvous

// Every refused or dropped client is a warning line: thousands a second would flood the test log
// and halve the speed. RESHARD_LOG_LEVEL=warning (set before starting) fuzzes the lines too.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("RESHARD_LOG_LEVEL", "error", /*overwrite=*/0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  reshard::rendezvous::Session session;
  session.Run(std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
