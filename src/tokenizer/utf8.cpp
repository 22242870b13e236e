#include "tokenizer/utf8.h"

namespace fdl::tok {

std::vector<uint32_t> decode_utf8_lenient(std::string_view text) {
  std::vector<uint32_t> cpts;
  cpts.reserve(text.size());
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const auto is_cont = [&](size_t i) { return i < text.size() && (byte(i) & 0xC0) == 0x80; };
  size_t i = 0;
  while (i < text.size()) {
    const uint8_t b0 = byte(i);
    if (b0 < 0x80) {
      cpts.push_back(b0);
      i += 1;
    } else if (b0 < 0xC0) {
      cpts.push_back(kReplacementChar);  // stray continuation byte
      i += 1;
    } else if (b0 < 0xE0) {
      if (!is_cont(i + 1)) { cpts.push_back(kReplacementChar); i += 1; continue; }
      cpts.push_back((uint32_t(b0 & 0x1F) << 6) | (byte(i + 1) & 0x3F));
      i += 2;
    } else if (b0 < 0xF0) {
      if (!is_cont(i + 1) || !is_cont(i + 2)) { cpts.push_back(kReplacementChar); i += 1; continue; }
      cpts.push_back((uint32_t(b0 & 0x0F) << 12) | (uint32_t(byte(i + 1) & 0x3F) << 6) |
                     (byte(i + 2) & 0x3F));
      i += 3;
    } else if (b0 < 0xF8) {
      if (!is_cont(i + 1) || !is_cont(i + 2) || !is_cont(i + 3)) {
        cpts.push_back(kReplacementChar);
        i += 1;
        continue;
      }
      const uint32_t cpt = (uint32_t(b0 & 0x07) << 18) | (uint32_t(byte(i + 1) & 0x3F) << 12) |
                           (uint32_t(byte(i + 2) & 0x3F) << 6) | (byte(i + 3) & 0x3F);
      cpts.push_back(cpt <= 0x10FFFF ? cpt : kReplacementChar);
      i += 4;
    } else {
      cpts.push_back(kReplacementChar);
      i += 1;
    }
  }
  return cpts;
}

void append_utf8(std::string& out, uint32_t cpt) {
  if (cpt < 0x80) {
    out.push_back(static_cast<char>(cpt));
  } else if (cpt < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cpt >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  }
}

Utf8Step utf8_step(std::string_view text, size_t pos) {
  const uint8_t b0 = static_cast<uint8_t>(text[pos]);
  if (b0 < 0x80) return {1, true, false};
  // Allowed range of the second byte and total length per lead byte (Unicode Table 3-7).
  uint8_t lo = 0x80, hi = 0xBF;
  size_t need;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return {1, false, false};  // C0, C1, F5..FF, or a stray continuation byte
  }
  size_t len = 1;
  while (len < need) {
    if (pos + len >= text.size()) return {len, false, true};
    const uint8_t b = static_cast<uint8_t>(text[pos + len]);
    const uint8_t min = (len == 1) ? lo : 0x80;
    const uint8_t max = (len == 1) ? hi : 0xBF;
    if (b < min || b > max) return {len, false, false};  // maximal subpart ends here
    ++len;
  }
  return {len, true, false};
}

bool is_well_formed_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const Utf8Step s = utf8_step(text, i);
    if (!s.well_formed) return false;
    i += s.length;
  }
  return true;
}

std::string to_well_formed_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const Utf8Step s = utf8_step(text, i);
    if (s.well_formed) {
      out.append(text.substr(i, s.length));
    } else {
      append_utf8(out, kReplacementChar);
    }
    i += s.length;
  }
  return out;
}

}  // namespace fdl::tok
