// Greedy generation through the Generator matches the llama.cpp / HF reference ids.
#include <gtest/gtest.h>

#include "engine_test_support.h"

namespace fdl {
namespace {

using test::greedy_request;
using test::read_reference;

TEST(GeneratorReference, Stories260KGreedyEachPromptAlone) {
  auto gen = test::make_generator(test::stories_model());
  const auto ref = read_reference("stories260K_greedy.json");
  ASSERT_FALSE(ref.empty());
  for (const auto& c : ref) {
    const auto prompt = c["prompt_token_ids"].get<std::vector<int32_t>>();
    const auto want = c["output_token_ids"].get<std::vector<int32_t>>();
    const auto res = gen.generate({greedy_request(prompt, c["n_predict"].get<int>())});
    ASSERT_EQ(res.size(), 1u);
    EXPECT_EQ(res[0].generated_ids, want) << c["id"];
    EXPECT_EQ(res[0].text, c["output_text"].get<std::string>()) << c["id"];
    EXPECT_EQ(res[0].finish_reason, "length");
  }
}

TEST(GeneratorReference, Stories260KGreedyAllPromptsInOneCall) {
  // 11 requests with 8 live at once: the last three are admitted as the first finish.
  auto gen = test::make_generator(test::stories_model());
  const auto ref = read_reference("stories260K_greedy.json");
  std::vector<GenerationRequest> requests;
  for (const auto& c : ref)
    requests.push_back(greedy_request(c["prompt_token_ids"].get<std::vector<int32_t>>(),
                                      c["n_predict"].get<int>()));
  const auto res = gen.generate(requests);
  ASSERT_EQ(res.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i)
    EXPECT_EQ(res[i].generated_ids, ref[i]["output_token_ids"].get<std::vector<int32_t>>())
        << ref[i]["id"];
}

TEST(GeneratorReference, CodeLmGreedyUpToTheFirstNearTie) {
  auto gen = test::make_generator(test::codelm_model());
  const auto ref = read_reference("codelm_greedy.json");
  ASSERT_FALSE(ref.empty());
  std::vector<GenerationRequest> requests;
  for (const auto& c : ref)
    requests.push_back(greedy_request(c["prompt_token_ids"].get<std::vector<int32_t>>(),
                                      c["n_predict"].get<int>()));
  const auto res = gen.generate(requests);
  for (size_t i = 0; i < ref.size(); ++i) {
    const auto want = ref[i]["output_token_ids"].get<std::vector<int32_t>>();
    // Only the ids before a step whose top-2 margin is < 1e-3 are binding (README).
    size_t binding = want.size();
    if (ref[i]["min_top1_top2_logit_margin"].get<double>() < 1e-3)
      binding = ref[i]["argmin_margin_step"].get<size_t>();
    ASSERT_EQ(res[i].generated_ids.size(), want.size());
    EXPECT_TRUE(std::equal(want.begin(), want.begin() + std::ptrdiff_t(binding),
                           res[i].generated_ids.begin()))
        << ref[i]["prompt"] << " (first " << binding << " ids)";
  }
}

}  // namespace
}  // namespace fdl
