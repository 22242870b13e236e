// json_output.h — printing JSON results on stdout.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdio>

#include "cli/stdout_io.h"

namespace fdl::cli {

/// One compact JSON object and a newline on stdout. Model output can contain bytes that
/// are not valid UTF-8 (a token may be half of a character); those are replaced with
/// U+FFFD instead of making the dump throw.
inline void print_json_line(const nlohmann::json& j) {
  const std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  write_stdout(s);
  write_stdout("\n");
  flush_stdout();
}

}  // namespace fdl::cli
