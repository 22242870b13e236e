// Internal: the adaptive speculation window (issue 4, "adaptive window").
//
// StepCostModel: forward time as a + b * batch_tokens, fitted by exponentially decayed least
// squares over the steps seen (a = fixed cost of a step: reading the weights, launching work;
// b = cost of one more token in the batch). Until the batch sizes vary enough to separate
// the two, b is taken as 10% of a (a weight-read-bound step). Batch sizes measured often
// enough are predicted from their own decayed mean instead of the line.
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
// kMaxProbeInterval, while the probes fail), so a sequence whose text turns repetitive is
// noticed.
#pragma once

#include <cstddef>
#include <vector>

namespace fdl::spec {

class StepCostModel {
 public:
  void observe(double batch_tokens, double ms);
  double fixed_ms() const;      ///< a
  double per_token_ms() const;  ///< b
  /// Measured decayed mean for a batch size seen at least kMinSamples times (real kernels
  /// are not linear: a matmul may switch tiling at some row count), else a + b * tokens.
  double predict(double batch_tokens) const;
  bool has_data() const { return w_ > 0.0; }
  /// Times batch size `batch_tokens` was observed.
  int samples(size_t batch_tokens) const {
    return batch_tokens < by_size_.size() ? by_size_[batch_tokens].n : 0;
  }
  static constexpr int kMinSamples = 3;

 private:
  double w_ = 0, sx_ = 0, sy_ = 0, sxx_ = 0, sxy_ = 0;  // decayed sums
  struct Cell { double mean_ms = 0; int n = 0; };
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

 private:
  // Prior: one accepted and one rejected token, i.e. alpha = 0.5, worth two observations.
  double accepted_ = 1.0;
  double rejections_ = 1.0;
  int since_probe_ = 0;
  int probe_interval_ = kProbeInterval;  ///< grows while probes fail
  int choices_ = 0;
  std::vector<double> values_;  ///< scratch of choose(): expected tokens per ms of each k
};

}  // namespace fdl::spec
