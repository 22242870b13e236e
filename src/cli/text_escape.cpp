#include "cli/text_escape.h"

#include <cstdio>

namespace fdl::cli {
namespace {

/// Length of the complete, valid UTF-8 sequence starting at s[i] (a non-ASCII lead byte), or
/// 0 when the bytes there are not one (stray continuation byte, truncated sequence,
/// overlong form, surrogate, or a code point above U+10FFFF).
size_t utf8_sequence_at(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = b(i);
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    len = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    len = 3;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    len = 4;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < len; ++k) {
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  }
  return len;
}

}  // namespace

std::string escape_piece(std::string_view piece) {
  std::string out;
  out.reserve(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) {
    const char c = piece[i];
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x80) {
      const size_t len = utf8_sequence_at(piece, i);
      if (len > 0) {
        out.append(piece.substr(i, len));  // a whole character: shown as itself
        i += len - 1;
      } else {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\x%02x", byte);
        out += buf;
      }
      continue;
    }
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
          out += c;  // printable ASCII
        }
    }
  }
  return out;
}

}  // namespace fdl::cli
