// Speculation state shared by the scheduler's steps (src/engine/spec_state.h).
#include <gtest/gtest.h>

#include "engine/spec_state.h"

namespace fdl::engine {
namespace {

// A preempted step must not make shadow drafting look cheap: the shadow budget is priced at
// the cost model's lower envelope; the breaker's reference (plain_ms) is a mean whose samples
// enter capped at 4x it.
TEST(SpecState, ShadowDraftsArePricedAtTheEnvelopeNotAtAPreemptedStep) {
  SpecOptions o;
  o.mode = SpecMode::Lookup;
  SpecState sp(o);
  EXPECT_EQ(sp.shadow_step_ms(1), 0.0);  // nothing measured yet
  for (int i = 0; i < 20; ++i) {
    sp.cost.observe(1, 0.05);
    sp.observe_plain(1, 0.05);
  }
  EXPECT_NEAR(sp.shadow_step_ms(1), 0.05, 1e-12);
  sp.cost.observe(1, 4.0);  // the OS ran something else for a 4 ms slice
  sp.observe_plain(1, 4.0);
  EXPECT_NEAR(sp.plain_ms(1), 0.9 * 0.05 + 0.1 * 0.2, 1e-12);  // capped at 4 x 0.05, not 0.445
  EXPECT_LT(sp.shadow_step_ms(1), 0.07);
  // With drafts at 4% of a step, the budget still allows about one every 4 plain steps.
  spec::WindowController w;
  int drafts = 0;
  for (int i = 0; i < 100; ++i) {
    if (w.shadow_due(0.002, sp.shadow_step_ms(1))) {
      ++drafts;
      w.start_shadow({1});
    }
    w.observe_plain_token(2);
  }
  EXPECT_LE(drafts, 30);
}

// The cap trims single outliers only: plain steps that really got slower (a longer context, a
// busier machine) move the mean to their new time within a few dozen steps.
TEST(SpecState, PlainStepTimeFollowsARealChange) {
  SpecState sp(SpecOptions{});
  for (int i = 0; i < 20; ++i) sp.observe_plain(1, 0.05);
  for (int i = 0; i < 60; ++i) sp.observe_plain(1, 1.0);  // 20x slower from now on
  EXPECT_NEAR(sp.plain_ms(1), 1.0, 0.01);
}

}  // namespace
}  // namespace fdl::engine
