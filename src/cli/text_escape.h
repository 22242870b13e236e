// text_escape.h — make token pieces readable on one terminal line.
#pragma once

#include <string>
#include <string_view>

namespace fdl::cli {

/// Escape a piece for display: \n, \t, \r, backslash, and other control bytes as \xNN;
/// printable ASCII and UTF-8 multi-byte sequences pass through unchanged.
std::string escape_piece(std::string_view piece);

}  // namespace fdl::cli
