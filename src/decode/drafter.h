// Internal: the interface every draft source implements. A drafter proposes tokens that
// might follow a context; the engine verifies them with the model, so a drafter may be
// wrong at no cost to correctness, only to speed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace fdl::spec {

/// Where a draft came from (for the policy and the metrics).
enum class DraftSource : uint8_t { None, PromptLookup, NgramCache, Jacobi, LookaheadPool };

struct Draft {
  std::vector<int32_t> tokens;  ///< proposed continuation, in order
  /// Strength of the evidence: the length of the matched suffix (0 = no draft).
  int match_len = 0;
  DraftSource source = DraftSource::None;
  void clear() { tokens.clear(); match_len = 0; source = DraftSource::None; }
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  /// Proposes up to `max_tokens` tokens following `context` (prompt + accepted output, the
  /// last entry being the next input token) into `out` (cleared first). Pure with respect
  /// to the drafter's state.
  virtual void propose(std::span<const int32_t> context, size_t max_tokens, Draft& out) const = 0;
};

/// 64-bit key of the n tokens ending at `end` (exclusive), n <= 8; mixes n in so that
/// grams of different lengths do not collide systematically.
inline uint64_t ngram_key(std::span<const int32_t> tokens, size_t end, size_t n) {
  uint64_t h = 0x9e3779b97f4a7c15ull * (n + 1);
  for (size_t i = end - n; i < end; ++i) {
    h ^= uint64_t(uint32_t(tokens[i])) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
  }
  return h;
}

}  // namespace fdl::spec
