// OffloadBreaker: p95-over-a-window latency breaker for disk offload (see offload_breaker.h).
#include "kv/offload_breaker.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace fdl::kv {

OffloadBreaker::OffloadBreaker(const OffloadBreakerConfig& cfg) : cfg_(cfg) {
  if (!std::isfinite(cfg.threshold_ms) || cfg.threshold_ms < 0)
    throw std::invalid_argument("OffloadBreaker: threshold_ms must be a finite number >= 0");
  if (!std::isfinite(cfg.cooldown_ms) || cfg.cooldown_ms < 0)
    throw std::invalid_argument("OffloadBreaker: cooldown_ms must be a finite number >= 0");
  if (cfg.window == 0 || cfg.min_samples == 0 || cfg.min_samples > cfg.window)
    throw std::invalid_argument("OffloadBreaker: need 1 <= min_samples <= window");
  samples_.reserve(cfg.window);
}

void OffloadBreaker::record(double latency_ms, Clock::time_point now) {
  if (!std::isfinite(latency_ms) || latency_ms < 0) return;
  if (samples_.size() < cfg_.window) {
    samples_.push_back(latency_ms);
  } else {
    samples_[next_] = latency_ms;
  }
  next_ = (next_ + 1) % cfg_.window;
  if (!open_ && samples_.size() >= cfg_.min_samples) {
    const double p95 = p95_ms();
    if (p95 > cfg_.threshold_ms)
      open(now, false, "p95 disk transfer latency " + std::to_string(p95) + " ms > threshold " +
                           std::to_string(cfg_.threshold_ms) + " ms over " +
                           std::to_string(samples_.size()) + " transfers");
  }
}

bool OffloadBreaker::allows_offload(Clock::time_point now) {
  if (!open_) return true;
  if (manual_) return false;
  const double open_ms = std::chrono::duration<double, std::milli>(now - opened_at_).count();
  if (open_ms < cfg_.cooldown_ms) return false;
  spdlog::info("kv offload breaker: cool-down of {} ms over, disk offload resumes",
               cfg_.cooldown_ms);
  reset();
  return true;
}

void OffloadBreaker::trip(Clock::time_point now, const std::string& reason) {
  open(now, true, reason.empty() ? "manual trip" : reason);
}

void OffloadBreaker::open(Clock::time_point now, bool manual, std::string reason) {
  open_ = true;
  manual_ = manual;
  opened_at_ = now;
  ++trips_;
  reason_ = std::move(reason);
  spdlog::warn("kv offload breaker tripped ({}); disk offload paused", reason_);
}

void OffloadBreaker::reset() {
  open_ = false;
  manual_ = false;
  samples_.clear();
  next_ = 0;
}

double OffloadBreaker::p95_ms() const {
  if (samples_.empty()) return 0.0;
  std::vector<double> s = samples_;
  // Nearest-rank p95: the ceil(0.95 n)-th smallest sample.
  const size_t rank = size_t(std::ceil(0.95 * double(s.size())));
  const size_t k = std::max<size_t>(rank, 1) - 1;
  std::nth_element(s.begin(), s.begin() + ptrdiff_t(k), s.end());
  return s[k];
}

}  // namespace fdl::kv
