// Internal: prompt-lookup drafting (Saxena 2023; llama.cpp's "lookup" example does the
// same): find the last n tokens of the context earlier in the context itself, n from
// `n_max` down to `n_min`, and propose the tokens that followed the most recent match.
// Strong on input-grounded work (repeating, editing or continuing a given passage).
#pragma once

#include "decode/drafter.h"

namespace fdl::spec {

class PromptLookup final : public Drafter {
 public:
  /// 1 <= n_min <= n_max (std::invalid_argument otherwise).
  PromptLookup(int n_min, int n_max);
  /// One backwards pass over the context per call (O(len), O(len * n_max) at worst), no
  /// index to maintain. Thread-safety: const, no shared state.
  void propose(std::span<const int32_t> context, size_t max_tokens, Draft& out) const override;
  /// Alternates for tree verification: the continuations of up to `max_drafts` matches
  /// whose first tokens differ (longest suffix first, then most recent), appended to `out`.
  /// The first is propose()'s draft. The same scan, run to the end instead of the first match.
  void propose_distinct(std::span<const int32_t> context, size_t max_tokens, size_t max_drafts,
                        std::vector<Draft>& out) const;

 private:
  int n_min_;
  int n_max_;
};

}  // namespace fdl::spec
