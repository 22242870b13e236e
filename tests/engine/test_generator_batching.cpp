// Batching must not change results: a request's ids are the same alone or in any batch,
// whatever the prefill chunk, block size or number of live sequences.
#include <gtest/gtest.h>

#include "engine_test_support.h"

namespace fdl {
namespace {

const std::vector<std::string> kPrompts{
    "Once upon a time",           "Lily and Tom went to the",  "One day, a",
    "The little dog",             "Mom said",                  "Tim had a big red",
    "In the park there was a",    "She was very happy because"};

std::vector<std::vector<int32_t>> encoded_prompts() {
  std::vector<std::vector<int32_t>> out;
  for (const auto& p : kPrompts) out.push_back(encode_prompt(*test::stories_model().tokenizer, p));
  return out;
}

std::vector<GenerationRequest> mixed_requests() {
  // Half greedy, half sampled with their own seeds, of different lengths.
  std::vector<GenerationRequest> reqs;
  const auto prompts = encoded_prompts();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int n = 40 + int(i) * 5;
    reqs.push_back(i % 2 ? test::sampled_request(prompts[i], n, 1000 + i)
                         : test::greedy_request(prompts[i], n));
  }
  return reqs;
}

std::vector<std::vector<int32_t>> ids_alone(const std::vector<GenerationRequest>& reqs) {
  auto gen = test::make_generator(test::stories_model());
  std::vector<std::vector<int32_t>> out;
  for (const auto& r : reqs) out.push_back(gen.generate({r}).at(0).generated_ids);
  return out;
}

void expect_same_ids(const std::vector<GenerationResult>& got,
                     const std::vector<std::vector<int32_t>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i].generated_ids, want[i]) << "request " << i;
}

TEST(GeneratorBatching, EightPromptsTogetherEqualEachAlone) {
  const auto reqs = mixed_requests();
  const auto alone = ids_alone(reqs);
  auto gen = test::make_generator(test::stories_model());
  const auto together = gen.generate(reqs);
  expect_same_ids(together, alone);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(together[i].generated_ids.size(), size_t(reqs[i].max_new_tokens));
  // One forward per decode step over all live sequences, not one per sequence.
  const auto& stats = gen.last_stats();
  EXPECT_LT(stats.n_forwards, 80);
  EXPECT_EQ(stats.n_decode_tokens + int64_t(reqs.size()),
            [&] { int64_t n = 0; for (auto& r : reqs) n += r.max_new_tokens; return n; }());
}

TEST(GeneratorBatching, FourCopiesOfOnePromptGiveIdenticalIds) {
  auto gen = test::make_generator(test::stories_model());
  const auto prompt = encode_prompt(*test::stories_model().tokenizer, "Once upon a time");
  std::vector<GenerationRequest> reqs(4, test::greedy_request(prompt, 64));
  const auto res = gen.generate(reqs);
  for (size_t i = 1; i < res.size(); ++i) EXPECT_EQ(res[i].generated_ids, res[0].generated_ids);
  // Same with sampling: the same seed gives each copy the same random stream.
  std::vector<GenerationRequest> sampled(4, test::sampled_request(prompt, 64, 77));
  const auto res2 = gen.generate(sampled);
  for (size_t i = 1; i < res2.size(); ++i) EXPECT_EQ(res2[i].generated_ids, res2[0].generated_ids);
}

TEST(GeneratorBatching, ResultsIndependentOfChunkBlockSizeAndLiveLimit) {
  const auto reqs = mixed_requests();
  const auto alone = ids_alone(reqs);
  const GeneratorOptions variants[] = {
      {.block_size = 1, .n_ctx = 256, .max_sequences = 8, .prefill_chunk = 3},
      {.block_size = 64, .n_ctx = 512, .max_sequences = 3, .prefill_chunk = 512},
      {.block_size = 7, .n_ctx = 128, .max_sequences = 1, .prefill_chunk = 1},
  };
  for (const auto& opt : variants) {
    auto gen = test::make_generator(test::stories_model(), opt);
    SCOPED_TRACE("block " + std::to_string(opt.block_size) + " chunk " +
                 std::to_string(opt.prefill_chunk) + " live " + std::to_string(opt.max_sequences));
    expect_same_ids(gen.generate(reqs), alone);
    EXPECT_EQ(gen.block_pool().n_free(), gen.block_pool().capacity());
  }
}

TEST(GeneratorBatching, LongPromptIsPrefilledInChunks) {
  const auto ref = test::read_reference("stories260K_greedy.json");
  const nlohmann::json* long_case = nullptr;
  for (const auto& c : ref)
    if (c["id"] == "long_story") long_case = &c;
  ASSERT_NE(long_case, nullptr);
  const auto prompt = (*long_case)["prompt_token_ids"].get<std::vector<int32_t>>();
  ASSERT_GT(prompt.size(), 100u);
  auto gen = test::make_generator(test::stories_model(), {.prefill_chunk = 32});
  const auto res = gen.generate({test::greedy_request(prompt, 128)});
  EXPECT_EQ(res[0].generated_ids, (*long_case)["output_token_ids"].get<std::vector<int32_t>>());
  const int64_t chunks = int64_t((prompt.size() + 31) / 32);
  EXPECT_EQ(gen.last_stats().n_forwards, chunks + 127);
  EXPECT_EQ(gen.last_stats().n_prefill_tokens, int64_t(prompt.size()));
}

}  // namespace
}  // namespace fdl
