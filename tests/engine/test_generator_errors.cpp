// Bad requests and options fail with clear exceptions before any work, and leave the
// Generator usable.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "engine_test_support.h"

namespace fdl {
namespace {

void expect_invalid(Generator& gen, const std::vector<GenerationRequest>& reqs,
                    const std::string& fragment) {
  try {
    gen.generate(reqs);
    ADD_FAILURE() << "expected std::invalid_argument mentioning '" << fragment << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(GeneratorErrors, BadRequestsAreRejectedByIndex) {
  auto gen = test::make_generator(test::stories_model(), {.n_ctx = 64});
  const auto ok = test::greedy_request({1, 403}, 4);
  expect_invalid(gen, {ok, test::greedy_request({}, 4)}, "request #1: prompt_ids is empty");
  expect_invalid(gen, {test::greedy_request({1, 512}, 4)}, "outside the vocabulary");
  expect_invalid(gen, {test::greedy_request({1, -3}, 4)}, "outside the vocabulary");
  expect_invalid(gen, {test::greedy_request(std::vector<int32_t>(64, 1), 4)}, "no room");
  expect_invalid(gen, {test::greedy_request({1}, -2)}, "max_new_tokens");
  auto bad_sampling = ok;
  bad_sampling.sampling.top_p = 0.f;
  expect_invalid(gen, {bad_sampling}, "top_p");
  auto empty_stop = ok;
  empty_stop.stop = {""};
  expect_invalid(gen, {empty_stop}, "stop string #0 is empty");
  // Nothing leaked; the generator still works.
  EXPECT_EQ(gen.block_pool().n_free(), gen.block_pool().capacity());
  EXPECT_EQ(gen.generate({ok}).at(0).generated_ids.size(), 4u);
}

TEST(GeneratorErrors, ExceptionFromTheCallbackFreesTheCache) {
  auto gen = test::make_generator(test::stories_model());
  std::vector<GenerationRequest> reqs(3, test::greedy_request({1, 403, 407}, 32));
  int calls = 0;
  EXPECT_THROW(gen.generate(reqs,
                            [&](size_t, std::string_view) {
                              if (++calls == 10) throw std::runtime_error("client went away");
                            }),
               std::runtime_error);
  EXPECT_EQ(gen.block_pool().n_free(), gen.block_pool().capacity());
  EXPECT_EQ(gen.generate(reqs).size(), 3u);
}

TEST(GeneratorErrors, BadOptionsAreRejected) {
  const auto& m = test::stories_model();
  EXPECT_THROW(Generator(*m.model, *m.tokenizer, {.block_size = 0}), std::invalid_argument);
  EXPECT_THROW(Generator(*m.model, *m.tokenizer, {.n_ctx = 4096}), std::invalid_argument);
  EXPECT_THROW(Generator(*m.model, *m.tokenizer, {.max_sequences = 0}), std::invalid_argument);
  EXPECT_THROW(Generator(*m.model, *m.tokenizer, {.prefill_chunk = 0}), std::invalid_argument);
}

TEST(GeneratorErrors, DefaultsResolveFromTheModel) {
  auto gen = test::make_generator(test::stories_model(), {.max_sequences = 2});
  EXPECT_EQ(gen.options().n_ctx, 2048);  // the model's context (below the 4096 cap)
  EXPECT_EQ(gen.block_pool().capacity(), 2u * 2048 / 16);
}

TEST(GeneratorErrors, EncodePromptGivesBosForEmptyText) {
  const auto& tok = *test::stories_model().tokenizer;
  EXPECT_EQ(encode_prompt(tok, ""), std::vector<int32_t>{tok.bos_id()});
  const auto ids = encode_prompt(tok, "Once upon a time");
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 403, 407, 261, 378}));
}

}  // namespace
}  // namespace fdl
