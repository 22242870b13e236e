// Adaptive window (see window_controller.h).
#include "decode/window_controller.h"

#include <algorithm>

namespace fdl::spec {
namespace {

constexpr double kCostDecay = 0.98;     // ~50 steps of memory: tracks load changes
constexpr double kAcceptDecay = 0.9;    // ~10 verifications of memory
constexpr double kPriorRatio = 0.1;     // b / a before the data separates them
constexpr double kRequiredGain = 1.1;   // expected tokens/ms over plain's to speculate
constexpr double kFirstRejectDiscount = 0.5;  // extra decay of acceptances when draft 1 fails

}  // namespace

void StepCostModel::observe(double x, double y) {
  // A step the OS preempted can take 10-100x its cost; clamp such outliers so one of them
  // does not make speculation look cheap (or dear) for the next fifty steps.
  if (w_ > 2.0) y = std::min(y, 3.0 * std::max(predict(x), 1e-6));
  w_ = w_ * kCostDecay + 1.0;
  sx_ = sx_ * kCostDecay + x;
  sy_ = sy_ * kCostDecay + y;
  sxx_ = sxx_ * kCostDecay + x * x;
  sxy_ = sxy_ * kCostDecay + x * y;
  ++observations_;
  if (x < 0 || x > 4096) return;
  const size_t i = size_t(x);
  if (by_size_.size() <= i) by_size_.resize(i + 1);
  Cell& c = by_size_[i];
  // Noise only ever makes a step slower (preemption, other processes' cache traffic), and a
  // step is slower for a while after a long prefill (the weights are streamed back into the
  // cache: the first decode steps of a generation cost up to 2x the later ones). So a sample
  // below the cell is the cost now and replaces it; a higher one moves it by 20%, so a
  // lasting slowdown (load, a growing context) is still followed. A cell that kept a cold
  // early value would misjudge every later decision (docs/SPECULATIVE.md, "Adaptive window").
  if (c.n == 0 || y < c.ms)
    c.ms = y;
  else
    c.ms = 0.8 * c.ms + 0.2 * std::min(y, 2.0 * c.ms);
  ++c.n;
  c.last = observations_;
  if (c.n > by_size_[most_observed_].n) most_observed_ = i;  // counts only grow: exact
  update_cell_slope();
}

void StepCostModel::update_cell_slope() {
  // Decode batches rarely vary enough for the line to separate a and b (a model on which
  // speculation does not pay decodes plainly: one batch size for hundreds of steps), and the
  // decayed sums forget the last variation within ~50 steps. The 10% prior then made every
  // window look cheap again on stories260K, where one more token costs 40-90% of a step, and
  // the controller went back to verifying windows that lose. Measured cells do not decay:
  // the slope between the usual batch size and a window measured near it is the evidence.
  // The smallest such slope (each cell is a lower envelope) errs on the optimistic side.
  const size_t base = most_observed_;
  cell_slope_ = 0.0;
  const size_t lo = base > kSlopeSpan ? base - kSlopeSpan : 0;
  const size_t hi = std::min(by_size_.size(), base + kSlopeSpan + 1);
  for (size_t i = lo; i < hi; ++i) {
    if (i == base || by_size_[i].n == 0) continue;
    const double slope = (by_size_[i].ms - by_size_[base].ms) / (double(i) - double(base));
    if (slope > 0.0 && (cell_slope_ == 0.0 || slope < cell_slope_)) cell_slope_ = slope;
  }
}

double StepCostModel::predict(double x) const {
  const size_t i = x >= 0 ? size_t(x) : 0;
  if (i < by_size_.size() && by_size_[i].n >= kMinSamples) return by_size_[i].ms;
  return fixed_ms() + per_token_ms() * x;
}

double StepCostModel::per_token_ms() const {
  if (w_ <= 0.0) return 0.0;
  const double mx = sx_ / w_, my = sy_ / w_;
  const double var = sxx_ / w_ - mx * mx;
  if (var > 0.25) {
    const double b = (sxy_ / w_ - mx * my) / var;
    if (b > 0.0 && b * mx < my) return b;
  }
  // Not identifiable (or noise made it absurd): the measured cells' slope, else the prior
  // shape b = ratio * a with a + b * mx = my.
  if (cell_slope_ > 0.0 && cell_slope_ * mx < my) return cell_slope_;
  return kPriorRatio * my / (1.0 + kPriorRatio * mx);
}

double StepCostModel::fixed_ms() const {
  if (w_ <= 0.0) return 0.0;
  return std::max(0.0, sy_ / w_ - per_token_ms() * sx_ / w_);
}

void WindowController::decay() {
  accepted_ *= kAcceptDecay;
  rejections_ *= kAcceptDecay;
  // Keep alpha away from exactly 1 so E(k) stays a finite series and the estimate can move.
  rejections_ = std::max(rejections_, 1e-3);
}

void WindowController::record_rejection(size_t accepted_before) {
  // Acceptance is not one stationary rate: text is copied for a while (drafts accepted
  // in full), then it stops (the first draft token rejected, step after step). Counting
  // the first-token rejection as one more event, the estimate built up by a long copied
  // stretch would take ~8 such steps to fall (each at several times a plain step's cost);
  // discounting the accumulated acceptances on it as well lets the window shrink in 2-3.
  if (accepted_before == 0) accepted_ *= kFirstRejectDiscount;
  rejections_ += 1.0;
  // A failed probe doubles the wait before the next one; any acceptance resets it.
  probe_interval_ = accepted_before > 0 ? kProbeInterval : std::min(probe_interval_ * 2, kMaxProbeInterval);
}

void WindowController::observe(size_t drafted, size_t accepted) {
  if (drafted == 0) return;
  decay();
  accepted_ += double(accepted);
  if (accepted < drafted)
    record_rejection(accepted);
  else
    probe_interval_ = kProbeInterval;
}

void WindowController::start_shadow(const std::vector<int32_t>& draft) {
  shadow_ = draft;
  shadow_pos_ = 0;
  since_shadow_ = 0;
  if (!shadow_.empty()) decay();
}

void WindowController::observe_plain_token(int32_t token) {
  if (shadow_.empty()) {
    ++since_shadow_;
    return;
  }
  // The evidence is added token by token (one plain step resolves one draft token), so a
  // shadow draft that keeps matching raises the estimate at once, not only after its last
  // token; the totals equal observe(shadow size, tokens matched).
  if (token == shadow_[shadow_pos_]) {
    accepted_ += 1.0;
    probe_interval_ = kProbeInterval;
    if (++shadow_pos_ == shadow_.size()) drop_shadow();
    return;
  }
  record_rejection(shadow_pos_);
  drop_shadow();
}

size_t WindowController::choose(size_t max_k, size_t n_live, const StepCostModel& cost) {
  gain_ = 0.0;
  if (max_k == 0) return 0;
  const double alpha = acceptance();
  const double n = double(std::max<size_t>(n_live, 1));
  const auto predict = [&](double tokens) {
    // Before any measurement: the prior shape, a = 1, b = kPriorRatio.
    return cost.has_data() ? cost.predict(tokens) : 1.0 + kPriorRatio * tokens;
  };
  const double base = predict(n);
  const double share = base / n;
  if (!(share > 0.0)) return 0;
  size_t best_k = 0;
  // Speculate only for a clear expected gain: drafting, per-row verification and timer noise
  // are not in the cost model, and a marginal window is a likely loss.
  double best = kRequiredGain / share;
  double expected = 1.0, term = 1.0;
  values_.assign(max_k + 1, 0.0);
  for (size_t k = 1; k <= max_k; ++k) {
    term *= alpha;
    expected += term;
    // The marginal cost is never below the fitted per-token slope: a noisy measured cell
    // must not make extra tokens look free (speculation would then never stop).
    // Measured cells are trusted (only kept positive); the line's slope is the floor
    // otherwise.
    const bool measured = cost.samples(size_t(n)) >= StepCostModel::kMinSamples &&
                          cost.samples(size_t(n) + k) >= StepCostModel::kMinSamples;
    const double floor = measured ? 0.02 * double(k) * share
                                  : double(k) * (cost.has_data() ? cost.per_token_ms() : kPriorRatio);
    const double marginal = std::max(predict(n + double(k)) - base, floor);
    const double value = expected / (share + marginal);
    values_[k] = value;
    if (value > best) { best = value; best_k = k; }
  }
  if (best_k > 0) {
    since_probe_ = 0;
    gain_ = best * share;
    // Exploration measures only windows that could plausibly win: an unmeasured size whose
    // line-predicted value is well below the best is not worth a step (with high acceptance
    // the 1..3-token windows cost several low-yield steps of a short generation otherwise).
    if (++choices_ % kExploreInterval == 0)
      for (size_t k = 1; k <= max_k; ++k)
        if (cost.samples(size_t(n) + k) < StepCostModel::kMinSamples && values_[k] >= kExploreMargin * best) {
          gain_ = values_[k] * share;
          return k;
        }
    return best_k;
  }
  if (++since_probe_ >= probe_interval_) {
    since_probe_ = 0;
    return 1;
  }
  return 0;
}

}  // namespace fdl::spec
