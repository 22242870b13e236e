#include "cli/text_escape.h"

#include <cstdio>

namespace fdl::cli {

std::string escape_piece(std::string_view piece) {
  std::string out;
  out.reserve(piece.size());
  for (const char c : piece) {
    const auto byte = static_cast<unsigned char>(c);
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '\\': out += "\\\\"; break;
      default:
        if (byte < 0x20 || byte == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", byte);
          out += buf;
        } else {
          out += c;  // printable ASCII or part of a UTF-8 sequence
        }
    }
  }
  return out;
}

}  // namespace fdl::cli
