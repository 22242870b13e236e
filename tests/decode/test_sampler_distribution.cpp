// The final candidate distribution for each truncation stage and temperature, compared with
// probabilities computed by hand. Base logits are ln(4), ln(3), ln(2), ln(1): at
// temperature 1 the probabilities are exactly 0.4, 0.3, 0.2, 0.1.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "flashdllm/sampling.h"

namespace fdl {
namespace {

const std::vector<float> kLogits{std::log(4.f), std::log(3.f), std::log(2.f), std::log(1.f)};

void expect_distribution(const std::vector<TokenProb>& got,
                         const std::vector<std::pair<int32_t, double>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].id, want[i].first) << "rank " << i;
    EXPECT_NEAR(got[i].prob, want[i].second, 1e-6) << "rank " << i;
  }
}

std::vector<TokenProb> dist(const SamplingParams& p, const std::vector<float>& logits = kLogits) {
  Sampler s(p, static_cast<int32_t>(logits.size()));
  return s.distribution(logits);
}

TEST(SamplerDistribution, PlainSoftmax) {
  expect_distribution(dist({}), {{0, 0.4}, {1, 0.3}, {2, 0.2}, {3, 0.1}});
}

TEST(SamplerDistribution, TopK) {
  SamplingParams p;
  p.top_k = 2;
  expect_distribution(dist(p), {{0, 4 / 7.}, {1, 3 / 7.}});
  p.top_k = 100;  // larger than the vocabulary: no-op
  expect_distribution(dist(p), {{0, 0.4}, {1, 0.3}, {2, 0.2}, {3, 0.1}});
}

TEST(SamplerDistribution, TopKBreaksTiesByLowerId) {
  SamplingParams p;
  p.top_k = 2;
  expect_distribution(dist(p, {1.f, 1.f, 1.f, 1.f}), {{0, 0.5}, {1, 0.5}});
}

TEST(SamplerDistribution, TopPKeepsSmallestPrefixReachingP) {
  SamplingParams p;
  p.top_p = 0.35f;  // 0.4 >= 0.35 already
  expect_distribution(dist(p), {{0, 1.0}});
  p.top_p = 0.6f;  // 0.4, 0.7
  expect_distribution(dist(p), {{0, 4 / 7.}, {1, 3 / 7.}});
  p.top_p = 0.75f;  // 0.4, 0.7, 0.9
  expect_distribution(dist(p), {{0, 4 / 9.}, {1, 3 / 9.}, {2, 2 / 9.}});
}

TEST(SamplerDistribution, MinPIsRelativeToTheTopProbability) {
  SamplingParams p;
  p.min_p = 0.6f;  // keep p >= 0.24
  expect_distribution(dist(p), {{0, 4 / 7.}, {1, 3 / 7.}});
  p.min_p = 0.3f;  // keep p >= 0.12
  expect_distribution(dist(p), {{0, 4 / 9.}, {1, 3 / 9.}, {2, 2 / 9.}});
}

TEST(SamplerDistribution, Temperature) {
  SamplingParams p;
  p.temperature = 0.5f;  // weights 16, 9, 4, 1
  expect_distribution(dist(p), {{0, 16 / 30.}, {1, 9 / 30.}, {2, 4 / 30.}, {3, 1 / 30.}});
  p.temperature = 2.f;  // weights sqrt(4), sqrt(3), sqrt(2), 1
  const double z = 2 + std::sqrt(3.) + std::sqrt(2.) + 1;
  expect_distribution(dist(p), {{0, 2 / z}, {1, std::sqrt(3.) / z}, {2, std::sqrt(2.) / z},
                                {3, 1 / z}});
}

TEST(SamplerDistribution, TruncationHappensBeforeTemperature) {
  // top-p on the temperature-1 probabilities keeps 3 tokens (0.4 + 0.3 < 0.75); had the
  // temperature 0.5 been applied first (16/30 + 9/30 >= 0.75) only 2 would survive.
  SamplingParams p;
  p.top_p = 0.75f;
  p.temperature = 0.5f;
  expect_distribution(dist(p), {{0, 16 / 29.}, {1, 9 / 29.}, {2, 4 / 29.}});
}

TEST(SamplerDistribution, PenaltiesThenTopK) {
  // repeat penalty 2 on token 0: ln4/2 = ln2, so token 0 ties with token 2.
  SamplingParams p;
  p.repeat_penalty = 2.f;
  p.top_k = 3;
  Sampler s(p, 4);
  s.accept(0);
  expect_distribution(s.distribution(kLogits), {{1, 3 / 7.}, {0, 2 / 7.}, {2, 2 / 7.}});
}

TEST(SamplerDistribution, MaskedTokensAreNeverCandidates) {
  const float inf = std::numeric_limits<float>::infinity();
  expect_distribution(dist({}, {-inf, 0.f, -inf, 0.f}), {{1, 0.5}, {3, 0.5}});
}

TEST(SamplerDistribution, TopPOnLargeVocabularyMatchesFullSort) {
  // Exercises the growing partial sort: the nucleus of a flat-ish distribution over
  // 50k tokens is far larger than the first 64-element prefix.
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.f, 2.f);
  std::vector<float> logits(50000);
  for (auto& l : logits) l = normal(rng);

  SamplingParams p;
  p.top_p = 0.9f;
  const auto got = dist(p, logits);

  std::vector<int32_t> order(logits.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  const double top = logits[order[0]];
  double z = 0;
  for (float l : logits) z += std::exp(double(l) - top);
  double cum = 0;
  size_t n_keep = 0;
  while (cum < 0.9 * z) cum += std::exp(double(logits[order[n_keep++]]) - top);

  ASSERT_EQ(got.size(), n_keep);
  EXPECT_GT(n_keep, 1000u);
  // Same set of tokens with the same probabilities (the order of near-equal probabilities
  // may differ once rounded to float).
  std::map<int32_t, float> got_prob;
  for (const auto& tp : got) got_prob[tp.id] = tp.prob;
  for (size_t i = 0; i < n_keep; ++i) {
    const auto it = got_prob.find(order[i]);
    ASSERT_NE(it, got_prob.end()) << "rank " << i << " token " << order[i] << " missing";
    EXPECT_NEAR(it->second, std::exp(double(logits[order[i]]) - top) / cum, 1e-7);
  }
}

}  // namespace
}  // namespace fdl
