// Sampler::sample_against_draft — verification of a draft token (see flashdllm/sampling.h).
//
// Why it is exact (Leviathan et al. 2023 with a point-mass draft q = delta_x): the draft x is
// emitted with probability p(x); any other y with probability (1 - p(x)) * p(y) / (1 - p(x))
// = p(y). So the emitted token has distribution p, whatever the drafter proposed.
#include "flashdllm/sampling.h"

namespace fdl {

int32_t Sampler::sample_against_draft(std::span<const float> logits, int32_t draft) {
  size_t argmax = 0;
  const auto row = prepared(logits, argmax);
  if (params_.is_greedy()) return static_cast<int32_t>(argmax);
  if (draft < 0 || draft >= n_vocab_) return sample(logits);

  const double total = build_candidates(row, row[argmax]);
  // Weight of the draft in the final distribution (0 when it was truncated away).
  size_t draft_index = weights_.size();
  if (all_tokens_) {
    draft_index = size_t(draft);
  } else {
    for (size_t i = 0; i < candidates_.size(); ++i)
      if (candidates_[i].id == draft) { draft_index = i; break; }
  }
  const double w_draft = draft_index < weights_.size() ? double(weights_[draft_index]) : 0.0;
  if (w_draft > 0.0 && uniform01() * total < w_draft) return draft;

  // Rejected: draw from p restricted to the other tokens, renormalized. Summed the same way
  // as the draw walks them, so the target always falls inside.
  double rest = 0.0;
  for (size_t i = 0; i < weights_.size(); ++i)
    if (i != draft_index && weights_[i] > 0.0f) rest += weights_[i];
  if (rest <= 0.0) return draft;  // p(draft) == 1: rejection has probability 0
  const double target = uniform01() * rest;
  double cumulative = 0.0;
  size_t last_positive = weights_.size();
  for (size_t i = 0; i < weights_.size(); ++i) {
    if (i == draft_index || weights_[i] <= 0.0f) continue;
    cumulative += weights_[i];
    last_positive = i;
    if (target < cumulative) return candidate_id(i);
  }
  return candidate_id(last_positive);  // rounding at u ~ 1
}

int32_t Sampler::sample_against_drafts(std::span<const float> logits, std::span<const int32_t> drafts) {
  if (drafts.size() <= 1) return drafts.empty() ? sample(logits) : sample_against_draft(logits, drafts[0]);
  size_t argmax = 0;
  const auto row = prepared(logits, argmax);
  if (params_.is_greedy()) return static_cast<int32_t>(argmax);

  // Why it is exact: by induction over the candidates. With residual r (p restricted to the
  // tokens not yet rejected, renormalized), trying x accepts it with probability r(x) and
  // otherwise continues with r minus x renormalized — the one-candidate rule, whose output
  // is distributed as r. So the final output is distributed as the first residual, p.
  double rest = build_candidates(row, row[argmax]);
  const auto index_of = [&](int32_t id) {
    if (id < 0 || id >= n_vocab_) return weights_.size();
    if (all_tokens_) return size_t(id);
    for (size_t i = 0; i < candidates_.size(); ++i)
      if (candidates_[i].id == id) return i;
    return weights_.size();
  };
  for (const int32_t d : drafts) {
    const size_t i = index_of(d);
    const double w = i < weights_.size() ? double(weights_[i]) : 0.0;
    if (w <= 0.0) continue;  // p(d) = 0 under the residual: rejected without a draw
    if (uniform01() * rest < w) return d;
    weights_[i] = 0.0f;  // removed from the residual (weights_ is rebuilt on the next call)
    rest = 0.0;
    for (const float x : weights_) rest += x > 0.0f ? double(x) : 0.0;  // summed as the draw walks
    if (rest <= 0.0) return d;  // residual empty: only reachable through rounding
  }
  const double target = uniform01() * rest;
  double cumulative = 0.0;
  size_t last_positive = weights_.size();
  for (size_t i = 0; i < weights_.size(); ++i) {
    if (weights_[i] <= 0.0f) continue;
    cumulative += weights_[i];
    last_positive = i;
    if (target < cumulative) return candidate_id(i);
  }
  return candidate_id(last_positive);  // rounding at u ~ 1
}

}  // namespace fdl
