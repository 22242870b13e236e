// Grammar-constrained generation (GenerationRequest::grammar): every output follows the
// grammar, and the forced drafts change nothing but the number of forwards — greedy and
// seeded sampling give the ids plain constrained decoding gives.
#include <gtest/gtest.h>

#include "device_sampling_model.h"
#include "engine_test_support.h"
#include "flashdllm/grammar.h"

namespace fdl {
namespace {

const char* kStoryGrammar = R"(
root ::= "Once upon a time, there was a " word " named " name ". " sentence{1,3}
word ::= [a-z]{2,10}
name ::= [A-Z] [a-z]{1,8}
sentence ::= [A-Z] [a-z]{0,8} (" " [a-z,]{1,10}){2,12} "."
)";

const char* kRecordGrammar = R"(
root ::= "{\"name\": \"" [a-zA-Z ]{1,20} "\", \"age\": " [1-9] [0-9]? ", \"city\": \"" [a-zA-Z ]{1,20} "\"}"
)";

bool follows(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.accept_bytes(text) && m.can_end();
}

GenerationRequest constrained(const LoadedModel& m, const std::string& prompt, std::shared_ptr<const Grammar> g,
                              float temperature, uint64_t seed, int32_t spec_window) {
  GenerationRequest r;
  r.prompt_ids = m.tokenizer->encode(prompt, true);
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.max_new_tokens = 200;
  r.grammar = std::move(g);
  r.spec_window = spec_window;
  return r;
}

TEST(GrammarDecoding, SampledOutputsFollowTheGrammarAndStop) {
  const auto& m = test::stories_model();
  const auto g = Grammar::compile(kStoryGrammar);
  Generator gen = test::make_generator(m, GeneratorOptions{.max_sequences = 8});
  std::vector<GenerationRequest> reqs;
  for (uint64_t seed = 1; seed <= 8; ++seed) reqs.push_back(constrained(m, "", g, 1.0f, seed, -1));
  const auto results = gen.generate(reqs);
  for (const auto& r : results) {
    EXPECT_EQ(r.finish_reason, "stop") << r.text;
    EXPECT_TRUE(follows(g, r.text)) << r.text;
  }
  EXPECT_GT(gen.last_stats().grammar_rows, 0);
}

TEST(GrammarDecoding, ForcedDraftsKeepGreedyAndSeededOutputsAndSaveForwards) {
  const auto& m = test::codelm_model();
  const auto g = Grammar::compile(kRecordGrammar);
  for (const float temperature : {0.0f, 1.0f}) {
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      Generator plain = test::make_generator(m);
      const auto a = plain.generate({constrained(m, "# a person\nperson = ", g, temperature, seed, 0)}).at(0);
      const int64_t plain_forwards = plain.last_stats().n_forwards;
      Generator forced = test::make_generator(m);
      const auto b = forced.generate({constrained(m, "# a person\nperson = ", g, temperature, seed, -1)}).at(0);
      EXPECT_TRUE(follows(g, a.text)) << a.text;
      EXPECT_EQ(a.generated_ids, b.generated_ids) << "temperature " << temperature << " seed " << seed;
      EXPECT_EQ(a.finish_reason, "stop");
      const SpecMetrics& sm = forced.spec_metrics();
      EXPECT_GT(sm.forced_drafted, 0);
      EXPECT_GT(sm.forced_accepted, 0);
      EXPECT_LT(forced.last_stats().n_forwards, plain_forwards) << a.text;
    }
  }
}

// On a model that samples on its device, grammar rows go up as masks (StepMasks) and only ids
// come back, forced drafts included when greedy: the same outputs as the host path, in a
// batch that mixes constrained, unconstrained and seeded requests. Sampled constrained
// requests with forced drafts take the host path (their rows' draws depend on what
// verification reaches); without drafts they draw on the device too.
TEST(GrammarDecoding, DeviceSampledMasksGiveTheHostPathsOutputs) {
  const auto& m = test::codelm_model();
  const auto g = Grammar::compile(kRecordGrammar);
  const std::string prompt = "# a person\nperson = ";
  std::vector<GenerationRequest> reqs;
  for (uint64_t seed = 1; seed <= 3; ++seed) reqs.push_back(constrained(m, prompt, g, 0.0f, seed, -1));
  reqs.push_back(constrained(m, "# another one\nrecord = ", g, 0.0f, 1, -1));
  reqs.push_back(constrained(m, prompt, g, 1.0f, 7, 0));  // seeded, no forced drafts
  GenerationRequest free_text;
  free_text.prompt_ids = m.tokenizer->encode("def add(a, b):", true);
  free_text.max_new_tokens = 24;
  free_text.sampling.temperature = 0.0f;
  reqs.push_back(free_text);
  Generator plain = test::make_generator(m, GeneratorOptions{.max_sequences = 8});
  const auto want = plain.generate(reqs);
  test::ArgmaxPreferringModel wrapped(*m.model);
  Generator device(wrapped, *m.tokenizer, GeneratorOptions{.max_sequences = 8});
  const auto got = device.generate(reqs);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].generated_ids, want[i].generated_ids) << "request " << i << ": " << got[i].text;
    EXPECT_EQ(got[i].finish_reason, want[i].finish_reason) << "request " << i;
    if (reqs[i].grammar) EXPECT_TRUE(follows(g, got[i].text)) << got[i].text;
  }
  EXPECT_GT(wrapped.masked_rows, 0);
  EXPECT_GT(wrapped.ids_steps, 0);
  EXPECT_GT(device.spec_metrics().forced_accepted, 0) << "forced drafts were verified on the device";
  // Greedy constrained requests alone never need logits on the host.
  wrapped.logit_steps = wrapped.ids_steps = 0;
  const std::vector<GenerationRequest> greedy(reqs.begin(), reqs.begin() + 4);
  device.generate(greedy);
  EXPECT_EQ(wrapped.logit_steps, 0);
  EXPECT_GT(wrapped.ids_steps, 0);
}

TEST(GrammarDecoding, RequestsSharingAGrammarLearnHowTheModelSpellsItsFixedText) {
  const auto& m = test::codelm_model();
  const auto g = Grammar::compile(
      R"(root ::= "{\"customer_identification_number\": " [0-9]{1,3} ", \"preferred_contact_channel\": \"" ("electronic_mail" | "telephone_call") "\"}")");
  std::vector<GenerationRequest> reqs, plain_reqs;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    reqs.push_back(constrained(m, "record = ", g, 1.0f, seed, -1));
    plain_reqs.push_back(constrained(m, "record = ", g, 1.0f, seed, 0));
  }
  GeneratorOptions one_at_a_time{.max_sequences = 1};
  Generator plain = test::make_generator(m, one_at_a_time);
  const auto expected = plain.generate(plain_reqs);
  Generator first = test::make_generator(m, one_at_a_time);
  first.generate({reqs[0]});
  const SpecMetrics alone = first.spec_metrics();
  Generator all = test::make_generator(m, one_at_a_time);
  const auto got = all.generate(reqs);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].generated_ids, expected[i].generated_ids) << i;
    EXPECT_TRUE(follows(g, got[i].text)) << got[i].text;
  }
  const SpecMetrics shared = all.spec_metrics();
  // The later requests draft the spellings the earlier ones chose, so more drafts are taken.
  EXPECT_GT(double(shared.forced_accepted) / double(shared.forced_drafted),
            double(alone.forced_accepted) / double(alone.forced_drafted));
}

TEST(GrammarDecoding, SpeculativeDraftsAreCutByTheGrammar) {
  const auto& m = test::stories_model();
  const auto g = Grammar::compile(kStoryGrammar);
  GeneratorOptions opts;
  opts.spec.mode = SpecMode::Auto;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    Generator plain = test::make_generator(m);
    const auto a = plain.generate({constrained(m, "Once upon a time", g, 0.0f, seed, 0)}).at(0);
    Generator spec = test::make_generator(m, opts);
    const auto b = spec.generate({constrained(m, "Once upon a time", g, 0.0f, seed, -1)}).at(0);
    EXPECT_EQ(a.generated_ids, b.generated_ids);
    EXPECT_TRUE(follows(g, b.text)) << b.text;
  }
}

TEST(GrammarDecoding, SpecialTokensKeepTheirTextWhenAsked) {
  const auto& m = test::codelm_model();
  // An end-of-generation token never shows; with skip_special_tokens off a control token's
  // text would. The grammar ends after "x", so the request stops there either way.
  const auto g = Grammar::compile(R"(root ::= "x")");
  Generator gen = test::make_generator(m);
  GenerationRequest r = constrained(m, "a = ", g, 0.0f, 1, -1);
  r.skip_special_tokens = false;
  const auto out = gen.generate({r}).at(0);
  EXPECT_EQ(out.text, "x");
  EXPECT_EQ(out.finish_reason, "stop");
}

}  // namespace
}  // namespace fdl
