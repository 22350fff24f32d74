// Specs the front end must refuse (issue "Nothing lost, nothing overwritten", item 4): sizes that
// overflow, views beyond the buffer limit, invalid UTF-8, non-finite or non-integer numbers,
// empty strides, worlds and meshes over the limits. Every refusal is InvalidArgument, names the
// tensor and the field, and is one line of bounded length whatever the user strings hold.
#include <gtest/gtest.h>

#include <string>

#include "src/plan/executor.h"
#include "src/plan/plan.h"
#include "src/plan/spec.h"
#include "src/plan/spec_json.h"

namespace reshard::plan {
namespace {

constexpr size_t kMaxErrorBytes = 1024;

std::string OneTensor(const std::string& shape, const std::string& src, const std::string& dst,
                      const std::string& name = "\"w\"", const std::string& dtype = "\"u8\"") {
  return "{\"tensors\":[{\"name\":" + name + ",\"dtype\":" + dtype + ",\"shape\":" + shape +
         ",\"src\":" + src + ",\"dst\":" + dst + "}]}";
}
const std::string kSrc = R"js({"mesh":[0,1],"placements":["S(0)"]})js";
const std::string kDst = R"js({"mesh":[2,3],"placements":["S(0)"]})js";

// The error for `json`, which must be refused with InvalidArgument in one bounded line.
std::string Refusal(const std::string& json) {
  auto spec = ParseSpecJson(json);
  if (spec.ok()) return "(accepted)";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  const std::string message(spec.status().message());
  EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
  EXPECT_LE(message.size(), kMaxErrorBytes) << message.substr(0, 2000);
  return message;
}

#define EXPECT_REFUSED_WITH(json, fragment)                                             \
  do {                                                                                  \
    const std::string m = Refusal(json);                                                \
    EXPECT_NE(m.find(fragment), std::string::npos) << "message: " << m.substr(0, 2000); \
  } while (0)

TEST(SpecLimitsTest, ShapeOfTwoToTheSixtyThreeIsRefusedNotPlannedNegative) {
  // Was accepted and planned negative tile shapes (extent + 1 and CeilDiv overflowed).
  EXPECT_EQ(Refusal(OneTensor("[9223372036854775807]", kSrc, kDst)),
            "tensor \"w\": shape is too large: a tensor must hold fewer than 2^62 bytes");
  EXPECT_REFUSED_WITH(OneTensor("[4611686018427387904]", kSrc, kDst), "tensor \"w\": shape");
  EXPECT_REFUSED_WITH(OneTensor("[2305843009213693952]", kSrc, kDst, "\"w\"", "\"fp16\""),
                      "tensor \"w\": shape is too large");
  EXPECT_REFUSED_WITH(OneTensor("[4294967296, 4294967296]", kSrc, kDst), "tensor \"w\": shape");
  // Just below the limit, sharded so that no tile is beyond the buffer limit: accepted.
  EXPECT_EQ(
      Refusal(OneTensor("[4611686018427387903]", R"js({"mesh":[[0,1,2,3],[4,5,6,7]],
      "placements":["S(0)","S(0)"]})js",
                        R"js({"mesh":[8],"placements":["S(0)"]})js")),
      "tensor \"w\": src.view addresses bytes beyond the per-rank buffer limit of 2^56 bytes");
}

TEST(SpecLimitsTest, ViewOffsetBeyondTheBufferLimitIsRefused) {
  // Was accepted; `reshard plan --verify` then aborted with bad_alloc.
  const std::string dst =
      R"js({"mesh":[2,3],"placements":["S(0)"],"view":{"offset":1152921504606846976}})js";
  EXPECT_EQ(Refusal(OneTensor("[8]", kSrc, dst)),
            "tensor \"w\": dst.view.offset 1152921504606846976 lies beyond the per-rank buffer "
            "limit of 2^56 bytes");
  // The last tile element at byte 2^56: refused; one before: accepted.
  const std::string over =
      R"js({"mesh":[2,3],"placements":["S(0)"],"view":{"offset":72057594037927933}})js";
  EXPECT_EQ(
      Refusal(OneTensor("[8]", kSrc, over)),
      "tensor \"w\": dst.view addresses bytes beyond the per-rank buffer limit of 2^56 bytes");
  const std::string last =
      R"js({"mesh":[2,3],"placements":["S(0)"],"view":{"offset":72057594037927932}})js";
  EXPECT_EQ(Refusal(OneTensor("[8]", kSrc, last)), "(accepted)");
  const std::string stride =
      R"js({"mesh":[0,1],"placements":["S(0)"],"view":{"strides":[72057594037927936]}})js";
  EXPECT_EQ(Refusal(OneTensor("[8]", stride, kDst)),
            "tensor \"w\": src.view.strides[0] is 72057594037927936, beyond the per-rank buffer "
            "limit of 2^56 bytes");
}

// A mesh of ranks first, first + 1, ..., first + n - 1.
std::string Ranks(int first, int n) {
  std::string out = "[";
  for (int r = first; r < first + n; ++r) out += (r > first ? "," : "") + std::to_string(r);
  return out + "]";
}

TEST(SpecLimitsTest, VerifyOfHugeButValidBuffersIsResourceExhaustedNotAnAbort) {
  // 256 destination ranks with a buffer of almost 2^56 bytes each: valid, but their total
  // (2^64) used to wrap below the verify limit and end in bad_alloc.
  auto spec = ParseSpecJson(
      OneTensor("[8]", kSrc,
                "{\"mesh\":" + Ranks(2, 256) +
                    R"js(,"placements":["R"],"view":{"offset":72057594037927928}})js"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto plan = BuildPlan(std::make_shared<const RefitSpec>(*spec));
  ASSERT_TRUE(plan.ok()) << plan.status();
  const absl::Status v = VerifyPlanInProcess(*plan, int64_t{4} << 30);
  EXPECT_EQ(v.code(), absl::StatusCode::kResourceExhausted) << v;
}

// Under a limit the host cannot honour, the failed allocation (bad_alloc) is an error too.
// Not run under ASan (scripts/sanitizers.sh): its allocator aborts on a 2^56-byte request
// instead of throwing.
TEST(SpecLimitsTest, VerifyBeyondWhatTheHostCanAllocateIsResourceExhausted) {
  auto one = ParseSpecJson(OneTensor(
      "[8]", kSrc, R"js({"mesh":[2],"placements":["R"],"view":{"offset":72057594037927928}})js"));
  ASSERT_TRUE(one.ok()) << one.status();
  auto one_plan = BuildPlan(std::make_shared<const RefitSpec>(*one));
  ASSERT_TRUE(one_plan.ok()) << one_plan.status();
  const absl::Status unlimited = VerifyPlanInProcess(*one_plan, INT64_MAX);
  EXPECT_EQ(unlimited.code(), absl::StatusCode::kResourceExhausted) << unlimited;
}

TEST(SpecLimitsTest, InvalidUtf8NameIsRefusedWithLineAndColumn) {
  EXPECT_EQ(Refusal(OneTensor("[8]", kSrc, kDst, "\"w\xff\"")),
            "line 1, column 23: invalid UTF-8 in string");
  // Built in C++, the same name is refused by Validate.
  auto spec = ParseSpecJson(OneTensor("[8]", kSrc, kDst));
  ASSERT_TRUE(spec.ok());
  spec->tensors[0].name = "w\xc3";
  const absl::Status s = Validate(*spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(s.message()), "tensor \"w\\xc3\": name is not valid UTF-8");
  spec->tensors[0].name = "w";
  spec->tensors[0].dst.buffer = "b\xff";
  EXPECT_EQ(std::string(Validate(*spec).message()), "tensor \"w\": dst.buffer is not valid UTF-8");
}

TEST(SpecLimitsTest, NonFiniteAndNonIntegerNumbersAreRefused) {
  EXPECT_EQ(Refusal(OneTensor("[8, 1e99999]", kSrc, kDst)),
            "line 1, column 50: number \"1e99999\" is out of range (it does not fit in a double)");
  EXPECT_EQ(Refusal(OneTensor("[8, NaN]", kSrc, kDst)),
            "line 1, column 50: unexpected character 'N', expected a value");
  EXPECT_EQ(Refusal(OneTensor("[8, 2.5]", kSrc, kDst)),
            "line 1, column 50: tensor \"w\": shape[1] must be an integer");
  EXPECT_EQ(Refusal(OneTensor("[8, 2.0]", kSrc, kDst)),
            "line 1, column 50: tensor \"w\": shape[1] must be an integer");
  EXPECT_EQ(Refusal(OneTensor("[9223372036854775808]", kSrc, kDst)),
            "line 1, column 47: tensor \"w\": shape[0] must be an integer");
  EXPECT_REFUSED_WITH(R"js({"topology": {"nic_gbytes_per_s": 1e400}, "tensors": []})js",
                      "line 1, column 35: number \"1e400\" is out of range");
  EXPECT_REFUSED_WITH(R"js({"topology": {"nic_gbytes_per_s": 1e300}, "tensors": []})js",
                      "topology.nic_gbytes_per_s is 1e+300; it must lie in [0.001, 1e+06] GB/s");
  EXPECT_REFUSED_WITH(R"js({"topology": {"nvlink_gbytes_per_s": 1e-9}, "tensors": []})js",
                      "topology.nvlink_gbytes_per_s is 1e-09; it must lie in [0.001, 1e+06] GB/s");
  EXPECT_REFUSED_WITH(
      OneTensor("[8]", kSrc, R"js({"mesh":[2,3],"placements":["S(0)"],"view":{"offset":1.5}})js"),
      "tensor \"w\": dst.view.offset must be an integer");
}

TEST(SpecLimitsTest, EmptyStridesOnATensorWithDimsAreRefused) {
  EXPECT_EQ(Refusal(OneTensor("[8, 8]", kSrc,
                              R"js({"mesh":[2,3],"placements":["S(0)"],"view":{"strides":[]}})js")),
            "line 1, column 156: tensor \"w\": dst.view.strides has 0 entries for a 2-D tensor "
            "(omit strides for row-major)");
  // A scalar has no dims: [] is its strides.
  EXPECT_EQ(Refusal(OneTensor("[]", R"js({"mesh":[0],"placements":["R"]})js",
                              R"js({"mesh":[2],"placements":["R"],"view":{"strides":[]}})js")),
            "(accepted)");
}

TEST(SpecLimitsTest, UserStringsInErrorsAreQuotedEscapedAndCut) {
  // A name with a newline: one line.
  const std::string newline = Refusal(OneTensor("[8]", kSrc, kDst, "\"a\\nb\"", "\"f32\""));
  EXPECT_EQ(newline.rfind("line 1, column 36: tensor \"a\\nb\": dtype \"f32\" is unknown", 0), 0u)
      << newline;
  // A 10,000-character name: cut at 64 characters, and refused by the name limit.
  const std::string long_name(10000, 'n');
  EXPECT_EQ(Refusal(OneTensor("[8]", kSrc, kDst, "\"" + long_name + "\"")),
            "tensor \"" + std::string(64, 'n') +
                "\"...: name is 10000 bytes long; at most 1024 "
                "are allowed");
  const std::string long_error =
      Refusal(OneTensor("[8]", kSrc, kDst, "\"" + long_name + "\"", "\"x\""));
  EXPECT_NE(long_error.find("tensor \"" + std::string(64, 'n') + "\"...: dtype \"x\" is unknown"),
            std::string::npos)
      << long_error;
  // An 8 MB dtype made of newlines and quotes: one short line.
  std::string dtype = "\"";
  for (int i = 0; i < 1'000'000; ++i) dtype += "\\n\\\"xyz";
  dtype += "\"";
  const std::string m = Refusal(OneTensor("[8]", kSrc, kDst, "\"w\"", dtype));
  EXPECT_EQ(m.rfind("line 1, column 33: tensor \"w\": dtype \"\\n\\\"xyz", 0), 0u)
      << m.substr(0, 200);
  // Unknown keys, placements and buffer names are quoted too.
  EXPECT_REFUSED_WITH(
      OneTensor("[8]", R"js({"mesh":[0,1],"placements":["S(0)"],"x\ty":1})js", kDst),
      "tensor \"w\": src has unknown key \"x\\ty\"");
  EXPECT_REFUSED_WITH(OneTensor("[8]", R"js({"mesh":[0,1],"placements":["S\n(0)"]})js", kDst),
                      "src.placements[0] is \"S\\n(0)\"; a placement is");
}

TEST(SpecLimitsTest, MeshOfNineAxesIsRefused) {
  EXPECT_EQ(
      Refusal(OneTensor(
          "[8]",
          R"js({"mesh":[[[[[[[[[0]]]]]]]]],"placements":["R","R","R","R","R","R","R","R","R"]})js",
          kDst)),
      "line 1, column 72: tensor \"w\": src.mesh[0][0][0][0][0][0][0][0] has more than 8 "
      "axes");
}

TEST(SpecLimitsTest, WorldsAndMeshesOverTheLimitAreRefused) {
  EXPECT_EQ(Refusal(OneTensor("[8]", kSrc, R"js({"mesh":[2,65536],"placements":["S(0)"]})js")),
            "tensor \"w\": dst.mesh rank 65536 is outside [0, 65536)");
  EXPECT_EQ(Refusal(OneTensor("[8]", kSrc, R"js({"mesh":[2,2147483647],"placements":["S(0)"]})js")),
            "tensor \"w\": dst.mesh rank 2147483647 is outside [0, 65536)");
  EXPECT_EQ(Refusal(R"js({"topology":{"domains":[[0],[70000]]},"tensors":[{"name":"w","dtype":"u8",
      "shape":[1],"src":{"mesh":[0],"placements":["R"]},"dst":{"mesh":[1],"placements":["R"]}}]})js"),
            "topology.domains[1] rank 70000 is outside [0, 65536)");
  // A mesh of 65,537 ranks, in JSON and built in C++.
  std::string ranks;
  for (int r = 0; r <= 65536; ++r) ranks += (r ? "," : "") + std::to_string(r);
  EXPECT_REFUSED_WITH(OneTensor("[8]", kSrc, "{\"mesh\":[" + ranks + "],\"placements\":[\"R\"]}"),
                      "tensor \"w\": dst.mesh[65536] is one rank more than 65536, the limit of a "
                      "world");
  auto spec = ParseSpecJson(OneTensor("[8]", kSrc, kDst));
  ASSERT_TRUE(spec.ok());
  spec->tensors[0].dst.mesh.shape = {65537};
  spec->tensors[0].dst.mesh.ranks.resize(65537);
  EXPECT_EQ(std::string(Validate(*spec).message()),
            "tensor \"w\": dst.mesh has more than 65536 ranks, the limit of a world");
}

// Validation checks a mesh's ranks once while tensors repeat it (a per-expert spec names a few
// meshes over tens of thousands of tensors); a mesh that differs from the one checked last is
// checked again, whichever tensor and side it is on.
TEST(SpecLimitsTest, EveryMeshIsCheckedWhenTensorsRepeatTheOneBefore) {
  auto tensor = [](const std::string& name, const std::string& src, const std::string& dst) {
    return "{\"name\":\"" + name + "\",\"dtype\":\"u8\",\"shape\":[8],\"src\":" + src +
           ",\"dst\":" + dst + "}";
  };
  const std::string twice = R"js({"mesh":[3,3],"placements":["S(0)"]})js";
  const std::string a = tensor("a", kSrc, kDst), b = tensor("b", kSrc, kDst);
  EXPECT_EQ(Refusal("{\"tensors\":[" + a + "," + b + "," + tensor("c", kSrc, twice) + "]}"),
            "tensor \"c\": dst.mesh names rank 3 twice");
  EXPECT_EQ(Refusal("{\"tensors\":[" + a + "," + b + "," + tensor("c", twice, kDst) + "]}"),
            "tensor \"c\": src.mesh names rank 3 twice");
  auto spec = ParseSpecJson("{\"tensors\":[" + a + "," + b + "," + tensor("c", kDst, kSrc) + "]}");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->WorldSize(), 4);
  spec->tensors[2].dst.mesh.ranks = {3, 3};
  EXPECT_EQ(std::string(ValidateForRank(*spec, 0).message()),
            "tensor \"c\": dst.mesh names rank 3 twice");
}

TEST(SpecLimitsTest, TotalBytesOfAllTilesAreBounded) {
  // 2^55 bytes, whole on each of 128 destination ranks: 2^62 bytes of tiles in all.
  const std::string src = "{\"mesh\":" + Ranks(0, 8) + ",\"placements\":[\"S(0)\"]}";
  const std::string dst = "{\"mesh\":" + Ranks(8, 128) + ",\"placements\":[\"R\"]}";
  EXPECT_EQ(Refusal(OneTensor("[36028797018963968]", src, dst)),
            "tensor \"w\": dst brings the tiles of all tensors on all ranks to 2^62 bytes or more, "
            "the limit of a spec");
  const std::string fewer = "{\"mesh\":" + Ranks(8, 126) + ",\"placements\":[\"R\"]}";
  EXPECT_EQ(Refusal(OneTensor("[36028797018963968]", src, fewer)), "(accepted)");
}

// The pieces of a plan are bounded (kMaxPieces, 2^27 (destination rank, source tile) pairs over
// all tensors): a spec at the bound validates, one pair more is refused naming the tensor that
// crossed it. DeepSeek-V3 and Kimi-K2 with one tensor per expert matrix into 1,024 inference GPUs
// stay below it (LayoutsTest.FullScaleSpecsValidate validates one into 512).
TEST(SpecLimitsTest, PiecesOfAPlanAreBounded) {
  // 8,192 source rows against 16,384 destination columns: every pair intersects, 2^27 in all.
  const std::string rows = "{\"mesh\":" + Ranks(0, 8192) + ",\"placements\":[\"S(0)\"]}";
  const std::string cols = "{\"mesh\":" + Ranks(8192, 16384) + ",\"placements\":[\"S(1)\"]}";
  const std::string a = "{\"name\":\"a\",\"dtype\":\"u8\",\"shape\":[8192,16384],\"src\":" + rows +
                        ",\"dst\":" + cols + "}";
  static_assert(kMaxPieces == int64_t{8192} * 16384);
  EXPECT_EQ(Refusal("{\"tensors\":[" + a + "]}"), "(accepted)");
  // One element more on one destination rank, from one source tile: one pair over.
  const std::string b =
      R"js({"name":"b","dtype":"u8","shape":[1],"src":{"mesh":[0],"placements":["R"]},"dst":{"mesh":[8192],"placements":["R"]}})js";
  EXPECT_EQ(Refusal("{\"tensors\":[" + a + "," + b + "]}"),
            "tensor \"b\": src and dst intersect in more than 134217728 (destination rank, source "
            "tile) pairs, counting the tensors before it: the limit of a plan");
}

TEST(SpecLimitsTest, ManyTensorsInOneInterleavedBufferValidateQuickly) {
  // 4,000 tensors interleaved element by element in one buffer: grouped and merged, not compared
  // pair by pair.
  RefitSpec spec;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    TensorSpec t;
    t.name = "t" + std::to_string(i);
    t.dtype = DType::kU8;
    t.shape = {64};
    t.src.mesh = {{1}, {0}};
    t.src.placements = {Placement::Replicate()};
    t.dst.mesh = {{2}, {1, 2}};
    t.dst.placements = {Placement::Replicate()};
    t.dst.buffer = "fused";
    t.dst.has_view = true;
    t.dst.view = {i, {n}};
    spec.tensors.push_back(t);
  }
  EXPECT_TRUE(Validate(spec).ok()) << Validate(spec);
  spec.tensors[n - 1].dst.view.offset = n + 5;  // Element 1 of t5... lands on t5's second run.
  const absl::Status s = Validate(spec);
  EXPECT_EQ(std::string(s.message()),
            "tensor \"t3999\": dst.view overlaps tensor \"t5\" in buffer \"fused\" on rank 1 "
            "(element offset 4005)");
}

// Views at the limits of the exact checks are validated in linear time, not by sorting millions
// of addresses (seconds in a release build, minutes under the sanitizers; found while fuzzing:
// tests/fuzz/regressions/spec/). Tests never time themselves: the ctest timeout does.
TEST(SpecLimitsTest, ExactOverlapChecksAtTheLimitsAreLinear) {
  auto dst = [](const std::string& view) {
    return "{\"mesh\":[1],\"placements\":[\"R\"],\"view\":" + view + "}";
  };
  const std::string src = R"js({"mesh":[0],"placements":["R"]})js";
  // Strides 2 and 3 are not provably injective, but 2i and 2i + 3 never meet: 2^23 elements are
  // checked one by one (a bitmap over their 2^23 + 1 addresses).
  EXPECT_EQ(Refusal(OneTensor("[4194304, 2]", src, dst(R"js({"strides":[2,3]})js"))), "(accepted)");
  // More elements than addresses: two of them share one, whatever the strides.
  EXPECT_EQ(Refusal(OneTensor("[4194304, 4]", src, dst(R"js({"strides":[2,3]})js"))),
            "tensor \"w\": dst.view.strides give two elements of one tile the same address");
  // A span of many addresses per element still sorts.
  EXPECT_EQ(Refusal(OneTensor("[1000, 2]", src, dst(R"js({"strides":[1000000,999999]})js"))),
            "(accepted)");
  EXPECT_EQ(Refusal(OneTensor("[1000, 3]", src, dst(R"js({"strides":[1000000,500000]})js"))),
            "tensor \"w\": dst.view.strides give two elements of one tile the same address");
  // Two tensors interleaved element by element in one buffer, 2^23 runs each: their run starts
  // come out in order and are merged without sorting.
  auto interleaved = [&](const std::string& name, const std::string& offset) {
    return "{\"name\":\"" + name + "\",\"dtype\":\"u8\",\"shape\":[8388608],\"src\":" + src +
           ",\"dst\":{\"mesh\":[1],\"placements\":[\"R\"],\"buffer\":\"ab\",\"view\":{\"offset\":" +
           offset + ",\"strides\":[2]}}}";
  };
  EXPECT_EQ(Refusal("{\"tensors\":[" + interleaved("a", "0") + "," + interleaved("b", "1") + "]}"),
            "(accepted)");
}

}  // namespace
}  // namespace reshard::plan
