// Which source buffers the engine registers and stages (RegisteredMemory::Create): only those a
// transfer of the rank reads (SourceBuffersRead). A quantized tensor's user source and a
// requantized FP8 source's scales are read by the quantizer alone, so with a UCX that cannot
// register CUDA memory they are not copied to pinned host memory before every refit.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "src/net/registered_memory.h"
#include "src/plan/plan.h"
#include "src/plan/spec_json.h"

namespace reshard::net {
namespace {

constexpr char kSpec[] = R"json({"tensors": [
  {"name": "w", "dtype": "bf16", "shape": [64, 256],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]},
   "dst": {"mesh": [2, 3], "placements": ["S(1)"], "dtype": "fp8e4m3",
           "quant": {"scheme": "block", "block": [32, 128]}}},
  {"name": "shared_with_w", "dtype": "bf16", "shape": [64],
   "src": {"mesh": [0, 1], "placements": ["S(0)"], "buffer": "both",
           "view": {"offset": 0}},
   "dst": {"mesh": [2, 3], "placements": ["R"]}},
  {"name": "q_shared", "dtype": "bf16", "shape": [64, 128],
   "src": {"mesh": [0, 1], "placements": ["S(0)"], "buffer": "both",
           "view": {"offset": 32}},
   "dst": {"mesh": [2, 3], "placements": ["S(0)"], "dtype": "fp8e4m3",
           "quant": {"scheme": "channel"}}},
  {"name": "b", "dtype": "fp32", "shape": [16],
   "src": {"mesh": [0, 1], "placements": ["S(0)"]},
   "dst": {"mesh": [2, 3], "placements": ["R"]}},
  {"name": "requant", "dtype": "bf16", "shape": [64, 256],
   "src": {"mesh": [0, 1], "placements": ["S(0)"], "dtype": "fp8e5m2",
           "quant": {"scheme": "mx", "block": [1, 32]}, "scale_buffer": "requant_scales"},
   "dst": {"mesh": [2, 3], "placements": ["S(1)"], "dtype": "fp8e4m3",
           "quant": {"scheme": "block", "block": [32, 128]}}},
  {"name": "same", "dtype": "bf16", "shape": [64, 256],
   "src": {"mesh": [0, 1], "placements": ["S(0)"], "dtype": "fp8e4m3",
           "quant": {"scheme": "block", "block": [32, 128]}},
   "dst": {"mesh": [2, 3], "placements": ["S(1)"], "dtype": "fp8e4m3",
           "quant": {"scheme": "block", "block": [32, 128]}}}]})json";

TEST(RegisteredMemory, StagesOnlySourceBuffersThatATransferReads) {
  auto spec = plan::ParseSpecJson(kSpec);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto plan = plan::BuildPlan(std::make_shared<const plan::RefitSpec>(*spec));
  ASSERT_TRUE(plan.ok()) << plan.status();
  // Source buffers a send or local copy reads: the internal FP8 and scale buffers, a matching FP8
  // source's bytes and scales, plain tensors', and a buffer that a plain tensor shares with a
  // quantized one. Not: the user's sources of quantized tensors, a requantized source's scales.
  const std::vector<std::string> read = {"reshard:fp8", "reshard:fp8-scales", "same",
                                         "same.scale",  "b",                  "both"};
  const std::vector<std::string> unread = {"w", "requant", "requant_scales"};
  for (int32_t rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE(rank);
    auto rank_plan = plan::BuildRankPlan(std::make_shared<const plan::RefitSpec>(*spec), rank);
    ASSERT_TRUE(rank_plan.ok()) << rank_plan.status();
    for (const plan::Plan* p : {&*plan, &*rank_plan}) {
      const std::vector<bool> got = SourceBuffersRead(*p, rank);
      ASSERT_EQ(got.size(), p->buffers().size());
      int found = 0;
      for (size_t b = 0; b < got.size(); ++b) {
        const plan::BufferInfo& info = p->buffers()[b];
        SCOPED_TRACE(info.name);
        if (info.side != plan::Side::kSrc) {
          EXPECT_FALSE(got[b]);  // Destination buffers are read only by relays, not here.
          continue;
        }
        const bool want_read = std::find(read.begin(), read.end(), info.name) != read.end();
        const bool want_unread =
            std::find(unread.begin(), unread.end(), info.name) != unread.end();
        ASSERT_TRUE(want_read || want_unread) << "a source buffer the test does not know";
        // Destination ranks send nothing from a source buffer.
        EXPECT_EQ(got[b], want_read && rank < 2);
        ++found;
      }
      EXPECT_EQ(found, static_cast<int>(read.size() + unread.size()));
    }
  }
}

}  // namespace
}  // namespace reshard::net
