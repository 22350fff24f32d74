// Fan-out buffer descriptors are untrusted text from the store (issue 10): each malformed,
// mismatched or hostile one is refused with one sentence naming the peer and the buffer.
#include "src/nvlink/peer_buffer.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace reshard::nvlink {
namespace {

constexpr int64_t kNeed = 4096;

TEST(PeerBufferDesc, AcceptsWhatTheBackendsPublish) {
  auto shm = ParseHostBufferDesc("shm,/reshard-12.34-0-r5,8192,65536,4096", 5, 2, kNeed);
  ASSERT_TRUE(shm.ok()) << shm.status();
  EXPECT_EQ(shm->kind, PeerBufferDesc::Kind::kShared);
  EXPECT_EQ(shm->name, "/reshard-12.34-0-r5");
  EXPECT_EQ(shm->offset, 8192);
  EXPECT_EQ(shm->mapped, 65536);
  auto addr = ParseHostBufferDesc("addr,140737488355328,4096", 5, 2, kNeed);
  ASSERT_TRUE(addr.ok()) << addr.status();
  EXPECT_EQ(addr->address, 140737488355328u);
  const std::string handle(64, 'a');
  auto ipc = ParseCudaIpcBufferDesc(absl::StrCat(handle, ",256,8192"), 5, 2, kNeed, 32);
  ASSERT_TRUE(ipc.ok()) << ipc.status();
  EXPECT_EQ(ipc->name.size(), 32u);
  EXPECT_EQ(ipc->offset, 256);
}

TEST(PeerBufferDesc, RefusesDescriptorsThatWouldWriteOutsideThePeersBuffer) {
  const char* bad[] = {
      "shm,/reshard-1.2-0-x,61440,65536,8192",                // Buffer ends past the object.
      "shm,/reshard-1.2-0-x,0,65536,1024",                    // Smaller than what this rank writes.
      "shm,/reshard-1.2-0-x,-8,65536,4096",                   // Negative offset.
      "shm,/reshard-1.2-0-x,9223372036854775807,65536,4096",  // Offset that would wrap.
      "shm,/dev/../etc/passwd,0,65536,4096",                  // Not one of reshard's objects.
      "shm,/other-object,0,65536,4096",
      "shm,/reshard-a/b,0,65536,4096",
      "addr,0,4096",                     // Null address.
      "addr,18446744073709551615,4096",  // Address range that wraps.
      "addr,4096,16",                    // Too small.
      "shm,/reshard-1.2-0-x,0,65536",    // Missing field.
      "",
      "mmap,/reshard-1.2-0-x,0,65536,4096",
  };
  for (const char* text : bad) {
    absl::StatusOr<PeerBufferDesc> d = ParseHostBufferDesc(text, 5, 2, kNeed);
    ASSERT_FALSE(d.ok()) << text;
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument) << text;
    const std::string message(d.status().message());
    EXPECT_NE(message.find("rank 5 published buffer 2"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  const std::string handle(64, 'a');
  for (const std::string& text :
       {absl::StrCat(handle, ",0,16"), absl::StrCat(handle, ",-1,8192"),
        absl::StrCat(std::string(62, 'a'), ",0,8192"),
        absl::StrCat(std::string(64, 'z'), ",0,8192"),
        absl::StrCat(handle, ",9223372036854775807,8192"), absl::StrCat(handle, ",0")}) {
    EXPECT_EQ(ParseCudaIpcBufferDesc(text, 5, 2, kNeed, 32).status().code(),
              absl::StatusCode::kInvalidArgument)
        << text;
  }
}

TEST(PeerBufferDesc, WrittenExtentIsTheHighestByteOfTheEdgesRuns) {
  FanoutTable table;
  // 4 runs of 8 bytes at row stride 32 starting at byte 16: the last ends at 16 + 3 * 32 + 8.
  plan::RegionDim dims[1] = {{4, 8, 32}};
  plan::Region region;
  region.to_offset = 16;
  region.run_bytes = 8;
  region.bytes = 32;
  region.ndims = 1;
  table.Add(0, -1, 0, 0, 1, 0, 1, region, dims);
  EXPECT_EQ(WrittenExtent(table, 0, 1, 1), 16 + 3 * 32 + 8);
  EXPECT_EQ(WrittenExtent(table, 0, 1, 0), 0);
  EXPECT_EQ(WrittenExtent(table, 1, 0, 1), 0);
}

}  // namespace
}  // namespace reshard::nvlink
