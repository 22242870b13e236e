// offload_breaker.h — pauses disk offload when disk transfers get slow.
//
// Why: a disk tier that has become slow (a saturated or failing device, a noisy neighbour)
// turns every returning block into a stall; past some latency recompute or staying in the
// upper tiers is cheaper. The breaker watches the latency of tier-2 transfers (demote writes
// and promote reads, milliseconds from submission to completion) over a sliding window of
// the last `window` samples. When the window holds at least `min_samples` and its p95
// exceeds `threshold_ms`, it opens (trips): disk offload is paused and blocks stay in the
// upper tiers. After `cooldown_ms` it closes again with an empty window (a fresh start, so
// one old slow sample cannot re-trip it at once).
//
// A manual trip (operator/API) latches: it does not time out, only reset() closes it.
// Thread-safety: none (engine thread). Time is passed in so tests need no sleeps.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "flashdllm/kv_tiers.h"

namespace fdl::kv {

using fdl::OffloadBreakerConfig;  // declared in flashdllm/kv_tiers.h


class OffloadBreaker {
 public:
  using Clock = std::chrono::steady_clock;
  /// Throws std::invalid_argument for a non-finite/negative threshold or cool-down, or a
  /// window/min_samples outside the ranges above.
  explicit OffloadBreaker(const OffloadBreakerConfig& cfg = {});

  /// Add one transfer latency (ms, >= 0; non-finite values are ignored).
  void record(double latency_ms, Clock::time_point now);
  /// True when disk offload may proceed. Closes an automatic trip whose cool-down is over.
  bool allows_offload(Clock::time_point now);
  void trip(Clock::time_point now, const std::string& reason);  ///< manual, latched
  void reset();                                                  ///< manual close

  bool is_open() const { return open_; }
  bool manual() const { return manual_; }
  uint64_t trips() const { return trips_; }
  const std::string& reason() const { return reason_; }
  /// p95 of the current window in ms (nearest-rank), 0 when empty.
  double p95_ms() const;
  size_t n_samples() const { return samples_.size(); }
  const OffloadBreakerConfig& config() const { return cfg_; }

 private:
  void open(Clock::time_point now, bool manual, std::string reason);
  OffloadBreakerConfig cfg_;
  std::vector<double> samples_;  // ring buffer of the last cfg_.window latencies
  size_t next_ = 0;
  bool open_ = false;
  bool manual_ = false;
  Clock::time_point opened_at_{};
  uint64_t trips_ = 0;
  std::string reason_;
};

}  // namespace fdl::kv
