// text_escape.h — make token pieces readable on one terminal line.
#pragma once

#include <string>
#include <string_view>

namespace fdl::cli {

/// Escape a piece for display: \n, \t, \r, backslash, and other control bytes as \xNN;
/// printable ASCII and complete, valid UTF-8 characters pass through unchanged; any other
/// byte (half of a character, e.g. a byte-fallback token such as <0xE2>) becomes \xNN, so
/// the output is always valid UTF-8.
std::string escape_piece(std::string_view piece);

}  // namespace fdl::cli
