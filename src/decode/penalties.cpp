// Sampler stage 1: the penalty history (accept) and the penalties themselves.
//
// The history is a sliding window of the last `repeat_last_n` accepted tokens with a count
// per token, updated incrementally, so applying the penalties costs O(window) per step and
// never O(n_vocab) beyond the one copy of the logits row.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "flashdllm/model.h"
#include "flashdllm/sampling.h"

namespace fdl {

void Sampler::accept(int32_t token) {
  if (token < 0 || token >= n_vocab_)
    throw std::out_of_range("Sampler::accept: token id " + std::to_string(token) +
                            " outside [0, " + std::to_string(n_vocab_) + ")");
  if (!params_.has_penalties()) return;
  if (counts_.empty()) {
    // Allocated on first use so that samplers without penalties stay small.
    counts_.assign(size_t(n_vocab_), 0);
    applied_stamp_.assign(size_t(n_vocab_), 0);
  }
  window_.push_back(token);
  ++counts_[size_t(token)];
  if (params_.repeat_last_n > 0 && window_.size() > size_t(params_.repeat_last_n)) {
    --counts_[size_t(window_.front())];
    window_.pop_front();
  }
}

template <typename F>
void Sampler::for_each_window_token(F f) {
  if (window_.empty()) return;
  // A fresh stamp per call marks tokens already visited, so each distinct token in the
  // window is visited exactly once without clearing an n_vocab-sized array.
  if (++stamp_ == 0) {
    std::fill(applied_stamp_.begin(), applied_stamp_.end(), 0u);
    stamp_ = 1;
  }
  for (int32_t token : window_) {
    const size_t t = size_t(token);
    if (applied_stamp_[t] == stamp_) continue;
    applied_stamp_[t] = stamp_;
    f(token, counts_[t]);
  }
}

std::span<const float> Sampler::penalized(std::span<const float> logits) {
  penalized_.assign(logits.begin(), logits.end());
  for (const auto& [token, bias] : params_.logit_bias) penalized_[size_t(token)] += bias;
  // llama.cpp: logit <= 0 is multiplied, positive divided; either way it moves down.
  for_each_window_token([&](int32_t token, int32_t count) {
    float& logit = penalized_[size_t(token)];
    logit = penalize_logit(logit, count, params_.repeat_penalty, params_.frequency_penalty, params_.presence_penalty);
  });
  return penalized_;
}

void Sampler::append_penalty_tokens(int32_t row, std::vector<PenaltyToken>& out) {
  if (!params_.has_penalties()) return;
  for_each_window_token(
      [&](int32_t token, int32_t count) { out.push_back(PenaltyToken{.row = row, .token = token, .count = count}); });
}

std::vector<float> Sampler::penalized_logits(std::span<const float> logits) {
  (void)scan(logits);  // validates
  auto out = params_.has_penalties() || !params_.logit_bias.empty() ? penalized(logits) : logits;
  return {out.begin(), out.end()};
}

}  // namespace fdl
