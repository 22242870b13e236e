// Model::submit_sample / collect_ids on the CPU model (the default, synchronous pipeline):
// the same tokens as forward_sample, and the API's rules.
#include <limits>

#include "model/pipelined_decode_checks.h"
#include "model/tiny_llama_gguf.h"

namespace fdl::test {
namespace {

TEST(PipelinedDecode, DrawsTheTokensOfTheSynchronousLoop) {
  expect_pipelined_equals_synchronous(shared_model("stories260K.gguf"));
}

TEST(PipelinedDecode, ChainSurvivesScratchGrowth) {
  auto m = Model::load(model_path("stories260K.gguf"), {.n_threads = 1});
  expect_chain_survives_scratch_growth(*m);
}

// output.weight's first element NaN: every logits row holds a NaN.
inline std::filesystem::path nan_logits_model() {
  TinyLlamaSpec spec;
  spec.set_values["output.weight"][0] = std::numeric_limits<float>::quiet_NaN();
  return write_tiny_llama("nan_logits.gguf", spec);
}

TEST(PipelinedDecode, FailedRowsFailTheirSteps) {
  auto m = Model::load(nan_logits_model(), {.n_threads = 1});
  expect_failed_rows_fail_their_steps(*m);
}

TEST(PipelinedDecode, RulesAreEnforced) { expect_pipeline_rules_enforced(shared_model("stories260K.gguf")); }

}  // namespace
}  // namespace fdl::test
