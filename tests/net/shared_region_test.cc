// Fields of a peer's wire-up record are untrusted text. shm.<id>: ParseSharedRegion accepts only
// an object of the peer's own process that holds the registered region, before anything is
// mapped (docs/data-plane.md, "Mapped copies on one host"). landing.<rank>: LandingBlockOf
// accepts only a block inside the registered landing area, so no later offset sum can wrap.
#include <cstdint>
#include <limits>

#include "src/net/registered_memory.h"
#include "src/net/wireup.h"

#include <string>

#include "gtest/gtest.h"

namespace reshard::net {
namespace {

constexpr int64_t kPid = 4242;
constexpr uint64_t kNs = 4026531836;

absl::StatusOr<SharedRegion> Parse(const std::string& text, uint64_t registered = 4096) {
  return ParseSharedRegion(text, /*peer=*/3, /*id=*/1, kPid, kNs, registered);
}

TEST(SharedRegion, AcceptsTheRegionOfThePeersOwnObject) {
  absl::StatusOr<SharedRegion> r = Parse("/reshard-4242.4026531836-7-r3-w,128,8192");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->name, "/reshard-4242.4026531836-7-r3-w");
  EXPECT_EQ(r->offset, 128);
  EXPECT_EQ(r->mapped, 8192);
  EXPECT_TRUE(Parse("/reshard-4242.4026531836-7-r3-w,4096,8192").ok());  // Exactly to the end.
}

TEST(SharedRegion, RefusesWhatIsNotThePeersOrDoesNotHoldTheRegion) {
  const struct {
    const char* text;
    const char* why;
  } cases[] = {
      {"/reshard-4243.4026531836-7-w,0,8192", "not an object of its process"},  // Another pid.
      {"/reshard-4242.1-7-w,0,8192", "not an object of its process"},           // Another ns.
      {"/reshard-board-4242.4026531836-7-w,0,8192", "not an object of its process"},
      {"/dev/shm/reshard-4242.4026531836-7,0,8192", "not an object of its process"},
      {"/reshard-4242.4026531836-7/../x,0,8192", "not an object of its process"},
      {"/reshard-4242.4026531836-7-w,4097,8192", "does not hold the 4096 bytes"},
      {"/reshard-4242.4026531836-7-w,0,4095", "does not hold the 4096 bytes"},
      {"/reshard-4242.4026531836-7-w,9000,8192", "does not hold the 4096 bytes"},
      {"/reshard-4242.4026531836-7-w,-1,8192", "expected NAME,OFFSET,MAPPED"},
      {"/reshard-4242.4026531836-7-w,0", "expected NAME,OFFSET,MAPPED"},
      {"/reshard-4242.4026531836-7-w,0,8192,1", "expected NAME,OFFSET,MAPPED"},
      {"/reshard-4242.4026531836-7-w,x,8192", "expected NAME,OFFSET,MAPPED"},
      {"", "expected NAME,OFFSET,MAPPED"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<SharedRegion> r = Parse(c.text);
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << c.text;
    const std::string message(r.status().message());
    EXPECT_NE(message.find("rank 3 places region 1 in shared memory"), std::string::npos)
        << message;
    EXPECT_NE(message.find(c.why), std::string::npos) << c.text << ": " << message;
  }
}

TEST(LandingBlock, AcceptsABlockInsideTheLandingArea) {
  const rendezvous::Record theirs = {{"landing.2", "4096:1024"}};
  absl::StatusOr<int64_t> block = LandingBlockOf(theirs, /*rank=*/2, /*peer=*/5, 1024, 5120);
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_EQ(*block, 4096);
}

TEST(LandingBlock, RefusesHostileOrMismatchedFields) {
  const std::string huge = std::to_string(std::numeric_limits<int64_t>::max());
  const struct {
    std::string value;
    absl::StatusCode code;
    const char* why;
  } cases[] = {
      {huge + ":1024", absl::StatusCode::kDataLoss, "outside its 5120-byte landing area"},
      {"4097:1024", absl::StatusCode::kDataLoss, "outside its 5120-byte landing area"},
      {"5121:1024", absl::StatusCode::kDataLoss, "outside its 5120-byte landing area"},
      {"-1:1024", absl::StatusCode::kDataLoss, "malformed landing.2"},
      {"0", absl::StatusCode::kDataLoss, "malformed landing.2"},
      {"x:1024", absl::StatusCode::kDataLoss, "malformed landing.2"},
      {"0:" + huge, absl::StatusCode::kFailedPrecondition, "expects"},
      {"0:512", absl::StatusCode::kFailedPrecondition, "which packs 1024"},
  };
  for (const auto& c : cases) {
    const rendezvous::Record theirs = {{"landing.2", c.value}};
    absl::StatusOr<int64_t> block = LandingBlockOf(theirs, 2, 5, 1024, 5120);
    ASSERT_FALSE(block.ok()) << c.value;
    EXPECT_EQ(block.status().code(), c.code) << c.value << ": " << block.status();
    EXPECT_NE(std::string(block.status().message()).find(c.why), std::string::npos)
        << c.value << ": " << block.status();
    EXPECT_NE(std::string(block.status().message()).find("rank 5"), std::string::npos);
  }
  absl::StatusOr<int64_t> missing = LandingBlockOf({}, 2, 5, 1024, 5120);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace reshard::net
