// Every bad-spec class of issue 2 item 5 gives InvalidArgument with one exact sentence naming
// the tensor and the field (and the JSON position where the reader knows it). Also the JSON
// round trip.
#include "src/plan/spec_json.h"

#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "src/plan/plan.h"
#include "src/plan/tiling.h"

namespace reshard::plan {
namespace {

// One tensor "w" with placeholders for its parts.
std::string OneTensor(const std::string& src, const std::string& dst,
                      const std::string& shape = "[8, 8]", const std::string& dtype = "\"bf16\"") {
  return "{\"tensors\": [{\"name\": \"w\", \"dtype\": " + dtype + ", \"shape\": " + shape +
         ",\n  \"src\": " + src + ",\n  \"dst\": " + dst + "}]}";
}
const std::string kSrc = R"js({"mesh": [0, 1], "placements": ["S(0)"]})js";
const std::string kDst = R"js({"mesh": [2, 3], "placements": ["S(1)"]})js";

// The error sentence for `json`, which must be rejected as InvalidArgument.
std::string Error(const std::string& json) {
  auto spec = ParseSpecJson(json);
  if (spec.ok()) return "(accepted)";
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  const std::string message(spec.status().message());
  EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
  return message;
}

TEST(SpecJsonTest, AcceptsTheBaseSpecAndATopLevelComment) {
  auto spec = ParseSpecJson(OneTensor(kSrc, kDst));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->tensors[0].dtype, DType::kBf16);
  auto commented = ParseSpecJson(
      R"js({"comment": "free text, any words", "tensors": [{"name": "w", "dtype": "i8", "shape": [],
             "src": {"mesh": [0], "placements": ["R"]},
             "dst": {"mesh": [[1, 2]], "placements": ["R", "R"]}}]})js");
  ASSERT_TRUE(commented.ok()) << commented.status();
  EXPECT_EQ(commented->comment, "free text, any words");
  EXPECT_EQ(commented->tensors[0].dst.mesh.shape, (std::vector<int64_t>{1, 2}));
}

TEST(SpecJsonTest, JsonSyntaxErrorsGiveLineAndColumn) {
  EXPECT_EQ(Error("{\"tensors\": [\n  {\"name\": \"w\",, }\n]}"),
            "line 2, column 16: expected a string key in object");
  EXPECT_EQ(Error("{\"tensors\": [1, 2\n"), "line 2, column 1: expected ',' or ']' in array");
  EXPECT_EQ(Error(""), "line 1, column 1: unexpected end of input, expected a value");
  EXPECT_EQ(Error("{\"tensors\": []} // trailing"), "line 1, column 17: unexpected text after the JSON document");
}

TEST(SpecJsonTest, MissingFields) {
  EXPECT_EQ(Error("{}"), "line 1, column 1: spec is missing \"tensors\"");
  EXPECT_EQ(Error("{\"tensors\": []}"), "the spec has no tensors");
  EXPECT_EQ(Error(R"js({"tensors": [{"dtype": "bf16"}]})js"),
            "line 1, column 14: tensors[0] is missing \"name\"");
  EXPECT_EQ(Error(R"js({"tensors": [{"name": "w", "shape": [1]}]})js"),
            "line 1, column 14: tensor \"w\": tensor is missing \"dtype\"");
  EXPECT_EQ(Error(R"js({"tensors": [{"name": "w", "dtype": "bf16"}]})js"),
            "line 1, column 14: tensor \"w\": tensor is missing \"shape\"");
  EXPECT_EQ(Error(R"js({"tensors": [{"name": "w", "dtype": "bf16", "shape": [2]}]})js"),
            "line 1, column 14: tensor \"w\": tensor is missing \"src\"");
  EXPECT_EQ(Error(OneTensor(R"js({"placements": ["S(0)"]})js", kDst)),
            "line 2, column 10: tensor \"w\": src is missing \"mesh\"");
  EXPECT_EQ(Error(OneTensor(kSrc, R"js({"mesh": [2, 3]})js")),
            "line 3, column 10: tensor \"w\": dst is missing \"placements\"");
}

TEST(SpecJsonTest, UnknownKeysOnlyATopLevelCommentIsFreeText) {
  // A typo such as `placement` must not pass silently.
  EXPECT_EQ(Error(OneTensor(R"js({"mesh": [0, 1], "placement": ["S(0)"]})js", kDst)),
            "line 2, column 40: tensor \"w\": src has unknown key \"placement\" (allowed: mesh, "
            "placements, buffer, view, dtype, quant, scale_buffer, scale_view)");
  EXPECT_EQ(Error(R"js({"tensor": [], "tensors": []})js"),
            "line 1, column 12: spec has unknown key \"tensor\" (allowed: comment, topology, "
            "tensors)");
  EXPECT_EQ(Error(R"js({"tensors": [{"name": "w", "comment": "x"}]})js"),
            "line 1, column 39: tensor \"w\": tensor has unknown key \"comment\" (allowed: name, "
            "dtype, shape, src, dst)");
  EXPECT_EQ(Error(OneTensor(kSrc, R"js({"mesh": [2, 3], "placements": ["R"], "view": {"offset": 0, "stride": [1, 1]}})js")),
            "line 3, column 80: tensor \"w\": dst.view has unknown key \"stride\" (allowed: offset, "
            "strides)");
  // Topology keys grow with the schedule; the sentence starts the same way.
  EXPECT_EQ(Error(R"js({"topology": {"domain": [[0]]}, "tensors": []})js")
                .rfind("line 1, column 25: topology has unknown key \"domain\" (allowed: domains, "
                       "ranks_per_domain, ", 0),
            0u);
  // Shape and dtype exist once per tensor, so the two sides cannot disagree: a per-side shape
  // is an unknown key.
  EXPECT_EQ(Error(OneTensor(R"js({"mesh": [0, 1], "placements": ["S(0)"], "shape": [8, 4]})js", kDst)),
            "line 2, column 60: tensor \"w\": src has unknown key \"shape\" (allowed: mesh, "
            "placements, buffer, view, dtype, quant, scale_buffer, scale_view)");
}

TEST(SpecJsonTest, UnknownDtype) {
  EXPECT_EQ(Error(OneTensor(kSrc, kDst, "[8, 8]", "\"bfloat16\"")),
            "line 1, column 37: tensor \"w\": dtype \"bfloat16\" is unknown (known: bool, u8, i8, "
            "i16, i32, i64, fp8e4m3, fp8e5m2, fp16, bf16, fp32, fp64)");
  EXPECT_EQ(Error(OneTensor(kSrc, kDst, "[8, 8]", "16")),
            "line 1, column 37: tensor \"w\": dtype must be a string, not a number");
}

TEST(SpecJsonTest, NegativeDimsAndBadShapes) {
  EXPECT_EQ(Error(OneTensor(kSrc, kDst, "[8, -1]")), "tensor \"w\": shape[1] is negative (-1)");
  EXPECT_EQ(Error(OneTensor(kSrc, kDst, "[8, 2.5]")),
            "line 1, column 58: tensor \"w\": shape[1] must be an integer");
  EXPECT_EQ(Error(OneTensor(kSrc, kDst, "[1, 2, 3, 4, 5, 6, 7, 8, 9]")),
            "tensor \"w\": shape has 9 dims; at most 8 are supported");
}

TEST(SpecJsonTest, NegativeRanks) {
  EXPECT_EQ(Error(OneTensor(R"js({"mesh": [0, -1], "placements": ["S(0)"]})js", kDst)),
            "line 2, column 23: tensor \"w\": src.mesh[1] rank -1 is not a valid rank");
  EXPECT_EQ(Error(R"js({"topology": {"domains": [[0, -2]]}, "tensors": []})js"),
            "line 1, column 27: topology.domains[0] rank -2 is not valid");
}

TEST(SpecJsonTest, RaggedMeshes) {
  EXPECT_EQ(Error(OneTensor(R"js({"mesh": [[0, 1], [2]], "placements": ["R", "S(0)"]})js", kDst)),
            "line 2, column 28: tensor \"w\": src.mesh[1] is ragged: axis 1 has 1 entries here "
            "and 2 elsewhere");
  EXPECT_EQ(Error(OneTensor(R"js({"mesh": [[0, 1], 2], "placements": ["R", "S(0)"]})js", kDst)),
            "line 2, column 28: tensor \"w\": src.mesh[1] is ragged: ranks appear at different "
            "nesting depths");
  EXPECT_EQ(Error(OneTensor(R"js({"mesh": [], "placements": []})js", kDst)),
            "line 2, column 19: tensor \"w\": src.mesh has an empty axis");
}

TEST(SpecJsonTest, RankTwiceInOneMesh) {
  EXPECT_EQ(Error(OneTensor(kSrc, R"js({"mesh": [[2, 3], [4, 3]], "placements": ["R", "S(1)"]})js")),
            "tensor \"w\": dst.mesh names rank 3 twice");
  // The same rank in both meshes is fine (a local copy).
  EXPECT_EQ(Error(OneTensor(kSrc, R"js({"mesh": [1, 0], "placements": ["S(1)"]})js")), "(accepted)");
}

TEST(SpecJsonTest, PlacementCountAndShardDim) {
  EXPECT_EQ(Error(OneTensor(kSrc, R"js({"mesh": [2, 3], "placements": ["R", "S(1)"]})js")),
            "tensor \"w\": dst.placements has 2 entries but the mesh has 1 axes");
  EXPECT_EQ(Error(OneTensor(R"js({"mesh": [0, 1], "placements": ["S(2)"]})js", kDst)),
            "tensor \"w\": src.placements[0] shards dim 2 of a 2-D tensor");
  EXPECT_EQ(Error(OneTensor(R"js({"mesh": [0, 1], "placements": ["Shard(0)"]})js", kDst)),
            "line 2, column 42: tensor \"w\": src.placements[0] is \"Shard(0)\"; a placement is "
            "\"R\", \"S(d)\" or \"_S(d, k)\"");
}

// torch's str() of _StridedShard(d, split_factor=k) is "_S(d, k)": the canonical spelling, which
// SpecToJson writes; "_S(d,k)" is read too. _S(d, 1) is S(d) (the same tiles in torch).
TEST(SpecJsonTest, StridedShardSpellings) {
  const std::string src = R"js({"mesh": [[0, 1], [2, 3]], "placements": ["_S(0, 2)", "S(0)"]})js";
  auto spec = ParseSpecJson(OneTensor(src, kDst));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->tensors[0].src.placements[0], Placement::StridedShard(0, 2));
  EXPECT_TRUE(spec->tensors[0].src.placements[0].is_strided());
  EXPECT_EQ(spec->tensors[0].src.placements[0].ToString(), "_S(0, 2)");
  auto tight = ParseSpecJson(OneTensor(
      R"js({"mesh": [[0, 1], [2, 3]], "placements": ["_S(0,2)", "S(0)"]})js", kDst));
  ASSERT_TRUE(tight.ok()) << tight.status();
  EXPECT_EQ(tight->tensors[0].src.placements, spec->tensors[0].src.placements);
  auto one = ParseSpecJson(OneTensor(R"js({"mesh": [0, 1], "placements": ["_S(1, 1)"]})js", kDst));
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->tensors[0].src.placements[0], Placement::Shard(1));
  EXPECT_EQ(one->tensors[0].src.placements[0].ToString(), "S(1)");
  const std::string written = SpecToJson(*spec);
  EXPECT_NE(written.find("\"placements\": [\"_S(0, 2)\", \"S(0)\"]"), std::string::npos) << written;
  auto again = ParseSpecJson(written);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->tensors[0].src.placements, spec->tensors[0].src.placements);
  EXPECT_EQ(SpecToJson(*again), written);
  // Other spellings of torch's (repr, comments) are not placements here: one spelling only.
  for (const char* bad : {"SS(0, 2)", "_StridedShard(dim=0, sf=2)", "_S(0, 2", "_S(0,  2)",
                          "_S( 0, 2)", "_S(0, -2)", "_S(0)", "_S(0, 2, 3)", "_S(, 2)"}) {
    EXPECT_EQ(Error(OneTensor(absl::StrCat(R"js({"mesh": [0, 1], "placements": [")js", bad,
                                           R"js("]})js"),
                              kDst)),
              absl::StrCat("line 2, column 42: tensor \"w\": src.placements[0] is \"", bad,
                           "\"; a placement is \"R\", \"S(d)\" or \"_S(d, k)\""));
  }
}

TEST(SpecJsonTest, StridedShardSplitFactorLimits) {
  auto with = [](const std::string& placement) {
    return OneTensor(R"js({"mesh": [0, 1], "placements": [")js" + placement + R"js("]})js", kDst);
  };
  EXPECT_EQ(Error(with("_S(0, 0)")),
            "tensor \"w\": src.placements[0] has split factor 0; a split factor is at least 1 and "
            "below 2^62");
  // 2^62: the first value too large (a factor beyond the dim's size is fine, as in torch).
  EXPECT_EQ(Error(with("_S(0, 4611686018427387904)")),
            "tensor \"w\": src.placements[0] has split factor 4611686018427387904; a split factor "
            "is at least 1 and below 2^62");
  EXPECT_EQ(Error(with("_S(0, 99999999999999999999)")),
            "line 2, column 42: tensor \"w\": src.placements[0] is \"_S(0, 99999999999999999999)\"; "
            "a split factor is at least 1 and below 2^62");
  // 2^62 - 1 over 8 rows: all 8 chunks of one row, rank 0 keeps them all (torch does the same).
  auto huge = ParseSpecJson(with("_S(0, 4611686018427387903)"));
  ASSERT_TRUE(huge.ok()) << huge.status();
  const TileGrid grid(huge->tensors[0].src, huge->tensors[0].shape);
  const Box rank0 = grid.CellBox(*grid.CellOfRank(0)), rank1 = grid.CellBox(*grid.CellOfRank(1));
  EXPECT_EQ(rank0.lo[0], 0);
  EXPECT_EQ(rank0.hi[0], 8);
  EXPECT_EQ(rank1.lo[0], 8);  // Empty: at the dim's size, as torch.
  EXPECT_EQ(rank1.hi[0], 8);
}

// reshard holds one box per rank: a strided shard that leaves a rank indices of a dim that are
// not one range is refused, naming the placement, one such rank and its first ranges.
TEST(SpecJsonTest, StridedShardsThatSplitARanksRowsAreRefused) {
  EXPECT_EQ(Error(OneTensor(R"js({"mesh": [0, 1], "placements": ["_S(0, 2)"]})js", kDst)),
            "tensor \"w\": src.placements[0] _S(0, 2) gives rank 0 (mesh coordinate [0]) indices "
            "[0, 2) and [4, 6) of dim 0, not one contiguous range; reshard holds one box per rank");
  EXPECT_EQ(Error(OneTensor(R"js({"mesh": [0, 1], "placements": ["_S(0, 3)"]})js", kDst)),
            "tensor \"w\": src.placements[0] _S(0, 3) gives rank 0 (mesh coordinate [0]) indices "
            "[0, 2), [3, 5), ... of dim 0, not one contiguous range; reshard holds one box per rank");
  // The first offending shard by mesh coordinates; replicate axes at coordinate 0.
  EXPECT_EQ(Error(OneTensor(kSrc, R"js({"mesh": [[[2, 3], [4, 5]], [[6, 7], [8, 9]]],
                                        "placements": ["R", "S(1)", "_S(1, 2)"]})js")),
            "tensor \"w\": dst.placements[2] _S(1, 2) gives rank 2 (mesh coordinate [0, 0, 0]) "
            "indices [0, 1) and [2, 3) of dim 1, not one contiguous range; reshard holds one box "
            "per rank");
  // The FSDP2 + TP order of the same axes is fine; so is a rank whose ranges a later S(d) cuts
  // apart again.
  auto fine = ParseSpecJson(OneTensor(kSrc, R"js({"mesh": [[2, 3], [4, 5]],
                                                  "placements": ["_S(1, 2)", "S(1)"]})js"));
  EXPECT_TRUE(fine.ok()) << fine.status();
}

TEST(SpecJsonTest, DuplicateTensorNames) {
  const std::string t = R"js({"name": "w", "dtype": "bf16", "shape": [4],
      "src": {"mesh": [0], "placements": ["R"]}, "dst": {"mesh": [1], "placements": ["R"]}})js";
  EXPECT_EQ(Error("{\"tensors\": [" + t + ", " + t + "]}"),
            "tensor \"w\": the name is used by two tensors");
}

TEST(SpecJsonTest, DestinationViewsWithTwoElementsAtOneAddress) {
  // Within one tile: strides [1, 1] put (0, 1) and (1, 0) at the same address.
  EXPECT_EQ(Error(OneTensor(kSrc, R"js({"mesh": [2, 3], "placements": ["S(1)"], "view": {"offset": 0, "strides": [1, 1]}})js")),
            "tensor \"w\": dst.view.strides give two elements of one tile the same address");
  // Across two tensors of one buffer: k starts inside q's rows.
  const std::string fused = R"js({"tensors": [
    {"name": "q", "dtype": "bf16", "shape": [4, 4],
     "src": {"mesh": [0], "placements": ["R"]},
     "dst": {"mesh": [1, 2], "placements": ["S(0)"], "buffer": "qkv", "view": {"offset": 0}}},
    {"name": "k", "dtype": "fp16", "shape": [2, 4],
     "src": {"mesh": [0], "placements": ["R"]},
     "dst": {"mesh": [1, 2], "placements": ["S(0)"], "buffer": "qkv", "view": {"offset": OFFSET}}}]})js";
  auto with_offset = [&](const std::string& offset) {
    std::string s = fused;
    s.replace(s.find("OFFSET"), 6, offset);
    return s;
  };
  EXPECT_EQ(Error(with_offset("6")),
            "tensor \"k\": dst.view overlaps tensor \"q\" in buffer \"qkv\" on rank 1 (element "
            "offset 6)");
  EXPECT_EQ(Error(with_offset("8")), "(accepted)");
  // Interleaved views that never share an address are fine; sharing one is not.
  const std::string interleaved = R"js({"tensors": [
    {"name": "a", "dtype": "i32", "shape": [3, 2],
     "src": {"mesh": [0], "placements": ["R"]},
     "dst": {"mesh": [1], "placements": ["R"], "buffer": "ab", "view": {"offset": 0, "strides": [4, 2]}}},
    {"name": "b", "dtype": "fp32", "shape": [3, 2],
     "src": {"mesh": [0], "placements": ["R"]},
     "dst": {"mesh": [1], "placements": ["R"], "buffer": "ab", "view": {"offset": B, "strides": [4, 2]}}}]})js";
  auto with_b = [&](const std::string& offset) {
    std::string s = interleaved;
    s.replace(s.find("B,"), 1, offset);
    return s;
  };
  EXPECT_EQ(Error(with_b("1")), "(accepted)");
  EXPECT_EQ(Error(with_b("2")),
            "tensor \"b\": dst.view overlaps tensor \"a\" in buffer \"ab\" on rank 1 (element "
            "offset 2)");
  // Tensors of one buffer need one element size.
  std::string mixed = with_b("1");
  mixed.replace(mixed.find("\"fp32\""), 6, "\"fp64\"");
  EXPECT_EQ(Error(mixed),
            "tensor \"b\": dst.buffer \"ab\" also holds tensor \"a\" whose dtype has a different "
            "size");
}

TEST(SpecJsonTest, OtherViewAndTopologyErrors) {
  EXPECT_EQ(Error(OneTensor(kSrc, R"js({"mesh": [2, 3], "placements": ["S(1)"], "view": {"offset": -3}})js")),
            "tensor \"w\": dst.view.offset is negative (-3)");
  EXPECT_EQ(Error(OneTensor(kSrc, R"js({"mesh": [2, 3], "placements": ["S(1)"], "view": {"strides": [1]}})js")),
            "tensor \"w\": dst.view.strides has 1 entries for a 2-D tensor");
  EXPECT_EQ(Error(R"js({"topology": {"domains": [[0, 1], [1, 2]]}, "tensors": [{"name": "w", "dtype": "u8", "shape": [1],
      "src": {"mesh": [0], "placements": ["R"]}, "dst": {"mesh": [1], "placements": ["R"]}}]})js"),
            "topology.domains[1] names rank 1, already in domains[0]");
  EXPECT_EQ(Error(R"js({"topology": {"ranks_per_domain": 0}, "tensors": []})js"),
            "line 1, column 35: topology.ranks_per_domain must be >= 1");
}

TEST(SpecJsonTest, LoadSpecFileNamesThePath) {
  const std::string path = std::string(RESHARD_BINARY_DIR) + "/spec_json_test_bad.json";
  {
    std::ofstream out(path);
    out << OneTensor(kSrc, kDst, "[8, 8]", "\"f32\"");
  }
  auto spec = LoadSpecFile(path);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(std::string(spec.status().message()).rfind(path + ": line 1, column 37: tensor \"w\": dtype \"f32\"", 0), 0u)
      << spec.status();
  std::remove(path.c_str());
  auto missing = LoadSpecFile(path);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(std::string(missing.status().message()), path + ": cannot open the spec file");
}

void ExpectSameSpec(const RefitSpec& a, const RefitSpec& b) {
  EXPECT_EQ(a.comment, b.comment);
  EXPECT_EQ(a.topology.domains, b.topology.domains);
  EXPECT_EQ(a.topology.ranks_per_domain, b.topology.ranks_per_domain);
  EXPECT_EQ(a.topology.nic_gbytes_per_s, b.topology.nic_gbytes_per_s);
  EXPECT_EQ(a.topology.nvlink_gbytes_per_s, b.topology.nvlink_gbytes_per_s);
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const TensorSpec& x = a.tensors[i];
    const TensorSpec& y = b.tensors[i];
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.dtype, y.dtype);
    EXPECT_EQ(x.shape, y.shape);
    for (auto [l, m] : {std::pair{&x.src, &y.src}, std::pair{&x.dst, &y.dst}}) {
      EXPECT_EQ(l->mesh, m->mesh);
      EXPECT_EQ(l->placements, m->placements);
      EXPECT_EQ(l->buffer, m->buffer);
      EXPECT_EQ(l->view, m->view);
      EXPECT_EQ(l->has_view, m->has_view);
    }
  }
}

TEST(SpecJsonTest, SpecToJsonRoundTrips) {
  const std::string json = R"js({"comment": "round \"trip\"\n",
    "topology": {"domains": [[0, 1], [2, 3, 4, 5]], "nic_gbytes_per_s": 25, "nvlink_gbytes_per_s": 900.5},
    "tensors": [
      {"name": "w.\u00e9", "dtype": "fp8e5m2", "shape": [8, 8],
       "src": {"mesh": [1, 0], "placements": ["S(0)"]},
       "dst": {"mesh": [[2, 3], [4, 5]], "placements": ["R", "S(1)"], "buffer": "fused",
               "view": {"offset": 3, "strides": [1, 8]}}},
      {"name": "s", "dtype": "fp64", "shape": [],
       "src": {"mesh": [[[0]], [[1]]], "placements": ["R", "R", "R"], "view": {"offset": 0}},
       "dst": {"mesh": [2], "placements": ["R"]}}]})js";
  auto a = ParseSpecJson(json);
  ASSERT_TRUE(a.ok()) << a.status();
  const std::string written = SpecToJson(*a);
  auto b = ParseSpecJson(written);
  ASSERT_TRUE(b.ok()) << b.status() << "\n" << written;
  ExpectSameSpec(*a, *b);
  EXPECT_EQ(SpecToJson(*b), written);
  RefitSpec rpd = *a;
  rpd.topology.domains.clear();
  rpd.topology.ranks_per_domain = 4;
  auto c = ParseSpecJson(SpecToJson(rpd));
  ASSERT_TRUE(c.ok()) << c.status();
  ExpectSameSpec(rpd, *c);
}

}  // namespace
}  // namespace reshard::plan
