// Overflow-checked integer arithmetic for sizes computed from user input.
//
// Every size, extent, byte count and offset derived from a spec goes through these: nullopt
// means the exact result does not fit in int64_t, never a wrapped value.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>

namespace reshard {

inline std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline std::optional<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline std::optional<int64_t> CheckedSub(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// Propagating forms: a nullopt operand gives nullopt.
inline std::optional<int64_t> CheckedMul(std::optional<int64_t> a, int64_t b) {
  return a ? CheckedMul(*a, b) : std::nullopt;
}
inline std::optional<int64_t> CheckedAdd(std::optional<int64_t> a, int64_t b) {
  return a ? CheckedAdd(*a, b) : std::nullopt;
}

// Product of all factors, or nullopt on overflow.
inline std::optional<int64_t> CheckedProduct(std::initializer_list<int64_t> factors) {
  std::optional<int64_t> r = 1;
  for (int64_t f : factors) r = CheckedMul(r, f);
  return r;
}
template <typename Range>
std::optional<int64_t> CheckedProductOf(const Range& factors) {
  std::optional<int64_t> r = 1;
  for (int64_t f : factors) r = CheckedMul(r, static_cast<int64_t>(f));
  return r;
}

// a + b, clamped to [INT64_MIN, INT64_MAX]: for totals compared against a limit, where "more
// than the limit" is all that matters.
inline int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t r;
  if (!__builtin_add_overflow(a, b, &r)) return r;
  return b > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
}
inline int64_t SaturatingMul(int64_t a, int64_t b) {
  int64_t r;
  if (!__builtin_mul_overflow(a, b, &r)) return r;
  return (a < 0) != (b < 0) ? std::numeric_limits<int64_t>::min()
                            : std::numeric_limits<int64_t>::max();
}

// ceil(a / b) for b > 0 without the overflow of (a + b - 1) / b; 0 when b <= 0.
inline int64_t CeilDiv(int64_t a, int64_t b) {
  if (b <= 0) return 0;
  return a / b + (a > 0 && a % b != 0 ? 1 : 0);
}

}  // namespace reshard
