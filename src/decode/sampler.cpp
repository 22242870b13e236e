// Sampler: greedy argmax or the truncate-temper-draw pipeline (see flashdllm/sampling.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "decode/candidate_filters.h"
#include "decode/draw_arithmetic.h"
#include "decode/row_ops.h"
#include "flashdllm/model.h"
#include "flashdllm/sampling.h"

namespace fdl {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct ById {
  bool operator()(const TokenLogit& a, const TokenLogit& b) const { return a.id < b.id; }
};
constexpr ById by_id{};

}  // namespace

Sampler::Sampler(const SamplingParams& params, int32_t n_vocab)
    : params_(params), n_vocab_(n_vocab), rng_(params.seed) {
  params_.validate();
  if (n_vocab <= 0 || n_vocab >= (1 << 20))
    throw std::invalid_argument("Sampler: n_vocab must be in [1, 1048575], got " + std::to_string(n_vocab));
  for (const auto& [token, bias] : params_.logit_bias)
    if (token >= n_vocab)
      throw std::invalid_argument("invalid logit_bias = " + std::to_string(token) + ": token ids must be < n_vocab = " +
                                  std::to_string(n_vocab));
}

size_t Sampler::scan(std::span<const float> logits) const {
  if (logits.size() != size_t(n_vocab_))
    throw std::invalid_argument("Sampler: logits row has " + std::to_string(logits.size()) +
                                " values, expected n_vocab = " + std::to_string(n_vocab_));
  const detail::RowScan scan = detail::scan_row(logits);
  // -Inf is a legitimate mask; NaN or +Inf would poison the softmax.
  if (scan.has_nan_or_pos_inf) {
    for (size_t i = 0; i < logits.size(); ++i)
      if (std::isnan(logits[i]) || logits[i] == kInf)
        throw std::invalid_argument("Sampler: logit of token " + std::to_string(i) + " is " +
                                    (std::isnan(logits[i]) ? "NaN" : "+Inf"));
  }
  if (scan.max == -kInf) throw std::invalid_argument("Sampler: every logit is -Inf");
  return scan.argmax;
}

std::span<const float> Sampler::prepared(std::span<const float> logits, size_t& argmax) {
  argmax = scan(logits);
  if ((!params_.has_penalties() || window_.empty()) && params_.logit_bias.empty()) return logits;
  const auto row = penalized(logits);
  argmax = detail::scan_row(row).argmax;  // biases and penalties may move the maximum either way
  return row;
}

unsigned long long Sampler::build_candidates(std::span<const float> logits, float max_logit) {
  const bool truncates = (params_.top_k > 0 && size_t(params_.top_k) < logits.size()) ||
                         params_.top_p < 1.0f || params_.min_p > 0.0f;
  if (!truncates) {
    // The whole vocabulary survives: weight i belongs to token i, so skip building a
    // candidate list (masked -Inf logits get weight 0 and can never be drawn).
    all_tokens_ = true;
    weights_.assign(logits.begin(), logits.end());
    detail::exp_shifted_in_place(weights_, max_logit, params_.temperature);
    return detail::sum_mass(weights_);
  }
  all_tokens_ = false;
  bool sorted = false;
  if (params_.top_k > 0 && size_t(params_.top_k) < logits.size()) {
    detail::select_top_k(logits, size_t(params_.top_k), candidates_);
    sorted = true;
  } else {
    // Without top-p, min-p only depends on the maximum, so it can filter while copying (a
    // bound 1e-3 nats looser than its own test, which keep_min_p applies below); with top-p
    // it must wait (top-p's probabilities are over the unfiltered set).
    double threshold = -std::numeric_limits<double>::infinity();
    if (params_.min_p > 0.0f && params_.top_p >= 1.0f)
      threshold = double(max_logit) + std::log(double(params_.min_p)) - 1e-3;
    detail::select_at_least(logits, threshold, candidates_);
  }
  if (params_.top_p < 1.0f)
    detail::keep_top_p(candidates_, params_.top_p, sorted, weights_, top_p_scratch_);
  detail::keep_min_p(candidates_, params_.min_p);
  // The draw walks the survivors in id order, as without truncation and as the GPU does
  // (Model::forward_sample): a seeded draw then picks the same token whichever path a step
  // takes. top-k leaves them ranked and top-p's partition in no order; the survivors are
  // few (a sort of m, against the passes over all n_vocab logits above).
  if (!std::is_sorted(candidates_.begin(), candidates_.end(), by_id))
    std::sort(candidates_.begin(), candidates_.end(), by_id);
  return detail::tempered_weights(candidates_, params_.temperature, weights_);
}

int32_t Sampler::candidate_id(size_t i) const {
  return all_tokens_ ? static_cast<int32_t>(i) : candidates_[i].id;
}

double Sampler::uniform01() { return double(rng_() >> 11) * 0x1.0p-53; }

double Sampler::next_uniform() { return uniform01(); }

int32_t Sampler::sample(std::span<const float> logits) {
  // 53 random bits -> a double uniform in [0, 1); the same on every platform, unlike
  // std::uniform_real_distribution whose algorithm is implementation-defined. Greedy draws
  // nothing.
  return sample_with_uniform(logits, params_.is_greedy() ? 0.0 : uniform01());
}

int32_t Sampler::sample_with_uniform(std::span<const float> logits, double u) {
  size_t argmax = 0;
  const auto row = prepared(logits, argmax);
  if (params_.is_greedy()) return static_cast<int32_t>(argmax);
  if (!(u >= 0.0)) u = 0.0;  // also NaN
  if (u >= 1.0) u = std::nextafter(1.0, 0.0);

  const draw::Mass total = build_candidates(row, row[argmax]);
  const draw::Mass target = draw::draw_target(u, total);
  draw::Mass cumulative = 0;
  size_t last_positive = 0;
  for (size_t i = 0; i < weights_.size(); ++i) {
    const draw::Mass m = draw::to_mass(weights_[i]);
    if (m == 0) continue;
    cumulative += m;
    last_positive = i;
    if (target < cumulative) return candidate_id(i);
  }
  return candidate_id(last_positive);  // unreachable: target < total
}

SamplingParams Sampler::params_of(const RowSampling& row) {
  SamplingParams p;
  p.temperature = row.temperature;
  p.top_k = row.top_k;
  p.top_p = row.top_p;
  p.min_p = row.min_p;
  p.repeat_penalty = row.repeat_penalty;
  p.frequency_penalty = row.frequency_penalty;
  p.presence_penalty = row.presence_penalty;
  p.validate();
  return p;
}

RowSampling Sampler::row_sampling(const SamplingParams& params, double u) {
  const bool pen = params.has_penalties();
  return RowSampling{.temperature = params.temperature,
                     .top_k = params.top_k,
                     .top_p = params.top_p,
                     .min_p = params.min_p,
                     .uniform = u,
                     .repeat_penalty = pen ? params.repeat_penalty : 1.0f,
                     .frequency_penalty = pen ? params.frequency_penalty : 0.0f,
                     .presence_penalty = pen ? params.presence_penalty : 0.0f};
}

std::vector<TokenProb> Sampler::distribution(std::span<const float> logits) {
  size_t argmax = 0;
  const auto row = prepared(logits, argmax);
  if (params_.is_greedy()) return {TokenProb{static_cast<int32_t>(argmax), 1.0f}};

  const double total = double(build_candidates(row, row[argmax]));
  std::vector<TokenProb> out;
  for (size_t i = 0; i < weights_.size(); ++i)
    if (const draw::Mass m = draw::to_mass(weights_[i]); m > 0)
      out.push_back(TokenProb{candidate_id(i), static_cast<float>(double(m) / total)});
  std::sort(out.begin(), out.end(), [](const TokenProb& a, const TokenProb& b) {
    return a.prob > b.prob || (a.prob == b.prob && a.id < b.id);
  });
  return out;
}

}  // namespace fdl
