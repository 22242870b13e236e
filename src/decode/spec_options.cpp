// SpecOptions validation and SpecMode names (see flashdllm/speculative.h).
#include <cmath>
#include <stdexcept>
#include <string>

#include "flashdllm/speculative.h"

namespace fdl {

SpecMode parse_spec_mode(std::string_view name) {
  if (name == "off") return SpecMode::Off;
  if (name == "lookup") return SpecMode::Lookup;
  if (name == "lookahead") return SpecMode::Lookahead;
  if (name == "auto") return SpecMode::Auto;
  throw std::invalid_argument("speculation mode must be off, lookup, lookahead or auto, got '" +
                              std::string(name) + "'");
}

const char* spec_mode_name(SpecMode mode) {
  switch (mode) {
    case SpecMode::Off: return "off";
    case SpecMode::Lookup: return "lookup";
    case SpecMode::Lookahead: return "lookahead";
    case SpecMode::Auto: return "auto";
  }
  return "?";
}

void SpecOptions::validate() const {
  const auto bad = [](const std::string& what) {
    throw std::invalid_argument("speculation: " + what);
  };
  if (window < 0 || window > 64) bad("window must be in [0, 64], got " + std::to_string(window));
  if (ngram_min < 1) bad("ngram_min must be >= 1, got " + std::to_string(ngram_min));
  if (ngram_max < ngram_min || ngram_max > 8)
    bad("ngram_max must be in [ngram_min, 8], got " + std::to_string(ngram_max));
  if (!(audit_fraction >= 0.0 && audit_fraction <= 1.0))
    bad("audit_fraction must be in [0, 1], got " + std::to_string(audit_fraction));
  if (!(breaker_threshold >= 0.0 && breaker_threshold <= 1.0))
    bad("breaker_threshold must be in [0, 1], got " + std::to_string(breaker_threshold));
  if (breaker_window < 1) bad("breaker_window must be >= 1, got " + std::to_string(breaker_window));
}

}  // namespace fdl
