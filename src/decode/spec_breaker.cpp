// Speculation circuit breaker (see spec_breaker.h).
#include "decode/spec_breaker.h"

#include <algorithm>
#include <cstdio>

namespace fdl::spec {

void SpecBreaker::trip(std::string why) {
  if (open_) return;
  open_ = true;
  ++trips_;
  reason_ = std::move(why);
  // One line on stderr: an operator must see that speculation went off and why.
  std::fprintf(stderr, "flashdllm: speculation breaker open: %s\n", reason_.c_str());
}

void SpecBreaker::record_audit(bool mismatch) {
  audits_.push_back(mismatch);
  if (audits_.size() > window_) audits_.pop_front();
  size_t bad = 0;
  for (bool m : audits_) bad += m ? 1 : 0;
  const double rate = double(bad) / double(audits_.size());
  if (rate > threshold_)
    trip("audit mismatch rate " + std::to_string(rate) + " over the last " +
         std::to_string(audits_.size()) + " audited steps");
}

void SpecBreaker::record_step(double tokens, double ms, double plain_tokens, double plain_ms) {
  steps_.push_back({tokens, ms, plain_tokens, plain_ms});
  if (steps_.size() > window_) steps_.pop_front();
  // Judge full windows only: a handful of steps is dominated by timer noise.
  if (steps_.size() < window_) return;
  // Each step's time relative to a plain step, capped at kOutlierFactor x the window's median
  // (spec_breaker.h: a preempted step must not read as a slowdown).
  slowness_.clear();
  for (const Step& s : steps_)
    if (s.plain_ms > 0.0) slowness_.push_back(s.ms / s.plain_ms);
  double cap = 0.0;
  if (!slowness_.empty()) {
    const auto mid = slowness_.begin() + std::ptrdiff_t(slowness_.size() / 2);
    std::nth_element(slowness_.begin(), mid, slowness_.end());
    cap = kOutlierFactor * *mid;
  }
  Step sum{0, 0, 0, 0};
  for (const Step& s : steps_) {
    const double ms = cap > 0.0 && s.plain_ms > 0.0 ? std::min(s.ms, cap * s.plain_ms) : s.ms;
    sum.tokens += s.tokens; sum.ms += ms; sum.plain_tokens += s.plain_tokens; sum.plain_ms += s.plain_ms;
  }
  if (sum.ms <= 0.0 || sum.plain_ms <= 0.0 || sum.plain_tokens <= 0.0) return;
  const double ratio = (sum.tokens / sum.ms) / (sum.plain_tokens / sum.plain_ms);
  if (ratio < 1.0 - threshold_)
    trip("speculation at " + std::to_string(ratio) + "x plain throughput over the last " +
         std::to_string(steps_.size()) + " speculating steps");
}

void SpecBreaker::reset() {
  open_ = false;  // reason_ stays: the metrics report why it last opened
  audits_.clear();
  steps_.clear();
}

}  // namespace fdl::spec
