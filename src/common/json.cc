#include "src/common/json.h"

#include <cstring>

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "src/common/escape.h"

namespace reshard::json {
namespace {

// Length of the well-formed UTF-8 sequence at the start of `s` (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF), or 0 when it is not one.
size_t Utf8SequenceLength(std::string_view s) {
  if (s.empty()) return 0;
  const auto b0 = static_cast<unsigned char>(s[0]);
  if (b0 < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // Range of the second byte.
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (s.size() < n) return 0;
  const auto b1 = static_cast<unsigned char>(s[1]);
  if (b1 < lo || b1 > hi) return 0;
  for (size_t i = 2; i < n; ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80 || b > 0xBF) return 0;
  }
  return n;
}

// A byte as text for an error message: printable ASCII as itself, anything else as \xNN.
std::string ByteForMessage(char c) {
  const auto b = static_cast<unsigned char>(c);
  if (b >= 0x20 && b < 0x7F) return std::string(1, c);
  return absl::StrFormat("\\x%02x", b);
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {  // ASCII, most names: no sequence to decode.
      ++i;
      continue;
    }
    const size_t n = Utf8SequenceLength(s.substr(i));
    if (n == 0) return false;
    i += n;
  }
  return true;
}

static_assert(sizeof(Value) == 24, "a spec holds tens of millions of values");

void Value::Clear() {
  if (HasContents()) delete contents_;
  type_ = Type::kNull;
  number_ = 0;
}

void Value::CopyFrom(const Value& other) {
  type_ = other.type_;
  bool_ = other.bool_;
  integral_ = other.integral_;
  line_ = other.line_;
  column_ = other.column_;
  if (other.HasContents()) {
    contents_ = new Contents(*other.contents_);
  } else {
    std::memcpy(&integer_, &other.integer_, sizeof(integer_));  // The number, either member.
  }
}

void Value::StealFrom(Value& other) {
  type_ = other.type_;
  bool_ = other.bool_;
  integral_ = other.integral_;
  line_ = other.line_;
  column_ = other.column_;
  std::memcpy(&integer_, &other.integer_, sizeof(integer_));  // Number or contents pointer.
  if (other.HasContents()) {
    contents_ = other.contents_;
    other.type_ = Type::kNull;
    other.number_ = 0;
  }
}

Value& Value::operator=(const Value& other) {
  if (this == &other) return *this;
  Clear();
  CopyFrom(other);
  return *this;
}

Value& Value::operator=(Value&& other) noexcept {
  if (this == &other) return *this;
  Clear();
  StealFrom(other);
  return *this;
}

const std::string& Value::as_string() const {
  static const std::string* const kEmpty = new std::string();
  const std::string* s = type_ == Type::kString ? std::get_if<std::string>(contents_) : nullptr;
  return s != nullptr ? *s : *kEmpty;
}

const std::vector<Value>& Value::items() const {
  static const std::vector<Value>* const kEmpty = new std::vector<Value>();
  const std::vector<Value>* v =
      type_ == Type::kArray ? std::get_if<std::vector<Value>>(contents_) : nullptr;
  return v != nullptr ? *v : *kEmpty;
}

const Value::Members& Value::members() const {
  static const Members* const kEmpty = new Members();
  const Members* m = type_ == Type::kObject ? std::get_if<Members>(contents_) : nullptr;
  return m != nullptr ? *m : *kEmpty;
}

const Value* Value::Find(std::string_view key) const {
  for (const auto& [k, v] : members()) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::string Value::Where() const { return absl::StrFormat("line %d, column %d", line_, column_); }

const char* Value::TypeName(Type t) {
  switch (t) {
    case Type::kNull:
      return "null";
    case Type::kBool:
      return "a boolean";
    case Type::kNumber:
      return "a number";
    case Type::kString:
      return "a string";
    case Type::kArray:
      return "an array";
    case Type::kObject:
      return "an object";
  }
  return "?";
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  absl::StatusOr<Value> Document() {
    Value v;
    SkipSpace();
    if (!ParseValue(v, 0)) return error_;
    SkipSpace();
    if (pos_ != text_.size()) return FailStatus("unexpected text after the JSON document");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 256;

  bool Fail(std::string_view what) {
    if (error_.ok()) {
      error_ = absl::InvalidArgumentError(
          absl::StrFormat("line %d, column %d: %s", line_, column_, what));
    }
    return false;
  }
  bool FailAt(int line, int column, std::string_view what) {
    line_ = line;
    column_ = column;
    return Fail(what);
  }
  absl::Status FailStatus(std::string_view what) {
    Fail(what);
    return error_;
  }

  char Peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool AtEnd() const { return pos_ >= text_.size(); }
  void Advance() {
    if (text_[pos_] == '\n') {
      ++line_;
      column_ = 1;
    } else {
      ++column_;
    }
    ++pos_;
  }
  void SkipSpace() {
    while (!AtEnd()) {
      char c = Peek();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        Advance();
      } else {
        break;
      }
    }
  }
  bool Expect(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) {
      return Fail(absl::StrCat("expected '", std::string(word), "'"));
    }
    for (size_t i = 0; i < word.size(); ++i) Advance();
    return true;
  }

  bool ParseValue(Value& v, int depth) {
    if (depth > kMaxDepth) return Fail("nesting deeper than 256 levels");
    v.line_ = line_;
    v.column_ = column_;
    if (AtEnd()) return Fail("unexpected end of input, expected a value");
    switch (Peek()) {
      case '{':
        return ParseObject(v, depth);
      case '[':
        return ParseArray(v, depth);
      case '"':
        return ParseString(v.Make<std::string>(Value::Type::kString));
      case 't':
        v.type_ = Value::Type::kBool;
        v.bool_ = true;
        return Expect("true");
      case 'f':
        v.type_ = Value::Type::kBool;
        v.bool_ = false;
        return Expect("false");
      case 'n':
        v.type_ = Value::Type::kNull;
        return Expect("null");
      default:
        break;
    }
    if (Peek() == '-' || (Peek() >= '0' && Peek() <= '9')) return ParseNumber(v);
    return Fail(
        absl::StrCat("unexpected character '", ByteForMessage(Peek()), "', expected a value"));
  }

  bool ParseObject(Value& v, int depth) {
    Value::Members& members = v.Make<Value::Members>(Value::Type::kObject);
    Advance();  // '{'
    SkipSpace();
    if (Peek() == '}') {
      Advance();
      return true;
    }
    while (true) {
      SkipSpace();
      if (Peek() != '"') return Fail("expected a string key in object");
      int key_line = line_, key_column = column_;
      std::string key;
      if (!ParseString(key)) return false;
      for (const auto& m : members) {
        if (m.first == key) {
          return FailAt(key_line, key_column, absl::StrCat("duplicate key ", QuoteForMessage(key)));
        }
      }
      SkipSpace();
      if (Peek() != ':') return Fail("expected ':' after object key");
      Advance();
      SkipSpace();
      members.emplace_back(std::move(key), Value());
      if (!ParseValue(members.back().second, depth + 1)) return false;
      SkipSpace();
      if (Peek() == ',') {
        Advance();
        continue;
      }
      if (Peek() == '}') {
        Advance();
        return true;
      }
      return Fail("expected ',' or '}' in object");
    }
  }

  bool ParseArray(Value& v, int depth) {
    std::vector<Value>& items = v.Make<std::vector<Value>>(Value::Type::kArray);
    Advance();  // '['
    SkipSpace();
    if (Peek() == ']') {
      Advance();
      return true;
    }
    while (true) {
      SkipSpace();
      items.emplace_back();
      if (!ParseValue(items.back(), depth + 1)) return false;
      SkipSpace();
      if (Peek() == ',') {
        Advance();
        continue;
      }
      if (Peek() == ']') {
        Advance();
        return true;
      }
      return Fail("expected ',' or ']' in array");
    }
  }

  static void AppendUtf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  bool ParseHex4(uint32_t& out) {
    out = 0;
    for (int i = 0; i < 4; ++i) {
      char c = Peek();
      int d;
      if (c >= '0' && c <= '9')
        d = c - '0';
      else if (c >= 'a' && c <= 'f')
        d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        d = c - 'A' + 10;
      else
        return Fail("invalid \\u escape in string");
      out = out * 16 + d;
      Advance();
    }
    return true;
  }

  bool ParseString(std::string& out) {
    Advance();  // opening quote
    while (true) {
      if (AtEnd()) return Fail("unterminated string");
      char c = Peek();
      if (c == '"') {
        Advance();
        return true;
      }
      if (static_cast<unsigned char>(c) < 0x20) return Fail("control character in string");
      if (static_cast<unsigned char>(c) >= 0x80) {
        const size_t n = Utf8SequenceLength(text_.substr(pos_));
        if (n == 0) return Fail("invalid UTF-8 in string");
        out.append(text_.substr(pos_, n));
        for (size_t i = 0; i < n; ++i) Advance();
        continue;
      }
      if (c != '\\') {
        out += c;
        Advance();
        continue;
      }
      Advance();
      if (AtEnd()) return Fail("unterminated string");
      char e = Peek();
      Advance();
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp;
          if (!ParseHex4(cp)) return false;
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            uint32_t low;
            if (Peek() != '\\') return Fail("unpaired surrogate in string");
            Advance();
            if (Peek() != 'u') return Fail("unpaired surrogate in string");
            Advance();
            if (!ParseHex4(low)) return false;
            if (low < 0xDC00 || low > 0xDFFF) return Fail("unpaired surrogate in string");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return Fail("unpaired surrogate in string");
          }
          AppendUtf8(out, cp);
          break;
        }
        default:
          return Fail(absl::StrCat("invalid escape '\\", ByteForMessage(e), "' in string"));
      }
    }
  }

  bool ParseNumber(Value& v) {
    v.type_ = Value::Type::kNumber;
    size_t start = pos_;
    bool integral = true;
    if (Peek() == '-') Advance();
    if (Peek() == '0') {
      Advance();
    } else if (Peek() >= '1' && Peek() <= '9') {
      while (Peek() >= '0' && Peek() <= '9') Advance();
    } else {
      return Fail("invalid number");
    }
    if (Peek() == '.') {
      integral = false;
      Advance();
      if (!(Peek() >= '0' && Peek() <= '9'))
        return Fail("invalid number: digit expected after '.'");
      while (Peek() >= '0' && Peek() <= '9') Advance();
    }
    if (Peek() == 'e' || Peek() == 'E') {
      integral = false;
      Advance();
      if (Peek() == '+' || Peek() == '-') Advance();
      if (!(Peek() >= '0' && Peek() <= '9'))
        return Fail("invalid number: digit expected in exponent");
      while (Peek() >= '0' && Peek() <= '9') Advance();
    }
    // Integers of up to 18 digits (every rank, shape and offset of a spec) are read directly:
    // they fit in int64, and their double is computed from them as strtod would round it.
    const std::string_view digits = text_.substr(start, pos_ - start);
    const bool negative = !digits.empty() && digits[0] == '-';
    if (integral && digits.size() - negative <= 18) {
      int64_t value = 0;
      for (size_t i = negative; i < digits.size(); ++i) value = value * 10 + (digits[i] - '0');
      v.integer_ = negative ? -value : value;
      v.integral_ = true;
      return true;
    }
    std::string literal(digits);
    const double number = std::strtod(literal.c_str(), nullptr);
    if (!std::isfinite(number)) {
      return FailAt(v.line_, v.column_,
                    absl::StrCat("number ", QuoteForMessage(literal),
                                 " is out of range (it does not fit in a double)"));
    }
    if (integral) {
      errno = 0;
      long long parsed = std::strtoll(literal.c_str(), nullptr, 10);
      if (errno == ERANGE) {
        integral = false;  // Too large for int64: kept as a double, rejected where ints are needed.
      } else {
        v.integer_ = parsed;
      }
    }
    if (!integral) v.number_ = number;
    v.integral_ = integral;
    return true;
  }

  std::string_view text_;
  size_t pos_ = 0;
  int line_ = 1;
  int column_ = 1;
  absl::Status error_;
};

absl::StatusOr<Value> Parse(std::string_view text) { return Parser(text).Document(); }

std::string QuoteForMessage(std::string_view s, size_t max_chars) {
  std::string out = "\"";
  size_t chars = 0, i = 0;
  while (i < s.size()) {
    if (chars == max_chars) {
      out += "\"...";
      return out;
    }
    const char c = s[i];
    const auto b = static_cast<unsigned char>(c);
    size_t n = 1;
    if (b == 0x7F) {
      out += "\\u007f";
    } else if (b < 0x80) {
      AppendJsonEscaped(out, c);
    } else if ((n = Utf8SequenceLength(s.substr(i))) == 0) {
      out += absl::StrFormat("\\x%02x", b);
      n = 1;
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
    ++chars;
  }
  out += '"';
  return out;
}

std::string Quote(std::string_view s) { return JsonQuote(s); }

}  // namespace reshard::json
