// How requests end: stop strings, max tokens, end-of-generation, context limit; and the
// streamed text.
#include <gtest/gtest.h>

#include <map>

#include "engine_test_support.h"

namespace fdl {
namespace {

std::vector<int32_t> once_prompt() {
  return encode_prompt(*test::stories_model().tokenizer, "Once upon a time");
}

/// Greedy continuation of "Once upon a time" (reference): ", there was a little girl named
/// Lily. She loved to play outside in the park. ..."
TEST(GeneratorFinish, StopStringSpanningTokensStopsAndIsNotEmitted) {
  auto gen = test::make_generator(test::stories_model());
  GenerationRequest r = test::greedy_request(once_prompt(), 128);
  // "little" and " girl" are separate tokens: "e gi" starts in one and ends in the next.
  r.stop = {"e gi", "never appears"};
  std::string streamed;
  const auto res = gen.generate({r}, [&](size_t index, std::string_view piece) {
    EXPECT_EQ(index, 0u);
    streamed += piece;
  });
  EXPECT_EQ(res[0].text, ", there was a littl");
  EXPECT_EQ(streamed, res[0].text);
  EXPECT_EQ(res[0].finish_reason, "stop");
  EXPECT_EQ(res[0].matched_stop, "e gi");
  // Generation stopped at the token that completed the stop string.
  const auto full = gen.generate({test::greedy_request(once_prompt(), 128)}).at(0);
  EXPECT_LT(res[0].generated_ids.size(), 10u);
  EXPECT_TRUE(std::equal(res[0].generated_ids.begin(), res[0].generated_ids.end(),
                         full.generated_ids.begin()));
  EXPECT_NE(full.text.find("e gi"), std::string::npos);
}

TEST(GeneratorFinish, MaxTokensGivesLength) {
  auto gen = test::make_generator(test::stories_model());
  const auto res = gen.generate({test::greedy_request(once_prompt(), 7),
                                 test::greedy_request(once_prompt(), 0)});
  EXPECT_EQ(res[0].generated_ids.size(), 7u);
  EXPECT_EQ(res[0].finish_reason, "length");
  EXPECT_EQ(res[0].timings.gen_tokens, 7);
  EXPECT_TRUE(res[1].generated_ids.empty());
  EXPECT_EQ(res[1].finish_reason, "length");
}

TEST(GeneratorFinish, EndOfGenerationStopsUnlessIgnored) {
  // The code model ends a file after the __main__ guard: greedy gives <|endoftext|> at once.
  const auto& m = test::codelm_model();
  auto gen = test::make_generator(m);
  const auto prompt = encode_prompt(*m.tokenizer, "if __name__ == '__main__':\n    main()\n");
  const auto res = gen.generate({test::greedy_request(prompt, 6, /*ignore_eos=*/false),
                                 test::greedy_request(prompt, 6, /*ignore_eos=*/true)});
  EXPECT_EQ(res[0].finish_reason, "stop");
  EXPECT_TRUE(res[0].generated_ids.empty());  // the end-of-generation token is not kept
  EXPECT_EQ(res[0].timings.gen_tokens, 1);
  EXPECT_EQ(res[0].text, "");
  EXPECT_EQ(res[1].finish_reason, "length");
  ASSERT_EQ(res[1].generated_ids.size(), 6u);
  EXPECT_TRUE(m.tokenizer->is_eog(res[1].generated_ids[0]));
}

TEST(GeneratorFinish, ContextLimitGivesLengthNotACrash) {
  auto gen = test::make_generator(test::stories_model(), {.block_size = 4, .n_ctx = 20});
  const auto prompt = once_prompt();  // 5 tokens
  const auto res = gen.generate({test::greedy_request(prompt, -1), test::greedy_request(prompt, 500)});
  for (const auto& r : res) {
    EXPECT_EQ(r.finish_reason, "length");
    EXPECT_EQ(r.prompt_ids.size() + r.generated_ids.size(), 20u);
  }
  EXPECT_EQ(gen.block_pool().n_free(), gen.block_pool().capacity());
}

TEST(GeneratorFinish, StreamedPiecesConcatenateToTextForEveryRequest) {
  auto gen = test::make_generator(test::stories_model());
  const auto ref = test::read_reference("stories260K_greedy.json");
  std::vector<GenerationRequest> reqs;
  for (const auto& c : ref)
    reqs.push_back(test::sampled_request(c["prompt_token_ids"].get<std::vector<int32_t>>(), 64,
                                         reqs.size()));
  std::map<size_t, std::string> streamed;
  const auto res = gen.generate(reqs, [&](size_t i, std::string_view piece) {
    EXPECT_FALSE(piece.empty());
    streamed[i] += piece;
  });
  for (size_t i = 0; i < res.size(); ++i) EXPECT_EQ(streamed[i], res[i].text) << i;
}

TEST(GeneratorFinish, TimingsAreFilledIn) {
  auto gen = test::make_generator(test::stories_model());
  const auto r = gen.generate({test::greedy_request(once_prompt(), 16)}).at(0).timings;
  EXPECT_EQ(r.prompt_tokens, 5);
  EXPECT_GT(r.prompt_ms, 0.0);
  EXPECT_GE(r.ttft_ms, r.prompt_ms);
  EXPECT_EQ(r.gen_tokens, 16);
  ASSERT_EQ(r.token_latencies_ms.size(), 15u);
  double sum = 0;
  for (double l : r.token_latencies_ms) {
    EXPECT_GT(l, 0.0);
    sum += l;
  }
  EXPECT_NEAR(sum, r.decode_ms, 1e-6 * r.decode_ms + 1e-9);
  EXPECT_GT(r.decode_tokens_per_s(), 0.0);
}

}  // namespace
}  // namespace fdl
