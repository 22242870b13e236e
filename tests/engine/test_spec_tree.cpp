// Tree verification (SpecOptions::tree): greedy output with several candidates verified per
// step is exactly plain greedy output — on every reference prompt of both models, on the
// "Lily had a red ball." sweep of test_spec_sweep.cpp, and in mixed batches of tree, linear
// and plain sequences — and every KV block returns to the pool. Each test also checks that
// trees were actually verified (and, where candidates disagree, that a non-first branch won
// sometimes).
#include <iostream>

#include "spec_test_support.h"

namespace fdl {
namespace {

using test::reference_requests;

GeneratorOptions tree_options(SpecMode mode, int window, bool adaptive = false, int ngram = 0) {
  GeneratorOptions o = ngram > 0 ? test::spec_options(mode, window, adaptive, ngram, ngram)
                                 : test::spec_options(mode, window, adaptive);
  o.spec.tree = true;
  return o;
}

void print(const char* what, const SpecMetrics& m) {
  std::cout << what << ": tree steps " << m.tree_steps << " of " << m.spec_seq_steps << ", accepted "
            << m.accepted << " (off the first branch " << m.tree_alt_accepted << "), tokens/forward "
            << m.tokens_per_forward() << "\n";
}

struct Config {
  SpecMode mode;
  int window;
  bool adaptive;
  bool alone;
};

// Returns the tree steps of all configurations.
int64_t check_model(const LoadedModel& m, const std::string& file, const std::vector<Config>& configs) {
  const auto reqs = reference_requests(file);
  auto plain = test::make_generator(m);
  const auto want = plain.generate(reqs);
  int64_t tree_steps = 0;
  for (const Config& c : configs) {
    SCOPED_TRACE(std::string(spec_mode_name(c.mode)) + " window " + std::to_string(c.window) +
                 (c.adaptive ? " adaptive" : " fixed"));
    auto gen = test::make_generator(m, tree_options(c.mode, c.window, c.adaptive));
    if (c.alone) {
      std::vector<GenerationResult> alone;
      for (const auto& r : reqs) alone.push_back(gen.generate({r}).at(0));
      test::expect_same_results(alone, want);
    }
    test::expect_same_results(gen.generate(reqs), want);  // all live at once
    test::expect_pool_full(gen);
    const SpecMetrics& sm = gen.spec_metrics();
    EXPECT_EQ(sm.accepted + sm.rejected, sm.drafted);
    EXPECT_LE(sm.tree_steps, sm.spec_seq_steps);
    EXPECT_LE(sm.tree_alt_accepted, sm.accepted);
    print(file.c_str(), sm);
    tree_steps += sm.tree_steps;
  }
  return tree_steps;
}

TEST(SpecTree, Stories260KReferencePromptsEqualPlainGreedy) {
  const int64_t trees = check_model(test::stories_model(), "stories260K_greedy.json",
                                    {{SpecMode::Lookup, 5, false, true},
                                     {SpecMode::Lookahead, 5, false, true},
                                     {SpecMode::Auto, 8, false, true},
                                     {SpecMode::Auto, 5, true, true}});
  EXPECT_GT(trees, 0);
}

TEST(SpecTree, CodeLmReferencePromptsEqualPlainGreedy) {
  const int64_t trees = check_model(test::codelm_model(), "codelm_greedy.json",
                                    {{SpecMode::Lookup, 5, false, false}, {SpecMode::Auto, 5, false, false}});
  EXPECT_GT(trees, 0);
}

TEST(SpecTree, LilySweepEveryWindowEqualsPlain) {
  const auto& m = test::stories_model();
  const auto prompt = encode_prompt(
      *m.tokenizer, "Lily had a red ball. Lily had a red ball. Lily had a red ball. Lily had");
  const auto r = test::greedy_request(prompt, 128);
  auto plain = test::make_generator(m);
  const auto want = plain.generate({r});
  int64_t trees = 0;
  for (int window : {1, 2, 3, 5, 8}) {
    for (int n = 1; n <= 4; ++n) {
      SCOPED_TRACE("window " + std::to_string(window) + " n-gram " + std::to_string(n));
      auto gen = test::make_generator(m, tree_options(SpecMode::Lookup, window, false, n));
      test::expect_same_results(gen.generate({r}), want);
      test::expect_pool_full(gen);
      trees += gen.spec_metrics().tree_steps;
      if (window == 1) { EXPECT_EQ(gen.spec_metrics().tree_steps, 0); }  // one node: never a tree
    }
    for (SpecMode mode : {SpecMode::Lookahead, SpecMode::Auto}) {
      SCOPED_TRACE(std::string(spec_mode_name(mode)) + " window " + std::to_string(window));
      auto gen = test::make_generator(m, tree_options(mode, window));
      test::expect_same_results(gen.generate({r}), want);
      test::expect_pool_full(gen);
      trees += gen.spec_metrics().tree_steps;
    }
  }
  EXPECT_GT(trees, 0);
}

// Prompts whose repeated words are followed by different words, so prompt lookup offers
// several candidates; windows 0 (plain), 1 (always linear), 3, 5 and 8 in one batch.
TEST(SpecTree, MixedBatchesOfTreeLinearAndPlainSequencesEqualPlain) {
  const auto& m = test::stories_model();
  const std::vector<std::string> texts{
      "Lily had a red ball. Lily had a blue hat. Lily had a red",
      "The dog ran to the park. The dog ran to the tree. The dog ran to the",
      "Tom saw a cat. Tom saw a bird. Tom saw a dog. Tom saw a",
      "Once upon a time, there was a little girl named Lily.",
      "Mom said, \"Be careful!\" Mom said, \"Be good!\" Mom said, \"Be",
      "One, two, three, four, one, two, five, one, two,",
      "The sun was hot. The sun was big. The sun was",
      "Ben liked cake. Ben liked milk. Ben liked"};
  const std::vector<int> windows{0, 1, 3, 5, 8};
  std::vector<GenerationRequest> reqs;
  for (size_t i = 0; i < texts.size() * 2; ++i) {
    auto r = test::greedy_request(encode_prompt(*m.tokenizer, texts[i % texts.size()]), 40 + int(i % 5) * 9,
                                  i % 3 != 0);
    r.spec_window = windows[i % windows.size()];
    reqs.push_back(std::move(r));
  }
  auto plain = test::make_generator(m);
  const auto want = plain.generate(reqs);
  for (bool adaptive : {false, true}) {
    SCOPED_TRACE(adaptive ? "adaptive" : "fixed");
    auto gen = test::make_generator(m, tree_options(SpecMode::Auto, 8, adaptive));
    test::expect_same_results(gen.generate(reqs), want);
    test::expect_pool_full(gen);
    const SpecMetrics& sm = gen.spec_metrics();
    print("mixed", sm);
    if (!adaptive) {
      EXPECT_GT(sm.tree_steps, 0);
      EXPECT_GT(sm.spec_seq_steps, sm.tree_steps);  // linear drafts too
      EXPECT_GT(sm.tree_alt_accepted, 0);
    }
  }
  // Tree verification off: linear drafts only.
  GeneratorOptions off = test::spec_options(SpecMode::Auto, 8);
  off.spec.tree = false;
  auto gen = test::make_generator(m, off);
  test::expect_same_results(gen.generate(reqs), want);
  test::expect_pool_full(gen);
  EXPECT_EQ(gen.spec_metrics().tree_steps, 0);
}

// Block size 1: every accepted branch that is not the first is packed across blocks, and the
// rejected nodes' blocks are returned on every step.
TEST(SpecTree, BlockSizeOnePacksAcceptedBranchesAcrossBlocks) {
  const auto& m = test::stories_model();
  GeneratorOptions o = tree_options(SpecMode::Auto, 6);
  o.block_size = 1;
  const std::vector<std::string> texts{"Lily had a red ball. Lily had a blue hat. Lily had a red",
                                       "Tom saw a cat. Tom saw a bird. Tom saw a dog. Tom saw a"};
  std::vector<GenerationRequest> reqs;
  for (const auto& t : texts) reqs.push_back(test::greedy_request(encode_prompt(*m.tokenizer, t), 60));
  GeneratorOptions po;
  po.block_size = 1;
  auto plain = test::make_generator(m, po);
  const auto want = plain.generate(reqs);
  auto gen = test::make_generator(m, o);
  test::expect_same_results(gen.generate(reqs), want);
  test::expect_pool_full(gen);
  EXPECT_GT(gen.spec_metrics().tree_steps, 0);
}

}  // namespace
}  // namespace fdl
