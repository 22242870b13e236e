// cli_error.h — the one exception type the CLI commands throw for user-facing errors.
//
// main() catches every exception and prints what() as a single line on stderr, so a
// message must say what was wrong and, where it helps, what to do instead.
#pragma once

#include <stdexcept>
#include <string>

namespace fdl::cli {

class CliError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace fdl::cli
