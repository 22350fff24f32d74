// JSON string escaping, header-only, so programs that link only the public library (the per-rank
// programs) share it with src/common/json without linking reshard_common.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace reshard {

// Appends byte `c` to `out` as it must appear inside a JSON string: `"` `\` and control
// characters escaped, every other byte as is (UTF-8 sequences pass through).
inline void AppendJsonEscaped(std::string& out, char c) {
  switch (c) {
    case '"':
      out += "\\\"";
      break;
    case '\\':
      out += "\\\\";
      break;
    case '\n':
      out += "\\n";
      break;
    case '\r':
      out += "\\r";
      break;
    case '\t':
      out += "\\t";
      break;
    default:
      if (static_cast<unsigned char>(c) < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned char>(c));
        out += buf;
      } else {
        out += c;
      }
  }
}

// `s` as a JSON string literal, quotes included.
inline std::string JsonQuote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) AppendJsonEscaped(out, c);
  out += '"';
  return out;
}

}  // namespace reshard
