// Internal: writing GBNF text from code (the JSON-schema converter, tool-call grammars).
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace fdl::grammar {

/// `text` as a GBNF string literal, quotes included: `"`, `\` and every byte below 0x20 or
/// 0x7F are escaped; other bytes (UTF-8 included) are written as they are.
inline std::string gbnf_quote(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto b = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (b < 0x20 || b == 0x7F) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", b);
      out += hex;
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

}  // namespace fdl::grammar
