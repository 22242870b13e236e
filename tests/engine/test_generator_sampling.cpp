// Sampling through the engine: seeds and penalties.
#include <gtest/gtest.h>

#include "engine_test_support.h"

namespace fdl {
namespace {

std::vector<int32_t> prompt(const std::string& text) {
  return encode_prompt(*test::stories_model().tokenizer, text);
}

TEST(GeneratorSampling, SameSeedSameOutputDifferentSeedDifferentOutput) {
  auto gen = test::make_generator(test::stories_model());
  const auto p = prompt("Once upon a time");
  const auto a = gen.generate({test::sampled_request(p, 48, 1)}).at(0);
  const auto b = gen.generate({test::sampled_request(p, 48, 1)}).at(0);
  const auto c = gen.generate({test::sampled_request(p, 48, 2)}).at(0);
  EXPECT_EQ(a.generated_ids, b.generated_ids);
  EXPECT_EQ(a.text, b.text);
  EXPECT_NE(a.generated_ids, c.generated_ids);
}

TEST(GeneratorSampling, SamplingDiffersFromGreedy) {
  auto gen = test::make_generator(test::stories_model());
  const auto p = prompt("Once upon a time");
  GenerationRequest hot = test::sampled_request(p, 48, 5);
  hot.sampling.temperature = 1.5f;
  hot.sampling.top_k = 0;
  hot.sampling.top_p = 1.f;
  const auto res = gen.generate({test::greedy_request(p, 48), hot});
  EXPECT_NE(res[0].generated_ids, res[1].generated_ids);
}

TEST(GeneratorSampling, RepeatPenaltyReducesRepetition) {
  const auto& tok = *test::stories_model().tokenizer;
  auto gen = test::make_generator(test::stories_model());
  const auto p = prompt("Lily Lily Lily Lily Lily");
  GenerationRequest plain = test::greedy_request(p, 64);
  GenerationRequest penalized = plain;
  penalized.sampling.repeat_penalty = 1.3f;
  const auto res = gen.generate({plain, penalized});
  const size_t lily_plain = test::count_occurrences(tok.decode(res[0].generated_ids), "Lily");
  const size_t lily_penalized = test::count_occurrences(tok.decode(res[1].generated_ids), "Lily");
  EXPECT_GT(lily_plain, 0u);
  EXPECT_LT(lily_penalized, lily_plain);
}

TEST(GeneratorSampling, FrequencyPenaltyReducesRepetition) {
  const auto& tok = *test::stories_model().tokenizer;
  auto gen = test::make_generator(test::stories_model());
  const auto p = prompt("Lily Lily Lily Lily Lily");
  GenerationRequest plain = test::greedy_request(p, 64);
  GenerationRequest penalized = plain;
  penalized.sampling.frequency_penalty = 1.0f;
  penalized.sampling.repeat_last_n = -1;
  const auto res = gen.generate({plain, penalized});
  EXPECT_LT(test::count_occurrences(tok.decode(res[1].generated_ids), "Lily"),
            test::count_occurrences(tok.decode(res[0].generated_ids), "Lily"));
}

}  // namespace
}  // namespace fdl
