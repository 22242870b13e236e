// Internal: the per-sequence lookahead drafter, after lookahead decoding (Fu et al. 2024).
//
// Lookahead decoding runs Jacobi iterations on extra "lookahead" positions and keeps the
// n-grams that appear along the iteration trajectory in a pool; candidates from the pool
// whose first token matches the last accepted token are verified. flashdllm adds no extra
// forward positions for a lookahead branch; instead it reuses the positions it verifies
// anyway (what this class does, precisely):
//  1. Jacobi guess: after a step that fed [x0, d1..dk] and rejected d_{j+1}, the model's
//     outputs (argmax) at positions j+1..k were computed from the wrong token d_{j+1} — one
//     Jacobi iteration on those positions. They become the next step's first guess for the
//     tokens after the model's own token, as in Jacobi decoding (y^{t+1} = f(y^t)).
//  2. n-gram pool: every (previous token, token) -> output triple seen in a verification
//     (x_{i-1}, x_i -> argmax_i, for all fed positions, rejected ones included: the lookahead
//     trajectory) and every trigram of the accepted history. Keys are 2-grams, with a
//     1-gram fallback; the most recent follower wins. Drafting chains lookups from the
//     context's last tokens.
// The Jacobi guess is preferred while it is fresh (it was made for exactly these
// positions); the pool otherwise.
#pragma once

#include <unordered_map>

#include "decode/drafter.h"

namespace fdl::spec {

class LookaheadPool final : public Drafter {
 public:
  /// Records the accepted tokens context[from..] (each with the two tokens before it).
  void feed_history(std::span<const int32_t> context, size_t from);
  /// Records one verification: `inputs` = [x0, d1..dk] as fed at the end of `context_before`
  /// (the context up to, not including, x0), `outputs` = the model's argmax at each of those
  /// k+1 positions, `accepted` = how many drafts were accepted. Sets the Jacobi guess to
  /// outputs[accepted+1..] (empty when every draft was accepted).
  void feed_verification(std::span<const int32_t> context_before, std::span<const int32_t> inputs,
                         std::span<const int32_t> outputs, size_t accepted);
  void propose(std::span<const int32_t> context, size_t max_tokens, Draft& out) const override;
  /// Alternates for tree verification: the pool's chain when propose() used the Jacobi
  /// guess, and the chain that starts with the 1-gram follower where it differs from the
  /// 2-gram one (appended to `out` when non-empty; may repeat propose()'s draft).
  void propose_alternates(std::span<const int32_t> context, size_t max_tokens, std::vector<Draft>& out) const;
  size_t pool_size() const { return by_bigram_.size() + by_token_.size(); }

 private:
  void record(int32_t prev, int32_t tok, int32_t next);
  /// Appends up to `max_tokens` pool lookups chained from (prev, cur) to `out`; the first
  /// lookup skips the 2-gram table when `unigram_first`.
  void chain(int32_t prev, int32_t cur, size_t max_tokens, bool unigram_first, Draft& out) const;
  std::unordered_map<uint64_t, int32_t> by_bigram_;
  std::unordered_map<int32_t, int32_t> by_token_;
  std::vector<int32_t> jacobi_;  ///< guessed tokens following `jacobi_after_` (see above)
  size_t jacobi_at_ = 0;         ///< context length the guess continues
};

}  // namespace fdl::spec
