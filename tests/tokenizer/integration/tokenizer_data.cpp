#include "tokenizer/integration/tokenizer_data.h"

#include <cstdio>

#include "tokenizer/utf8.h"

namespace fdl::test {

std::string backslash_replace(const std::string& bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    const tok::Utf8Step s = tok::utf8_step(bytes, i);
    if (s.well_formed) {
      out.append(bytes, i, s.length);
    } else {
      for (size_t k = 0; k < s.length; ++k) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<uint8_t>(bytes[i + k]));
        out += buf;
      }
    }
    i += s.length;
  }
  return out;
}

}  // namespace fdl::test
