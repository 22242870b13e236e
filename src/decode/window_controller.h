// Internal: the adaptive speculation window (docs/SPECULATIVE.md, "Adaptive window").
//
// StepCostModel: forward time as a + b * batch_tokens, fitted by exponentially decayed least
// squares over the steps seen (a = fixed cost of a step: reading the weights, launching work;
// b = cost of one more token in the batch). Until the batch sizes vary enough to separate
// the two, b is the slope between the measured cells nearest the usual batch size (below),
// and only while no second batch size was ever measured 10% of a (a weight-read-bound
// step). Batch sizes measured often enough are predicted from their own cell instead of the
// line: a lower envelope of the samples (a faster sample replaces the cell, a slower one
// moves it by 20%).
//
// WindowController (one per sequence): the per-token acceptance rate alpha, estimated as a
// decayed ratio accepted / (accepted + rejection events) — the maximum-likelihood estimate
// when each draft token is accepted independently with probability alpha. A window of k
// then emits E(k) = 1 + alpha + ... + alpha^k tokens in expectation, and costs its share of
// the step, C(n)/n_live + C(n + k) - C(n) with n = n_live and C the cost model's
// prediction; the controller picks the k in [0, max_k] maximizing
// E(k) / cost(k) (Leviathan et al. 2023, section 3.4, with a measured cost), and only if
// that beats plain decoding by 10% (costs outside the model: drafting, timer noise). When that is
// 0 it still probes with k = 1 every `kProbeInterval` steps (doubling, up to
// kMaxProbeInterval, while the probes fail), and the scheduler may make *shadow drafts*
// (below), so a sequence whose text turns repetitive is noticed.
//
// Thread-safety: none; each instance belongs to one scheduler thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

namespace fdl::spec {

class StepCostModel {
 public:
  void observe(double batch_tokens, double ms);
  double fixed_ms() const;      ///< a
  double per_token_ms() const;  ///< b
  /// Measured cell (lower envelope, see observe) for a batch size seen at least kMinSamples
  /// times (real kernels are not linear: a matmul may switch tiling at some row count), else
  /// a + b * tokens. Milliseconds.
  double predict(double batch_tokens) const;
  bool has_data() const { return w_ > 0.0; }
  /// Times batch size `batch_tokens` was observed.
  int samples(size_t batch_tokens) const {
    return batch_tokens < by_size_.size() ? by_size_[batch_tokens].n : 0;
  }
  /// Observations (of any batch size) since `batch_tokens` was last observed; a large
  /// number if never. A cell this old may describe a machine state that has passed.
  int64_t age(size_t batch_tokens) const {
    return batch_tokens < by_size_.size() && by_size_[batch_tokens].n > 0
               ? observations_ - by_size_[batch_tokens].last
               : std::numeric_limits<int32_t>::max();
  }
  static constexpr int kMinSamples = 3;
  /// Cells at most this many tokens from the most observed batch size feed the fallback
  /// slope (verification windows, not prefill chunks: a prefill's per-token cost is far
  /// below a window's marginal cost on a compute-bound model).
  static constexpr size_t kSlopeSpan = 16;

 private:
  /// The fallback slope when the line is not identifiable: the smallest positive slope
  /// between the most observed cell and another measured cell within kSlopeSpan of it
  /// (ms per token; 0 while there is none). Recomputed by observe().
  void update_cell_slope();
  double w_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;  // decayed sums
  double cell_slope_ = 0.0;
  size_t most_observed_ = 0;  ///< the cell observed most often (the usual batch size)
  int64_t observations_ = 0;
  struct Cell { double ms = 0; int n = 0; int64_t last = 0; };  // ms: see observe()
  std::vector<Cell> by_size_;  ///< index = batch tokens
};

class WindowController {
 public:
  static constexpr int kProbeInterval = 32;
  static constexpr int kMaxProbeInterval = 256;
  /// While speculation pays, every kExploreInterval-th choice is a window whose batch size
  /// the cost model has not measured yet (smallest first), so the choice rests on measured
  /// costs rather than on the straight line ...
  static constexpr int kExploreInterval = 4;
  /// ... among the unmeasured windows whose predicted value (the cost model's line) is at
  /// least this fraction of the best window's.
  static constexpr double kExploreMargin = 0.95;
  /// One verification: `drafted` tokens fed, `accepted` of them accepted.
  void observe(size_t drafted, size_t accepted);
  /// Window for the next step, <= max_k; `n_live` sequences share the step's fixed cost.
  size_t choose(size_t max_k, size_t n_live, const StepCostModel& cost);
  double acceptance() const { return accepted_ / (accepted_ + rejections_); }
  // Shadow drafts: evidence about acceptance while the sequence decodes plainly. A draft
  // made on a plain step is not verified; the tokens the following plain steps emit are
  // compared with it, one per step, and once resolved (first mismatch, or every token
  // matched) it has counted exactly as a verification of that draft would have: what
  // verifying it would have accepted under greedy decoding, and the same acceptance
  // probability under sampling (P(sampled token == draft) = p(draft)). Without it a
  // sequence that decodes plainly learns only from 1-token probes every 32+ steps, so text
  // that turns (or, after one unlucky draft, still is) repetitive waits that long.

  /// True when no shadow draft is pending and drafting one now keeps the drafting cost within
  /// kShadowBudget of the plain steps since the last one (`draft_ms`: measured cost of one
  /// draft; `step_ms`: this sequence's share of a plain step; both in milliseconds).
  bool shadow_due(double draft_ms, double step_ms) const {
    return shadow_.empty() && double(since_shadow_ + 1) * step_ms * kShadowBudget >= draft_ms;
  }
  /// Starts comparing the next plain steps' tokens with `draft` (an empty one just records
  /// that a draft was tried).
  void start_shadow(const std::vector<int32_t>& draft);
  /// A plain step emitted `token`: advances (and maybe resolves) the pending shadow draft.
  void observe_plain_token(int32_t token);
  /// Forget a pending shadow draft (the sequence speculates: its verification is the
  /// evidence then).
  void drop_shadow() { shadow_.clear(); shadow_pos_ = 0; }
  /// Fraction of plain-step time that shadow drafting may take.
  static constexpr double kShadowBudget = 0.01;

  /// Expected throughput of the last choose()'s window relative to plain decoding's
  /// (expected tokens per ms / plain tokens per ms, as the cost model predicts it); 0 when it
  /// chose plain decoding (or a probe window).
  double predicted_gain() const { return gain_; }

 private:
  // Prior: one accepted and one rejected token, i.e. alpha = 0.5, worth two observations.
  double accepted_ = 1.0;
  double rejections_ = 1.0;
  int since_probe_ = 0;
  int probe_interval_ = kProbeInterval;  ///< grows while probes fail
  int choices_ = 0;
  double gain_ = 0.0;
  void decay();  ///< ages the acceptance evidence by one verification
  void record_rejection(size_t accepted_before);
  std::vector<int32_t> shadow_;  ///< pending shadow draft
  size_t shadow_pos_ = 0;        ///< its tokens matched so far
  int since_shadow_ = 0;         ///< plain steps since the last shadow draft
  std::vector<double> values_;  ///< scratch of choose(): expected tokens per ms of each k
};

}  // namespace fdl::spec
