// GPT-2's reversible byte <-> Unicode mapping used by byte-level BPE vocabularies.
//
// Spec: OpenAI GPT-2 `bytes_to_unicode` (encoder.py): the printable bytes 0x21-0x7E,
// 0xA1-0xAC and 0xAE-0xFF stand for the code point of the same value; the other 68 bytes
// (controls, space, 0x7F-0xA0, 0xAD) map in increasing order to U+0100, U+0101, ...
// So a space is "Ġ" (U+0120) and a newline "Ċ" (U+010A) in vocab and merges text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fdl::tok {

/// Code point that stands for byte `b`.
uint32_t byte_to_mapped_codepoint(uint8_t b);
/// Byte a mapped code point stands for, or -1 when `cpt` is not one of the 256.
int mapped_codepoint_to_byte(uint32_t cpt);

/// Raw bytes -> their mapped UTF-8 spelling (as vocab entries are written).
std::string bytes_to_mapped(std::string_view raw);
/// Mapped UTF-8 spelling -> raw bytes; std::nullopt if some character is not a mapped one
/// (or the text is not well-formed UTF-8).
std::optional<std::string> mapped_to_bytes(std::string_view mapped);

}  // namespace fdl::tok
