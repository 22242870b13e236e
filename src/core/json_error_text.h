// Internal: the text of an nlohmann::json exception for a user-facing message.
// nlohmann's what() starts with an id such as "[json.exception.parse_error.101] ", which
// helps nobody reading an error; the rest (position and cause) is kept.
// Thread-safety: a pure function.
#pragma once

#include <exception>
#include <string>
#include <string_view>

namespace fdl {

inline std::string json_error_text(const std::exception& e) {
  std::string_view s = e.what();
  if (!s.empty() && s.front() == '[')
    if (const auto close = s.find("] "); close != std::string_view::npos) s.remove_prefix(close + 2);
  return std::string(s);
}

}  // namespace fdl
