// OffloadBreaker: trips on p95 over the window, cools down, manual trip latches.
#include <gtest/gtest.h>

#include <cmath>

#include "kv/offload_breaker.h"

namespace fdl::kv {
namespace {

using namespace std::chrono_literals;
using Clock = OffloadBreaker::Clock;

TEST(OffloadBreaker, StaysClosedWhileP95IsUnderThreshold) {
  OffloadBreaker b({.threshold_ms = 200, .window = 20, .min_samples = 5, .cooldown_ms = 1000});
  const auto t = Clock::time_point{} + 1h;
  // 19 fast, 1 slow: p95 (the 19th of 20) is fast, so one outlier does not trip it.
  for (int i = 0; i < 19; ++i) b.record(10, t);
  b.record(5000, t);
  EXPECT_FALSE(b.is_open());
  EXPECT_TRUE(b.allows_offload(t));
  EXPECT_DOUBLE_EQ(b.p95_ms(), 10);
}

TEST(OffloadBreaker, TripsOnSlowP95AndResumesAfterCooldown) {
  OffloadBreaker b({.threshold_ms = 200, .window = 10, .min_samples = 4, .cooldown_ms = 1000});
  const auto t = Clock::time_point{} + 1h;
  b.record(300, t);
  b.record(300, t);
  b.record(300, t);
  EXPECT_FALSE(b.is_open()) << "fewer than min_samples never trip";
  b.record(300, t);
  EXPECT_TRUE(b.is_open());
  EXPECT_EQ(b.trips(), 1u);
  EXPECT_FALSE(b.allows_offload(t + 999ms));
  EXPECT_TRUE(b.allows_offload(t + 1000ms));
  EXPECT_FALSE(b.is_open());
  EXPECT_EQ(b.n_samples(), 0u) << "a fresh window after the cool-down";
}

TEST(OffloadBreaker, SlidingWindowForgetsOldSamples) {
  OffloadBreaker b({.threshold_ms = 200, .window = 4, .min_samples = 4, .cooldown_ms = 0});
  const auto t = Clock::time_point{} + 1h;
  for (int i = 0; i < 4; ++i) b.record(1, t);
  for (int i = 0; i < 3; ++i) b.record(1000, t);  // window: 1, 1000, 1000, 1000
  EXPECT_TRUE(b.is_open());
}

TEST(OffloadBreaker, ManualTripLatchesUntilReset) {
  OffloadBreaker b({.threshold_ms = 200, .window = 8, .min_samples = 1, .cooldown_ms = 10});
  const auto t = Clock::time_point{} + 1h;
  b.trip(t, "operator");
  EXPECT_TRUE(b.is_open());
  EXPECT_TRUE(b.manual());
  EXPECT_FALSE(b.allows_offload(t + 1h)) << "manual trips do not time out";
  EXPECT_NE(b.reason().find("operator"), std::string::npos);
  b.reset();
  EXPECT_TRUE(b.allows_offload(t));
  EXPECT_FALSE(b.manual());
}

TEST(OffloadBreaker, RejectsBadConfigAndIgnoresBadSamples) {
  EXPECT_THROW(OffloadBreaker({.threshold_ms = -1}), std::invalid_argument);
  EXPECT_THROW(OffloadBreaker({.window = 0}), std::invalid_argument);
  EXPECT_THROW(OffloadBreaker({.window = 4, .min_samples = 5}), std::invalid_argument);
  EXPECT_THROW(OffloadBreaker({.cooldown_ms = std::nan("")}), std::invalid_argument);
  OffloadBreaker b({.threshold_ms = 1, .window = 2, .min_samples = 1});
  b.record(std::nan(""), Clock::now());
  b.record(-5, Clock::now());
  EXPECT_EQ(b.n_samples(), 0u);
  EXPECT_FALSE(b.is_open());
}

}  // namespace
}  // namespace fdl::kv
