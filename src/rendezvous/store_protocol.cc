#include "src/rendezvous/store_protocol.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/common/log.h"

namespace reshard::rendezvous {

namespace store_wire {

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
void PutStr(std::string* out, std::string_view s) {
  PutU32(out, static_cast<uint32_t>(s.size()));
  out->append(s);
}
std::string Frame(std::string_view body) {
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

bool Reader::U8(uint8_t* v) {
  if (s_.size() - pos_ < 1) return false;
  *v = static_cast<uint8_t>(s_[pos_++]);
  return true;
}
bool Reader::U32(uint32_t* v) {
  if (s_.size() - pos_ < 4) return false;
  *v = LoadU32(s_.data() + pos_);
  pos_ += 4;
  return true;
}
bool Reader::U64(uint64_t* v) {
  if (s_.size() - pos_ < 8) return false;
  uint32_t lo, hi;
  U32(&lo);
  U32(&hi);
  *v = (static_cast<uint64_t>(hi) << 32) | lo;
  return true;
}
bool Reader::Str(std::string* v) {
  if (s_.size() - pos_ < 4) return false;
  const uint32_t n = LoadU32(s_.data() + pos_);
  if (s_.size() - pos_ - 4 < n) return false;
  v->assign(s_.substr(pos_ + 4, n));
  pos_ += 4 + static_cast<size_t>(n);
  return true;
}

}  // namespace store_wire

using namespace store_wire;  // NOLINT: the wire format is this file's vocabulary.

namespace {

bool TokensEqual(const std::string& presented, const std::string& expected) {
  // Time depends only on the presented token's length, not on where it differs.
  unsigned diff = presented.size() == expected.size() ? 0u : 1u;
  for (size_t i = 0; i < presented.size(); ++i) {
    uint8_t e = i < expected.size() ? static_cast<uint8_t>(expected[i]) : 0;
    diff |= static_cast<uint8_t>(presented[i]) ^ e;
  }
  return diff == 0 && !expected.empty();
}

std::string StrPayload(std::string_view s) {
  std::string p;
  PutStr(&p, s);
  return p;
}

}  // namespace

StoreProtocol::StoreProtocol(std::string token) : token_(std::move(token)) {}

void StoreProtocol::Open(int id, std::string peer, absl::Time now) {
  Conn c;
  c.peer = std::move(peer);
  c.auth_deadline = now + kAuthTimeout;
  conns_[id] = std::move(c);
}

void StoreProtocol::Close(int id) { conns_.erase(id); }

std::string& StoreProtocol::output(int id) { return conns_.at(id).out; }

bool StoreProtocol::closing(int id) const {
  auto it = conns_.find(id);
  return it == conns_.end() || it->second.closing;
}

bool StoreProtocol::authenticated(int id) const {
  auto it = conns_.find(id);
  return it != conns_.end() && it->second.authed;
}

size_t StoreProtocol::buffered(int id) const {
  auto it = conns_.find(id);
  return it == conns_.end() ? 0 : it->second.in.size();
}

std::vector<int> StoreProtocol::ids() const {
  std::vector<int> out;
  out.reserve(conns_.size());
  for (const auto& [id, c] : conns_) out.push_back(id);
  return out;
}

void StoreProtocol::Reply(Conn& c, uint8_t code, std::string_view payload) {
  PutU32(&c.out, static_cast<uint32_t>(payload.size() + 1));
  c.out.push_back(static_cast<char>(code));
  c.out.append(payload);
}

bool StoreProtocol::Receive(int id, std::string_view bytes, absl::Time now) {
  Conn& c = conns_.at(id);
  if (c.closing) return true;
  c.in.append(bytes);
  // Complete frames are taken from the front; `in` is compacted once at the end, so a burst of
  // many small frames costs linear time.
  size_t pos = 0;
  bool keep = true;
  while (!c.closing && c.in.size() - pos >= 4) {
    const uint32_t len = LoadU32(c.in.data() + pos);
    const uint32_t limit = c.authed ? kMaxFrame : kMaxHandshakeFrame;
    if (len > limit) {
      RESHARD_LOG(kWarning, "store: dropped client %s: frame of %u bytes (limit %u%s)", c.peer, len,
                  limit, c.authed ? "" : " before authentication");
      keep = false;
      break;
    }
    if (c.in.size() - pos - 4 < len) break;
    Handle(c, std::string_view(c.in).substr(pos + 4, len), now);
    pos += 4 + static_cast<size_t>(len);
  }
  if (!keep || c.closing) {
    c.in.clear();
  } else {
    c.in.erase(0, pos);
  }
  c.partial_since = c.in.empty() ? absl::InfiniteFuture() : std::min(c.partial_since, now);
  return keep;
}

void StoreProtocol::Handshake(Conn& c, uint8_t op, Reader& r) {
  uint32_t version = 0;
  std::string token;
  if (op != kHello || !r.U32(&version) || !r.Str(&token) || !r.Done()) {
    RESHARD_LOG(kWarning, "store: refused client %s: no handshake", c.peer);
    ++refused_;
    Reply(c, kBadRequest, StrPayload("the first request must be a handshake"));
    c.closing = true;
    return;
  }
  if (version != kProtocolVersion) {
    RESHARD_LOG(kWarning, "store: refused client %s: protocol version %u", c.peer, version);
    ++refused_;
    Reply(c, kBadRequest,
          StrPayload(absl::StrCat("protocol version ", version, " is not supported (server speaks ",
                                  kProtocolVersion, ")")));
    c.closing = true;
    return;
  }
  if (!TokensEqual(token, token_)) {
    RESHARD_LOG(kWarning, "store: refused client %s: wrong token", c.peer);
    ++refused_;
    Reply(c, kDenied, StrPayload("wrong store token"));
    c.closing = true;
    return;
  }
  c.authed = true;
  Reply(c, kOk, "");
}

void StoreProtocol::Handle(Conn& c, std::string_view body, absl::Time now) {
  Reader r(body);
  uint8_t op = 0;
  if (!r.U8(&op)) {
    Reply(c, kBadRequest, StrPayload("empty request"));
    c.closing = true;
    return;
  }
  if (!c.authed) {
    Handshake(c, op, r);
    return;
  }
  std::string key;
  switch (op) {
    case kSet: {
      std::string value;
      if (!r.Str(&key) || !r.Str(&value) || !r.Done()) break;
      Reply(c, kOk, "");
      for (auto& [id, other] : conns_) {
        if (other.waiting && other.wait_key == key) {
          other.waiting = false;
          Reply(other, kOk, StrPayload(value));
        }
      }
      auto [it, inserted] = data_.try_emplace(std::move(key));
      stored_bytes_ += value.size() + (inserted ? it->first.size() : 0);
      stored_bytes_ -= it->second.size();
      it->second = std::move(value);
      return;
    }
    case kGet: {
      uint64_t wait_ms = 0;
      if (!r.Str(&key) || !r.U64(&wait_ms) || !r.Done()) break;
      auto it = data_.find(key);
      if (it != data_.end()) {
        Reply(c, kOk, StrPayload(it->second));
      } else if (wait_ms == 0) {
        Reply(c, kTimeout, "");
      } else {
        c.waiting = true;
        c.wait_key = std::move(key);
        c.wait_deadline = now + absl::Milliseconds(std::min<uint64_t>(wait_ms, 1ull << 40));
      }
      return;
    }
    case kDelete: {
      if (!r.Str(&key) || !r.Done()) break;
      auto it = data_.find(key);
      if (it != data_.end()) {
        stored_bytes_ -= it->first.size() + it->second.size();
        data_.erase(it);
      }
      Reply(c, kOk, "");
      return;
    }
    case kList: {
      std::string prefix;
      if (!r.Str(&prefix) || !r.Done()) break;
      std::string payload;
      uint32_t n = 0;
      std::string entries;
      for (auto it = data_.lower_bound(prefix);
           it != data_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
        PutStr(&entries, it->first);
        PutStr(&entries, it->second);
        ++n;
      }
      PutU32(&payload, n);
      payload.append(entries);
      if (payload.size() + 1 > kMaxFrame) {
        Reply(c, kBadRequest,
              StrPayload(absl::StrCat("the LIST of prefix \"", prefix.substr(0, 64), "\" is ",
                                      payload.size(), " bytes, over the ", kMaxFrame,
                                      "-byte frame limit; list a narrower prefix")));
        return;
      }
      Reply(c, kOk, payload);
      return;
    }
    default:
      break;
  }
  Reply(c, kBadRequest, StrPayload(absl::StrCat("malformed request (op ", op, ")")));
  c.closing = true;
}

void StoreProtocol::Tick(absl::Time now, std::vector<int>* drop) {
  for (auto& [id, c] : conns_) {
    if (c.waiting && now >= c.wait_deadline) {
      c.waiting = false;
      Reply(c, kTimeout, "");
    }
    if (c.authed && !c.closing && now >= c.partial_since + kPartialFrameTimeout) {
      RESHARD_LOG(kWarning, "store: dropped client %s: a frame left unfinished for %s", c.peer,
                  absl::FormatDuration(kPartialFrameTimeout));
      drop->push_back(id);
    }
    if (!c.authed && !c.closing && now >= c.auth_deadline) {
      RESHARD_LOG(kWarning, "store: dropped client %s: no handshake within %s", c.peer,
                  absl::FormatDuration(kAuthTimeout));
      drop->push_back(id);
    }
  }
}

absl::Time StoreProtocol::NextDeadline() const {
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [id, c] : conns_) {
    if (!c.authed) next = std::min(next, c.auth_deadline);
    if (c.waiting) next = std::min(next, c.wait_deadline);
    next = std::min(next, c.partial_since + kPartialFrameTimeout);
  }
  return next;
}

}  // namespace reshard::rendezvous
