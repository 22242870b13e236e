// flashdllm/sampling.h — turning one row of logits into the next token.
//
// Pipeline (the order llama.cpp's default sampler chain uses for these stages):
//   1. penalties over the last `repeat_last_n` accepted tokens (prompt included):
//      - repetition penalty (Keskar et al. 2019, CTRL, as implemented by llama.cpp): for every
//        distinct token seen, a positive logit is divided by `repeat_penalty`, a negative one
//        multiplied by it;
//      - frequency / presence penalties (OpenAI API semantics):
//        logit -= frequency_penalty * count + presence_penalty * (count > 0);
//   2. top-k: keep the k highest logits (ties: lower id first);
//   3. top-p / nucleus (Holtzman et al. 2019): softmax over the survivors, keep the smallest
//      prefix (by descending probability) whose cumulative probability is >= top_p, >= 1 token;
//   4. min-p (Nguyen et al. 2024): keep tokens whose probability is >= min_p * p_max;
//   5. temperature: logits / temperature, softmax over the survivors;
//   6. draw one token with the sampler's own RNG (std::mt19937_64 seeded with `seed`): the
//      survivor whose interval of the cumulative weights, walked in token-id order, holds
//      u · total.
// Top-p's and the draw's probabilities are exact integers (weight · 2^44, truncated; a token
// below 2^-44 of the best one's weight is never drawn) of one exp approximation (relative
// error ~2e-7), and min-p compares that exp of (logit - max) with min_p, so no result depends
// on the order of a sum: the GPU's parallel sampler (Model::forward_sample) computes the same
// bits and draws the same token for the same u, wherever a step is sampled.
// temperature == 0 is greedy decoding: the argmax of the penalized logits, lowest id on ties
// (stages 2-4 always keep the argmax, so they cannot change it and are skipped).
//
// Degenerate settings stay well defined: a tiny temperature (down to the smallest denormal)
// or top_p puts all the probability on the argmax, never NaN/Inf. -Inf logits are masked
// tokens and are never drawn.
// Cost per token: linear passes over the vocabulary (vectorized max/exp), no full sort —
// top-k keeps a k-entry heap, top-p sorts only the probability bucket where the cut falls.
//
// Units: logits are raw fp32 model outputs, n_vocab per row; probabilities are in [0, 1].
// Errors: bad parameters throw std::invalid_argument naming the parameter; a logits row of
// the wrong size, containing NaN or +Inf, or entirely -Inf throws std::invalid_argument.
// Thread-safety: a Sampler is not thread-safe (it owns an RNG and scratch buffers); use one
// per sequence. SamplingParams::validate() is pure.
#pragma once

#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace fdl {

/// How Model::forward_sample turns one logits row into a token: this header's
/// pipeline — the penalties of the row's PenaltyTokens, then top-k, top-p, min-p,
/// temperature and one draw. The draw is given, so the caller's RNG stays where it is on the
/// host (Sampler::next_uniform()). Plain data with a fixed layout (40 bytes): a GPU model
/// copies an array of them as is.
struct RowSampling {
  float temperature = 0.0f;  ///< 0 = greedy: the argmax of the penalized row, lowest id on ties
  int32_t top_k = 0;         ///< 0 = off
  float top_p = 1.0f;        ///< 1 = off; in (0, 1]
  float min_p = 0.0f;        ///< 0 = off; in [0, 1]
  double uniform = 0.0;      ///< the draw, in [0, 1)
  float repeat_penalty = 1.0f;     ///< applied to the row's PenaltyTokens (stage 1, penalize_logit)
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  int32_t reserved = 0;            ///< keeps the layout free of implicit padding
};

/// The tokens some logits rows of a sampled step may draw (a grammar's masks,
/// Model::forward_sample): row rows[i] keeps logit t only where bit t of its mask is set —
/// the mask is entry which[i] of `words`, words_per_row(n_vocab) 64-bit words each, bit t in
/// word t / 64 at position t % 64 — and every other logit of that row is -inf before the
/// penalties and the draw. Rows appear at most once; masks may be shared by several rows.
/// Views only: the caller keeps the arrays alive for the call.
struct TokenMasks {
  std::span<const int32_t> rows;
  std::span<const int32_t> which;
  std::span<const uint64_t> words;
  static size_t words_per_row(int32_t n_vocab) { return (size_t(n_vocab) + 63) / 64; }
  bool empty() const { return rows.empty(); }
};

/// One distinct token of a row's penalty window and how often it occurs there
/// (Sampler::append_penalty_tokens). Each (row, token) pair at most once (not checked: a
/// repeated pair is applied twice on the host and races on the GPU).
struct PenaltyToken {
  int32_t row = 0;    ///< index into forward_sample's rows
  int32_t token = 0;  ///< in [0, n_vocab)
  int32_t count = 0;  ///< occurrences in the window, >= 1
};

/// Stage 1 for one distinct token of the penalty window that occurs `count` (>= 1) times
/// there: the repetition penalty (positive logits divided, others multiplied), then
/// logit -= count * frequency_penalty + presence_penalty. Every backend applies exactly
/// these float operations (no fused multiply-add), so penalized rows are bit-identical.
/// Extreme but valid penalties saturate at +-FLT_MAX instead of overflowing to Inf or NaN
/// (a finite logit stays finite, so no penalty can make a row unsamplable); a logit that is
/// not finite (masked -Inf, or NaN / +Inf, which the row check refuses) is returned as is.
inline float penalize_logit(float logit, int32_t count, float repeat_penalty, float frequency_penalty,
                            float presence_penalty) {
  constexpr float kMax = std::numeric_limits<float>::max();
  const auto sat = [](float x) { return x < -kMax ? -kMax : (x > kMax ? kMax : x); };
  if (!std::isfinite(logit)) return logit;
  if (repeat_penalty != 1.0f) logit = sat(logit <= 0.0f ? logit * repeat_penalty : logit / repeat_penalty);
  const float by_count = sat(float(count) * frequency_penalty);
  return sat(logit - sat(by_count + (count > 0 ? presence_penalty : 0.0f)));
}

struct SamplingParams {
  float temperature = 1.0f;       ///< 0 = greedy; must be finite and >= 0
  int32_t top_k = 0;              ///< 0 = off; must be >= 0
  float top_p = 1.0f;             ///< 1 = off; must be in (0, 1]
  float min_p = 0.0f;             ///< 0 = off; must be in [0, 1]
  float repeat_penalty = 1.0f;    ///< 1 = off; must be finite and > 0
  int32_t repeat_last_n = 64;     ///< penalty window in tokens; -1 = whole context, 0 = off
  float frequency_penalty = 0.0f; ///< finite; 0 = off
  float presence_penalty = 0.0f;  ///< finite; 0 = off
  uint64_t seed = 0;              ///< RNG seed: same seed + same logits -> same tokens
  /// OpenAI's logit_bias: (token id, bias) pairs added to those tokens' logits before the
  /// penalties and everything else (-100 bans a token, +100 all but forces it). Ids must be
  /// in [0, n_vocab) (Sampler's constructor checks), biases finite and in [-100, 100].
  /// Engine steps with a biased sequence sample on the host.
  std::vector<std::pair<int32_t, float>> logit_bias{};

  bool is_greedy() const { return temperature == 0.0f; }
  bool has_penalties() const {
    return repeat_last_n != 0 &&
           (repeat_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f);
  }
  /// Throws std::invalid_argument naming the first invalid parameter and its value.
  void validate() const;
};

/// A token with its (possibly transformed) logit.
struct TokenLogit {
  int32_t id = 0;
  float logit = 0.0f;
};

/// One candidate token of the final distribution.
struct TokenProb {
  int32_t id = 0;
  float prob = 0.0f;
};

/// Per-sequence sampler: holds the parameters, the penalty history and the RNG.
class Sampler {
 public:
  /// Validates `params` (std::invalid_argument) and 0 < `n_vocab` < 2^20 (the integer
  /// probabilities of a row must fit 64 bits).
  Sampler(const SamplingParams& params, int32_t n_vocab);

  const SamplingParams& params() const { return params_; }
  int32_t n_vocab() const { return n_vocab_; }

  /// Record a token of the context (prompt tokens and every generated token) for the
  /// penalties. sample() does not call it: the caller accepts what it keeps.
  /// Throws std::out_of_range for an id outside [0, n_vocab).
  void accept(int32_t token);

  /// Draw the next token from one row of `n_vocab` logits (advances the RNG unless greedy).
  /// Equals sample_with_uniform(logits, next_uniform()) when not greedy.
  int32_t sample(std::span<const float> logits);

  /// The uniform in [0, 1) the next sample() would draw (53 bits of the RNG); advances the
  /// RNG exactly as that sample() would. With sample_with_uniform, the draw can happen where
  /// the logits are not (Model::forward_sample samples on the GPU) while the sequence's
  /// RNG stream stays the one sample() uses.
  double next_uniform();

  /// sample() with the draw given (`u` in [0, 1), clamped into it otherwise): the token whose
  /// interval of the cumulative distribution, walked in token-id order, holds u. Does not touch
  /// the RNG. Greedy ignores u.
  int32_t sample_with_uniform(std::span<const float> logits, double u);

  /// The RowSampling (above) of these parameters for a draw `u`: with the PenaltyTokens
  /// append_penalty_tokens gives, what forward_sample needs to draw as sample_with_uniform
  /// does. Penalties that has_penalties() calls off are left neutral.
  static RowSampling row_sampling(const SamplingParams& params, double u);
  /// The other way: the parameters a RowSampling stands for (seed 0; its penalty window is
  /// the PenaltyTokens, not a history). Throws std::invalid_argument, as
  /// SamplingParams::validate(), for values the sampler refuses.
  static SamplingParams params_of(const RowSampling& row);
  /// Appends one PenaltyToken{row, token, count} per distinct token of the penalty window
  /// (nothing without penalties): what penalized() applies, for a model that applies it
  /// itself (Model::forward_sample). O(window).
  void append_penalty_tokens(int32_t row, std::vector<PenaltyToken>& out);

  /// The final distribution sample() would draw from, sorted by descending probability
  /// (ties: lower id first); probabilities sum to 1. Greedy gives one token with prob 1.
  /// Does not advance the RNG. Meant for tests and log-probabilities; allocates.
  std::vector<TokenProb> distribution(std::span<const float> logits);

  /// Stage 1 only: the logits after logit_bias and the penalties for the current history.
  /// Allocates.
  std::vector<float> penalized_logits(std::span<const float> logits);

 private:
  /// Validates a row (size, no NaN/+Inf, not all -Inf) and returns its argmax (lowest id
  /// on ties) in the same pass.
  size_t scan(std::span<const float> logits) const;
  /// Copies `logits` into scratch and applies logit_bias, then the penalties, there.
  std::span<const float> penalized(std::span<const float> logits);
  /// Calls f(token, count) once per distinct token of the penalty window (penalized() and
  /// append_penalty_tokens() share it).
  template <typename F>
  void for_each_window_token(F f);
  /// The row after logit_bias and penalties (the input itself when there are none) and its
  /// argmax.
  std::span<const float> prepared(std::span<const float> logits, size_t& argmax);
  /// Runs stages 2-5; leaves the unnormalized weights of the survivors in weights_ (the
  /// i-th belongs to candidate_id(i)) and returns their exact integer mass (see the top).
  unsigned long long build_candidates(std::span<const float> logits, float max_logit);
  int32_t candidate_id(size_t i) const;
  /// Uniform double in [0, 1) from 53 bits of the RNG.
  double uniform01();

  SamplingParams params_;
  int32_t n_vocab_;
  std::mt19937_64 rng_;
  // penalty history: the window of accepted tokens and per-token counts inside it
  std::deque<int32_t> window_;
  std::vector<int32_t> counts_;
  std::vector<uint32_t> applied_stamp_;
  uint32_t stamp_ = 0;
  // scratch, reused across calls (no per-token allocation)
  std::vector<float> penalized_;
  std::vector<TokenLogit> candidates_;
  bool all_tokens_ = false;  ///< no truncation: weight i is token i's, candidates_ unused
  std::vector<float> weights_;
  std::vector<unsigned long long> top_p_scratch_;
};

}  // namespace fdl
