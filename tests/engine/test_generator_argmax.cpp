// Ids-only steps (Model::forward_sample): when every row a step reads is one plain draw —
// greedy or sampled, without penalties, logprobs, drafts or audits — the scheduler asks a
// model that samples on its device (the CUDA model) for ids instead of logits, handing it
// each row's parameters and the uniform the sequence's own RNG gives next. A CPU model wrapped
// to prefer that stands in for the GPU here (Model's default forward_sample: forward, then
// the host sampler with the given uniform): outputs must equal the plain model's exactly —
// seeded sampling too, so the RNG streams are the ones sample() uses — the ids-only path
// must actually run, and any step with a row that needs logits (penalties, logprobs,
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
  void forward_sample(const StepBatch& b, KvCache& kv, std::span<const RowSampling> rows,
                      std::vector<int32_t>& ids) override {
    ++ids_steps;
    for (const RowSampling& r : rows) sampled_rows += r.temperature > 0.0f ? 1 : 0;
    inner_.forward_sample(b, kv, rows, ids);  // Model's default: forward + host sampling
  }
  bool prefers_device_sampling() const override { return true; }
  int logit_steps = 0, ids_steps = 0, sampled_rows = 0;

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
    EXPECT_GT(wrapped.ids_steps, 0);
    EXPECT_EQ(wrapped.logit_steps, 0) << "every row of every step was plain greedy";
  }
}

TEST(GeneratorArgmax, SeededSamplingUsesIdsOnlyAndDrawsTheSameTokens) {
  // Every truncation stage, alone and together, in one batch with a greedy row: the ids-only
  // path must draw exactly what the logits path draws from the same seeds.
  const LoadedModel& m = stories_model();
  std::vector<GenerationRequest> reqs{greedy_request({1, 403, 407, 261}, 30)};
  for (int i = 0; i < 5; ++i) {
    GenerationRequest r = sampled_request({1, 403, int32_t(300 + 7 * i)}, 30, uint64_t(11 + i));
    r.sampling.temperature = 0.7f + 0.2f * float(i);
    r.sampling.top_k = 0;  // temperature only, unless set below
    r.sampling.top_p = 1.0f;
    if (i == 1) r.sampling.top_k = 12;
    if (i == 2) r.sampling.top_p = 0.8f;
    if (i == 3) r.sampling.min_p = 0.05f;
    if (i == 4) r.sampling.top_k = 40, r.sampling.top_p = 0.9f, r.sampling.min_p = 0.02f;
    reqs.push_back(r);
  }
  Generator plain = make_generator(m);
  const auto want = ids_of(plain.generate(reqs));
  ArgmaxPreferringModel wrapped(*m.model);
  Generator g(wrapped, *m.tokenizer, {});
  EXPECT_EQ(ids_of(g.generate(reqs)), want);
  EXPECT_GT(wrapped.ids_steps, 0);
  EXPECT_GT(wrapped.sampled_rows, 0);
  EXPECT_EQ(wrapped.logit_steps, 0) << "no row needed logits on the host";
}

TEST(GeneratorArgmax, StepsWithRowsThatNeedLogitsTakeTheLogitsPath) {
  const LoadedModel& m = stories_model();
  std::vector<GenerationRequest> reqs{greedy_request({1, 403, 407, 261}, 24)};
  GenerationRequest pen = sampled_request({1, 77, 30}, 24, 5);
  pen.sampling.repeat_penalty = 1.3f;
  GenerationRequest lp = greedy_request({1, 42, 43}, 24);
  lp.logprobs = 2;
  Generator plain = make_generator(m);
  ArgmaxPreferringModel wrapped(*m.model);
  Generator g(wrapped, *m.tokenizer, {});
  for (const auto& extra : {pen, lp}) {
    const std::vector<GenerationRequest> batch{reqs[0], extra};
    const auto want = plain.generate(batch);
    wrapped.logit_steps = wrapped.ids_steps = 0;
    const auto got = g.generate(batch);
    EXPECT_EQ(ids_of(got), ids_of(want));
    EXPECT_GT(wrapped.logit_steps, 0);
  }
  // Speculation reads logits for verification: never ids-only.
  GeneratorOptions spec;
  spec.spec.mode = SpecMode::Lookup;
  Generator gs(wrapped, *m.tokenizer, spec);
  wrapped.logit_steps = wrapped.ids_steps = 0;
  const std::vector<GenerationRequest> one{reqs[0]};
  EXPECT_EQ(ids_of(gs.generate(one)), ids_of(plain.generate(one)));
  EXPECT_EQ(wrapped.ids_steps, 0);
}

TEST(GeneratorArgmax, ForwardSampleNeedsOneRowPerWantedToken) {
  const LoadedModel& m = stories_model();
  BlockPool pool(m.model->kv_shape(16), 8);
  KvCache kv(pool);
  const SeqId seq = kv.create_sequence();
  StepBatch b;
  const size_t first = kv.append_slots(seq, 2);
  b.add(1, int32_t(first), seq, false);
  b.add(403, int32_t(first + 1), seq, true);
  std::vector<int32_t> ids;
  const std::vector<RowSampling> none, two(2);
  EXPECT_THROW(m.model->forward_sample(b, kv, none, ids), std::invalid_argument);
  EXPECT_THROW(m.model->forward_sample(b, kv, two, ids), std::invalid_argument);
  RowSampling bad;
  bad.temperature = 1.0f;
  bad.top_p = 0.0f;  // outside (0, 1]: the sampler's own check
  EXPECT_THROW(m.model->forward_sample(b, kv, std::vector<RowSampling>{bad}, ids), std::invalid_argument);
  const std::vector<RowSampling> one(1);  // greedy
  m.model->forward_sample(b, kv, one, ids);
  std::vector<int32_t> want;
  m.model->forward_argmax(b, kv, want);  // the same step again: same slots, same logits
  EXPECT_EQ(ids, want);
}

}  // namespace
}  // namespace fdl::test
