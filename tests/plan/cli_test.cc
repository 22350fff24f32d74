// `reshard plan` as users run it: exit statuses, one-line errors, machine-readable output.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "src/common/json.h"

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
    for (const char* key : {"dst_total", "network", "local"}) {
      ASSERT_NE(bytes->Find(key), nullptr) << key;
      EXPECT_TRUE(bytes->Find(key)->is_integer()) << key;
    }
    EXPECT_GT(bytes->Find("dst_total")->as_int(), 0);
    ASSERT_NE(doc->Find("plan_seconds"), nullptr);
    EXPECT_TRUE(doc->Find("plan_seconds")->is_number());
    ASSERT_NE(doc->Find("fingerprint"), nullptr);
    EXPECT_TRUE(doc->Find("fingerprint")->is_string());
    EXPECT_FALSE(doc->Find("fingerprint")->as_string().empty());
  }
  EXPECT_GE(specs, 4);
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

}  // namespace
}  // namespace reshard
