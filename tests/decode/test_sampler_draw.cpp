// Drawing tokens: greedy, determinism by seed, frequencies, degenerate settings, bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "flashdllm/sampling.h"

namespace fdl {
namespace {

const std::vector<float> kLogits{std::log(4.f), std::log(3.f), std::log(2.f), std::log(1.f)};

TEST(SamplerDraw, GreedyIsArgmaxWithLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0.f;
  Sampler s(p, 5);
  EXPECT_EQ(s.sample(std::vector<float>{0.f, 3.f, 1.f, 3.f, -2.f}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{-5.f, -1.f, -1.f, -3.f, -2.f}), 1);
  const auto d = s.distribution(std::vector<float>{0.f, 3.f, 1.f, 3.f, -2.f});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].id, 1);
  EXPECT_EQ(d[0].prob, 1.f);
}

TEST(SamplerDraw, FrequenciesMatchProbabilities) {
  SamplingParams p;
  p.seed = 1234;
  Sampler s(p, 4);
  const int n = 40000;
  std::vector<int> counts(4, 0);
  for (int i = 0; i < n; ++i) ++counts[size_t(s.sample(kLogits))];
  const double want[] = {0.4, 0.3, 0.2, 0.1};
  // std of a frequency is sqrt(p(1-p)/n) <= 0.0025; 0.012 is ~5 sigma.
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(counts[i] / double(n), want[i], 0.012) << i;
}

TEST(SamplerDraw, FrequenciesRespectTopK) {
  SamplingParams p;
  p.seed = 99;
  p.top_k = 2;
  Sampler s(p, 4);
  const int n = 20000;
  std::vector<int> counts(4, 0);
  for (int i = 0; i < n; ++i) ++counts[size_t(s.sample(kLogits))];
  EXPECT_EQ(counts[2] + counts[3], 0);
  EXPECT_NEAR(counts[0] / double(n), 4 / 7., 0.015);
}

std::vector<int32_t> draw_sequence(uint64_t seed, int n) {
  SamplingParams p;
  p.seed = seed;
  Sampler s(p, 4);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(s.sample(kLogits));
  return out;
}

TEST(SamplerDraw, SameSeedSameTokensDifferentSeedDifferentTokens) {
  EXPECT_EQ(draw_sequence(42, 64), draw_sequence(42, 64));
  EXPECT_NE(draw_sequence(42, 64), draw_sequence(43, 64));
}

TEST(SamplerDraw, DistributionDoesNotAdvanceTheRng) {
  SamplingParams p;
  p.seed = 5;
  Sampler a(p, 4), b(p, 4);
  for (int i = 0; i < 10; ++i) {
    (void)b.distribution(kLogits);
    EXPECT_EQ(a.sample(kLogits), b.sample(kLogits));
  }
}

TEST(SamplerDraw, TinyTemperatureDegradesToGreedyWithoutNaN) {
  for (float t : {1e-8f, 1e-30f, std::numeric_limits<float>::denorm_min()}) {
    SamplingParams p;
    p.temperature = t;
    p.seed = 3;
    Sampler s(p, 4);
    const std::vector<float> logits{0.5f, 0.9f, 0.89999f, -1.f};
    const auto d = s.distribution(logits);
    ASSERT_EQ(d.size(), 1u) << t;
    EXPECT_EQ(d[0].id, 1);
    EXPECT_EQ(d[0].prob, 1.f);
    for (int i = 0; i < 100; ++i) EXPECT_EQ(s.sample(logits), 1) << t;
  }
}

TEST(SamplerDraw, TinyTopPDegradesToGreedy) {
  SamplingParams p;
  p.top_p = 1e-4f;
  p.seed = 11;
  Sampler s(p, 4);
  const auto d = s.distribution(kLogits);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].id, 0);
  EXPECT_FALSE(std::isnan(d[0].prob));
  for (int i = 0; i < 100; ++i) EXPECT_EQ(s.sample(kLogits), 0);
}

TEST(SamplerDraw, RejectsBadLogitRows) {
  Sampler s(SamplingParams{}, 4);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_THROW(s.sample(std::vector<float>{1.f, 2.f}), std::invalid_argument);
  EXPECT_THROW(s.sample(std::vector<float>{1.f, nan, 0.f, 0.f}), std::invalid_argument);
  EXPECT_THROW(s.sample(std::vector<float>{1.f, inf, 0.f, 0.f}), std::invalid_argument);
  EXPECT_THROW(s.sample(std::vector<float>{-inf, -inf, -inf, -inf}), std::invalid_argument);
}

// The split a GPU model relies on (Model::forward_sample): next_uniform() moves the RNG as
// sample() would, and sample_with_uniform() with that draw picks sample()'s token, for every
// truncation stage; greedy ignores the uniform and draws nothing.
TEST(SamplerDraw, SampleIsNextUniformThenSampleWithUniform) {
  const std::vector<float> row{0.3f, 2.f, -1.f, 1.5f, 2.f, -std::numeric_limits<float>::infinity(), 0.9f, 1.9f};
  for (int stage = 0; stage < 4; ++stage) {
    SamplingParams p;
    p.seed = 77 + uint64_t(stage);
    p.temperature = 0.8f;
    if (stage == 1) p.top_k = 3;
    if (stage == 2) p.top_p = 0.7f;
    if (stage == 3) p.min_p = 0.2f, p.top_k = 5, p.top_p = 0.9f;
    Sampler a(p, int32_t(row.size())), b(p, int32_t(row.size()));
    for (int i = 0; i < 200; ++i) {
      const double u = b.next_uniform();
      ASSERT_GE(u, 0.0);
      ASSERT_LT(u, 1.0);
      ASSERT_EQ(a.sample(row), b.sample_with_uniform(row, u)) << "stage " << stage << " draw " << i;
    }
    EXPECT_EQ(a.next_uniform(), b.next_uniform()) << "the RNG streams stayed together";
  }
  SamplingParams g;
  g.temperature = 0.f;
  Sampler s(g, int32_t(row.size()));
  EXPECT_EQ(s.sample_with_uniform(row, 0.99), 1);
  // Out-of-range uniforms are clamped into [0, 1), not trusted.
  SamplingParams p;
  Sampler t(p, int32_t(row.size()));
  EXPECT_EQ(t.sample_with_uniform(row, -3.0), t.sample_with_uniform(row, 0.0));
  EXPECT_EQ(t.sample_with_uniform(row, 7.0), t.sample_with_uniform(row, std::nextafter(1.0, 0.0)));
  EXPECT_EQ(t.sample_with_uniform(row, std::nan("")), t.sample_with_uniform(row, 0.0));
}

TEST(SamplerDraw, TheDrawWalksTheSurvivorsInIdOrder) {
  // Ranks differ from ids: id 5 is the best, then 1, then 3 (top-k 3 keeps those). The draw
  // walks them by id, as the GPU does (Model::forward_sample), so the smallest u goes to id
  // 1 and the largest to id 5, whatever their ranks.
  const std::vector<float> row{0.0f, 2.0f, -1.0f, 1.0f, -2.0f, 3.0f, -3.0f};
  for (const bool by_top_p : {false, true}) {
    SamplingParams p;
    p.temperature = 1.0f;
    if (by_top_p)
      p.top_p = 0.9f;  // keeps 5, 1, 3 (0.633 + 0.233 < 0.9: the third is needed)
    else
      p.top_k = 3;
    Sampler s(p, int32_t(row.size()));
    const auto d = s.distribution(row);
    ASSERT_EQ(d.size(), 3u);
    double p1 = 0, p3 = 0;
    for (const auto& t : d) {
      if (t.id == 1) p1 = double(t.prob);
      if (t.id == 3) p3 = double(t.prob);
    }
    EXPECT_EQ(s.sample_with_uniform(row, 0.0), 1);
    EXPECT_EQ(s.sample_with_uniform(row, p1 - 1e-6), 1);
    EXPECT_EQ(s.sample_with_uniform(row, p1 + 1e-6), 3);
    EXPECT_EQ(s.sample_with_uniform(row, p1 + p3 + 1e-6), 5);
    EXPECT_EQ(s.sample_with_uniform(row, std::nextafter(1.0, 0.0)), 5);
  }
}

}  // namespace
}  // namespace fdl
