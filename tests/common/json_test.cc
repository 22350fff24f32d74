#include "src/common/json.h"

#include <gtest/gtest.h>

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
  EXPECT_EQ(std::string(v.status().message()), "line 2, column 14: unexpected character ',', expected a value");
}

TEST(JsonTest, RejectsDuplicateKeysTrailingTextAndHugeIntegers) {
  EXPECT_FALSE(Parse("{\"a\": 1, \"a\": 2}").ok());
  EXPECT_FALSE(Parse("{} x").ok());
  auto big = Parse("123456789012345678901234567890");
  ASSERT_TRUE(big.ok());
  EXPECT_FALSE(big->is_integer());
}

TEST(JsonTest, QuoteEscapes) { EXPECT_EQ(Quote("a\"b\\\n"), "\"a\\\"b\\\\\\n\""); }

}  // namespace
}  // namespace reshard::json
