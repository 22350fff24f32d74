#include "src/common/json.h"

#include <cerrno>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace reshard::json {

const Value* Value::Find(std::string_view key) const {
  for (const auto& [k, v] : members_) {
    if (k == key) return &v;
  }
  return nullptr;
}

std::string Value::Where() const { return absl::StrFormat("line %d, column %d", line_, column_); }

const char* Value::TypeName(Type t) {
  switch (t) {
    case Type::kNull: return "null";
    case Type::kBool: return "a boolean";
    case Type::kNumber: return "a number";
    case Type::kString: return "a string";
    case Type::kArray: return "an array";
    case Type::kObject: return "an object";
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
      case '{': return ParseObject(v, depth);
      case '[': return ParseArray(v, depth);
      case '"': v.type_ = Value::Type::kString; return ParseString(v.string_);
      case 't': v.type_ = Value::Type::kBool; v.bool_ = true; return Expect("true");
      case 'f': v.type_ = Value::Type::kBool; v.bool_ = false; return Expect("false");
      case 'n': v.type_ = Value::Type::kNull; return Expect("null");
      default: break;
    }
    if (Peek() == '-' || (Peek() >= '0' && Peek() <= '9')) return ParseNumber(v);
    return Fail(absl::StrFormat("unexpected character '%c', expected a value", Peek()));
  }

  bool ParseObject(Value& v, int depth) {
    v.type_ = Value::Type::kObject;
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
      for (const auto& m : v.members_) {
        if (m.first == key) {
          line_ = key_line;
          column_ = key_column;
          return Fail(absl::StrCat("duplicate key \"", key, "\""));
        }
      }
      SkipSpace();
      if (Peek() != ':') return Fail("expected ':' after object key");
      Advance();
      SkipSpace();
      v.members_.emplace_back(std::move(key), Value());
      if (!ParseValue(v.members_.back().second, depth + 1)) return false;
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
    v.type_ = Value::Type::kArray;
    Advance();  // '['
    SkipSpace();
    if (Peek() == ']') {
      Advance();
      return true;
    }
    while (true) {
      SkipSpace();
      v.items_.emplace_back();
      if (!ParseValue(v.items_.back(), depth + 1)) return false;
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
      if (c >= '0' && c <= '9') d = c - '0';
      else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
      else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
      else return Fail("invalid \\u escape in string");
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
      if (c != '\\') {
        out += c;
        Advance();
        continue;
      }
      Advance();
      char e = Peek();
      if (AtEnd()) return Fail("unterminated string");
      Advance();
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
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
          }
          AppendUtf8(out, cp);
          break;
        }
        default: return Fail(absl::StrFormat("invalid escape '\\%c' in string", e));
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
      if (!(Peek() >= '0' && Peek() <= '9')) return Fail("invalid number: digit expected after '.'");
      while (Peek() >= '0' && Peek() <= '9') Advance();
    }
    if (Peek() == 'e' || Peek() == 'E') {
      integral = false;
      Advance();
      if (Peek() == '+' || Peek() == '-') Advance();
      if (!(Peek() >= '0' && Peek() <= '9')) return Fail("invalid number: digit expected in exponent");
      while (Peek() >= '0' && Peek() <= '9') Advance();
    }
    std::string literal(text_.substr(start, pos_ - start));
    v.number_ = std::strtod(literal.c_str(), nullptr);
    if (integral) {
      errno = 0;
      long long parsed = std::strtoll(literal.c_str(), nullptr, 10);
      if (errno == ERANGE) {
        integral = false;  // Too large for int64: kept as a double, rejected where ints are needed.
      } else {
        v.integer_ = parsed;
      }
    }
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

std::string Quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

}  // namespace reshard::json
