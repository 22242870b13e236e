// The adaptive window (cost model + acceptance estimate) and the breaker.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "decode/spec_breaker.h"
#include "decode/window_controller.h"

namespace fdl::spec {
namespace {

TEST(StepCostModel, RecoversFixedAndPerTokenCost) {
  StepCostModel cost;
  for (int i = 0; i < 200; ++i) {
    const double tokens = 1 + i % 9;
    cost.observe(tokens, 2.0 + 0.5 * tokens);
  }
  EXPECT_NEAR(cost.fixed_ms(), 2.0, 1e-6);
  EXPECT_NEAR(cost.per_token_ms(), 0.5, 1e-6);
  EXPECT_NEAR(cost.predict(4), 4.0, 1e-6);
}

TEST(StepCostModel, UsesThePriorRatioWhenBatchSizesNeverVary) {
  StepCostModel cost;
  for (int i = 0; i < 50; ++i) cost.observe(1, 1.1);
  EXPECT_NEAR(cost.predict(1), 1.1, 1e-9);
  EXPECT_NEAR(cost.per_token_ms() / cost.fixed_ms(), 0.1, 1e-9);
}

StepCostModel cost_with(double a, double b) {
  StepCostModel cost;
  for (int i = 0; i < 200; ++i) cost.observe(1 + i % 9, a + b * (1 + i % 9));
  return cost;
}

TEST(WindowController, GrowsWithAcceptanceAndShrinksWithout) {
  const auto cheap = cost_with(1.0, 0.05);  // weight-bound: extra tokens nearly free
  WindowController good;
  for (int i = 0; i < 30; ++i) good.observe(8, 8);
  EXPECT_GT(good.acceptance(), 0.95);
  EXPECT_EQ(good.choose(8, 1, cheap), 8u);

  WindowController bad;
  for (int i = 0; i < 30; ++i) bad.observe(4, 0);
  EXPECT_LT(bad.acceptance(), 0.05);
  const auto pricey = cost_with(1.0, 1.0);  // compute-bound: each token costs a step
  // Plain decode, except 1-token probes, at intervals that doubled with every failed
  // verification up to kMaxProbeInterval.
  size_t probes = 0;
  for (int i = 0; i < 3 * WindowController::kMaxProbeInterval; ++i) {
    const size_t k = bad.choose(8, 1, pricey);
    if (k > 0) {
      EXPECT_EQ(k, 1u);
      ++probes;
      bad.observe(k, 0);
    }
  }
  EXPECT_EQ(probes, 3u);

  // An acceptance brings the probe interval back to kProbeInterval.
  WindowController recovering;
  for (int i = 0; i < 30; ++i) recovering.observe(4, 0);
  recovering.observe(4, 1);  // an acceptance resets the interval
  size_t first_probe = 0;
  for (int i = 1; i <= WindowController::kMaxProbeInterval && !first_probe; ++i)
    if (recovering.choose(8, 1, pricey) > 0) first_probe = size_t(i);
  EXPECT_EQ(first_probe, size_t(WindowController::kProbeInterval));
}

TEST(WindowController, SharedFixedCostMakesSpeculationCostlierInBigBatches) {
  const auto cost = cost_with(1.0, 0.1);
  WindowController w;
  for (int i = 0; i < 30; ++i) w.observe(4, 2);  // alpha ~ 2/3
  EXPECT_GE(w.choose(8, 1, cost), w.choose(8, 32, cost));
}

// Exploration measures only windows that could win: with near-certain acceptance and a
// measured 6-token step, the 1..4-token windows' predicted values are far below the 5-token
// window's, so no step is spent on them.
TEST(WindowController, DoesNotExploreWindowsThatCannotWin) {
  StepCostModel cost;
  for (int i = 0; i < 20; ++i) {
    cost.observe(1, 1.0);
    cost.observe(6, 2.0);
  }
  WindowController w;
  for (int i = 0; i < 30; ++i) w.observe(5, 5);
  for (int i = 0; i < 4 * WindowController::kExploreInterval; ++i) EXPECT_EQ(w.choose(5, 1, cost), 5u) << i;
}

// ... but a window predicted close to the best (within kExploreMargin) is still tried, once
// every kExploreInterval choices, while its batch size is unmeasured.
TEST(WindowController, ExploresUnmeasuredWindowsNearTheBest) {
  StepCostModel cost;
  for (int i = 0; i < 20; ++i) cost.observe(1, 1.0);  // only 1-token steps: the prior line
  WindowController w;
  for (int i = 0; i < 30; ++i) w.observe(4, 2);  // alpha ~ 0.67: a flat optimum
  std::map<size_t, int> picks;
  for (int i = 0; i < 4 * WindowController::kExploreInterval; ++i) ++picks[w.choose(5, 1, cost)];
  ASSERT_GE(picks.size(), 2u);  // the best window, and at least one explored neighbour
  int best_count = 0;
  for (const auto& [k, c] : picks) best_count = std::max(best_count, c);
  EXPECT_EQ(best_count, 3 * WindowController::kExploreInterval);  // every 4th choice explores
}

TEST(SpecBreaker, AuditMismatchRateAboveThresholdOpensItUntilReset) {
  SpecBreaker b(0.05, 20);
  for (int i = 0; i < 19; ++i) b.record_audit(false);
  EXPECT_FALSE(b.open());
  b.record_audit(true);  // 1 of 20 = 5%: not above the threshold
  EXPECT_FALSE(b.open());
  b.record_audit(true);  // 2 of 20 = 10%
  EXPECT_TRUE(b.open());
  EXPECT_EQ(b.trips(), 1);
  b.reset();
  EXPECT_FALSE(b.open());
  EXPECT_FALSE(b.reason().empty());  // why it last opened stays visible
}

TEST(SpecBreaker, SlowdownOverAFullWindowOpensIt) {
  SpecBreaker b(0.05, 8);
  for (int i = 0; i < 7; ++i) b.record_step(1.0, 2.0, 1.0, 1.0);  // half speed, window not full
  EXPECT_FALSE(b.open());
  b.record_step(1.0, 2.0, 1.0, 1.0);
  EXPECT_TRUE(b.open());

  SpecBreaker fine(0.05, 8);
  for (int i = 0; i < 100; ++i) fine.record_step(2.0, 1.5, 1.0, 1.0);  // 1.33x plain
  for (int i = 0; i < 100; ++i) fine.record_step(1.0, 1.04, 1.0, 1.0);  // 4% slower: tolerated
  EXPECT_FALSE(fine.open());
}

}  // namespace
}  // namespace fdl::spec
