// option_checks.h — range checks for numeric flags, with messages that name the flag.
//
// CLI11 parses "nan" and "-5" happily into float/int options; these checks turn such
// values into one clear CliError before any work starts.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
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

/// For values where 0 is meaningless (top-p, penalties): (0, max], the message says so.
inline void check_finite_positive_upto(const char* flag, double value, double max, const char* hint) {
  if (!std::isfinite(value) || value <= 0.0 || value > max) {
    throw CliError(std::string(flag) + " must be a number in (0, " + number_text(max) + "] (" + hint + "), got " +
                   number_text(value));
  }
}

inline void check_finite(const char* flag, double value) {
  if (!std::isfinite(value)) {
    throw CliError(std::string(flag) + " must be a finite number, got " + number_text(value));
  }
}

/// Parse a --seed value: an unsigned decimal in [0, 2^64-1], or (when `allow_random`) "-1"
/// for "pick a random seed" (llama.cpp's convention), returned as nullopt. Anything else
/// (other negatives, out-of-range values, trailing junk) is an error naming the flag.
inline std::optional<uint64_t> parse_seed(const char* flag, const std::string& text,
                                          bool allow_random) {
  if (allow_random && text == "-1") return std::nullopt;
  const std::string range = allow_random ? "0..18446744073709551615, or -1 for a random seed"
                                         : "0..18446744073709551615";
  bool digits = !text.empty() && text.size() <= 40;
  for (const char c : text) digits = digits && c >= '0' && c <= '9';
  if (!digits) throw CliError(std::string(flag) + " " + text + ": must be an integer in " + range);
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE)
    throw CliError(std::string(flag) + " " + text + ": out of range (valid: " + range + ")");
  return static_cast<uint64_t>(v);
}

/// --ctx-size: 0 (model default) or at least 2 tokens (a prompt token and a new one).
inline void check_ctx_size(const char* flag, long long value) {
  if (value != 0 && value < 2)
    throw CliError(std::string(flag) + " " + std::to_string(value) +
                   ": must be at least 2 (or 0 for the model default)");
}

}  // namespace fdl::cli
