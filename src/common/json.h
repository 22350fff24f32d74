// A small JSON reader that remembers where every value came from.
//
// Spec errors must name the line and column of the offending value, which general-purpose JSON
// libraries on Debian 12 do not expose; this reader keeps a position on every node. It accepts
// RFC 8259 JSON only (no comments, no trailing commas) and rejects duplicate object keys,
// invalid UTF-8 (raw or through unpaired \u surrogates; every string it returns is valid UTF-8)
// and numbers that do not fit in a double (1e99999). NaN and Infinity are not JSON.
// Columns count bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"

namespace reshard::json {

// 24 bytes: a spec names every rank of every mesh, so a whole model's spec parses into tens of
// millions of numbers. Strings, arrays and objects keep their contents in one allocation.
class Value {
 public:
  enum class Type : uint8_t { kNull, kBool, kNumber, kString, kArray, kObject };

  Value() = default;
  Value(const Value& other) { CopyFrom(other); }
  Value& operator=(const Value& other);
  Value(Value&& other) noexcept { StealFrom(other); }
  Value& operator=(Value&& other) noexcept;
  ~Value() { Clear(); }

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_array() const { return type_ == Type::kArray; }
  bool is_object() const { return type_ == Type::kObject; }
  // True for numbers written without fraction or exponent that fit in int64 (so 2.0, 1e3 and
  // 2^63 are numbers but not integers).
  bool is_integer() const { return type_ == Type::kNumber && integral_; }

  bool as_bool() const { return bool_; }
  // An integer's double is the literal's, correctly rounded, as strtod would give it.
  double as_double() const {
    if (type_ != Type::kNumber) return 0;
    return integral_ ? static_cast<double>(integer_) : number_;
  }
  int64_t as_int() const { return is_integer() ? integer_ : 0; }
  const std::string& as_string() const;
  const std::vector<Value>& items() const;
  const std::vector<std::pair<std::string, Value>>& members() const;
  // Member lookup; nullptr when absent (or when this is not an object).
  const Value* Find(std::string_view key) const;

  int line() const { return line_; }
  int column() const { return column_; }
  // "line L, column C" for error messages.
  std::string Where() const;
  static const char* TypeName(Type t);

 private:
  friend class Parser;
  using Members = std::vector<std::pair<std::string, Value>>;
  using Contents = std::variant<std::string, std::vector<Value>, Members>;
  bool HasContents() const {
    return type_ == Type::kString || type_ == Type::kArray || type_ == Type::kObject;
  }
  // Makes this a string, array or object (`type`) holding an empty T, and returns it.
  template <typename T>
  T& Make(Type type) {
    Clear();
    type_ = type;
    contents_ = new Contents(std::in_place_type<T>);
    return std::get<T>(*contents_);
  }
  void Clear();
  void CopyFrom(const Value& other);
  void StealFrom(Value& other);

  Type type_ = Type::kNull;
  bool bool_ = false;
  bool integral_ = false;
  int32_t line_ = 0;
  int32_t column_ = 0;
  union {
    double number_ = 0;   // A number, when !integral_.
    int64_t integer_;     // A number, when integral_.
    Contents* contents_;  // A string, array or object (HasContents()); owned, never null.
  };
};

// Parses a whole document. Errors are InvalidArgument: "line L, column C: what is wrong".
[[nodiscard]] absl::StatusOr<Value> Parse(std::string_view text);

// Writes `s` as a JSON string literal (with quotes), escaping as needed.
std::string Quote(std::string_view s);

// `s` for an error message, on one line and bounded: quoted, with quotes, backslashes and
// control characters escaped, bytes that are not UTF-8 as \xNN, and cut after `max_chars`
// characters with `...` after the closing quote ("abc"...). Every user string echoed in an
// error goes through this.
std::string QuoteForMessage(std::string_view s, size_t max_chars = 64);

// True when `s` is well-formed UTF-8 (RFC 3629).
bool IsValidUtf8(std::string_view s);

}  // namespace reshard::json
