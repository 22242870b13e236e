// Greedy continuations must equal llama.cpp's (stories260K, 128 tokens, EOS not stopping) and
// HF Transformers' fp32 run (codelm-16m as GGUF and as a Hugging Face directory, 64 tokens)
// for every reference case, starting from the reference prompt ids. Where a case's smallest top-1/top-2 margin is below 1e-3, only
// the ids before its argmin_margin_step are compared (see binding_prefix).
#include "model/model_test_util.h"

namespace fdl::test {
namespace {

struct GreedyCase {
  std::string reference;
  std::string model;
  size_t index;
};

void PrintTo(const GreedyCase& c, std::ostream* os) { *os << c.reference << "#" << c.index; }

class ReferenceGreedy : public ::testing::TestWithParam<GreedyCase> {};

TEST_P(ReferenceGreedy, MatchesReferenceIds) {
  const GreedyCase& gc = GetParam();
  const nlohmann::json ref = load_reference(gc.reference)[gc.index];
  const auto prompt = ref["prompt_token_ids"].get<std::vector<int32_t>>();
  const auto expected = ref["output_token_ids"].get<std::vector<int32_t>>();
  Model& m = shared_model(gc.model);
  auto pool = make_pool(m, prompt.size() + expected.size());
  KvCache kv(*pool);
  const std::vector<int32_t> got = greedy_decode(m, kv, prompt, int(expected.size()));
  const size_t binding = binding_prefix(ref);
  if (binding < expected.size())
    std::cout << "  (margin " << ref["min_top1_top2_logit_margin"] << " < 1e-3: only the first "
              << binding << " of " << expected.size() << " ids are binding)\n";
  ASSERT_EQ(got.size(), expected.size());
  if (binding < expected.size()) {
    size_t same = 0;
    while (same < got.size() && got[same] == expected[same]) ++same;
    std::cout << "  (informational: " << same << " leading ids match the reference)\n";
  }
  for (size_t i = 0; i < binding; ++i)
    ASSERT_EQ(got[i], expected[i]) << "first difference at output step " << i;
  EXPECT_EQ(pool->n_free(), pool->capacity());
}

std::vector<GreedyCase> cases(const std::string& reference, const std::string& model) {
  std::vector<GreedyCase> out;
  const size_t n = reference_case_count(reference);
  for (size_t i = 0; i < n; ++i) out.push_back({reference, model, i});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Stories260K, ReferenceGreedy,
                         ::testing::ValuesIn(cases("stories260K_greedy.json", "stories260K.gguf")),
                         [](const auto& info) { return "case" + std::to_string(info.param.index); });
INSTANTIATE_TEST_SUITE_P(CodeLm16M, ReferenceGreedy,
                         ::testing::ValuesIn(cases("codelm_greedy.json", "codelm-16m-f16.gguf")),
                         [](const auto& info) { return "case" + std::to_string(info.param.index); });
// The same model from its Hugging Face directory (safetensors, config.json, tokenizer.json).
INSTANTIATE_TEST_SUITE_P(CodeLm16MHfDirectory, ReferenceGreedy,
                         ::testing::ValuesIn(cases("codelm_greedy.json", "codelm-16m-hf")),
                         [](const auto& info) { return "case" + std::to_string(info.param.index); });

}  // namespace
}  // namespace fdl::test
