// Model::submit_sample / collect_ids on the CPU model (the default, synchronous pipeline):
// the same tokens as forward_sample, and the API's rules.
#include "model/pipelined_decode_checks.h"

namespace fdl::test {
namespace {

TEST(PipelinedDecode, DrawsTheTokensOfTheSynchronousLoop) {
  expect_pipelined_equals_synchronous(shared_model("stories260K.gguf"));
}

TEST(PipelinedDecode, ChainSurvivesScratchGrowth) {
  auto m = Model::load(model_path("stories260K.gguf"), {.n_threads = 1});
  expect_chain_survives_scratch_growth(*m);
}

TEST(PipelinedDecode, RulesAreEnforced) { expect_pipeline_rules_enforced(shared_model("stories260K.gguf")); }

}  // namespace
}  // namespace fdl::test
