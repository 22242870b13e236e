// Speculative sampling is distribution-exact, with one linear draft and with a tree of
// candidates (recursive rejection): 20k draws of the first tokens after a fixed prompt, with
// speculation on (temperature, top-p and a repetition penalty on), fit the exact
// plain-sampling distribution of those tokens (chi-square goodness of fit, p > 0.01). The
// exact distribution is enumerated with the model and Sampler::distribution over every
// prefix, so only the speculative side needs samples.
#include <map>

#include "decode/chi_square_test_util.h"
#include "spec_test_support.h"

namespace fdl {
namespace {

constexpr int kSamples = 20000;
constexpr int kTokens = 3;  // token 1 comes from prefill, tokens 2-3 from verified windows

SamplingParams params(uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_p = 0.9f;
  p.top_k = 0;
  p.repeat_penalty = 1.3f;  // its history must include the drafts accepted before
  p.seed = seed;
  return p;
}

/// P(t1..tk) of plain sampling for every sequence of kTokens tokens with nonzero probability.
std::map<std::vector<int32_t>, double> exact_distribution(Model& model,
                                                          const std::vector<int32_t>& prompt) {
  BlockPool pool(model.kv_shape(16), 8);
  KvCache kv(pool);
  std::vector<float> logits;
  std::map<std::vector<int32_t>, double> out;
  std::vector<std::pair<std::vector<int32_t>, double>> frontier{{{}, 1.0}};
  for (int depth = 0; depth < kTokens; ++depth) {
    std::vector<std::pair<std::vector<int32_t>, double>> next;
    for (const auto& [path, p] : frontier) {
      std::vector<int32_t> ids = prompt;
      ids.insert(ids.end(), path.begin(), path.end());
      const SeqId seq = kv.create_sequence();
      kv.append_slots(seq, ids.size());
      StepBatch batch;
      for (size_t i = 0; i < ids.size(); ++i)
        batch.add(ids[i], int32_t(i), seq, i + 1 == ids.size());
      model.forward(batch, kv, logits);
      kv.free_sequence(seq);
      Sampler sampler(params(0), model.config().n_vocab);
      for (int32_t t : ids) sampler.accept(t);  // the engine's penalties see the prompt too
      for (const TokenProb& tp : sampler.distribution(logits)) {
        auto longer = path;
        longer.push_back(tp.id);
        next.emplace_back(std::move(longer), p * double(tp.prob));
      }
    }
    frontier = std::move(next);
  }
  for (auto& [path, p] : frontier) out[path] += p;
  return out;
}

// Runs kSamples sampled requests of `text` with speculation and checks the chi-square fit;
// returns the speculation metrics.
// Requests emit `emit` >= kTokens tokens; the first kTokens are compared (their distribution
// does not depend on what follows them).
SpecMetrics check_fit(const std::string& text, bool tree, int emit) {
  const auto& m = test::stories_model();
  const auto prompt = encode_prompt(*m.tokenizer, text);
  const auto probs = exact_distribution(*m.model, prompt);

  auto opt = test::spec_options(SpecMode::Lookup, 4);
  opt.spec.tree = tree;
  opt.n_ctx = 32;
  opt.max_sequences = 64;
  auto gen = test::make_generator(m, opt);
  std::vector<GenerationRequest> reqs(static_cast<size_t>(kSamples));
  for (int i = 0; i < kSamples; ++i) {
    reqs[size_t(i)].prompt_ids = prompt;
    reqs[size_t(i)].max_new_tokens = emit;
    reqs[size_t(i)].ignore_eos = true;
    reqs[size_t(i)].sampling = params(uint64_t(i) + 1);
  }
  std::map<std::vector<int32_t>, int64_t> observed;
  for (const auto& res : gen.generate(reqs))
    ++observed[std::vector<int32_t>(res.generated_ids.begin(), res.generated_ids.begin() + kTokens)];

  const SpecMetrics sm = gen.spec_metrics();
  EXPECT_GT(sm.accepted, kSamples / 10);  // drafts were verified, and went both ways
  EXPECT_GT(sm.rejected, kSamples / 10);
  test::expect_pool_full(gen);
  const auto chi = test::chi_square_fit(observed, probs);
  EXPECT_GE(chi.dof, 5);
  EXPECT_GT(chi.p_value, 0.01) << "chi2 " << chi.statistic << " dof " << chi.dof;
  std::cout << "chi2 " << chi.statistic << " dof " << chi.dof << " p " << chi.p_value
            << " accepted " << sm.accepted << " rejected " << sm.rejected << " tree steps " << sm.tree_steps
            << " accepted off the first branch " << sm.tree_alt_accepted << "\n";
  return sm;
}

TEST(SpecSamplingExactness, ChiSquareSpeculativeSamplesFitThePlainDistribution) {
  // Repetitive, so prompt lookup drafts the likely continuation at once.
  const SpecMetrics sm = check_fit("red ball. red ball. red", false, kTokens);
  EXPECT_EQ(sm.tree_steps, 0);
}

// Tree verification: "red" was followed by " hat" and by " ball", so prompt lookup offers two
// candidates and the first position is verified by recursive rejection over both. Requests
// emit 6 tokens, so the second token's window has room for a branch (the budget is what the
// request may still emit).
TEST(SpecSamplingExactness, ChiSquareTreeSamplesFitThePlainDistribution) {
  const SpecMetrics sm = check_fit("red ball. red hat. red", true, kTokens + 3);
  EXPECT_GT(sm.tree_steps, kSamples / 10);
  EXPECT_GT(sm.tree_alt_accepted, 0);
}

}  // namespace
}  // namespace fdl
