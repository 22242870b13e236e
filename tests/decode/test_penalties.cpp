// Stage 1 of the sampler: repetition (llama.cpp), frequency and presence (OpenAI) penalties.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "flashdllm/sampling.h"

namespace fdl {
namespace {

std::vector<float> penalize(const SamplingParams& p, const std::vector<float>& logits,
                            const std::vector<int32_t>& history) {
  Sampler s(p, static_cast<int32_t>(logits.size()));
  for (int32_t t : history) s.accept(t);
  return s.penalized_logits(logits);
}

TEST(Penalties, RepetitionDividesPositiveMultipliesNegative) {
  SamplingParams p;
  p.repeat_penalty = 1.5f;
  const auto out = penalize(p, {2.f, -2.f, 0.5f, -0.5f}, {0, 1});
  ASSERT_EQ(out.size(), 4u);
  EXPECT_NEAR(out[0], 1.3333333f, 1e-6);
  EXPECT_NEAR(out[1], -3.f, 1e-6);
  EXPECT_FLOAT_EQ(out[2], 0.5f);
  EXPECT_FLOAT_EQ(out[3], -0.5f);
}

TEST(Penalties, RepetitionAppliesOncePerDistinctToken) {
  SamplingParams p;
  p.repeat_penalty = 2.f;
  const auto out = penalize(p, {4.f, 4.f}, {0, 0, 0});
  EXPECT_FLOAT_EQ(out[0], 2.f);  // not 4 / 2^3
  EXPECT_FLOAT_EQ(out[1], 4.f);
}

TEST(Penalties, FrequencyAndPresenceFollowOpenAi) {
  SamplingParams p;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  // token 0 seen 3x, token 2 once, token 1 never
  const auto out = penalize(p, {1.f, 1.f, 1.f}, {0, 2, 0, 0});
  EXPECT_FLOAT_EQ(out[0], 1.f - 3 * 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(out[1], 1.f);
  EXPECT_FLOAT_EQ(out[2], 1.f - 0.5f - 0.25f);
}

TEST(Penalties, WindowOnlyCountsLastNTokens) {
  SamplingParams p;
  p.frequency_penalty = 1.f;
  p.repeat_last_n = 2;
  const auto out = penalize(p, {0.f, 0.f, 0.f}, {0, 0, 1, 2});  // window = {1, 2}
  EXPECT_FLOAT_EQ(out[0], 0.f);
  EXPECT_FLOAT_EQ(out[1], -1.f);
  EXPECT_FLOAT_EQ(out[2], -1.f);
}

TEST(Penalties, MinusOneIsWholeContextAndZeroIsOff) {
  SamplingParams p;
  p.frequency_penalty = 1.f;
  p.repeat_last_n = -1;
  std::vector<int32_t> history(500, 1);
  history[0] = 0;
  auto out = penalize(p, {0.f, 0.f}, history);
  EXPECT_FLOAT_EQ(out[0], -1.f);
  EXPECT_FLOAT_EQ(out[1], -499.f);

  p.repeat_last_n = 0;
  out = penalize(p, {0.f, 0.f}, history);
  EXPECT_FLOAT_EQ(out[0], 0.f);
  EXPECT_FLOAT_EQ(out[1], 0.f);
}

TEST(Penalties, ChangeTheGreedyChoice) {
  SamplingParams p;
  p.temperature = 0.f;
  p.repeat_penalty = 2.f;
  Sampler s(p, 3);
  const std::vector<float> logits{3.f, 2.f, 1.f};
  EXPECT_EQ(s.sample(logits), 0);
  s.accept(0);  // 3 / 2 = 1.5 < 2
  EXPECT_EQ(s.sample(logits), 1);
}

TEST(Penalties, AcceptRejectsOutOfRangeIds) {
  SamplingParams p;
  p.repeat_penalty = 1.1f;
  Sampler s(p, 4);
  EXPECT_THROW(s.accept(4), std::out_of_range);
  EXPECT_THROW(s.accept(-1), std::out_of_range);
}

TEST(Penalties, ExtremeValidPenaltiesSaturateInsteadOfOverflowing) {
  // Valid but extreme settings (a repetition penalty of 1e-38 divides a positive logit past
  // FLT_MAX): the result saturates, so a penalized row stays samplable; non-finite logits
  // pass through unchanged (masked -Inf stays masked, NaN / +Inf are refused by the row check).
  constexpr float kMax = std::numeric_limits<float>::max();
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(penalize_logit(5.0f, 1, 1e-38f, 0.0f, 0.0f), kMax);   // 5e38
  EXPECT_EQ(penalize_logit(-5.0f, 1, 1e38f, 0.0f, 0.0f), -kMax);  // -5e38
  EXPECT_EQ(penalize_logit(1.0f, 4, 1.0f, -1e38f, 0.0f), kMax);   // 1 + 4e38
  EXPECT_EQ(penalize_logit(5.0f, 4, 1e-38f, -1e38f, 0.0f), kMax); // Inf - (-Inf) would be NaN
  EXPECT_EQ(penalize_logit(-inf, 2, 1.3f, -1e38f, 1.0f), -inf);
  EXPECT_TRUE(std::isnan(penalize_logit(std::nanf(""), 1, 1.3f, 0.5f, 0.5f)));
  EXPECT_EQ(penalize_logit(inf, 1, 1.3f, 0.5f, 0.5f), inf);
  // Ordinary values: exactly the float operations of the formula.
  EXPECT_EQ(penalize_logit(3.0f, 2, 1.5f, 0.25f, 0.5f), 3.0f / 1.5f - (2.0f * 0.25f + 0.5f));
  EXPECT_EQ(penalize_logit(-3.0f, 1, 1.5f, 0.0f, 0.0f), -3.0f * 1.5f);
  // The sampler draws from such a row without throwing.
  SamplingParams p;
  p.repeat_penalty = 1e-38f;
  p.temperature = 0.0f;
  Sampler s(p, 4);
  s.accept(1);
  EXPECT_EQ(s.sample(std::vector<float>{0.5f, 0.1f, 0.2f, 0.3f}), 1);  // 0.1 / 1e-38 saturates: the max
}

}  // namespace
}  // namespace fdl

namespace fdl {
namespace {

// logit_bias: added before the penalties; -100 bans the argmax, +100 makes a token win greedy
// and sampled draws; ids beyond the vocabulary and biases outside [-100, 100] are refused.
TEST(LogitBias, BansForcesAndIsValidated) {
  const std::vector<float> logits = {0.0f, 5.0f, 1.0f, -2.0f};
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  greedy.logit_bias = {{1, -100.0f}};
  EXPECT_EQ(Sampler(greedy, 4).sample(logits), 2);
  greedy.logit_bias = {{3, 100.0f}};
  EXPECT_EQ(Sampler(greedy, 4).sample(logits), 3);
  SamplingParams sampled;
  sampled.seed = 7;
  sampled.logit_bias = {{3, 100.0f}};
  Sampler s(sampled, 4);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(logits), 3);
  const std::vector<float> row = Sampler(sampled, 4).penalized_logits(logits);
  EXPECT_EQ(row[3], 98.0f);
  EXPECT_EQ(row[1], 5.0f);
  sampled.logit_bias = {{4, 1.0f}};
  EXPECT_THROW(Sampler(sampled, 4), std::invalid_argument);
  sampled.logit_bias = {{0, 101.0f}};
  EXPECT_THROW(sampled.validate(), std::invalid_argument);
  sampled.logit_bias = {{-1, 1.0f}};
  EXPECT_THROW(sampled.validate(), std::invalid_argument);
}

}  // namespace
}  // namespace fdl
