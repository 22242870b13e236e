// `flashdllm generate --json` greedy output against other engines' reference continuations:
// llama.cpp on stories260K, HF Transformers / llama.cpp on codelm-16m.
//
// Where a reference records a tiny top-1/top-2 logit margin (< 1e-3), an fp32 engine may
// legitimately pick the other token at that step, so only the ids before that step bind.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "cli_test_support.h"

namespace fdl::test {
namespace {

constexpr double kBindingMargin = 1e-3;

struct ReferenceCase {
  std::string file;      // reference JSON in shared/reference
  std::string model;     // model file in shared/models
  size_t index = 0;      // case index in the reference file
};

void PrintTo(const ReferenceCase& c, std::ostream* os) { *os << c.file << "#" << c.index; }

class CliGreedyReference : public ::testing::TestWithParam<ReferenceCase> {};

TEST_P(CliGreedyReference, GeneratedIdsMatch) {
  FDL_REQUIRE_CLI();
  const ReferenceCase& rc = GetParam();
  const auto ref_path = reference_path(rc.file);
  const auto model = model_path(rc.model);
  FDL_REQUIRE_FILE(ref_path);
  FDL_REQUIRE_FILE(model);
  const auto ref = read_json_file(ref_path).at(rc.index);
  const std::string prompt = ref.at("prompt");
  const int n_predict = ref.at("n_predict");

  std::vector<std::string> args = {"generate", "-m", model.string(), "-p", prompt, "--temp", "0",
                                   "--ignore-eos", "-n", std::to_string(n_predict), "--json"};
  if (!ref.at("add_bos").get<bool>()) args.push_back("--no-bos");
  const CliResult r = run_cli(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = parse_cli_json(r);
  ASSERT_TRUE(j.is_object());

  EXPECT_EQ(j.at("prompt_token_ids"), ref.at("prompt_token_ids"));
  const auto want = ref.at("output_token_ids").get<std::vector<int>>();
  const auto got = j.at("token_ids").get<std::vector<int>>();
  ASSERT_EQ(got.size(), want.size()) << "finish_reason " << j.at("finish_reason");
  EXPECT_EQ(j.at("finish_reason"), "length");

  size_t binding = want.size();
  if (ref.at("min_top1_top2_logit_margin").get<double>() < kBindingMargin) {
    binding = ref.at("argmin_margin_step").get<size_t>();
  }
  const std::vector<int> got_prefix(got.begin(), got.begin() + binding);
  const std::vector<int> want_prefix(want.begin(), want.begin() + binding);
  EXPECT_EQ(got_prefix, want_prefix) << "first " << binding << " ids must match";
  if (binding == want.size()) {
    EXPECT_EQ(j.at("text"), ref.at("output_text"));
  }
}

std::vector<ReferenceCase> stories_cases() {
  std::vector<ReferenceCase> v;
  for (size_t i = 0; i < 11; ++i) v.push_back({"stories260K_greedy.json", "stories260K.gguf", i});
  return v;
}

// A handful of the codelm prompts; each costs a 16M-parameter model run of 64 tokens.
std::vector<ReferenceCase> codelm_cases() {
  return {{"codelm_greedy.json", "codelm-16m-f16.gguf", 0},
          {"codelm_greedy.json", "codelm-16m-f16.gguf", 1},
          {"codelm_greedy.json", "codelm-16m-f16.gguf", 4},
          {"codelm_greedy.json", "codelm-16m-f16.gguf", 8}};
}

INSTANTIATE_TEST_SUITE_P(Stories260K, CliGreedyReference, ::testing::ValuesIn(stories_cases()));
INSTANTIATE_TEST_SUITE_P(CodeLm, CliGreedyReference, ::testing::ValuesIn(codelm_cases()));

TEST(CliGreedyReferenceFiles, HoldTheCasesTheTestsIndex) {
  const auto stories = reference_path("stories260K_greedy.json");
  const auto codelm = reference_path("codelm_greedy.json");
  FDL_REQUIRE_FILE(stories);
  FDL_REQUIRE_FILE(codelm);
  EXPECT_GE(read_json_file(stories).size(), 11u);
  EXPECT_GE(read_json_file(codelm).size(), 9u);
}

}  // namespace
}  // namespace fdl::test
