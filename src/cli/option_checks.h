// option_checks.h — range checks for numeric flags, with messages that name the flag.
//
// CLI11 parses "nan" and "-5" happily into float/int options; these checks turn such
// values into one clear CliError before any work starts.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

#include "cli/cli_error.h"

namespace fdl::cli {

/// Shortest readable form of a number ("0.95", "nan", "-1").
inline std::string number_text(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

inline void check_at_least(const char* flag, long long value, long long min) {
  if (value < min) {
    throw CliError(std::string(flag) + " must be >= " + std::to_string(min) + ", got " +
                   std::to_string(value));
  }
}

inline void check_int_in(const char* flag, long long value, long long min, long long max) {
  if (value < min || value > max) {
    throw CliError(std::string(flag) + " must be in [" + std::to_string(min) + ", " +
                   std::to_string(max) + "], got " + std::to_string(value));
  }
}

/// Upper bounds that keep absurd values from reaching allocations and thread creation.
inline constexpr long long kMaxThreads = 1024;
inline constexpr long long kMaxBlockSize = 4096;

inline void check_finite_in(const char* flag, double value, double min, double max) {
  if (!std::isfinite(value) || value < min || value > max) {
    throw CliError(std::string(flag) + " must be a number in [" + number_text(min) + ", " +
                   number_text(max) + "], got " + number_text(value));
  }
}

inline void check_finite(const char* flag, double value) {
  if (!std::isfinite(value)) {
    throw CliError(std::string(flag) + " must be a finite number, got " + number_text(value));
  }
}

}  // namespace fdl::cli
