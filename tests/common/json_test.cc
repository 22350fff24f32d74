#include "src/common/json.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <iterator>
#include <string>
#include <utility>

namespace reshard::json {
namespace {

TEST(JsonTest, ParsesNestedValuesWithPositions) {
  auto v = Parse("{\n  \"a\": [1, -2.5, true, null],\n  \"b\": \"x\\u00e9\"\n}");
  ASSERT_TRUE(v.ok()) << v.status();
  const Value* a = v->Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items().size(), 4u);
  EXPECT_TRUE(a->items()[0].is_integer());
  EXPECT_EQ(a->items()[0].as_int(), 1);
  EXPECT_FALSE(a->items()[1].is_integer());
  EXPECT_DOUBLE_EQ(a->items()[1].as_double(), -2.5);
  EXPECT_EQ(a->line(), 2);
  EXPECT_EQ(a->column(), 8);
  EXPECT_EQ(v->Find("b")->as_string(), "x\xc3\xa9");
}

TEST(JsonTest, ReportsLineAndColumnOfSyntaxErrors) {
  auto v = Parse("{\n  \"a\": [1, 2,,]\n}");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(std::string(v.status().message()),
            "line 2, column 14: unexpected character ',', expected a value");
}

TEST(JsonTest, RejectsDuplicateKeysTrailingTextAndHugeIntegers) {
  EXPECT_FALSE(Parse("{\"a\": 1, \"a\": 2}").ok());
  EXPECT_FALSE(Parse("{} x").ok());
  auto big = Parse("123456789012345678901234567890");
  ASSERT_TRUE(big.ok());
  EXPECT_FALSE(big->is_integer());
}

TEST(JsonTest, QuoteEscapes) { EXPECT_EQ(Quote("a\"b\\\n"), "\"a\\\"b\\\\\\n\""); }

TEST(JsonTest, RejectsInvalidUtf8WithLineAndColumn) {
  // A bad byte, an overlong '/', a surrogate, above U+10FFFF, a cut sequence.
  for (const char* bad : {"\xff", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xe2\x82"}) {
    auto v = Parse(std::string("[\n \"a") + bad + "\"]");
    ASSERT_FALSE(v.ok()) << bad;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(v.status().message()), "line 2, column 4: invalid UTF-8 in string");
  }
  // Well-formed multi-byte characters pass through; so do escaped pairs.
  auto ok = Parse("[\"\xe2\x82\xac \xf0\x9f\x98\x80 \\ud83d\\ude00\"]");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->items()[0].as_string(), "\xe2\x82\xac \xf0\x9f\x98\x80 \xf0\x9f\x98\x80");
  EXPECT_TRUE(IsValidUtf8(ok->items()[0].as_string()));
  // A lone low surrogate would decode to invalid UTF-8.
  auto low = Parse("\"\\udc00\"");
  ASSERT_FALSE(low.ok());
  EXPECT_EQ(std::string(low.status().message()), "line 1, column 8: unpaired surrogate in string");
  // A stray byte outside strings is named, escaped.
  auto stray = Parse("[\xff]");
  ASSERT_FALSE(stray.ok());
  EXPECT_EQ(std::string(stray.status().message()),
            "line 1, column 2: unexpected character '\\xff', expected a value");
}

TEST(JsonTest, RejectsNonFiniteNumbers) {
  auto huge = Parse("{\"a\":\n  [1, 1e99999]}");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(std::string(huge.status().message()),
            "line 2, column 7: number \"1e99999\" is out of range (it does not fit in a double)");
  EXPECT_FALSE(Parse("-1e400").ok());
  for (const char* word : {"NaN", "Infinity", "-Infinity", "nan"}) {
    auto v = Parse(std::string("[") + word + "]");
    ASSERT_FALSE(v.ok()) << word;
    EXPECT_EQ(std::string(v.status().message()).rfind("line 1, column ", 0), 0u) << v.status();
  }
  // Underflow is not infinity: it reads as zero.
  auto tiny = Parse("1e-99999");
  ASSERT_TRUE(tiny.ok());
  EXPECT_EQ(tiny->as_double(), 0);
}

TEST(JsonTest, OnlyExactIntegersAreIntegers) {
  auto v = Parse("[2.5, 2.0, 1e3, 9223372036854775807, 9223372036854775808, -9223372036854775808]");
  ASSERT_TRUE(v.ok());
  const auto& x = v->items();
  EXPECT_FALSE(x[0].is_integer());
  EXPECT_FALSE(x[1].is_integer());
  EXPECT_FALSE(x[2].is_integer());
  EXPECT_TRUE(x[3].is_integer());
  EXPECT_EQ(x[3].as_int(), INT64_MAX);
  EXPECT_FALSE(x[4].is_integer());
  EXPECT_TRUE(x[5].is_integer());
  EXPECT_EQ(x[5].as_int(), INT64_MIN);
}

// Integers of up to 18 digits are read without strtod; longer ones, fractions and exponents go
// through it. Both give an integer's double as strtod rounds the literal.
TEST(JsonTest, IntegersReadDirectlyEqualTheLiteralsAndTheirDoubles) {
  auto v = Parse("[0, -0, 7, -7, 999999999999999999, -999999999999999999, 1000000000000000000, "
                 "9007199254740993, 123456789012345678, 1234567890123456789, 0.5]");
  ASSERT_TRUE(v.ok()) << v.status();
  const auto& x = v->items();
  const int64_t expected[] = {0,
                              0,
                              7,
                              -7,
                              999999999999999999,
                              -999999999999999999,
                              1000000000000000000,
                              9007199254740993,
                              123456789012345678,
                              1234567890123456789};
  for (size_t i = 0; i < std::size(expected); ++i) {
    ASSERT_TRUE(x[i].is_integer()) << i;
    EXPECT_EQ(x[i].as_int(), expected[i]) << i;
    EXPECT_EQ(x[i].as_double(), static_cast<double>(expected[i])) << i;
  }
  // 2^53 + 1 is no double: strtod rounds it to 2^53, as the conversion does.
  EXPECT_EQ(x[7].as_double(), 9007199254740992.0);
  EXPECT_FALSE(x[10].is_integer());
  EXPECT_EQ(x[10].as_int(), 0);
  EXPECT_EQ(x[10].as_double(), 0.5);
}

// A value is 24 bytes with its string, array or object contents behind one pointer: copies are
// deep, a moved-from value is null, and a value of one kind answers the others' accessors empty.
TEST(JsonTest, ValuesCopyDeeplyAndMoveToNull) {
  auto v = Parse("{\"a\": [1, [2, \"s\"], {\"k\": 3.5}], \"b\": \"text\"}");
  ASSERT_TRUE(v.ok()) << v.status();
  Value copy = *v;
  Value assigned;
  assigned = copy;
  for (const Value* c : {&copy, &assigned}) {
    ASSERT_TRUE(c->is_object());
    const Value* a = c->Find("a");
    ASSERT_NE(a, nullptr);
    ASSERT_EQ(a->items().size(), 3u);
    EXPECT_NE(&a->items()[0], &v->Find("a")->items()[0]);  // Deep: not the original's.
    EXPECT_EQ(a->items()[1].items()[1].as_string(), "s");
    EXPECT_EQ(a->items()[2].Find("k")->as_double(), 3.5);
    EXPECT_EQ(c->Find("b")->as_string(), "text");
    EXPECT_EQ(c->Find("b")->line(), 1);
  }
  Value moved = std::move(copy);
  EXPECT_TRUE(copy.is_null());  // NOLINT(bugprone-use-after-move): the moved-from state is defined.
  EXPECT_TRUE(copy.items().empty());
  EXPECT_EQ(moved.Find("b")->as_string(), "text");
  moved = std::move(assigned);
  EXPECT_EQ(moved.Find("a")->items()[0].as_int(), 1);
  // Accessors of another kind are empty, not undefined.
  EXPECT_TRUE(moved.Find("b")->items().empty());
  EXPECT_TRUE(moved.Find("a")->members().empty());
  EXPECT_EQ(moved.Find("a")->as_string(), "");
  EXPECT_EQ(moved.Find("a")->as_double(), 0);
  EXPECT_EQ(moved.Find("a")->Find("x"), nullptr);
  static_assert(sizeof(Value) == 24);
}

TEST(JsonTest, DuplicateKeyIsQuotedForTheMessage) {
  auto v = Parse("{\"a\\nb\": 1, \"a\\nb\": 2}");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(std::string(v.status().message()), "line 1, column 13: duplicate key \"a\\nb\"");
}

TEST(JsonTest, QuoteForMessageIsOneBoundedLine) {
  EXPECT_EQ(QuoteForMessage("w"), "\"w\"");
  EXPECT_EQ(QuoteForMessage("a\nb\t\"c\\\x01\x7f"), "\"a\\nb\\t\\\"c\\\\\\u0001\\u007f\"");
  EXPECT_EQ(QuoteForMessage("\xff\xc3\xa9"), "\"\\xff\xc3\xa9\"");
  EXPECT_EQ(QuoteForMessage(std::string(64, 'x')), "\"" + std::string(64, 'x') + "\"");
  EXPECT_EQ(QuoteForMessage(std::string(10000, 'x')), "\"" + std::string(64, 'x') + "\"...");
  EXPECT_EQ(QuoteForMessage("abcdef", 3), "\"abc\"...");
  // Characters, not bytes: a multi-byte character is never cut.
  EXPECT_EQ(QuoteForMessage("\xc3\xa9\xc3\xa9\xc3\xa9", 2), "\"\xc3\xa9\xc3\xa9\"...");
  // Newlines in a huge string: still one line, bounded.
  const std::string q = QuoteForMessage(std::string(50'000'000, '\n'));
  EXPECT_EQ(q.find('\n'), std::string::npos);
  EXPECT_LE(q.size(), 64u * 6 + 5);
}

}  // namespace
}  // namespace reshard::json
