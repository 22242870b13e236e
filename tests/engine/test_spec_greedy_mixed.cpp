// Greedy decoding with speculation equals plain greedy decoding on 50 prompts of our own,
// in mixed batches (some requests not speculating, different windows), with every end
// condition in play: end-of-generation, stop strings, max tokens, the context limit.
#include "spec_test_support.h"

namespace fdl {
namespace {

// Story openings and passages that repeat themselves (where drafts get accepted), plain
// openings (where they mostly do not), and odd inputs.
const std::vector<std::string> kPrompts{
    "Once upon a time, there was a little girl named Lily.",
    "Tom had a big dog. Tom had a big dog. Tom had a big",
    "The sun was shining. The birds were singing. The sun was",
    "One day, Ben went to the park with his mom.",
    "Sue liked to play with her ball. Sue liked to play with her",
    "Lily and Tom were friends. They liked to play. Lily and Tom",
    "The cat sat on the mat. The cat sat on the",
    "Max was a happy dog. He liked to run and jump.",
    "Mom said, \"Be careful!\" Mom said, \"Be",
    "There was a big tree in the garden. There was a big",
    "Anna had a red hat. She wore it every day. Anna had a",
    "The little bird could not fly. The little bird",
    "Once upon a time, in a small town, there lived a boy.",
    "Tim and Sam went to the beach. They built a sand castle.",
    "The dog barked. The dog barked. The dog barked. The dog",
    "She was sad because she lost her toy.",
    "He ran and ran and ran and ran and",
    "The girl saw a pretty flower. She wanted to pick it.",
    "Jack liked cake. Jack liked cake. Jack liked",
    "It was a sunny day. Lily went outside to play.",
    "The boy had a toy car. The toy car was red. The toy",
    "Once there was a fish who lived in the sea.",
    "Lily said, \"I love you, Mom.\" Mom said, \"I love you,",
    "The bear was hungry. He looked for honey.",
    "One, two, three, four, one, two, three,",
    "The king had a big castle. The king had a",
    "Sara found a shiny rock. She showed it to her dad.",
    "The frog jumped into the pond. Splash! The frog",
    "Ben was scared of the dark. His mom gave him a light.",
    "The rain fell and fell. The rain fell and",
    "Mia had a doll. Mia loved her doll. Mia",
    "The man had a hat. The hat was big. The man had a",
    "Timmy wanted to help his dad fix the car.",
    "The moon was bright. The stars were bright. The moon",
    "Lucy and her dog played ball all day long.",
    "Once upon a time, once upon a time, once upon a",
    "The baby laughed. The baby laughed again. The baby",
    "Sam saw a big truck. It was very loud.",
    "The bunny hopped and hopped. The bunny",
    "Kitty wanted milk. Kitty asked for milk. Kitty",
    "The old lady had a garden full of flowers.",
    "Zoe liked to draw. She drew a sun, a tree and a house.",
    "The ball went up, up, up. The ball went",
    "Lily had a red ball. Lily had a red ball. Lily had a red ball. Lily had",
    "Bob the bird sang a song every morning.",
    "The kids ran to the park. The kids ran to the",
    "\n",
    "a",
    "Once upon a time",
    "The end. The end. The end.",
};

std::vector<GenerationRequest> mixed_requests(const Tokenizer& tok) {
  std::vector<GenerationRequest> reqs;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    // Lengths from 1 to 90 tokens, end-of-generation honoured for most of them.
    GenerationRequest r = test::greedy_request(encode_prompt(tok, kPrompts[i]),
                                               int(1 + (i * 37) % 90), /*ignore_eos=*/i % 3 == 0);
    if (i % 4 == 1) r.stop = {"."};
    if (i % 7 == 2) r.stop = {"the", "!"};
    if (i % 5 == 3) r.sampling.repeat_penalty = 1.1f;  // penalties see accepted drafts
    r.spec_window = int32_t(i % 6 == 0 ? 0 : (i % 9));  // 0 = plain; windows 1..8
    if (r.spec_window == 0 && i % 6 != 0) r.spec_window = -1;  // generator default
    reqs.push_back(r);
  }
  return reqs;
}

TEST(SpecGreedyMixed, FiftyPromptsMixedBatchesEqualPlain) {
  const auto& m = test::stories_model();
  const auto reqs = mixed_requests(*m.tokenizer);
  ASSERT_EQ(reqs.size(), 50u);
  auto plain = test::make_generator(m, {.max_sequences = 8});
  const auto want = plain.generate(reqs);
  for (SpecMode mode : {SpecMode::Lookup, SpecMode::Lookahead, SpecMode::Auto}) {
    SCOPED_TRACE(spec_mode_name(mode));
    auto opt = test::spec_options(mode, 5, /*adaptive=*/mode == SpecMode::Auto);
    opt.max_sequences = 8;
    auto gen = test::make_generator(m, opt);
    test::expect_same_results(gen.generate(reqs), want);
    test::expect_pool_full(gen);
    EXPECT_GT(gen.spec_metrics().accepted, 0);
  }
}

TEST(SpecGreedyMixed, EachPromptAloneEqualsPlain) {
  const auto& m = test::stories_model();
  const auto reqs = mixed_requests(*m.tokenizer);
  auto plain = test::make_generator(m);
  auto gen = test::make_generator(m, test::spec_options(SpecMode::Auto, 8));
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto r = reqs[i];
    r.spec_window = -1;
    const auto want = plain.generate({r});
    test::expect_same_results(gen.generate({r}), want);
  }
  test::expect_pool_full(gen);
}

TEST(SpecGreedyMixed, ContextLimitAndMaxTokensAreNeverExceeded) {
  // A repetitive prompt in a tiny context: drafts would run past n_ctx if not clipped.
  const auto& m = test::stories_model();
  const auto prompt = encode_prompt(*m.tokenizer, kPrompts[43]);
  for (int n_ctx : {int(prompt.size()) + 1, int(prompt.size()) + 3, int(prompt.size()) + 17}) {
    auto plain = test::make_generator(m, {.block_size = 4, .n_ctx = n_ctx});
    auto opt = test::spec_options(SpecMode::Lookup, 8);
    opt.block_size = 4;
    opt.n_ctx = n_ctx;
    auto gen = test::make_generator(m, opt);
    for (int max_new : {-1, 1, 2, 5}) {
      const auto r = test::greedy_request(prompt, max_new);
      const auto want = plain.generate({r});
      const auto got = gen.generate({r});
      test::expect_same_results(got, want);
      if (max_new > 0) { EXPECT_LE(got[0].generated_ids.size(), size_t(max_new)); }
      EXPECT_LE(prompt.size() + got[0].generated_ids.size(), size_t(n_ctx));
    }
    test::expect_pool_full(gen);
  }
}

}  // namespace
}  // namespace fdl
