// The window x n-gram sweep (after a llama.cpp bug where prompt-lookup changed temperature-0
// output with the draft size, even at draft 0): every window x n-gram size, and lookahead,
// gives the plain greedy ids.
#include "spec_test_support.h"

namespace fdl {
namespace {

TEST(SpecSweep, LilyPromptEveryWindowAndNgramSizeEqualsPlain) {
  const auto& m = test::stories_model();
  const auto prompt = encode_prompt(
      *m.tokenizer, "Lily had a red ball. Lily had a red ball. Lily had a red ball. Lily had");
  const auto r = test::greedy_request(prompt, 128);
  auto plain = test::make_generator(m);
  const auto want = plain.generate({r});
  int64_t accepted = 0;
  for (int window : {0, 1, 2, 3, 5, 8}) {
    for (int n = 1; n <= 4; ++n) {
      SCOPED_TRACE("window " + std::to_string(window) + " n-gram " + std::to_string(n));
      auto gen = test::make_generator(m, test::spec_options(SpecMode::Lookup, window, false, n, n));
      test::expect_same_results(gen.generate({r}), want);
      test::expect_pool_full(gen);
      if (window == 0) { EXPECT_EQ(gen.spec_metrics().drafted, 0); }
      accepted += gen.spec_metrics().accepted;
    }
    for (SpecMode mode : {SpecMode::Lookahead, SpecMode::Auto}) {
      SCOPED_TRACE(std::string(spec_mode_name(mode)) + " window " + std::to_string(window));
      auto gen = test::make_generator(m, test::spec_options(mode, window));
      test::expect_same_results(gen.generate({r}), want);
      test::expect_pool_full(gen);
    }
  }
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace fdl
