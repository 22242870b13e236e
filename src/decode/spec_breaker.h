// Internal: the speculation circuit breaker (docs/SPECULATIVE.md, "Fingerprint audit and
// breaker"). Speculation must never cost correctness or speed; this turns it off for every
// sequence when either signal over a sliding window exceeds the threshold:
//  - audit: the fraction of audited steps whose fingerprint differed from the plain shadow;
//  - slowdown: 1 - (tokens/ms of the last `window` speculating steps) / (tokens/ms plain
//    decoding would have had on the same steps, from measured plain steps). A step whose time
//    relative to its plain step is more than kOutlierFactor x the window's median counts as
//    kOutlierFactor x the median: one step the OS preempted (4-8 ms against ~0.05 ms steps on
//    stories260K) would otherwise outweigh the 63 others of a 64-step window and open the
//    breaker although speculation pays; a real slowdown (most steps slower) is not capped.
// It stays open until reset() (the engine API's manual reset); opening logs one line.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace fdl::spec {

class SpecBreaker {
 public:
  SpecBreaker(double threshold, int window) : threshold_(threshold), window_(size_t(window)) {}
  void record_audit(bool mismatch);
  /// A step in which some sequence speculated: it emitted `tokens` in `ms`; plain decoding
  /// would have emitted `plain_tokens` in `plain_ms`.
  void record_step(double tokens, double ms, double plain_tokens, double plain_ms);
  bool open() const { return open_; }
  int64_t trips() const { return trips_; }
  const std::string& reason() const { return reason_; }
  void reset();
  /// Opens the breaker (manual trip through the engine API, or an automatic signal);
  /// a no-op when already open.
  void trip(std::string why);

 private:
  double threshold_;
  size_t window_;
  bool open_ = false;
  int64_t trips_ = 0;
  std::string reason_;
  std::deque<bool> audits_;
  struct Step { double tokens, ms, plain_tokens, plain_ms; };
  std::deque<Step> steps_;
  static constexpr double kOutlierFactor = 4.0;
  std::vector<double> slowness_;  // scratch of record_step (no allocation per step)
};

}  // namespace fdl::spec
