// Validate() checks that tensors sharing a per-rank buffer never share an element, run by run,
// so interleaved fused views (vLLM's expert w13) validate at full model scale; ValidateForRank()
// checks one rank's buffers.
#include <gtest/gtest.h>

#include "src/plan/spec.h"

namespace reshard::plan {
namespace {

// gate and up stacks [E, I, H] interleaved in one [E, 2*I, H] buffer on ranks 0 and 1 (S(1)).
RefitSpec InterleavedW13(int64_t e, int64_t i, int64_t h, int64_t up_row_offset) {
  RefitSpec spec;
  for (int m = 0; m < 2; ++m) {
    TensorSpec t;
    t.name = m == 0 ? "gate" : "up";
    t.dtype = DType::kBf16;
    t.shape = {e, i, h};
    t.src.mesh = {{1}, {2}};
    t.src.placements = {Placement::Replicate()};
    t.dst.mesh = {{2}, {0, 1}};
    t.dst.placements = {Placement::Shard(1)};
    t.dst.buffer = "w13";
    t.dst.has_view = true;
    t.dst.view.strides = {i * h, h, 1};  // 2 * (i / 2) rows per expert on each rank.
    t.dst.view.offset = m == 0 ? 0 : up_row_offset * h;
    spec.tensors.push_back(t);
  }
  return spec;
}

TEST(BufferOverlapTest, InterleavedDisjointViewsPass) {
  EXPECT_TRUE(Validate(InterleavedW13(4, 6, 8, 3)).ok());
}

TEST(BufferOverlapTest, InterleavedOverlapIsFoundWithItsOffset) {
  // Up starts one row too early: its first row is gate's last row of expert 0.
  const absl::Status s = Validate(InterleavedW13(4, 6, 8, 2));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("overlaps tensor \"gate\" in buffer \"w13\""),
            std::string::npos)
      << s;
  EXPECT_NE(std::string(s.message()).find("element offset 16"), std::string::npos) << s;
}

TEST(BufferOverlapTest, FullScaleInterleavedViewsValidateQuickly) {
  // DeepSeek-V3 sized stack: 256 experts x 2048 x 7168 (3.8 G elements per tensor).
  EXPECT_TRUE(Validate(InterleavedW13(256, 2048, 7168, 1024)).ok());
  EXPECT_FALSE(Validate(InterleavedW13(256, 2048, 7168, 1023)).ok());
}

TEST(BufferOverlapTest, SharedBufferNeedsOneElementSize) {
  RefitSpec spec = InterleavedW13(4, 6, 8, 3);
  spec.tensors[1].dtype = DType::kFp32;
  const absl::Status s = Validate(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("dst.buffer \"w13\" also holds tensor \"gate\""),
            std::string::npos)
      << s;
  EXPECT_NE(std::string(s.message()).find("\"up\""), std::string::npos) << s;
}

// Rows 5 over two ranks: rank 0 holds 3 rows of a (elements [0, 12)), rank 1 holds 2 (elements
// [0, 8)); b starts at element 10 of the buffer on both ranks, so only rank 0's tiles overlap.
TEST(BufferOverlapTest, ARankValidatesItsOwnBuffers) {
  RefitSpec spec;
  for (const char* name : {"a", "b"}) {
    TensorSpec t;
    t.name = name;
    t.dtype = DType::kFp32;
    t.shape = {5, 4};
    t.src.mesh = {{1}, {2}};
    t.src.placements = {Placement::Replicate()};
    t.dst.mesh = {{2}, {0, 1}};
    t.dst.placements = {Placement::Shard(0)};
    t.dst.buffer = "ab";
    t.dst.has_view = true;
    t.dst.view.offset = t.name == "a" ? 0 : 10;
    spec.tensors.push_back(t);
  }
  const absl::Status world = Validate(spec);
  ASSERT_FALSE(world.ok());
  EXPECT_EQ(std::string(world.message()),
            "tensor \"b\": dst.view overlaps tensor \"a\" in buffer \"ab\" on rank 0 (element "
            "offset 10)");
  EXPECT_EQ(ValidateForRank(spec, 0), world);
  EXPECT_TRUE(ValidateForRank(spec, 1).ok());
  EXPECT_TRUE(ValidateForRank(spec, 2).ok());  // The source rank holds no shared buffer.
  // Every other check still covers every tensor on every rank.
  spec.tensors[1].src.placements = {Placement::Shard(2)};
  EXPECT_EQ(ValidateForRank(spec, 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(ValidateForRank(spec, 1).message()).find("src.placements[0] shards dim 2"),
            std::string::npos);
}

}  // namespace
}  // namespace reshard::plan
