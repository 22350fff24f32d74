// Quantized destinations in the spec and planner (quant_spec.h, docs/quantization.md): the JSON
// fields round-trip, every validation error names tensor, field (and dim and rank for cut
// blocks), the lowering moves FP8 bytes plus scales, the in-process executor's refit equals the
// reference for every scheme and format, and FP8 specs put about half the bf16 bytes on the wire.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "src/plan/executor.h"
#include "src/plan/fill.h"
#include "src/plan/plan.h"
#include "src/plan/quant_spec.h"
#include "src/common/quant_math.h"
#include "src/plan/spec_json.h"

namespace reshard::plan {
namespace {

// A bf16 [512, 1024] matrix from 2 row shards to 4 column shards, its destination as `dst_extra`.
std::string OneTensor(const std::string& dst_extra, const std::string& src_placement = "S(0)",
                      const std::string& shape = "[512, 1024]", const std::string& dtype = "bf16") {
  return absl::StrCat(R"j({"topology": {"ranks_per_domain": 2}, "tensors": [{"name": "w", "dtype": ")j",
                      dtype, R"j(", "shape": )j", shape,
                      R"j(, "src": {"mesh": [0, 1], "placements": [")j", src_placement,
                      R"j("]}, "dst": {"mesh": [2, 3, 4, 5], "placements": ["S(1)"])j", dst_extra,
                      "}}]}");
}

absl::StatusOr<Plan> PlanOf(const std::string& json) {
  auto spec = ParseSpecJson(json);
  if (!spec.ok()) return spec.status();
  return BuildPlan(std::make_shared<const RefitSpec>(*spec));
}

std::string ErrorOf(const std::string& json) {
  auto plan = PlanOf(json);
  return plan.ok() ? "ok" : std::string(plan.status().message());
}

TEST(QuantSpecTest, JsonRoundTrips) {
  const std::string json = OneTensor(
      R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "block", "block": [128, 128]},
         "scale_buffer": "s", "scale_view": {"offset": 4, "strides": [8, 1]})j");
  auto spec = ParseSpecJson(json);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const Layout& dst = spec->tensors[0].dst;
  EXPECT_EQ(dst.dtype, DType::kFp8E4M3);
  EXPECT_EQ(dst.quant.scheme, QuantScheme::kBlock);
  EXPECT_EQ(dst.quant.block, (std::vector<int64_t>{128, 128}));
  EXPECT_EQ(dst.scale_buffer, "s");
  EXPECT_TRUE(dst.has_scale_view);
  EXPECT_EQ(dst.scale_view.offset, 4);
  auto again = ParseSpecJson(SpecToJson(*spec));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->tensors[0].dst.quant, dst.quant);
  EXPECT_EQ(again->tensors[0].dst.dtype, dst.dtype);
  EXPECT_EQ(again->tensors[0].dst.scale_view, dst.scale_view);
  EXPECT_EQ(SpecToJson(*again), SpecToJson(*spec));
}

TEST(QuantSpecTest, ErrorsNameTensorFieldDimAndRank) {
  EXPECT_EQ(ErrorOf(OneTensor(R"j(, "quant": {"scheme": "block", "block": [128, 128]})j")),
            "tensor \"w\": dst.quant (scheme block) needs dst.dtype fp8e4m3 or fp8e5m2");
  EXPECT_EQ(ErrorOf(OneTensor(R"j(, "dtype": "fp16")j")),
            "tensor \"w\": dst.dtype fp16 differs from the tensor's dtype bf16 without dst.quant; "
            "a destination of another dtype must be quantized (casting is not supported)");
  EXPECT_EQ(ErrorOf(OneTensor(R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "block"})j")),
            "tensor \"w\": dst.quant.block is required by scheme block (e.g. [128, 128])");
  EXPECT_EQ(ErrorOf(OneTensor(R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "channel", "block": [4]})j")),
            "tensor \"w\": dst.quant.block is not taken by scheme channel (its block is a whole row)");
  EXPECT_EQ(ErrorOf(OneTensor(R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "block", "block": [1, 2, 3]})j")),
            "tensor \"w\": dst.quant.block has 3 entries for a 2-D tensor");
  EXPECT_EQ(ErrorOf(OneTensor(R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "mx", "block": [0]})j")),
            "tensor \"w\": dst.quant.block[0] is 0; blocks are at least 1 and below 2^62");
  // A hostile block: ceil(shape / block) must not wrap.
  EXPECT_EQ(ErrorOf(OneTensor(
                R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "block", "block": [9223372036854775807, 1]})j")),
            "tensor \"w\": dst.quant.block[0] is 9223372036854775807; blocks are at least 1 and "
            "below 2^62");
  EXPECT_EQ(ErrorOf(OneTensor(R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "block", "block": [128, 128]})j",
                              "S(0)", "[512, 1024]", "i32")),
            "tensor \"w\": dst.quant quantizes bf16, fp16 or fp32 tensors, not i32");
  // Destination columns of 256 cut 384-wide blocks at 256 (rank 3's tile).
  EXPECT_EQ(ErrorOf(OneTensor(R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "block", "block": [128, 384]})j")),
            "tensor \"w\": dst tiles cut the quantization blocks of dim 1 (rank 3's tile starts at "
            "element 256, not a multiple of the block's 384); only a dim of one block may be cut "
            "(its scale is then replicated)");
  // Source row shards of 250 cut 128-row blocks (more than one block along the dim).
  EXPECT_EQ(ErrorOf(OneTensor(R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "block", "block": [128, 128]})j",
                              "S(0)", "[500, 1024]")),
            "tensor \"w\": src tiles cut the quantization blocks of dim 0 (rank 1's tile starts at "
            "element 250, not a multiple of the block's 128); only a dim of one block may be cut "
            "(its amax is then combined across the source tiles)");
  // Source column shards cut every row (a channel): their partial amaxes are exchanged.
  EXPECT_EQ(ErrorOf(OneTensor(R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "channel"})j", "S(1)")),
            "ok");
  EXPECT_EQ(ErrorOf(OneTensor(R"j(, "buffer": "reshard:x")j")),
            "tensor \"w\": dst.buffer \"reshard:x\" starts with the reserved prefix \"reshard:\"");
  // A channel destination cut along its rows' one block is fine: each rank gets every scale.
  EXPECT_EQ(ErrorOf(OneTensor(R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "channel"})j")), "ok");
}

TEST(QuantSpecTest, LoweringMovesFp8BytesAndScales) {
  auto spec = ParseSpecJson(
      OneTensor(R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "block", "block": [128, 128]})j"));
  ASSERT_TRUE(spec.ok());
  auto lowered = LowerQuantization(std::make_shared<const RefitSpec>(*spec));
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  const RefitSpec& l = **lowered;
  ASSERT_EQ(l.tensors.size(), 2u);
  EXPECT_EQ(l.tensors[0].dtype, DType::kFp8E4M3);
  EXPECT_EQ(l.tensors[0].src.buffer, kQuantizedBuffer);
  EXPECT_EQ(l.tensors[1].name, "w.scale");
  EXPECT_EQ(l.tensors[1].dtype, DType::kFp32);
  EXPECT_EQ(l.tensors[1].shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(l.tensors[1].dst.buffer, "w.scale");
  ASSERT_EQ(l.quantized_sources.size(), 1u);
  EXPECT_EQ(l.quantized_sources[0].src.buffer, "w");
  // Lowering a lowered spec changes nothing.
  auto twice = LowerQuantization(*lowered);
  ASSERT_TRUE(twice.ok());
  EXPECT_EQ(twice->get(), lowered->get());
  // The user's buffers: the source and both destination buffers; the internal one is not theirs.
  auto plan = BuildPlan(std::make_shared<const RefitSpec>(*spec));
  ASSERT_TRUE(plan.ok()) << plan.status();
  int internal = 0;
  for (const BufferInfo& b : plan->buffers()) internal += b.internal;
  EXPECT_EQ(internal, 2);  // Elements (1 byte) and fp32 scales.
  EXPECT_EQ(plan->BufferBytes(0)[plan->quantized_source_buffer(0)], 256 * 1024 * 2);
}

TEST(QuantSpecTest, InProcessRefitsEqualTheReferenceForEverySchemeAndFormat) {
  for (const char* fp8 : {"fp8e4m3", "fp8e5m2"}) {
    for (const char* quant : {R"j({"scheme": "block", "block": [128, 128]})j",
                              R"j({"scheme": "block", "block": [64]})j", R"j({"scheme": "mx"})j",
                              R"j({"scheme": "mx", "block": [2, 32]})j", R"j({"scheme": "channel"})j",
                              R"j({"scheme": "tensor"})j"}) {
      for (const char* dtype : {"bf16", "fp16", "fp32"}) {
        SCOPED_TRACE(absl::StrCat(fp8, " ", quant, " from ", dtype));
        const std::string json =
            OneTensor(absl::StrCat(R"j(, "dtype": ")j", fp8, R"j(", "quant": )j", quant),
                      // Channel and tensor blocks are cut by column shards: amax exchange.
                      "S(1)", "[256, 512]", dtype);
        auto plan = PlanOf(json);
        ASSERT_TRUE(plan.ok()) << plan.status();
        EXPECT_TRUE(VerifyPlanInProcess(*plan, int64_t{1} << 30).ok());
        // The reference is not trivial: most elements are not zero. (Not for one scale per
        // tensor: its 131,072 elements almost surely hold one of the fill's rare huge values,
        // which then sets the scale and sends the others to zero, as it would in a real model.)
        if (std::string(quant).find("tensor") != std::string::npos) continue;
        const QuantizedExpectation e = ExpectQuantized(plan->spec(), 0, 1);
        const int64_t zeros = std::count(e.elements.begin(), e.elements.end(), 0) +
                              std::count(e.elements.begin(), e.elements.end(), 0x80);
        EXPECT_LT(zeros, static_cast<int64_t>(e.elements.size()) / 2);
      }
    }
  }
}

TEST(QuantSpecTest, SourcesThatShareBlocksExchangeTheirAmaxes) {
  // Channel scales of a column-sharded source, and one scale for a tensor sharded both ways.
  auto spec = ParseSpecJson(R"j({"topology": {"ranks_per_domain": 2}, "tensors": [
    {"name": "c", "dtype": "bf16", "shape": [64, 200], "src": {"mesh": [0, 1], "placements": ["S(1)"]},
     "dst": {"mesh": [2, 3, 4, 5], "placements": ["S(0)"], "dtype": "fp8e4m3", "quant": {"scheme": "channel"}}},
    {"name": "t", "dtype": "fp32", "shape": [30, 50], "src": {"mesh": [[0, 1], [6, 7]], "placements": ["S(0)", "S(1)"]},
     "dst": {"mesh": [2, 3, 4, 5], "placements": ["S(1)"], "dtype": "fp8e5m2", "quant": {"scheme": "tensor"}}},
    {"name": "b", "dtype": "bf16", "shape": [256, 256], "src": {"mesh": [0, 1], "placements": ["S(0)"]},
     "dst": {"mesh": [2, 3], "placements": ["S(1)"], "dtype": "fp8e4m3", "quant": {"scheme": "block", "block": [128, 128]}}}]})j");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto lowered = LowerQuantization(std::make_shared<const RefitSpec>(*spec));
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  const RefitSpec& l = **lowered;
  ASSERT_NE(l.amax_exchange, nullptr);
  ASSERT_EQ(l.amax_exchange->tensors.size(), 2u);  // Not "b": its source tiles hold whole blocks.
  EXPECT_TRUE(l.quantized_sources[0].exchange);
  EXPECT_EQ(l.quantized_sources[0].cut_parts, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(l.quantized_sources[1].cut_parts, (std::vector<int64_t>{2, 2}));
  EXPECT_FALSE(l.quantized_sources[2].exchange);
  // Partials: one per row and source shard, gathered by both shards of the row.
  const TensorSpec& partials = l.amax_exchange->tensors[0];
  EXPECT_EQ(partials.shape, (std::vector<int64_t>{64, 2}));
  EXPECT_EQ(partials.src.placements[0], Placement::Shard(1));
  EXPECT_EQ(partials.dst.placements[0], Placement::Replicate());
  // The scales are replicated over the shards that share their blocks.
  EXPECT_EQ(l.tensors[l.quantized_sources[0].scale_tensor].src.placements[0], Placement::Replicate());
  EXPECT_TRUE(Validate(*l.amax_exchange).ok());
  auto plan = BuildPlan(std::make_shared<const RefitSpec>(*spec));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(VerifyPlanInProcess(*plan, int64_t{1} << 30).ok());
  // CombineAmax: the max over the parts of each block.
  const QuantizedSource& qs = l.quantized_sources[0];
  Box tile;
  tile.ndim = 2;
  tile.hi = {64, 100};
  const float gathered[] = {1, 5, 7, 2, 0, 0};  // Rows 0-2, parts 0-1 (only rows 0-2 read).
  float amax[3] = {};
  Box rows = tile;
  rows.hi[0] = 3;
  CombineAmax(qs, rows, gathered, amax);
  EXPECT_EQ(amax[0], 5);
  EXPECT_EQ(amax[1], 7);
  EXPECT_EQ(amax[2], 0);
}

// FSDP2 + TP sources (strided shards) into FP8 destinations: blocks split shard by shard (a
// strided dim's intervals are sorted by start, not by shard), and an amax exchange over a dim of
// one block that a strided shard cuts (its partials are laid out with S(d), which gives every
// tile exactly one).
TEST(QuantSpecTest, StridedShardSourcesQuantizeExactly) {
  auto spec = ParseSpecJson(R"j({"tensors": [
    {"name": "w", "dtype": "bf16", "shape": [512, 256],
     "src": {"mesh": [[0, 1], [2, 3]], "placements": ["_S(0, 2)", "S(0)"]},
     "dst": {"mesh": [4, 5], "placements": ["S(0)"], "dtype": "fp8e4m3", "quant": {"scheme": "block", "block": [128, 128]}}},
    {"name": "c", "dtype": "fp32", "shape": [8, 12],
     "src": {"mesh": [[0, 1, 2], [3, 4, 5]], "placements": ["_S(1, 3)", "S(1)"]},
     "dst": {"mesh": [6, 7], "placements": ["S(0)"], "dtype": "fp8e5m2", "quant": {"scheme": "channel"}}}]})j");
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto lowered = LowerQuantization(std::make_shared<const RefitSpec>(*spec));
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  const RefitSpec& l = **lowered;
  EXPECT_FALSE(l.quantized_sources[0].exchange);
  ASSERT_TRUE(l.quantized_sources[1].exchange);
  EXPECT_EQ(l.quantized_sources[1].cut_parts, (std::vector<int64_t>{1, 6}));
  // The partials take one entry per tile: S(1) over the cut dim, whatever the split factor.
  const TensorSpec& partials = l.amax_exchange->tensors[0];
  EXPECT_EQ(partials.src.placements[0], Placement::Shard(1));
  EXPECT_TRUE(Validate(*l.amax_exchange).ok()) << Validate(*l.amax_exchange);
  auto plan = BuildPlan(std::make_shared<const RefitSpec>(*spec));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(VerifyPlanInProcess(*plan, int64_t{1} << 30).ok());
}

TEST(QuantSpecTest, ExecutorVerifyCatchesAWrongScale) {
  auto plan = PlanOf(
      OneTensor(R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "block", "block": [128, 128]})j"));
  ASSERT_TRUE(plan.ok());
  auto world = LocalWorld::Create(*plan, int64_t{1} << 30);
  ASSERT_TRUE(world.ok());
  world->Prepare(1);
  world->Execute();
  // Corrupt one scale on rank 2.
  const uint32_t scales = plan->buffer_of(1, Side::kDst);
  world->buffer(2, scales)[0] ^= 1;
  const absl::Status st = world->Verify(1);
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("tensor \"w.scale\": rank 2"), std::string::npos) << st;
}

// FP8 sources (src.dtype, src.quant): a bf16 [512, 1024] tensor held as FP8 by 2 row shards.
std::string Fp8Source(const std::string& src_extra, const std::string& dst_extra,
                      const std::string& src_placement = "S(0)") {
  return absl::StrCat(
      R"j({"topology": {"ranks_per_domain": 2}, "tensors": [{"name": "w", "dtype": "bf16", "shape": [512, 1024], "src": {"mesh": [0, 1], "placements": [")j",
      src_placement, R"j("])j", src_extra,
      R"j(}, "dst": {"mesh": [2, 3, 4, 5], "placements": ["S(1)"])j", dst_extra, "}}]}");
}
constexpr char kBlockE4M3[] =
    R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "block", "block": [128, 128]})j";

TEST(QuantSpecTest, Fp8SourceErrorsNameTensorFieldDimAndRank) {
  EXPECT_EQ(ErrorOf(Fp8Source(kBlockE4M3, "")),
            "tensor \"w\": src.quant (an FP8 source) needs dst.quant: FP8 sources refit into "
            "quantized destinations only (dequantizing into the destination is not supported)");
  EXPECT_EQ(ErrorOf(Fp8Source(R"j(, "quant": {"scheme": "mx"})j", kBlockE4M3)),
            "tensor \"w\": src.quant (scheme mx) needs src.dtype fp8e4m3 or fp8e5m2");
  EXPECT_EQ(ErrorOf(Fp8Source(R"j(, "dtype": "fp8e4m3")j", kBlockE4M3)),
            "tensor \"w\": src.dtype fp8e4m3 differs from the tensor's dtype bf16 without "
            "src.quant; a source of another dtype must be quantized (casting is not supported)");
  EXPECT_EQ(ErrorOf(Fp8Source(R"j(, "scale_buffer": "s")j", kBlockE4M3)),
            "tensor \"w\": src.scale_buffer and src.scale_view need src.quant");
  EXPECT_EQ(ErrorOf(Fp8Source(R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "block"})j", kBlockE4M3)),
            "tensor \"w\": src.quant.block is required by scheme block (e.g. [128, 128])");
  EXPECT_EQ(ErrorOf(Fp8Source(R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "mx"}, "scale_buffer": "reshard:s")j",
                              kBlockE4M3)),
            "tensor \"w\": src.scale_buffer \"reshard:s\" starts with the reserved prefix "
            "\"reshard:\"");
  // Source row shards of 256 cut the source's 384-row blocks (rank 1's tile).
  EXPECT_EQ(ErrorOf(Fp8Source(R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "block", "block": [384, 128]})j",
                              kBlockE4M3)),
            "tensor \"w\": src tiles cut the src.quant blocks of dim 0 (rank 1's tile starts at "
            "element 256, not a multiple of the block's 384); only a dim of one block may be cut "
            "(its scale is then replicated)");
  // The tensor's dtype stays the unquantized one.
  EXPECT_EQ(ErrorOf(absl::StrReplaceAll(Fp8Source(kBlockE4M3, kBlockE4M3),
                                        {{R"("dtype": "bf16")", R"("dtype": "fp8e4m3")"}})),
            "tensor \"w\": dst.quant quantizes bf16, fp16 or fp32 tensors, not fp8e4m3 (an FP8 "
            "source gives src.dtype and src.quant, and the tensor's dtype stays the unquantized "
            "one)");
  // A requantized source's scale view is checked like any view (here its scales would overlap).
  const std::string overlapping = ErrorOf(Fp8Source(
      R"j(, "dtype": "fp8e5m2", "quant": {"scheme": "mx"}, "scale_view": {"offset": 0, "strides": [0, 1]})j",
      kBlockE4M3));
  EXPECT_EQ(overlapping.rfind("tensor \"w.scale\": src.view", 0), 0u) << overlapping;
  // Channel scales of column shards: every shard holds its rows' (replicated) scales.
  EXPECT_EQ(ErrorOf(Fp8Source(R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "channel"})j",
                              R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "channel"})j", "S(1)")),
            "ok");
}

TEST(QuantSpecTest, MatchingFp8SourcesMoveBytesAndScalesAsTheyAre) {
  auto spec = ParseSpecJson(Fp8Source(
      R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "block", "block": [128, 128]}, "buffer": "w8", "view": {"offset": 16}, "scale_buffer": "ws", "scale_view": {"offset": 3})j",
      kBlockE4M3));
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto lowered = LowerQuantization(std::make_shared<const RefitSpec>(*spec));
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  const RefitSpec& l = **lowered;
  // Two plain tensors on the user's buffers: no quantizer, no internal buffer.
  EXPECT_TRUE(l.quantized_sources.empty());
  ASSERT_EQ(l.tensors.size(), 2u);
  EXPECT_EQ(l.tensors[0].dtype, DType::kFp8E4M3);
  EXPECT_EQ(l.tensors[0].src.buffer, "w8");
  EXPECT_EQ(l.tensors[0].src.view.offset, 16);
  EXPECT_FALSE(l.tensors[0].src_quantized());
  EXPECT_EQ(l.tensors[1].name, "w.scale");
  EXPECT_EQ(l.tensors[1].shape, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(l.tensors[1].src.buffer, "ws");
  EXPECT_EQ(l.tensors[1].src.view.offset, 3);
  EXPECT_EQ(l.tensors[1].dst.buffer, "w.scale");
  auto plan = BuildPlan(std::make_shared<const RefitSpec>(*spec));
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const BufferInfo& b : plan->buffers()) EXPECT_FALSE(b.internal) << b.name;
  // The user's FP8 source: 256 rows x 1024 bytes after 16; its 2 x 8 fp32 scales after 3.
  EXPECT_EQ(plan->BufferBytes(0)[plan->buffer_of(0, Side::kSrc)], 16 + 256 * 1024);
  EXPECT_EQ(plan->BufferBytes(0)[plan->buffer_of(1, Side::kSrc)], (3 + 2 * 8) * 4);
  // Bytes and scales arrive as the sources hold them (the executor's fill of plain tensors).
  EXPECT_TRUE(VerifyPlanInProcess(*plan, int64_t{1} << 30).ok());
  // The same bytes on the wire as a bf16 source quantized at the source.
  auto quantizing = PlanOf(OneTensor(kBlockE4M3));
  ASSERT_TRUE(quantizing.ok());
  EXPECT_EQ(plan->stats().bytes_network, quantizing->stats().bytes_network);
}

// Mismatched FP8 sources: each source tile is dequantized (DecodeFp8 * its block's scale) and
// quantized with the destination's scheme, amax exchange included; every element and scale
// equals the whole tensor dequantized and quantized as one tile. Sources read through strided
// views and scale views, so a wrong block or scale index fails.
TEST(QuantSpecTest, MismatchedFp8SourcesRequantizeExactly) {
  const char* kSources[] = {
      R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "block", "block": [64, 128]}, "buffer": "b", "view": {"offset": 5, "strides": [1, 300]}, "scale_buffer": "bs", "scale_view": {"offset": 2, "strides": [1, 4]})j",
      R"j(, "dtype": "fp8e5m2", "quant": {"scheme": "mx", "block": [1, 32]})j",
      R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "channel"}, "scale_view": {"offset": 7})j",
      R"j(, "dtype": "fp8e5m2", "quant": {"scheme": "tensor"})j",
      R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "block", "block": [128, 128]})j"};
  const char* kDestinations[] = {
      R"j(, "dtype": "fp8e5m2", "quant": {"scheme": "block", "block": [128, 128]})j",
      R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "mx"})j",
      R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "channel"})j",
      R"j(, "dtype": "fp8e4m3", "quant": {"scheme": "tensor"})j"};
  for (const char* placement : {"S(0)", "S(1)"}) {
    for (const char* src : kSources) {
      for (const char* dst : kDestinations) {
        const std::string s = src, d = dst;
        SCOPED_TRACE(absl::StrCat(placement, " ", src, " -> ", dst));
        // Channel and tensor blocks (either side) are cut by column shards.
        const std::string json =
            absl::StrReplaceAll(Fp8Source(src, dst, placement), {{"[512, 1024]", "[256, 512]"}});
        auto plan = PlanOf(json);
        ASSERT_TRUE(plan.ok()) << plan.status();
        // Channel e4m3 into channel e4m3 matches (moved as it is); every other pair requantizes.
        const bool matches = s.find("channel") != std::string::npos &&
                             d.find("channel") != std::string::npos;
        ASSERT_EQ(plan->spec().quantized_sources.size(), matches ? 0u : 1u);
        if (!matches) {
          EXPECT_TRUE(plan->spec().quantized_sources[0].requantized());
        }
        const absl::Status verified = VerifyPlanInProcess(*plan, int64_t{1} << 30);
        EXPECT_TRUE(verified.ok()) << verified;
      }
    }
  }
}

// DequantizeTile against a naive dequantizer written here from the definition: each element's
// FP8 byte decoded and multiplied by the fp32 scale (or 2^(e8m0 - 127)) of its block, found by
// its global index; a tile in the middle of the tensor, read through a transposed view.
TEST(QuantSpecTest, DequantizeTileMultipliesEachElementByItsBlocksScale) {
  for (const bool mx : {false, true}) {
    QuantizedSource qs;
    qs.dtype = mx ? DType::kFp8E5M2 : DType::kFp8E4M3;
    qs.src_scheme = mx ? QuantScheme::kMx : QuantScheme::kBlock;
    qs.src_block = {4, 3};
    const std::vector<int64_t> shape = {16, 10};
    Box tile;
    tile.ndim = 2;
    tile.lo = {4, 3};
    tile.hi = {12, 10};  // 8 x 7: two row blocks, three column blocks (the last partial).
    qs.src.view = View{2, {1, 9}};  // Transposed, padded.
    qs.src_scales.view = View{1, {}};
    std::vector<uint8_t> bytes(2 + 7 * 9);
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 37 + 11);
    const int scale_bytes = mx ? 1 : 4;
    std::vector<uint8_t> scales(static_cast<size_t>((1 + 2 * 3) * scale_bytes));
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<uint8_t>(120 + i * 3);
    std::vector<float> out(56, -1.0f);
    DequantizeTile(qs, shape, tile, bytes.data(), scales.data(), out.data());
    for (int r = 0; r < 8; ++r) {
      for (int c = 0; c < 7; ++c) {
        const uint8_t b = bytes[2 + r + 9 * c];
        const int block = ((tile.lo[0] + r) / 4 - 1) * 3 + ((tile.lo[1] + c) / 3 - 1);
        float scale;
        if (mx) {
          scale = std::ldexp(1.0f, scales[1 + block] - 127);
        } else {
          std::memcpy(&scale, &scales[4 * (1 + block)], 4);
        }
        const float want =
            quant::DecodeFp8(b, mx ? quant::Fp8Format::kE5M2 : quant::Fp8Format::kE4M3) * scale;
        const float got = out[r * 7 + c];
        EXPECT_TRUE((std::isnan(want) && std::isnan(got)) ||
                    std::memcmp(&want, &got, 4) == 0)
            << "mx " << mx << " at " << r << ", " << c << ": " << got << " vs " << want;
      }
    }
  }
}

TEST(QuantSpecTest, Fp8PutsAboutHalfTheBf16BytesOnTheWire) {
  auto bf16 = PlanOf(OneTensor(""));
  ASSERT_TRUE(bf16.ok());
  for (const char* quant : {R"j({"scheme": "block", "block": [128, 128]})j", R"j({"scheme": "channel"})j",
                            R"j({"scheme": "mx"})j"}) {
    auto fp8 = PlanOf(OneTensor(absl::StrCat(R"j(, "dtype": "fp8e4m3", "quant": )j", quant)));
    ASSERT_TRUE(fp8.ok()) << fp8.status();
    const double ratio = static_cast<double>(fp8->stats().bytes_network) /
                         static_cast<double>(bf16->stats().bytes_network);
    SCOPED_TRACE(quant);
    EXPECT_GT(ratio, 0.5);
    EXPECT_LE(ratio, std::string(quant).find("mx") != std::string::npos ? 0.52 + 1.0 / 64 : 0.52);
  }
}

}  // namespace
}  // namespace reshard::plan
