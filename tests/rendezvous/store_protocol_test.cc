// The TCP store server's protocol without sockets (src/rendezvous/store_protocol.h), on a clock
// of the test's own: the handshake, the operations, parked Gets and the time limits.
#include "src/rendezvous/store_protocol.h"

#include <string>
#include <string_view>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace reshard::rendezvous {
namespace {

using namespace store_wire;  // NOLINT

constexpr char kToken[] = "s3cret";

std::string Hello(std::string_view token = kToken, uint32_t version = kProtocolVersion) {
  std::string body(1, static_cast<char>(kHello));
  PutU32(&body, version);
  PutStr(&body, token);
  return Frame(body);
}
std::string Set(std::string_view key, std::string_view value) {
  std::string body(1, static_cast<char>(kSet));
  PutStr(&body, key);
  PutStr(&body, value);
  return Frame(body);
}
std::string Get(std::string_view key, uint64_t wait_ms) {
  std::string body(1, static_cast<char>(kGet));
  PutStr(&body, key);
  PutU64(&body, wait_ms);
  return Frame(body);
}

struct Reply {
  uint8_t code;
  std::string payload;
  bool operator==(const Reply&) const = default;
};

// Takes every reply frame out of `id`'s output.
std::vector<Reply> Replies(StoreProtocol& p, int id) {
  std::vector<Reply> out;
  std::string& bytes = p.output(id);
  size_t pos = 0;
  while (bytes.size() - pos >= 4) {
    const uint32_t len = LoadU32(bytes.data() + pos);
    EXPECT_GE(len, 1u);
    if (len == 0 || bytes.size() - pos - 4 < len) break;
    out.push_back({static_cast<uint8_t>(bytes[pos + 4]), bytes.substr(pos + 5, len - 1)});
    pos += 4 + len;
  }
  EXPECT_EQ(pos, bytes.size()) << "a partial reply frame";
  bytes.clear();
  return out;
}

std::string Str(std::string_view s) {
  std::string out;
  PutStr(&out, s);
  return out;
}

class StoreProtocolTest : public ::testing::Test {
 protected:
  StoreProtocol p_{kToken};
  absl::Time now_ = absl::FromUnixSeconds(1000);
};

TEST_F(StoreProtocolTest, HandshakeThenSetGetDelete) {
  p_.Open(3, "peer", now_);
  ASSERT_TRUE(p_.Receive(3, Hello() + Set("k", "v") + Get("k", 0), now_));
  EXPECT_TRUE(p_.authenticated(3));
  EXPECT_EQ(Replies(p_, 3), (std::vector<Reply>{{kOk, ""}, {kOk, ""}, {kOk, Str("v")}}));
  EXPECT_EQ(p_.stored_bytes(), 2u);
  std::string del(1, static_cast<char>(kDelete));
  PutStr(&del, "k");
  ASSERT_TRUE(p_.Receive(3, Frame(del) + Get("k", 0), now_));
  EXPECT_EQ(Replies(p_, 3), (std::vector<Reply>{{kOk, ""}, {kTimeout, ""}}));
  EXPECT_EQ(p_.stored_bytes(), 0u);
}

TEST_F(StoreProtocolTest, FramesSplitAcrossReadsAreReassembled) {
  p_.Open(3, "peer", now_);
  const std::string bytes = Hello() + Set("key", "value");
  for (char c : bytes) ASSERT_TRUE(p_.Receive(3, std::string_view(&c, 1), now_));
  EXPECT_EQ(Replies(p_, 3).size(), 2u);
  EXPECT_EQ(p_.buffered(3), 0u);
}

TEST_F(StoreProtocolTest, WrongTokenOrVersionOrNoHandshakeIsRefusedAndClosing) {
  p_.Open(1, "a", now_);
  p_.Open(2, "b", now_);
  p_.Open(3, "c", now_);
  ASSERT_TRUE(p_.Receive(1, Hello("wrong"), now_));
  ASSERT_TRUE(p_.Receive(2, Hello(kToken, 2), now_));
  ASSERT_TRUE(p_.Receive(3, Set("k", "v"), now_));
  EXPECT_EQ(Replies(p_, 1), (std::vector<Reply>{{kDenied, Str("wrong store token")}}));
  EXPECT_EQ(Replies(p_, 2)[0].code, kBadRequest);
  EXPECT_EQ(Replies(p_, 3)[0].code, kBadRequest);
  EXPECT_TRUE(p_.closing(1) && p_.closing(2) && p_.closing(3));
  EXPECT_EQ(p_.refused(), 3);
  EXPECT_EQ(p_.stored_bytes(), 0u);
  // A closing connection's further input is ignored.
  ASSERT_TRUE(p_.Receive(3, Hello(), now_));
  EXPECT_TRUE(Replies(p_, 3).empty());
}

TEST_F(StoreProtocolTest, OversizeFramesAreDroppedWithoutBuffering) {
  p_.Open(1, "a", now_);
  std::string header;
  PutU32(&header, kMaxHandshakeFrame + 1);
  EXPECT_FALSE(p_.Receive(1, header, now_));
  p_.Open(2, "b", now_);
  ASSERT_TRUE(p_.Receive(2, Hello(), now_));
  header.clear();
  PutU32(&header, kMaxFrame);
  ASSERT_TRUE(p_.Receive(2, header + "x", now_));  // At the limit: waits for the rest.
  EXPECT_EQ(p_.buffered(2), 5u);
  p_.Open(4, "c", now_);
  ASSERT_TRUE(p_.Receive(4, Hello(), now_));
  header.clear();
  PutU32(&header, kMaxFrame + 1);
  EXPECT_FALSE(p_.Receive(4, header, now_));
}

TEST_F(StoreProtocolTest, AParkedGetIsAnsweredBySetOrTimesOut) {
  p_.Open(1, "waiter", now_);
  p_.Open(2, "setter", now_);
  ASSERT_TRUE(p_.Receive(1, Hello() + Get("k", 1000), now_));
  ASSERT_TRUE(p_.Receive(2, Hello(), now_));
  EXPECT_EQ(Replies(p_, 1).size(), 1u);  // The handshake only: the Get is parked.
  EXPECT_EQ(p_.NextDeadline(), now_ + absl::Seconds(1));
  ASSERT_TRUE(p_.Receive(2, Set("k", "v"), now_ + absl::Milliseconds(10)));
  EXPECT_EQ(Replies(p_, 1), (std::vector<Reply>{{kOk, Str("v")}}));

  ASSERT_TRUE(p_.Receive(1, Get("never", 1000), now_));
  std::vector<int> drop;
  p_.Tick(now_ + absl::Milliseconds(999), &drop);
  EXPECT_TRUE(Replies(p_, 1).empty());
  EXPECT_EQ(p_.NextDeadline(), now_ + absl::Seconds(1));
  p_.Tick(now_ + absl::Seconds(1), &drop);
  EXPECT_EQ(Replies(p_, 1), (std::vector<Reply>{{kTimeout, ""}}));
  EXPECT_TRUE(drop.empty());
}

TEST_F(StoreProtocolTest, LateHandshakesAndUnfinishedFramesAreDropped) {
  p_.Open(1, "silent", now_);
  p_.Open(2, "slow", now_);
  ASSERT_TRUE(p_.Receive(2, Hello() + Set("k", "v").substr(0, 6), now_));
  // What the server does: closes the connections Tick drops.
  auto tick = [&](absl::Time at) {
    std::vector<int> drop;
    p_.Tick(at, &drop);
    for (int id : drop) p_.Close(id);
    return drop;
  };
  EXPECT_TRUE(tick(now_ + StoreProtocol::kAuthTimeout - absl::Milliseconds(1)).empty());
  EXPECT_EQ(tick(now_ + StoreProtocol::kAuthTimeout), std::vector<int>{1});
  EXPECT_FALSE(p_.is_open(1));
  EXPECT_TRUE(tick(now_ + StoreProtocol::kPartialFrameTimeout - absl::Milliseconds(1)).empty());
  EXPECT_EQ(tick(now_ + StoreProtocol::kPartialFrameTimeout), std::vector<int>{2});
  EXPECT_EQ(p_.connections(), 0u);
}

TEST_F(StoreProtocolTest, ABurstOfSmallFramesIsAnsweredInOrder) {
  p_.Open(1, "a", now_);
  std::string burst = Hello();
  for (int i = 0; i < 20000; ++i) burst += Set("k" + std::to_string(i), "");
  burst += Get("k19999", 0);
  ASSERT_TRUE(p_.Receive(1, burst, now_));
  std::vector<Reply> replies = Replies(p_, 1);
  ASSERT_EQ(replies.size(), 20002u);
  EXPECT_EQ(replies.back(), (Reply{kOk, Str("")}));
  EXPECT_EQ(p_.buffered(1), 0u);
}

}  // namespace
}  // namespace reshard::rendezvous
