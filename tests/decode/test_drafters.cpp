// The draft sources: prompt lookup, the cross-request n-gram cache, the lookahead pool, and
// the policy that picks among them.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "decode/draft_policy.h"

namespace fdl::spec {
namespace {

using Ids = std::vector<int32_t>;

Ids propose(const Drafter& d, const Ids& ctx, size_t k) {
  Draft out;
  d.propose(ctx, k, out);
  return out.tokens;
}

TEST(PromptLookup, ProposesWhatFollowedTheMostRecentLongestMatch) {
  const PromptLookup lookup(1, 3);
  // "7 8 9" occurs twice; the most recent occurrence is followed by 4 5.
  EXPECT_EQ(propose(lookup, {7, 8, 9, 1, 2, 7, 8, 9, 4, 5, 6, 7, 8, 9}, 2), (Ids{4, 5}));
  // A longer match beats a more recent shorter one: "2 3" -> 10, but "1 2 3" -> 11.
  EXPECT_EQ(propose(lookup, {1, 2, 3, 11, 5, 2, 3, 10, 1, 2, 3}, 1), (Ids{11}));
  // The continuation may run into the suffix itself (periodic text).
  EXPECT_EQ(propose(lookup, {5, 6, 5, 6, 5, 6}, 4), (Ids{5, 6}));
}

// The definition, one backwards scan per n (longest first, most recent occurrence first):
// propose()'s single pass must give exactly this, draft and match length.
Draft reference_lookup(const Ids& ctx, size_t max_tokens, size_t n_min, size_t n_max) {
  Draft out;
  const size_t len = ctx.size();
  if (max_tokens == 0 || len < 2) return out;
  for (size_t n = std::min(n_max, len - 1); n >= n_min; --n) {
    for (size_t start = len - n; start-- > 0;)
      if (std::equal(ctx.end() - std::ptrdiff_t(n), ctx.end(), ctx.begin() + std::ptrdiff_t(start))) {
        const size_t from = start + n;
        out.tokens.assign(ctx.begin() + std::ptrdiff_t(from),
                          ctx.begin() + std::ptrdiff_t(from + std::min(max_tokens, len - from)));
        out.match_len = int(n);
        return out;
      }
    if (n == 1) break;
  }
  return out;
}

TEST(PromptLookup, SinglePassEqualsTheScanPerNgramLength) {
  std::mt19937 rng(7);
  size_t found = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    // Small alphabets make matches of every length common, repeats and overlaps included.
    std::uniform_int_distribution<int32_t> tok(0, 1 + trial % 6);
    Ids ctx(size_t(trial % 40));
    for (auto& t : ctx) t = tok(rng);
    const size_t n_min = 1 + size_t(trial % 3), n_max = n_min + size_t(trial % 4);
    const size_t k = size_t(trial % 7);
    Draft got;
    PromptLookup(int(n_min), int(n_max)).propose(ctx, k, got);
    const Draft want = reference_lookup(ctx, k, n_min, n_max);
    ASSERT_EQ(got.tokens, want.tokens) << "trial " << trial;
    ASSERT_EQ(got.match_len, want.match_len) << "trial " << trial;
    found += want.tokens.empty() ? 0 : 1;
  }
  EXPECT_GT(found, 1500u);  // most trials have a draft to compare
}

TEST(PromptLookup, RespectsTheNgramRangeAndTheBudget) {
  const Ids ctx{1, 2, 3, 4, 9, 3, 4};
  EXPECT_EQ(propose(PromptLookup(1, 4), ctx, 8), (Ids{9, 3, 4}));
  EXPECT_TRUE(propose(PromptLookup(3, 4), ctx, 8).empty());  // only a 2-gram matches
  EXPECT_EQ(propose(PromptLookup(1, 4), ctx, 1), (Ids{9}));
  EXPECT_TRUE(propose(PromptLookup(1, 4), ctx, 0).empty());
  EXPECT_TRUE(propose(PromptLookup(1, 4), {42}, 3).empty());
  EXPECT_THROW(PromptLookup(0, 2), std::invalid_argument);
  EXPECT_THROW(PromptLookup(3, 2), std::invalid_argument);
}

TEST(NgramCache, ChainsWhatOtherSequencesProduced) {
  NgramCache cache(1, 3);
  const Ids other{50, 1, 2, 3, 4, 5};
  cache.feed(other, 1);
  // A different request ending in "1 2" is proposed "3 4 5" by chaining lookups.
  EXPECT_EQ(propose(cache, {9, 9, 1, 2}, 3), (Ids{3, 4, 5}));
  EXPECT_TRUE(propose(cache, {77}, 3).empty());
  // Newer data wins: "2 -> 8" replaces "2 -> 3" for the 1-gram key; the 2-gram still says 3.
  cache.feed(Ids{6, 2, 8}, 1);
  EXPECT_EQ(propose(cache, {1, 2}, 1), (Ids{3}));
  EXPECT_EQ(propose(cache, {6, 2}, 1), (Ids{8}));
}

TEST(NgramCache, StaysBounded) {
  NgramCache cache(1, 1, 4);
  Ids ctx;
  for (int i = 0; i < 20; ++i) ctx.push_back(i);
  cache.feed(ctx, 1);
  EXPECT_LE(cache.size(), 4u);
}

TEST(LookaheadPool, JacobiGuessContinuesAfterTheModelsOwnToken) {
  LookaheadPool pool;
  // Context before the step: [1 2]; fed x0=3 with drafts 4 5 6; the model's outputs were
  // 4 (accept d1) 7 (reject d2: model says 7) 8 9 (made after the wrong token 5).
  const Ids before{1, 2};
  pool.feed_verification(before, Ids{3, 4, 5, 6}, Ids{4, 7, 8, 9}, 1);
  // Context now: 1 2 3 4 7 -> the Jacobi guess for what follows 7 is 8 9.
  Draft d;
  pool.propose(Ids{1, 2, 3, 4, 7}, 2, d);
  EXPECT_EQ(d.tokens, (Ids{8, 9}));
  EXPECT_EQ(d.source, DraftSource::Jacobi);
  // Any other context falls back to the n-gram pool: after (4, 5) the model said 8.
  pool.propose(Ids{4, 5}, 1, d);
  EXPECT_EQ(d.tokens, (Ids{8}));
  EXPECT_EQ(d.source, DraftSource::LookaheadPool);
}

TEST(LookaheadPool, HistoryTrigramsChain) {
  LookaheadPool pool;
  pool.feed_history(Ids{10, 11, 12, 13, 14}, 1);
  EXPECT_EQ(propose(pool, {10, 11}, 3), (Ids{12, 13, 14}));
  EXPECT_EQ(propose(pool, {99, 12}, 2), (Ids{13, 14}));  // 1-gram fallback
  EXPECT_TRUE(propose(pool, {99, 98}, 2).empty());
}

TEST(DraftPolicy, PicksByModeAndExtendsShortDrafts) {
  NgramCache cache(1, 4);
  cache.feed(Ids{0, 5, 6, 7, 8}, 1);
  LookaheadPool pool;
  pool.feed_history(Ids{3, 4, 42, 43}, 1);
  const Ids ctx{1, 2, 3, 4, 5, 1, 2, 3, 4};  // lookup: "1 2 3 4" -> 5, then cache 6 7 8
  Draft d;
  SpecOptions o;
  o.mode = SpecMode::Off;
  DraftPolicy(o, cache).propose(ctx, 4, pool, d);
  EXPECT_TRUE(d.tokens.empty());
  o.mode = SpecMode::Lookup;
  DraftPolicy(o, cache).propose(ctx, 4, pool, d);
  EXPECT_EQ(d.tokens, (Ids{5, 1, 2, 3}));  // a 4-gram match has 4 tokens of continuation
  DraftPolicy(o, cache).propose(Ids{9, 5}, 4, pool, d);
  EXPECT_EQ(d.tokens, (Ids{6, 7, 8}));  // no lookup match: the cross-request cache
  o.mode = SpecMode::Lookahead;
  DraftPolicy(o, cache).propose(ctx, 2, pool, d);
  EXPECT_EQ(d.tokens, (Ids{42, 43}));  // only the pool
  o.mode = SpecMode::Auto;
  DraftPolicy(o, cache).propose(ctx, 4, pool, d);
  EXPECT_EQ(d.source, DraftSource::PromptLookup);  // a strong lookup match wins
}

}  // namespace
}  // namespace fdl::spec
