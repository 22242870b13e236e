#include "tokenizer/byte_unicode.h"

#include <array>

#include "tokenizer/utf8.h"

namespace fdl::tok {
namespace {

struct ByteMap {
  std::array<uint32_t, 256> to_cpt{};
  std::array<int16_t, 324> from_cpt{};  // mapped code points are all < 256 + 68

  ByteMap() {
    from_cpt.fill(-1);
    uint32_t next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cpt[b] = printable ? static_cast<uint32_t>(b) : next_extra++;
      from_cpt[to_cpt[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

}  // namespace

uint32_t byte_to_mapped_codepoint(uint8_t b) { return byte_map().to_cpt[b]; }

int mapped_codepoint_to_byte(uint32_t cpt) {
  const auto& m = byte_map();
  return cpt < m.from_cpt.size() ? m.from_cpt[cpt] : -1;
}

std::string bytes_to_mapped(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (char c : raw) append_utf8(out, byte_to_mapped_codepoint(static_cast<uint8_t>(c)));
  return out;
}

std::optional<std::string> mapped_to_bytes(std::string_view mapped) {
  std::string out;
  out.reserve(mapped.size());
  for (size_t i = 0; i < mapped.size();) {
    const Utf8Step s = utf8_step(mapped, i);
    if (!s.well_formed) return std::nullopt;
    uint32_t cpt = static_cast<uint8_t>(mapped[i]);
    if (s.length == 2) cpt = ((cpt & 0x1F) << 6) | (static_cast<uint8_t>(mapped[i + 1]) & 0x3F);
    if (s.length > 2) return std::nullopt;  // all mapped code points are below U+0800
    const int b = mapped_codepoint_to_byte(cpt);
    if (b < 0) return std::nullopt;
    out.push_back(static_cast<char>(b));
    i += s.length;
  }
  return out;
}

}  // namespace fdl::tok
