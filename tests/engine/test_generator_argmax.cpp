// Argmax-only steps (Model::forward_argmax): when every row a step reads is sampled greedily
// without penalties, logprobs, drafts or audits, the scheduler asks a model that prefers it
// (the CUDA model) for ids instead of logits. A CPU model wrapped to prefer argmax stands in
// for the GPU here: outputs must equal the plain model's exactly, the ids-only path must
// actually run, and any step with a row that needs logits (sampling, penalties, logprobs,
// speculation) must take the logits path.
#include <gtest/gtest.h>

#include "engine_test_support.h"

namespace fdl::test {
namespace {

// Delegates to a real model; counts which forward each step used.
class ArgmaxPreferringModel final : public Model {
 public:
  explicit ArgmaxPreferringModel(Model& inner) : inner_(inner) {}
  const ModelConfig& config() const override { return inner_.config(); }
  const GgufFile& gguf() const override { return inner_.gguf(); }
  KvShape kv_shape(int block_size) const override { return inner_.kv_shape(block_size); }
  int n_threads() const override { return inner_.n_threads(); }
  void forward(const StepBatch& b, KvCache& kv, std::vector<float>& logits) override {
    ++logit_steps;
    inner_.forward(b, kv, logits);
  }
  void forward_argmax(const StepBatch& b, KvCache& kv, std::vector<int32_t>& ids) override {
    ++argmax_steps;
    inner_.forward_argmax(b, kv, ids);  // Model's default: forward + host scan
  }
  bool prefers_argmax() const override { return true; }
  int logit_steps = 0, argmax_steps = 0;

 private:
  Model& inner_;
};

std::vector<std::vector<int32_t>> ids_of(const std::vector<GenerationResult>& rs) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& r : rs) out.push_back(r.generated_ids);
  return out;
}

TEST(GeneratorArgmax, GreedyBatchesUseIdsOnlyAndMatchThePlainModel) {
  for (const LoadedModel* m : {&stories_model(), &codelm_model()}) {
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 6; ++i) {
      std::vector<int32_t> p{1};
      for (int j = 0; j < 5 + 7 * i; ++j) p.push_back(int32_t(3 + (j * 37 + i * 11) % 250));
      reqs.push_back(greedy_request(p, 20 + 3 * i));
    }
    Generator plain = make_generator(*m);
    const auto want = ids_of(plain.generate(reqs));
    ArgmaxPreferringModel wrapped(*m->model);
    Generator g(wrapped, *m->tokenizer, {});
    EXPECT_EQ(ids_of(g.generate(reqs)), want);
    EXPECT_GT(wrapped.argmax_steps, 0);
    EXPECT_EQ(wrapped.logit_steps, 0) << "every row of every step was plain greedy";
  }
}

TEST(GeneratorArgmax, StepsWithRowsThatNeedLogitsTakeTheLogitsPath) {
  const LoadedModel& m = stories_model();
  std::vector<GenerationRequest> reqs{greedy_request({1, 403, 407, 261}, 24), sampled_request({1, 403}, 24, 7)};
  GenerationRequest pen = greedy_request({1, 77, 30}, 24);
  pen.sampling.repeat_penalty = 1.3f;
  GenerationRequest lp = greedy_request({1, 42, 43}, 24);
  lp.logprobs = 2;
  Generator plain = make_generator(m);
  ArgmaxPreferringModel wrapped(*m.model);
  Generator g(wrapped, *m.tokenizer, {});
  for (const auto& extra : {reqs[1], pen, lp}) {
    const std::vector<GenerationRequest> batch{reqs[0], extra};
    const auto want = plain.generate(batch);
    wrapped.logit_steps = wrapped.argmax_steps = 0;
    const auto got = g.generate(batch);
    EXPECT_EQ(ids_of(got), ids_of(want));
    EXPECT_GT(wrapped.logit_steps, 0);
  }
  // Speculation reads logits for verification: never ids-only.
  GeneratorOptions spec;
  spec.spec.mode = SpecMode::Lookup;
  Generator gs(wrapped, *m.tokenizer, spec);
  wrapped.logit_steps = wrapped.argmax_steps = 0;
  const std::vector<GenerationRequest> one{reqs[0]};
  EXPECT_EQ(ids_of(gs.generate(one)), ids_of(plain.generate(one)));
  EXPECT_EQ(wrapped.argmax_steps, 0);
}

}  // namespace
}  // namespace fdl::test
