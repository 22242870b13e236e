// space_mark.h — SentencePiece's visible space, U+2581 "▁", which its vocabularies use in
// place of ' ' (the SentencePiece paper, arXiv:1808.06226, section 3.1).
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

namespace fdl::tok {

inline constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

/// `text` with every "▁" replaced by ' ' (other bytes unchanged, valid UTF-8 or not).
std::string unescape_spaces(std::string_view text);

}  // namespace fdl::tok
