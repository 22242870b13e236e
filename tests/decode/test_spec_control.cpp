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

// Decode steps rarely vary the batch size enough for the line to separate a and b, and
// the decayed sums forget the last variation within ~50 steps; measured cells do not. The
// prior (b = 10% of a) must not come back once a window near the usual size was measured,
// and a prefill-sized cell far from it (a cheap per-token cost) must not set the slope.
TEST(StepCostModel, FallsBackToTheMeasuredCellsSlopeNotThePrior) {
  StepCostModel cost;
  cost.observe(300, 30.0);  // a prefill: 0.1 ms per token
  for (int i = 0; i < 20; ++i) cost.observe(1, 1.0);
  for (int i = 0; i < 3; ++i) cost.observe(3, 2.0);  // a 3-token window: 0.5 ms per token more
  for (int i = 0; i < 1000; ++i) cost.observe(1, 1.0);  // plain decoding from then on
  EXPECT_NEAR(cost.per_token_ms(), 0.5, 1e-9);
  EXPECT_NEAR(cost.predict(4), 1.0 + 3 * 0.5, 1e-6);  // unmeasured: the line through the base
  // An acceptance of ~0.25 does not pay for tokens at half a step each (with the prior's
  // 10% it would: (1 + 0.25) / 1.09 > 1.1).
  WindowController w;
  for (int i = 0; i < 10; ++i) w.observe(4, 1);
  EXPECT_EQ(w.choose(5, 1, cost), 0u) << "acceptance " << w.acceptance();
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

// The first decode steps after a long prefill are slow (the weights are streamed back into
// the cache); a cell measured then must not keep that cost once faster steps are seen.
TEST(StepCostModel, AFasterSampleReplacesTheCellASlowerOneMovesIt) {
  StepCostModel cost;
  for (double ms : {1.6, 1.5, 1.4}) cost.observe(1, ms);
  EXPECT_NEAR(cost.predict(1), 1.4, 1e-9);
  cost.observe(1, 0.75);
  EXPECT_NEAR(cost.predict(1), 0.75, 1e-9);
  cost.observe(1, 1.0);  // slower: 20% of the way
  EXPECT_NEAR(cost.predict(1), 0.8, 1e-9);
  cost.observe(1, 100.0);  // an outlier counts as at most twice the cell
  EXPECT_LE(cost.predict(1), 0.8 * 0.8 + 0.2 * 1.6 + 1e-9);
}

TEST(StepCostModel, AgeCountsObservationsSinceTheBatchSizeWasLastSeen) {
  StepCostModel cost;
  EXPECT_GT(cost.age(1), 1000);  // never observed
  cost.observe(1, 1.0);
  EXPECT_EQ(cost.age(1), 0);
  for (int i = 0; i < 5; ++i) cost.observe(6, 2.0);
  EXPECT_EQ(cost.age(1), 5);
  EXPECT_EQ(cost.age(6), 0);
}

// Text stops being copied: the first draft token fails step after step. After a long
// copied stretch the window must shrink to plain decoding within three such steps, not
// after the ~8 a plain decayed ratio needs (each at several plain steps' cost).
TEST(WindowController, ShrinksWithinThreeFirstTokenRejectionsAfterACopiedStretch) {
  const auto pricey = cost_with(1.0, 1.0);  // compute-bound: each token costs a step
  WindowController w;
  for (int i = 0; i < 40; ++i) w.observe(5, 5);
  EXPECT_GT(w.choose(5, 1, pricey), 0u);
  for (int i = 0; i < 3; ++i) w.observe(5, 0);
  EXPECT_EQ(w.choose(5, 1, pricey), 0u) << "acceptance estimate " << w.acceptance();
  // A partly accepted window is ordinary evidence, not a regime change.
  WindowController partly;
  for (int i = 0; i < 40; ++i) partly.observe(5, 5);
  for (int i = 0; i < 3; ++i) partly.observe(5, 2);
  EXPECT_GT(partly.acceptance(), 0.8);
}

// A shadow draft counts, token by token, as a verification of it would have.
TEST(WindowController, ShadowDraftsCountLikeTheirVerification) {
  WindowController shadow, verified;
  for (int round = 0; round < 3; ++round) {
    shadow.start_shadow({7, 8, 9, 10});
    for (int32_t t : {7, 8, 4}) shadow.observe_plain_token(t);  // two matched, then a miss
    verified.observe(4, 2);
  }
  EXPECT_NEAR(shadow.acceptance(), verified.acceptance(), 1e-12);
  // A fully matched shadow draft resolves on its last token; the next plain token is not
  // compared with anything.
  WindowController full, full_verified;
  full.start_shadow({1, 2});
  for (int32_t t : {1, 2, 3}) full.observe_plain_token(t);
  full_verified.observe(2, 2);
  EXPECT_NEAR(full.acceptance(), full_verified.acceptance(), 1e-12);
}

// Matching shadow drafts take a sequence that decodes plainly back to speculation without
// waiting for a probe; failing ones keep it plain.
TEST(WindowController, MatchingShadowDraftsRestartSpeculation) {
  const auto cost = cost_with(1.0, 0.3);
  WindowController w;
  for (int i = 0; i < 5; ++i) w.observe(5, 0);
  ASSERT_EQ(w.choose(5, 1, cost), 0u);
  w.start_shadow({1, 2, 3, 4, 5});
  for (int32_t t : {1, 2, 3, 4, 5}) w.observe_plain_token(t);
  EXPECT_GT(w.choose(5, 1, cost), 0u) << "acceptance estimate " << w.acceptance();
  EXPECT_GT(w.predicted_gain(), 1.1);

  WindowController no;
  for (int i = 0; i < 5; ++i) no.observe(5, 0);
  for (int i = 0; i < 5; ++i) {
    no.start_shadow({1, 2, 3, 4, 5});
    no.observe_plain_token(9);
  }
  EXPECT_EQ(no.choose(5, 1, cost), 0u);
  EXPECT_EQ(no.predicted_gain(), 0.0);
}

// Shadow drafting is rate-limited to kShadowBudget of the plain steps' time.
TEST(WindowController, ShadowDraftsStayWithinTheirTimeBudget) {
  WindowController w;
  const double step_ms = 0.05, draft_ms = 0.002;  // a tiny model: a draft is 4% of a step
  int drafts = 0;
  const int steps = 1000;
  for (int i = 0; i < steps; ++i) {
    if (w.shadow_due(draft_ms, step_ms)) {
      ++drafts;
      w.start_shadow({1});
    }
    w.observe_plain_token(2);  // always a miss: a new draft would be wanted at once
  }
  EXPECT_LE(drafts * draft_ms, WindowController::kShadowBudget * steps * step_ms * 1.05);
  EXPECT_GE(drafts, 1);
  // Cheap drafts (a large model): one every step a draft is not pending.
  WindowController cheap;
  EXPECT_TRUE(cheap.shadow_due(0.002, 1.0));
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

// One step the OS preempted (100x its usual time) among 63 at 1.2x plain throughput: the sum
// over the window would read 0.47x plain; capped at 4x the window's median it reads ~1.14x.
TEST(SpecBreaker, OnePreemptedStepDoesNotOpenIt) {
  SpecBreaker b(0.05, 64);
  for (int i = 0; i < 63; ++i) b.record_step(1.2, 1.0, 1.0, 1.0);
  b.record_step(1.2, 100.0, 1.0, 1.0);
  EXPECT_FALSE(b.open()) << b.reason();
  for (int i = 0; i < 200; ++i) b.record_step(1.2, i % 50 == 7 ? 100.0 : 1.0, 1.0, 1.0);  // now and then
  EXPECT_FALSE(b.open()) << b.reason();
}

// Most steps slower is a real slowdown, however the times spread: the cap only trims a
// minority of outliers.
TEST(SpecBreaker, SlowdownOfMostStepsStillOpensIt) {
  SpecBreaker b(0.05, 64);
  for (int i = 0; i < 64; ++i) b.record_step(1.0, i % 2 ? 1.3 : 1.1, 1.0, 1.0);  // 0.83x plain
  EXPECT_TRUE(b.open());
  SpecBreaker spiky(0.05, 64);  // every step slow, some very slow: still a slowdown
  for (int i = 0; i < 64; ++i) spiky.record_step(1.0, i % 4 == 0 ? 20.0 : 2.0, 1.0, 1.0);
  EXPECT_TRUE(spiky.open());
}

// Speculation pays by its total: many steps whose drafts were all rejected (slower than a
// plain step) and fewer that accepted several tokens; judged by the window's sums, not by a
// typical step.
TEST(SpecBreaker, BurstyAcceptanceIsJudgedByItsTotal) {
  SpecBreaker b(0.05, 64);
  for (int i = 0; i < 640; ++i) {
    if (i % 5 < 3) b.record_step(1.0, 1.2, 1.0, 1.0);  // rejected: 0.83x plain
    else b.record_step(4.0, 1.3, 1.0, 1.0);            // 4 accepted: 3.1x plain
  }
  EXPECT_FALSE(b.open()) << b.reason();  // in total ~1.77x plain
}

}  // namespace
}  // namespace fdl::spec
