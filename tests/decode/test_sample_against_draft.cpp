// Sampler::sample_against_draft: greedy verification is the argmax; speculative sampling
// reproduces the target distribution whatever the draft (chi-square), and a biased rule
// (always accept the draft) is caught by the same test.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "decode/chi_square_test_util.h"
#include "flashdllm/sampling.h"

namespace fdl {
namespace {

const std::vector<float> kRow{2.0f, 1.5f, 0.2f, 1.9f, -1.0f, 0.0f, 1.0f, 0.7f};

SamplingParams hot(uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.repeat_penalty = 1.5f;
  p.seed = seed;
  return p;
}

std::map<int32_t, double> target(const SamplingParams& p, const std::vector<int32_t>& history) {
  Sampler s(p, int32_t(kRow.size()));
  for (int32_t t : history) s.accept(t);
  std::map<int32_t, double> out;
  for (const auto& tp : s.distribution(kRow)) out[tp.id] = tp.prob;
  return out;
}

TEST(SampleAgainstDraft, GreedyReturnsThePenalizedArgmax) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.repeat_penalty = 2.0f;
  Sampler s(p, int32_t(kRow.size()));
  EXPECT_EQ(s.sample_against_draft(kRow, 0), 0);
  EXPECT_EQ(s.sample_against_draft(kRow, 3), 0);
  s.accept(0);  // 2.0 -> 1.0: token 3 (1.9) is the argmax now
  EXPECT_EQ(s.sample_against_draft(kRow, 3), 3);
  EXPECT_EQ(s.sample_against_draft(kRow, 0), s.sample(kRow));
}

// Draft 0 (likely), 3 (likely but penalized), 4 (outside top-p: never accepted), -1 (none).
class SpeculativeSampling : public ::testing::TestWithParam<int32_t> {};

TEST_P(SpeculativeSampling, MatchesTheTargetDistribution) {
  const int32_t draft = GetParam();
  const std::vector<int32_t> history{3, 6};
  Sampler s(hot(99), int32_t(kRow.size()));
  for (int32_t t : history) s.accept(t);
  std::map<int32_t, int64_t> observed;
  int64_t accepted = 0;
  constexpr int kDraws = 40000;
  for (int i = 0; i < kDraws; ++i) {
    const int32_t t = s.sample_against_draft(kRow, draft);
    ++observed[t];
    accepted += t == draft ? 1 : 0;
  }
  const auto probs = target(hot(0), history);
  const auto chi = test::chi_square_fit(observed, probs);
  EXPECT_GT(chi.p_value, 0.01) << "chi2 " << chi.statistic << " dof " << chi.dof;
  if (draft == 4) { EXPECT_EQ(accepted, 0); }
}

INSTANTIATE_TEST_SUITE_P(Drafts, SpeculativeSampling, ::testing::Values(0, 3, 4, -1));

TEST(SpeculativeSampling, TheTestCatchesABiasedAcceptanceRule) {
  // Negative control: accepting the draft with probability 1/2 regardless of p(draft) skews
  // the distribution, and the same chi-square test must reject it.
  Sampler s(hot(7), int32_t(kRow.size()));
  std::mt19937_64 coin(1);
  std::map<int32_t, int64_t> observed;
  for (int i = 0; i < 40000; ++i) ++observed[coin() % 2 ? 5 : s.sample(kRow)];
  const auto chi = test::chi_square_fit(observed, target(hot(0), {}));
  EXPECT_LT(chi.p_value, 1e-6);
}

// Several candidates for one position (a node of a token tree with several children):
// recursive rejection must reproduce the target distribution whatever the candidates —
// likely ones, penalized ones, ones outside top-p, and all of the nucleus.
class TreeSampling : public ::testing::TestWithParam<std::vector<int32_t>> {};

TEST_P(TreeSampling, SeveralCandidatesMatchTheTargetDistribution) {
  const std::vector<int32_t> drafts = GetParam();
  const std::vector<int32_t> history{3, 6};
  Sampler s(hot(1234), int32_t(kRow.size()));
  for (int32_t t : history) s.accept(t);
  std::map<int32_t, int64_t> observed;
  constexpr int kDraws = 40000;
  for (int i = 0; i < kDraws; ++i) ++observed[s.sample_against_drafts(kRow, drafts)];
  const auto chi = test::chi_square_fit(observed, target(hot(0), history));
  EXPECT_GT(chi.p_value, 0.01) << "chi2 " << chi.statistic << " dof " << chi.dof;
  if (std::find(drafts.begin(), drafts.end(), 4) != drafts.end()) {
    EXPECT_EQ(observed.count(4), 0u);  // outside top-p: never accepted
  }
}

INSTANTIATE_TEST_SUITE_P(Candidates, TreeSampling,
                         ::testing::Values(std::vector<int32_t>{0, 3}, std::vector<int32_t>{3, 0, 7},
                                           std::vector<int32_t>{4, 2, 6}, std::vector<int32_t>{0, 1, 3, 6, 7, 2},
                                           std::vector<int32_t>{-1, 5}));

TEST(TreeSampling, GreedyReturnsTheArgmaxWhateverTheCandidates) {
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler s(p, int32_t(kRow.size()));
  const std::vector<int32_t> a{3, 0}, b{3, 6};
  EXPECT_EQ(s.sample_against_drafts(kRow, a), 0);
  EXPECT_EQ(s.sample_against_drafts(kRow, b), 0);
}

// A two-level tree as the engine verifies it: candidates {0, 3} at the root; below 0 the
// chain {1}, below 3 the candidates {7, 2}; every other first token continues plainly. The
// row of the second position depends on the first token (kRow rotated by it), and the
// penalty history holds the first token when the second is verified. The joint distribution
// of the two emitted tokens must be p(t1) * p(t2 | t1).
TEST(TreeSampling, TwoLevelTreeMatchesTheJointDistribution) {
  const std::vector<int32_t> history{6};
  const auto row_after = [](int32_t t1) {
    std::vector<float> r(kRow.size());
    for (size_t i = 0; i < r.size(); ++i) r[i] = kRow[(i + size_t(t1)) % kRow.size()];
    return r;
  };
  const std::map<int32_t, std::vector<int32_t>> children{{0, {1}}, {3, {7, 2}}};
  const std::vector<int32_t> root_children{0, 3};
  std::map<std::pair<int32_t, int32_t>, int64_t> observed;
  constexpr int kDraws = 60000;
  std::mt19937_64 seeds(5);
  for (int i = 0; i < kDraws; ++i) {
    Sampler s(hot(seeds()), int32_t(kRow.size()));
    for (int32_t t : history) s.accept(t);
    const int32_t t1 = s.sample_against_drafts(kRow, root_children);
    s.accept(t1);
    const auto it = children.find(t1);
    const std::vector<float> row = row_after(t1);
    const int32_t t2 = it != children.end() ? s.sample_against_drafts(row, it->second) : s.sample(row);
    ++observed[{t1, t2}];
  }
  std::map<std::pair<int32_t, int32_t>, double> joint;
  for (const auto& [t1, p1] : target(hot(0), history)) {
    Sampler s(hot(0), int32_t(kRow.size()));
    for (int32_t t : history) s.accept(t);
    s.accept(t1);
    for (const auto& tp : s.distribution(row_after(t1))) joint[{t1, tp.id}] = p1 * tp.prob;
  }
  const auto chi = test::chi_square_fit(observed, joint);
  EXPECT_GT(chi.p_value, 0.01) << "chi2 " << chi.statistic << " dof " << chi.dof;
}

}  // namespace
}  // namespace fdl
