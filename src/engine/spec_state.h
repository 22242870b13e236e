// Internal: speculation state that outlives one generate() call (owned by Generator::Impl):
// the shared n-gram cache, the step cost model, the breaker and the metrics. Not thread-safe:
// the scheduler's thread owns it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "decode/draft_tree.h"
#include "decode/ngram_cache.h"
#include "decode/spec_breaker.h"
#include "decode/window_controller.h"
#include "flashdllm/speculative.h"

namespace fdl::engine {

struct SpecState {
  explicit SpecState(const SpecOptions& o)
      : options(o), cache(o.ngram_min, o.ngram_max), breaker(o.breaker_threshold, o.breaker_window) {}

  /// Every `kCalibrationInterval`-th decode step runs plain for every sequence, so the
  /// breaker compares speculation with measured plain steps, not only with a model.
  static constexpr int64_t kCalibrationInterval = 32;
  /// A plain-step measurement older than this many steps is re-taken (one plain step)
  /// unless some drafting sequence expects at least kClearGain x plain throughput.
  static constexpr int64_t kBaseMaxAge = 8;
  static constexpr double kClearGain = 1.5;

  bool enabled() const { return options.mode != SpecMode::Off; }
  /// Measured wall time of a plain step with `n_live` sequences (decayed mean), else the
  /// cost model's prediction.
  double plain_ms(size_t n_live) const {
    if (n_live < plain_ms_by_live.size() && plain_ms_by_live[n_live] > 0)
      return plain_ms_by_live[n_live];
    return cost.predict(double(n_live));
  }
  /// What a plain step of `n_live` sequences costs when pricing shadow drafts (their time
  /// budget): the lower of plain_ms() and the cost model's lower envelope. plain_ms() is a
  /// mean, right for the breaker's reference; preempted steps are capped when they enter it
  /// (observe_plain), but even a capped one raises it by 30%, and the shadow budget with it.
  double shadow_step_ms(size_t n_live) const {
    const double mean = plain_ms(n_live);
    return cost.has_data() ? std::min(mean, cost.predict(double(n_live))) : mean;
  }
  /// Wall time of one draft (policy proposal, pool update included), decayed mean.
  void observe_draft(double ms) { draft_ms = draft_ms > 0 ? 0.9 * draft_ms + 0.1 * ms : ms; }
  /// A sample above kPlainOutlierFactor x the current mean enters capped there: one preempted
  /// plain step (4-8 ms against ~0.05 ms on stories260K) inflated the mean tenfold for ~20
  /// steps, and the breaker's reference with it (speculation then looked faster than it was).
  /// A real change in step time still moves the mean (by up to 30% per step).
  static constexpr double kPlainOutlierFactor = 4.0;
  void observe_plain(size_t n_live, double ms) {
    if (plain_ms_by_live.size() <= n_live) plain_ms_by_live.resize(n_live + 1, 0.0);
    double& m = plain_ms_by_live[n_live];
    m = m > 0 ? 0.9 * m + 0.1 * std::min(ms, kPlainOutlierFactor * m) : ms;
  }

  SpecOptions options;
  spec::NgramCache cache;
  spec::StepCostModel cost;
  spec::AlternateRate alternates;  ///< tree verification: how often an alternate wins
  spec::SpecBreaker breaker;
  SpecMetrics metrics;
  std::vector<double> plain_ms_by_live;
  double draft_ms = 0.0;  ///< see observe_draft; 0 until the first draft
  int64_t decode_steps = 0;
  int forced_mismatches = 0;  ///< test hook (Generator::force_audit_mismatches)
  double audit_credit = 0.0;  ///< accumulates audit_fraction per admitted greedy request
};

}  // namespace fdl::engine
