// Speculation circuit breaker (see spec_breaker.h).
#include "decode/spec_breaker.h"

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
  Step sum{0, 0, 0, 0};
  for (const Step& s : steps_) {
    sum.tokens += s.tokens; sum.ms += s.ms; sum.plain_tokens += s.plain_tokens; sum.plain_ms += s.plain_ms;
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
