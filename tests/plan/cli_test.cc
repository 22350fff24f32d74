// `reshard plan` and `reshard spec` as users run them: exit statuses, one-line errors,
// machine-readable output, and specs that `spec` writes and `plan` reads back.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "src/common/json.h"
#include "tests/plan/spec_text.h"

namespace reshard {
namespace {

namespace fs = std::filesystem;

struct Result {
  int status = -1;
  std::string out, err;
};

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    binary_ = fs::path(RESHARD_BINARY_DIR) / "bin" / "reshard";
    ASSERT_TRUE(fs::exists(binary_)) << binary_ << " is not built";
    dir_ = fs::path(RESHARD_BINARY_DIR) / "cli_test_tmp" /
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // `reshard sim` of kTinyMoe on h100-nvl8 as JSON, with `extra` flags (defined below).
  absl::StatusOr<json::Value> SimTinyMoeJson(const std::string& extra);

  // Runs `reshard <args>` (arguments are trusted test strings) and captures both streams.
  Result Run(const std::string& args) {
    const fs::path out = dir_ / "stdout", err = dir_ / "stderr";
    const std::string cmd =
        binary_.string() + " " + args + " >" + out.string() + " 2>" + err.string();
    const int raw = std::system(cmd.c_str());
    Result r;
    r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    r.out = ReadFile(out);
    r.err = ReadFile(err);
    return r;
  }

  fs::path Write(const std::string& name, const std::string& text) {
    const fs::path p = dir_ / name;
    std::ofstream(p) << text;
    return p;
  }

  fs::path binary_, dir_;
};

int Lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

TEST_F(CliTest, BadSpecsExitTwoWithOneLineOnStderrAndNothingOnStdout) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"syntax.json", "{\"tensors\": [\n  {\"name\": \"w\",, }\n]}"},
      {"typo.json", R"js({"tensors": [{"name": "w", "dtype": "bf16", "shape": [4],
          "src": {"mesh": [0], "placement": ["R"]}, "dst": {"mesh": [1], "placements": ["R"]}}]})js"},
      {"overlap.json", R"js({"tensors": [{"name": "w", "dtype": "bf16", "shape": [4, 4],
          "src": {"mesh": [0], "placements": ["R"]},
          "dst": {"mesh": [1], "placements": ["R"], "view": {"strides": [2, 1]}}}]})js"},
  };
  for (const auto& [name, text] : cases) {
    const fs::path spec = Write(name, text);
    for (const char* flags : {"", " --verify --json", " --tiles"}) {
      const Result r = Run("plan " + spec.string() + flags);
      EXPECT_EQ(r.status, 2) << name << flags;
      EXPECT_EQ(r.out, "") << name << flags;
      EXPECT_EQ(Lines(r.err), 1) << name << flags << ": " << r.err;
      EXPECT_EQ(r.err.rfind("reshard plan: " + spec.string() + ": ", 0), 0u) << r.err;
    }
  }
  const Result syntax = Run("plan " + (dir_ / "syntax.json").string());
  EXPECT_NE(syntax.err.find("line 2, column 16"), std::string::npos) << syntax.err;
  const Result typo = Run("plan " + (dir_ / "typo.json").string());
  EXPECT_NE(typo.err.find("tensor \"w\": src has unknown key \"placement\""), std::string::npos)
      << typo.err;
  const Result missing = Run("plan " + (dir_ / "absent.json").string());
  EXPECT_EQ(missing.status, 2);
  EXPECT_EQ(Lines(missing.err), 1);
}

TEST_F(CliTest, OverflowingSpecsExitTwoWithOneLineInsteadOfPlanningOrAborting) {
  // Issue "Nothing lost, nothing overwritten", item 4: a 2^63-1 dim was planned with negative
  // tiles, and a destination view offset of 2^60 made --verify abort with bad_alloc.
  const std::string shape = Write("shape.json", R"js({"tensors":[{"name":"w","dtype":"u8",
      "shape":[9223372036854775807],"src":{"mesh":[0,1],"placements":["S(0)"]},
      "dst":{"mesh":[2,3],"placements":["S(0)"]}}]})js")
                                .string();
  const std::string offset = Write("offset.json", R"js({"tensors":[{"name":"w","dtype":"u8",
      "shape":[8],"src":{"mesh":[0,1],"placements":["S(0)"]},
      "dst":{"mesh":[2,3],"placements":["S(0)"],"view":{"offset":1152921504606846976}}}]})js")
                                 .string();
  for (const std::string& spec : {shape, offset}) {
    for (const char* flags : {"", " --verify", " --tiles --json"}) {
      const Result r = Run("plan " + spec + flags);
      EXPECT_EQ(r.status, 2) << spec << flags;
      EXPECT_EQ(r.out, "") << spec << flags;
      EXPECT_EQ(Lines(r.err), 1) << spec << flags << ": " << r.err;
      EXPECT_EQ(r.err.rfind("reshard plan: " + spec + ": tensor \"w\": ", 0), 0u) << r.err;
    }
  }
  EXPECT_NE(Run("plan " + shape).err.find("shape is too large"), std::string::npos);
  EXPECT_NE(Run("plan " + offset).err.find("dst.view.offset 1152921504606846976"),
            std::string::npos);
  // Valid but far too large to verify in process: refused by --verify-max-bytes, not an abort.
  const std::string big = Write("big.json", R"js({"tensors":[{"name":"w","dtype":"u8",
      "shape":[8],"src":{"mesh":[0,1],"placements":["S(0)"]},
      "dst":{"mesh":[2,3],"placements":["S(0)"],"view":{"offset":72057594037927928}}}]})js")
                              .string();
  EXPECT_EQ(Run("plan " + big).status, 0);
  const Result verify = Run("plan " + big + " --verify");
  EXPECT_EQ(verify.status, 2);
  EXPECT_EQ(Lines(verify.err), 1) << verify.err;
  EXPECT_NE(verify.err.find("cannot verify"), std::string::npos) << verify.err;
}

TEST_F(CliTest, ErrorsEchoingUserStringsStayOneBoundedLine) {
  const std::string name =
      Write("name.json", "{\"tensors\":[{\"name\":\"a\\nb" + std::string(10000, 'x') +
                             "\",\"dtype\":\"" + std::string(100000, 'y') +
                             "\",\"shape\":[8],\"src\":{\"mesh\":[0],\"placements\":[\"R\"]},"
                             "\"dst\":{\"mesh\":[1],\"placements\":[\"R\"]}}]}")
          .string();
  const std::string utf8 = Write("utf8.json",
                                 "{\"tensors\":[{\"name\":\"w\xff\",\"dtype\":\"u8\","
                                 "\"shape\":[8],\"src\":{\"mesh\":[0],\"placements\":[\"R\"]},"
                                 "\"dst\":{\"mesh\":[1],\"placements\":[\"R\"]}}]}")
                               .string();
  for (const std::string& spec : {name, utf8}) {
    for (const char* flags : {"", " --tiles --json"}) {
      const Result r = Run("plan " + spec + flags);
      EXPECT_EQ(r.status, 2) << spec << flags;
      EXPECT_EQ(r.out, "") << spec << flags;
      EXPECT_EQ(Lines(r.err), 1) << r.err.substr(0, 500);
      EXPECT_LE(r.err.size(), 1024u) << r.err.substr(0, 500);
    }
  }
  EXPECT_NE(Run("plan " + utf8).err.find("line 1, column 23: invalid UTF-8 in string"),
            std::string::npos);
}

TEST_F(CliTest, UsageErrorsExitTwo) {
  for (const char* args :
       {"plan", "plan a.json b.json", "plan --no-such-flag x.json", "no-such-command"}) {
    const Result r = Run(args);
    EXPECT_EQ(r.status, 2) << args;
    EXPECT_EQ(Lines(r.err), 1) << args << ": " << r.err;
  }
}

TEST_F(CliTest, HelpExitsZeroAndDocumentsEveryOption) {
  const Result r = Run("plan --help");
  EXPECT_EQ(r.status, 0);
  for (const char* word : {"--verify", "--json", "--explain", "--tiles", "exit status"}) {
    EXPECT_NE(r.out.find(word), std::string::npos) << word;
  }
  EXPECT_EQ(Run("--help").status, 0);
}

TEST_F(CliTest, EveryExampleSpecVerifiesWithJsonOutput) {
  int specs = 0;
  for (const auto& entry :
       fs::directory_iterator(fs::path(RESHARD_SOURCE_DIR) / "examples/specs")) {
    if (entry.path().extension() != ".json") continue;
    ++specs;
    const Result r = Run("plan " + entry.path().string() + " --verify --json");
    ASSERT_EQ(r.status, 0) << entry.path() << ": " << r.err;
    EXPECT_EQ(r.err, "");
    auto doc = json::Parse(r.out);
    ASSERT_TRUE(doc.ok()) << doc.status() << "\n" << r.out;
    ASSERT_TRUE(doc->is_object());
    const json::Value* ok = doc->Find("ok");
    ASSERT_NE(ok, nullptr);
    EXPECT_TRUE(ok->is_bool() && ok->as_bool());
    ASSERT_NE(doc->Find("verify"), nullptr);
    EXPECT_EQ(doc->Find("verify")->as_string(), "passed") << entry.path();
    for (const char* key : {"tensors", "pieces", "regions"}) {
      ASSERT_NE(doc->Find(key), nullptr) << key;
      EXPECT_TRUE(doc->Find(key)->is_integer()) << key;
      EXPECT_GT(doc->Find(key)->as_int(), 0) << key;
    }
    const json::Value* bytes = doc->Find("bytes");
    ASSERT_NE(bytes, nullptr);
    for (const char* key : {"dst_total", "network", "relay", "staged", "local", "fanout"}) {
      ASSERT_NE(bytes->Find(key), nullptr) << key;
      EXPECT_TRUE(bytes->Find(key)->is_integer()) << key;
    }
    EXPECT_LE(bytes->Find("relay")->as_int(), bytes->Find("network")->as_int());
    EXPECT_GT(bytes->Find("dst_total")->as_int(), 0);
    ASSERT_NE(doc->Find("plan_seconds"), nullptr);
    EXPECT_TRUE(doc->Find("plan_seconds")->is_number());
    ASSERT_NE(doc->Find("fingerprint"), nullptr);
    EXPECT_TRUE(doc->Find("fingerprint")->is_string());
    EXPECT_FALSE(doc->Find("fingerprint")->as_string().empty());
  }
  EXPECT_GE(specs, 4);
}

// `plan --rank R`: each rank's share carries the world plan's fingerprint and totals, and the
// shares of all ranks add up to the world's network and fan-out bytes.
TEST_F(CliTest, PlanOneRankSharesAddUpToTheWorld) {
  const std::string spec =
      std::string(RESHARD_SOURCE_DIR) + "/examples/specs/fig3-tp4-to-tp2dp2.json";
  auto world = json::Parse(Run("plan " + spec + " --json").out);
  ASSERT_TRUE(world.ok()) << world.status();
  const int64_t world_size = world->Find("world_size")->as_int();
  int64_t network_out = 0, network_in = 0, fanout_out = 0, fanout_in = 0;
  for (int64_t r = 0; r < world_size; ++r) {
    const Result res = Run("plan " + spec + " --rank " + std::to_string(r) + " --json");
    ASSERT_EQ(res.status, 0) << res.err;
    auto doc = json::Parse(res.out);
    ASSERT_TRUE(doc.ok()) << doc.status() << "\n" << res.out;
    EXPECT_EQ(doc->Find("fingerprint")->as_string(), world->Find("fingerprint")->as_string());
    EXPECT_EQ(doc->Find("pieces")->as_int(), world->Find("pieces")->as_int());
    const json::Value* rank = doc->Find("rank");
    ASSERT_NE(rank, nullptr);
    EXPECT_EQ(rank->Find("rank")->as_int(), r);
    EXPECT_GT(rank->Find("peak_rss_bytes")->as_int(), 0);
    const json::Value* bytes = rank->Find("bytes");
    ASSERT_NE(bytes, nullptr);
    network_out += bytes->Find("network_out")->as_int();
    network_in += bytes->Find("network_in")->as_int();
    fanout_out += bytes->Find("fanout_out")->as_int();
    fanout_in += bytes->Find("fanout_in")->as_int();
  }
  const json::Value* bytes = world->Find("bytes");
  EXPECT_GT(bytes->Find("network")->as_int(), 0);
  EXPECT_EQ(network_out, bytes->Find("network")->as_int());
  EXPECT_EQ(network_in, bytes->Find("network")->as_int());
  EXPECT_EQ(fanout_out, bytes->Find("fanout")->as_int());
  EXPECT_EQ(fanout_in, bytes->Find("fanout")->as_int());
  // The text form names the rank's share.
  const Result text = Run("plan " + spec + " --rank 4");
  EXPECT_EQ(text.status, 0);
  EXPECT_NE(text.out.find("rank 4"), std::string::npos) << text.out;
  // A rank outside the world, or --verify with --rank: usage errors in one line.
  for (const std::string& args : {std::string(" --rank 99"), std::string(" --rank 0 --verify")}) {
    const Result bad = Run("plan " + spec + args);
    EXPECT_EQ(bad.status, 2) << args;
    EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
  }
}

TEST_F(CliTest, FingerprintIsTheSameAcrossRuns) {
  const std::string spec = std::string(RESHARD_SOURCE_DIR) + "/examples/specs/fused-qkv.json";
  auto a = json::Parse(Run("plan " + spec + " --json").out);
  auto b = json::Parse(Run("plan " + spec + " --json").out);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->Find("fingerprint")->as_string(), b->Find("fingerprint")->as_string());
  EXPECT_EQ(a->Find("verify")->as_string(), "skipped");
}

TEST_F(CliTest, TilesPrintEveryRanksTileAsJson) {
  const std::string spec = std::string(RESHARD_SOURCE_DIR) + "/examples/specs/uneven-nested.json";
  const Result r = Run("plan " + spec + " --tiles");
  ASSERT_EQ(r.status, 0) << r.err;
  auto doc = json::Parse(r.out);
  ASSERT_TRUE(doc.ok()) << doc.status() << "\n" << r.out;
  ASSERT_TRUE(doc->is_array());
  ASSERT_EQ(doc->items().size(), 1u);
  const json::Value& t = doc->items()[0];
  EXPECT_EQ(t.Find("name")->as_string(), "t");
  // DESIGN: 10 rows over a 2x2 mesh, both axes S(0) -> [0,3) [3,5) [5,8) [8,10).
  const json::Value* src = t.Find("src");
  ASSERT_NE(src, nullptr);
  ASSERT_EQ(src->items().size(), 4u);
  const int64_t lo[] = {0, 3, 5, 8}, rows[] = {3, 2, 3, 2};
  for (int i = 0; i < 4; ++i) {
    const json::Value& tile = src->items()[i];
    ASSERT_NE(tile.Find("rank"), nullptr);
    ASSERT_NE(tile.Find("offset"), nullptr);
    ASSERT_NE(tile.Find("shape"), nullptr);
    EXPECT_EQ(tile.Find("rank")->as_int(), i);
    EXPECT_EQ(tile.Find("offset")->items()[0].as_int(), lo[i]);
    EXPECT_EQ(tile.Find("offset")->items()[1].as_int(), 0);
    EXPECT_EQ(tile.Find("shape")->items()[0].as_int(), rows[i]);
    EXPECT_EQ(tile.Find("shape")->items()[1].as_int(), 7);
  }
  // 7 columns over 3 ranks: 3, 3, 1.
  const json::Value* dst = t.Find("dst");
  ASSERT_EQ(dst->items().size(), 3u);
  EXPECT_EQ(dst->items()[2].Find("rank")->as_int(), 6);
  EXPECT_EQ(dst->items()[2].Find("offset")->items()[1].as_int(), 6);
  EXPECT_EQ(dst->items()[2].Find("shape")->items()[1].as_int(), 1);
  // With --json the same tiles sit under "tiles".
  auto with_json = json::Parse(Run("plan " + spec + " --tiles --json").out);
  ASSERT_TRUE(with_json.ok());
  ASSERT_NE(with_json->Find("tiles"), nullptr);
  EXPECT_EQ(with_json->Find("tiles")->items().size(), 1u);
}

TEST_F(CliTest, ExplainPrintsATablePerTensor) {
  const std::string spec = std::string(RESHARD_SOURCE_DIR) + "/examples/specs/fused-qkv.json";
  const Result r = Run("plan " + spec + " --explain --verify");
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* word : {"tensor", "pieces", "contiguous", "verify      passed"}) {
    EXPECT_NE(r.out.find(word), std::string::npos) << word << "\n" << r.out;
  }
  for (const char* name : {"q ", "k ", "v "}) EXPECT_NE(r.out.find(name), std::string::npos);
}

std::string Example(const std::string& rel) {
  return std::string(RESHARD_SOURCE_DIR) + "/examples/" + rel;
}

// tiny-moe: 5 layers (layer 0 dense), 8 experts of I = 24, H = 64; trainers are ranks 0..7 (stage
// 1 = ranks 4..7 with layers 2..4, experts 4..7 on ranks 6 and 7), inference tp=2, dp=2 at 8..11.
const std::string kTinyMoe = "--model " + Example("models/tiny-moe.json") +
                             " --train tp=2,ep=2,pp=2,gpus=8 --infer tp=2,dp=2";

// The parsed output, or why there is none (the exit status and standard error, or the parse
// error).
absl::StatusOr<json::Value> CliTest::SimTinyMoeJson(const std::string& extra) {
  const Result r = Run("sim " + kTinyMoe + " --cluster " + Example("clusters/h100-nvl8.json") +
                       " --json" + extra);
  if (r.status != 0) {
    return absl::InternalError(
        absl::StrCat("reshard sim", extra, " exited ", r.status, ": ", r.err));
  }
  return json::Parse(r.out);
}

// Elements of destination tiles per rank, from `reshard plan --tiles --json`.
std::map<int64_t, int64_t> DstElementsPerRank(const json::Value& plan_json) {
  std::map<int64_t, int64_t> out;
  for (const json::Value& tensor : plan_json.Find("tiles")->items()) {
    for (const json::Value& tile : tensor.Find("dst")->items()) {
      int64_t n = 1;
      for (const json::Value& d : tile.Find("shape")->items()) n *= d.as_int();
      out[tile.Find("rank")->as_int()] += n;
    }
  }
  return out;
}

const json::Value* FindTensor(const json::Value& spec, const std::string& name) {
  for (const json::Value& t : spec.Find("tensors")->items()) {
    if (t.Find("name")->as_string() == name) return &t;
  }
  return nullptr;
}

std::vector<int64_t> Ints(const json::Value& list) {
  std::vector<int64_t> out;
  for (const json::Value& v : list.items()) out.push_back(v.as_int());
  return out;
}

TEST_F(CliTest, SpecHelpDocumentsEveryOption) {
  const Result r = Run("spec --help");
  EXPECT_EQ(r.status, 0);
  for (const char* word : {"--model", "--train", "--infer", "--cluster", "--per-expert", "--dtype",
                           "--layers", "-o, --output", "exit status"}) {
    EXPECT_NE(r.out.find(word), std::string::npos) << word;
  }
  EXPECT_NE(Run("--help").out.find("spec"), std::string::npos);
  EXPECT_NE(Run("sim --help").out.find("--per-expert"), std::string::npos);
  EXPECT_NE(Run("bench --help").out.find("--per-expert"), std::string::npos);
}

TEST_F(CliTest, SpecErrorsAreOneSentenceAndExitTwo) {
  const fs::path gpt2 = Write("gpt2.json", R"({"model_type": "gpt2", "hidden_size": 8})");
  const std::string tiny = "--model " + Example("models/tiny-moe.json");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"spec", "reshard spec: needs --model M.json, --train P and --infer P (see --help)"},
      {"spec " + tiny + " --train tp=2", "reshard spec: needs --model M.json, --train P and"},
      {"spec --model /nonexistent/m.json --train tp=1,dp=1 --infer tp=1",
       "reshard spec: /nonexistent/m.json: cannot open the model config"},
      {"spec --model " + gpt2.string() + " --train tp=1,dp=1 --infer tp=1",
       "reshard spec: " + gpt2.string() + ": "},
      {"spec " + tiny + " --train tp=3,dp=1 --infer tp=2",
       "reshard spec: train.tp: 3 does not divide num_attention_heads (8)"},
      {"spec " + tiny + " --train tp=2,xp=1 --infer tp=2",
       "reshard spec: train parallelism \"tp=2,xp=1\": unknown key \"xp\""},
      {"spec " + tiny + " --train tp=2,dp=1 --infer tp=2,dp=2,ep=3",
       "reshard spec: infer.ep: 3 does not divide the 8 experts"},
      {"spec --model " + Example("models/qwen3-32b.json") +
           " --train tp=8,dp=1 --infer tp=8 --per-expert",
       "reshard spec: experts: per-expert tensors need routed experts, and this qwen3 model has "
       "none"},
      {"spec " + kTinyMoe + " --dtype fp7", "reshard spec: --dtype \"fp7\" is unknown"},
      {"spec " + kTinyMoe + " --layers 0", "reshard spec: --layers must be a positive integer"},
      {"spec " + kTinyMoe + " extra.json", "reshard spec: takes no positional arguments"},
      {"spec " + kTinyMoe + " -o", "reshard spec: -o needs a value"},
      {"spec " + kTinyMoe + " --per-expert=yes", "reshard spec: --per-expert takes no value"},
  };
  for (const auto& [args, prefix] : cases) {
    const Result r = Run(args);
    EXPECT_EQ(r.status, 2) << args;
    EXPECT_EQ(r.out, "") << args;
    EXPECT_EQ(Lines(r.err), 1) << args << ": " << r.err;
    EXPECT_EQ(r.err.rfind(prefix, 0), 0u) << args << ": " << r.err;
  }
  EXPECT_NE(Run("spec --model " + gpt2.string() + " --train tp=1,dp=1 --infer tp=1")
                .err.find("\"gpt2\" is not supported"),
            std::string::npos);
  const Result unwritable = Run("spec " + kTinyMoe + " -o /nonexistent/dir/spec.json");
  EXPECT_EQ(unwritable.status, 1);
  EXPECT_EQ(Lines(unwritable.err), 1) << unwritable.err;
  EXPECT_EQ(unwritable.err.rfind("reshard spec: cannot write /nonexistent/dir/spec.json: ", 0), 0u)
      << unwritable.err;
}

TEST_F(CliTest, SpecIsDeterministicOnStdoutAndInAFile) {
  for (const char* per_expert : {"", " --per-expert"}) {
    const Result a = Run("spec " + kTinyMoe + per_expert);
    const Result b = Run("spec " + kTinyMoe + per_expert);
    ASSERT_EQ(a.status, 0) << a.err;
    EXPECT_EQ(a.err, "");
    EXPECT_EQ(a.out, b.out);
    const fs::path file = dir_ / "spec.json";
    const Result written = Run("spec " + kTinyMoe + per_expert + " -o " + file.string());
    EXPECT_EQ(written.status, 0) << written.err;
    EXPECT_EQ(written.out, "");
    EXPECT_EQ(ReadFile(file), a.out);
    const Result long_form = Run("spec " + kTinyMoe + per_expert + " --output=" + file.string());
    EXPECT_EQ(long_form.status, 0) << long_form.err;
    EXPECT_EQ(ReadFile(file), a.out);
  }
}

// What `reshard spec` writes, `reshard plan` reads, plans and verifies; the per-expert form names
// each expert's matrices, places them where the stack's slices live, and delivers exactly the
// stacked form's bytes to every destination rank.
TEST_F(CliTest, PlanReadsBackWhatSpecWroteAndPerExpertAgreesInBytesWithStacked) {
  const fs::path stacked = dir_ / "stacked.json", per_expert = dir_ / "per_expert.json";
  ASSERT_EQ(Run("spec " + kTinyMoe + " -o " + stacked.string()).status, 0);
  ASSERT_EQ(Run("spec " + kTinyMoe + " --per-expert -o " + per_expert.string()).status, 0);

  auto spec = json::Parse(ReadFile(per_expert));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->Find("tensors")->items().size(), 146u);
  EXPECT_EQ(FindTensor(*spec, "layers.3.mlp.experts.gate_proj"), nullptr);
  const json::Value* up = FindTensor(*spec, "layers.3.mlp.experts.5.up_proj");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->Find("dtype")->as_string(), "bf16");
  EXPECT_EQ(Ints(*up->Find("shape")), (std::vector<int64_t>{24, 64}));
  EXPECT_EQ(Ints(*up->Find("src")->Find("mesh")), (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(up->Find("src")->Find("placements")->items()[0].as_string(), "S(0)");
  const json::Value* dst = up->Find("dst");
  EXPECT_EQ(dst->Find("placements")->items()[1].as_string(), "S(0)");
  EXPECT_EQ(dst->Find("buffer")->as_string(), "layers.3.mlp.experts.w13_weight");
  EXPECT_EQ(dst->Find("view")->Find("offset")->as_int(), 5 * 24 * 64 + 12 * 64);
  EXPECT_EQ(Ints(*dst->Find("view")->Find("strides")), (std::vector<int64_t>{64, 1}));
  const json::Value* down = FindTensor(*spec, "layers.4.mlp.experts.0.down_proj");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(Ints(*down->Find("shape")), (std::vector<int64_t>{64, 24}));
  EXPECT_EQ(Ints(*down->Find("src")->Find("mesh")), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(down->Find("dst")->Find("buffer")->as_string(), "layers.4.mlp.experts.down_proj");
  EXPECT_EQ(down->Find("dst")->Find("view")->Find("offset")->as_int(), 0);

  const Result a = Run("plan " + stacked.string() + " --verify --tiles --json");
  const Result b = Run("plan " + per_expert.string() + " --verify --tiles --json");
  ASSERT_EQ(a.status, 0) << a.err;
  ASSERT_EQ(b.status, 0) << b.err;
  auto plan_a = json::Parse(a.out);
  auto plan_b = json::Parse(b.out);
  ASSERT_TRUE(plan_a.ok() && plan_b.ok());
  EXPECT_EQ(plan_a->Find("verify")->as_string(), "passed");
  EXPECT_EQ(plan_b->Find("verify")->as_string(), "passed");
  EXPECT_EQ(plan_a->Find("tensors")->as_int(), 62);
  EXPECT_EQ(plan_b->Find("tensors")->as_int(), 146);
  EXPECT_EQ(plan_a->Find("world_size")->as_int(), 12);
  EXPECT_EQ(plan_b->Find("world_size")->as_int(), 12);
  EXPECT_EQ(plan_b->Find("bytes")->Find("dst_total")->as_int(),
            plan_a->Find("bytes")->Find("dst_total")->as_int());
  const std::map<int64_t, int64_t> per_rank = DstElementsPerRank(*plan_b);
  EXPECT_EQ(per_rank, DstElementsPerRank(*plan_a));
  EXPECT_EQ(per_rank.size(), 4u);  // Inference ranks 8..11 only.
  EXPECT_EQ(per_rank.begin()->first, 8);
}

// `reshard sim --no-baselines` simulates ours and the lower bound only: the same figures for
// ours, no baseline rows, and null for the baselines in JSON.
TEST_F(CliTest, SimWithoutBaselinesGivesTheSameOursAndNullBaselines) {
  auto a = SimTinyMoeJson("");
  auto b = SimTinyMoeJson(" --no-baselines");
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  for (const char* key : {"seconds", "network_bytes", "max_nic_bytes"}) {
    EXPECT_EQ(b->Find("ours")->Find(key)->as_double(), a->Find("ours")->Find(key)->as_double())
        << key;
  }
  EXPECT_EQ(b->Find("lower_bound")->Find("seconds")->as_double(),
            a->Find("lower_bound")->Find("seconds")->as_double());
  for (const char* key : {"naive_p2p", "gather_broadcast", "gather_broadcast_serial"}) {
    EXPECT_TRUE(b->Find(key)->is_null()) << key;
    EXPECT_FALSE(a->Find(key)->is_null()) << key;
  }
  EXPECT_TRUE(b->Find("timings")->Find("naive_p2p")->is_null());
  const Result text = Run("sim " + kTinyMoe + " --cluster " + Example("clusters/h100-nvl8.json") +
                          " --no-baselines");
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("lower bound"), std::string::npos) << text.out;
  EXPECT_EQ(text.out.find("gather-broadcast "), std::string::npos) << text.out;
  EXPECT_EQ(text.out.find("naive P2P"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("baselines not simulated"), std::string::npos) << text.out;
}

// Two trainers in one domain feed three inference domains of two ranks: relays carry most of
// "a"; "b" goes to one domain only.
// `reshard plan` reports the relayed bytes, part of the network's, in JSON and in its text.
TEST_F(CliTest, PlanReportsRelayedBytes) {
  const fs::path spec = Write("relays.json", plan::kRelaySpec);
  const Result r = Run("plan " + spec.string() + " --json");
  ASSERT_EQ(r.status, 0) << r.err;
  auto doc = json::Parse(r.out);
  ASSERT_TRUE(doc.ok()) << doc.status();
  const json::Value* bytes = doc->Find("bytes");
  ASSERT_NE(bytes, nullptr);
  ASSERT_NE(bytes->Find("relay"), nullptr);
  const int64_t relay = bytes->Find("relay")->as_int();
  EXPECT_GT(relay, 0);
  EXPECT_LT(relay, bytes->Find("network")->as_int());
  const Result text = Run("plan " + spec.string());
  ASSERT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("over the network ("), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("of it relayed between domains"), std::string::npos) << text.out;
  // Without relays or staging the line says nothing of them.
  const Result plain = Run("plan " + Example("specs/fig1-rows-to-cols.json"));
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_EQ(plain.out.find("relayed"), std::string::npos) << plain.out;
}

// `reshard sim --relay-priority W` (a what-if): the same plan, so the same bytes on the same NICs
// and the same bound, only shared differently; W below 1 or not a number is refused.
TEST_F(CliTest, SimRelayPriorityIsAWhatIfOverTheSamePlan) {
  const fs::path spec = Write("relays.json", plan::kRelaySpec);
  const auto sim = [&](const std::string& extra) -> absl::StatusOr<json::Value> {
    const Result r = Run("sim --spec " + spec.string() + " --json --no-baselines" + extra);
    if (r.status != 0) return absl::InternalError(absl::StrCat("exited ", r.status, ": ", r.err));
    return json::Parse(r.out);
  };
  auto fair = sim("");
  auto weighted = sim(" --relay-priority 10");
  ASSERT_TRUE(fair.ok() && weighted.ok()) << fair.status() << weighted.status();
  EXPECT_GT(fair->Find("ours_plan")->Find("bytes_relay")->as_int(), 0);
  for (const char* key : {"network_bytes", "max_nic_bytes"}) {
    EXPECT_EQ(weighted->Find("ours")->Find(key)->as_int(), fair->Find("ours")->Find(key)->as_int())
        << key;
  }
  EXPECT_EQ(weighted->Find("lower_bound")->Find("seconds")->as_double(),
            fair->Find("lower_bound")->Find("seconds")->as_double());
  EXPECT_GE(weighted->Find("ours")->Find("seconds")->as_double(),
            fair->Find("lower_bound")->Find("seconds")->as_double());
  for (const char* bad : {" --relay-priority 0.5", " --relay-priority x"}) {
    const Result r = Run("sim --spec " + spec.string() + bad);
    EXPECT_EQ(r.status, 2) << bad;
    EXPECT_EQ(Lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("--relay-priority"), std::string::npos) << r.err;
  }
}

// `reshard sim --change-fraction F`: relays forward delta streams as the engine does, so on a
// spec whose relays carry most of the network bytes the delta refit's network bytes follow the
// change fraction, and the refit is faster; the withdrawn what-if `--relay-deltas` is refused.
TEST_F(CliTest, SimDeltaRefitsShrinkRelaysToo) {
  const fs::path spec = Write("relays.json", plan::kRelaySpec);
  const Result r =
      Run("sim --spec " + spec.string() + " --json --no-baselines --change-fraction 0.05");
  ASSERT_EQ(r.status, 0) << r.err;
  auto doc = json::Parse(r.out);
  ASSERT_TRUE(doc.ok()) << doc.status();
  const json::Value* ours = doc->Find("ours");
  const json::Value* delta = doc->Find("delta")->Find("result");
  const double ratio = doc->Find("delta")->Find("bytes_ratio")->as_double();
  // bytes_ratio is for bf16; kRelaySpec is fp32, whose streams are smaller still.
  EXPECT_LE(static_cast<double>(delta->Find("network_bytes")->as_int()),
            ratio * static_cast<double>(ours->Find("network_bytes")->as_int()));
  EXPECT_LT(delta->Find("seconds")->as_double(), ours->Find("seconds")->as_double());
  // The memory the delta refit holds (plan::DeltaMemoryOf, checked against the engine's send
  // programs in net_send_program_test): every piece's capacity lands somewhere.
  const json::Value* memory = doc->Find("delta")->Find("memory");
  ASSERT_NE(memory, nullptr) << r.out;
  EXPECT_GT(memory->Find("max_shadow_bytes")->as_int(), 0);
  EXPECT_GE(memory->Find("max_landing_rank")->as_int(), 0);
  EXPECT_EQ(memory->Find("send_scratch_bytes")->as_int(), memory->Find("landing_bytes")->as_int());
  const Result human =
      Run("sim --spec " + spec.string() + " --no-baselines --change-fraction 0.05");
  EXPECT_NE(human.out.find("delta memory per rank, at most: shadows"), std::string::npos)
      << human.out;
  const Result refused =
      Run("sim --spec " + spec.string() + " --change-fraction 0.05 --relay-deltas");
  EXPECT_EQ(refused.status, 2);
  EXPECT_EQ(Lines(refused.err), 1) << refused.err;
  EXPECT_NE(refused.err.find("relay-deltas"), std::string::npos) << refused.err;
}

// `reshard sim --per-expert` simulates the same refit: the same bytes must cross the network.
TEST_F(CliTest, SimPerExpertMovesTheSameBytesAsStacked) {
  auto sim_a = SimTinyMoeJson("");
  auto sim_b = SimTinyMoeJson(" --per-expert");
  ASSERT_TRUE(sim_a.ok() && sim_b.ok()) << sim_a.status() << sim_b.status();
  EXPECT_EQ(sim_a->Find("tensors")->as_int(), 62);
  EXPECT_EQ(sim_b->Find("tensors")->as_int(), 146);
  EXPECT_EQ(sim_b->Find("lower_bound")->Find("network_bytes")->as_int(),
            sim_a->Find("lower_bound")->Find("network_bytes")->as_int());
  EXPECT_NE(sim_b->Find("title")->as_string().find("per-expert"), std::string::npos);
  const Result excluded = Run("sim --spec " + Example("specs/fused-qkv.json") + " --per-expert");
  EXPECT_EQ(excluded.status, 2);
  EXPECT_EQ(Lines(excluded.err), 1) << excluded.err;
}

// DeepSeek-V3 with one tensor per expert matrix: 1,025 - 58 x 3 stacks + 58 x 256 x 3 tensors.
TEST_F(CliTest, SpecWritesDeepSeekV3PerExpert) {
  const fs::path file = dir_ / "deepseek.json";
  const Result r =
      Run("spec --model " + Example("models/deepseek-v3.json") + " --cluster " +
          Example("clusters/h100-nvl8.json") +
          " --train pp=16,ep=16,gpus=256 --infer tp=32,dp=1 --per-expert -o " + file.string());
  ASSERT_EQ(r.status, 0) << r.err;
  auto spec = json::Parse(ReadFile(file));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->Find("tensors")->items().size(), 45395u);
  const json::Value* gate = FindTensor(*spec, "layers.60.mlp.experts.255.gate_proj");
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(Ints(*gate->Find("shape")), (std::vector<int64_t>{2048, 7168}));
  // The last stage's 16 ranks (240..255) hold 16 experts each: expert 255 on rank 255, whole.
  EXPECT_EQ(Ints(*gate->Find("src")->Find("mesh")), (std::vector<int64_t>{255}));
  // Inference TP32 from rank 256 (one replica keeps the file at 10 MB): I split over the 32
  // ranks, as a view at local expert 255 of w13_weight [256, 2 x 64, 7168].
  const json::Value* dst = gate->Find("dst");
  EXPECT_EQ(dst->Find("mesh")->items().size(), 32u);
  EXPECT_EQ(dst->Find("mesh")->items()[0].as_int(), 256);
  EXPECT_EQ(dst->Find("placements")->items().size(), 1u);
  EXPECT_EQ(dst->Find("placements")->items()[0].as_string(), "S(0)");
  EXPECT_EQ(dst->Find("view")->Find("offset")->as_int(), 255 * 128 * 7168);
}

}  // namespace
}  // namespace reshard
