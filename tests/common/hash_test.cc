// Fill values and fingerprints: deterministic, sensitive to every input, never index % 256.
#include "src/common/hash.h"

#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "src/common/checked.h"

namespace reshard {
namespace {

TEST(HashTest, FillValuesDifferAcrossIndexTensorAndEpoch) {
  const uint64_t key = HashString("layers.0.w");
  std::set<uint64_t> values, low_bytes_at_256;
  for (uint64_t i = 0; i < 4096; ++i) values.insert(FillValue(key, i, 1));
  EXPECT_EQ(values.size(), 4096u);
  // Elements 256 apart (which index % 256 would confuse) get different low bytes.
  int same_low_byte = 0;
  for (uint64_t i = 0; i < 1024; ++i) {
    same_low_byte += (FillValue(key, i, 1) & 0xff) == (FillValue(key, i + 256, 1) & 0xff);
  }
  EXPECT_LT(same_low_byte, 16);  // About 1024 / 256 by chance.
  EXPECT_NE(FillValue(key, 7, 1), FillValue(key, 7, 2));
  EXPECT_NE(FillValue(key, 7, 1), FillValue(HashString("layers.0.v"), 7, 1));
  EXPECT_EQ(FillValue(key, 7, 1), FillValue(HashString("layers.0.w"), 7, 1));
}

uint64_t FingerprintOf(const std::vector<uint64_t>& words) {
  Fingerprint fp;
  for (uint64_t w : words) fp.Add(w);
  return fp.value();
}

TEST(HashTest, FingerprintIsDeterministicAndSensitiveToValueOrderAndLength) {
  const std::vector<uint64_t> base = {1, 2, 3, 0, 0xffffffffffffffffULL};
  EXPECT_EQ(FingerprintOf(base), FingerprintOf(base));
  std::set<uint64_t> seen = {FingerprintOf(base)};
  // Every single-word change, swap, truncation and extension gives a new value.
  for (size_t i = 0; i < base.size(); ++i) {
    for (uint64_t delta : {1ULL, 1ULL << 63, 0x100ULL}) {
      auto w = base;
      w[i] += delta;
      EXPECT_TRUE(seen.insert(FingerprintOf(w)).second) << i << " " << delta;
    }
  }
  auto swapped = base;
  std::swap(swapped[0], swapped[1]);
  EXPECT_TRUE(seen.insert(FingerprintOf(swapped)).second);
  auto shorter = base;
  shorter.pop_back();
  EXPECT_TRUE(seen.insert(FingerprintOf(shorter)).second);
  auto longer = base;
  longer.push_back(0);
  EXPECT_TRUE(seen.insert(FingerprintOf(longer)).second);
  EXPECT_TRUE(seen.insert(FingerprintOf({})).second);
  // Strings are length-prefixed: ("ab", "c") differs from ("a", "bc").
  Fingerprint a, b;
  a.Add(std::string_view("ab"));
  a.Add(std::string_view("c"));
  b.Add(std::string_view("a"));
  b.Add(std::string_view("bc"));
  EXPECT_NE(a.value(), b.value());
}

TEST(CheckedTest, OverflowIsReportedNotWrapped) {
  EXPECT_EQ(CheckedMul(int64_t{1} << 31, int64_t{1} << 31), int64_t{1} << 62);
  EXPECT_FALSE(CheckedMul(int64_t{1} << 32, int64_t{1} << 31).has_value());
  EXPECT_FALSE(CheckedAdd(INT64_MAX, 1).has_value());
  EXPECT_EQ(CheckedAdd(-5, 3), -2);
  EXPECT_EQ(CeilDiv(10, 4), 3);
  EXPECT_EQ(CeilDiv(0, 4), 0);
  EXPECT_EQ(CeilDiv(8, 4), 2);
  EXPECT_EQ(CeilDiv(5, 0), 0);
}

}  // namespace
}  // namespace reshard
