// Tree verification's drafting side: prompt lookup's distinct alternates, the n-gram cache's
// shorter-gram alternate, and DraftTreeBuilder's allocation of the node budget by confidence
// (shared prefixes once, main chain first, depth-first order).
#include <gtest/gtest.h>

#include "decode/draft_policy.h"
#include "decode/draft_tree.h"

namespace fdl::spec {
namespace {

using Ids = std::vector<int32_t>;

Draft draft_of(Ids tokens) {
  Draft d;
  d.tokens = std::move(tokens);
  return d;
}

TEST(PromptLookupAlternates, DistinctContinuationsLongestThenMostRecent) {
  const PromptLookup lookup(1, 3);
  // "6 1 2" followed by 7; "1 2" by 5 (most recent), 7, 5; "2" alone also by 9.
  const Ids ctx{2, 9, 1, 2, 5, 6, 1, 2, 7, 8, 1, 2, 5, 6, 1, 2};
  std::vector<Draft> out;
  lookup.propose_distinct(ctx, 2, 3, out);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].tokens, (Ids{7, 8}));  // the longest match: what propose() returns
  EXPECT_EQ(out[1].tokens, (Ids{5, 6}));
  EXPECT_EQ(out[2].tokens, (Ids{9, 1}));  // from the 1-gram "2"
  Draft main;
  lookup.propose(ctx, 2, main);
  EXPECT_EQ(main.tokens, out[0].tokens);
  out.clear();
  lookup.propose_distinct(ctx, 2, 1, out);
  EXPECT_EQ(out.size(), 1u);
}

TEST(NgramCacheAlternate, ShorterGramWithAnotherFollower) {
  NgramCache cache(1, 2);
  cache.feed(Ids{4, 1, 2, 3}, 0);  // "1 2" -> 3, "2" -> 3
  cache.feed(Ids{9, 2, 7}, 0);     // "2" -> 7 (most recent), "9 2" -> 7
  Draft alt;
  cache.propose_alternate(Ids{1, 2}, 2, alt);  // longest: "1 2" -> 3; shorter "2" -> 7
  ASSERT_FALSE(alt.tokens.empty());
  EXPECT_EQ(alt.tokens.front(), 7);
  cache.propose_alternate(Ids{9, 2}, 2, alt);  // both grams agree on 7
  EXPECT_TRUE(alt.tokens.empty());
}

TEST(DraftTreeBuilder, OneCandidateIsItsChain) {
  DraftTreeBuilder b;
  DraftTree t;
  const std::vector<Draft> c{draft_of({5, 6, 7, 8})};
  b.build(c, 3, 0.5, 0.4, t);
  EXPECT_EQ(t.tokens, (Ids{5, 6, 7}));
  EXPECT_TRUE(t.linear());
  EXPECT_EQ(t.main_depth(), 3u);
}

TEST(DraftTreeBuilder, LowAcceptanceMovesNodesToAlternates) {
  DraftTreeBuilder b;
  DraftTree t;
  // Main 5 6 7 8 9; alternate 5 6 20 21 shares "5 6"; alternate 30 31 differs at once.
  const std::vector<Draft> c{draft_of({5, 6, 7, 8, 9}), draft_of({5, 6, 20, 21}), draft_of({30, 31})};
  b.build(c, 5, 0.95, 0.4, t);  // confident: the main chain takes the whole budget
  EXPECT_EQ(t.tokens, (Ids{5, 6, 7, 8, 9}));
  EXPECT_TRUE(t.linear());
  b.build(c, 5, 0.4, 0.4, t);
  // Values: main 0.4, 0.16, 0.064, ...; alternate 30: 0.6 * 0.4 = 0.24, 31: 0.096;
  // alternate 20 below "5 6": 0.16 * 0.24 = 0.038.
  EXPECT_EQ(t.tokens, (Ids{5, 6, 7, 30, 31}));
  EXPECT_EQ(t.parent, (std::vector<int32_t>{-1, 0, 1, -1, 3}));
  EXPECT_FALSE(t.linear());
  EXPECT_EQ(t.main_depth(), 3u);
  // Shared prefixes once: the repeated candidate adds nothing.
  const std::vector<Draft> dup{draft_of({5, 6}), draft_of({5, 6}), draft_of({5})};
  b.build(dup, 5, 0.4, 0.4, t);
  EXPECT_EQ(t.tokens, (Ids{5, 6}));
}

TEST(DraftTreeBuilder, ParentsComeFirstAndTheBudgetHolds) {
  DraftTreeBuilder b;
  DraftTree t;
  const std::vector<Draft> c{draft_of({1, 2, 3}), draft_of({4, 5, 6}), draft_of({7, 8}), draft_of({1, 9, 9}),
                             draft_of({1, 2, 10})};
  for (size_t budget = 0; budget <= 9; ++budget) {
    b.build(c, budget, 0.3, 0.4, t);
    EXPECT_EQ(t.size(), std::min<size_t>(budget, 12));
    for (size_t i = 0; i < t.size(); ++i) EXPECT_LT(t.parent[i], int32_t(i));
  }
}

TEST(DraftTreeBuilder, AlternatesUsefulOnlyWhenTheyCouldWin) {
  EXPECT_FALSE(DraftTreeBuilder::alternates_useful(1, 0.1, 0.4));  // one node: no branch
  EXPECT_FALSE(DraftTreeBuilder::alternates_useful(5, 0.9, 0.4));  // 0.04 < 0.59
  EXPECT_TRUE(DraftTreeBuilder::alternates_useful(5, 0.5, 0.4));   // 0.2 > 0.03
  EXPECT_FALSE(DraftTreeBuilder::alternates_useful(2, 0.7, 0.4));  // 0.12 < 0.49
}

TEST(DraftTreeBuilder, ShortMainDraftsSpareBudgetOnlyForWorthyAlternates) {
  DraftTreeBuilder b;
  DraftTree t;
  const std::vector<Draft> c{draft_of({5, 6}), draft_of({30, 31, 32})};
  // alpha 0.8, budget 5: floor 0.33; alternate 30 is worth 0.2 * 0.4 = 0.08: not kept, though
  // three nodes of the budget are unused.
  b.build(c, 5, 0.8, 0.4, t);
  EXPECT_EQ(t.tokens, (Ids{5, 6}));
  // alpha 0.3: floor 0.002; 30 (0.28), 31 (0.084), 32 (0.025) are all kept.
  b.build(c, 5, 0.3, 0.4, t);
  EXPECT_EQ(t.tokens, (Ids{5, 6, 30, 31, 32}));
}

TEST(AlternateRate, LearnsHowOftenAnAlternateWins) {
  AlternateRate r;
  EXPECT_DOUBLE_EQ(r.gamma(), AlternateRate::kPrior);
  for (int i = 0; i < 200; ++i) r.observe(false);
  EXPECT_DOUBLE_EQ(r.gamma(), 0.05);  // clamped: trees stay possible at low acceptance
  for (int i = 0; i < 200; ++i) r.observe(i % 2 == 0);
  EXPECT_NEAR(r.gamma(), 0.5, 0.05);
  // A low gamma keeps a mid-confidence draft linear.
  DraftTreeBuilder b;
  DraftTree t;
  const std::vector<Draft> c{draft_of({5, 6, 7, 8, 9}), draft_of({30, 31})};
  b.build(c, 5, 0.5, 0.05, t);
  EXPECT_TRUE(t.linear());
  b.build(c, 5, 0.5, 0.4, t);
  EXPECT_FALSE(t.linear());
}

}  // namespace
}  // namespace fdl::spec
