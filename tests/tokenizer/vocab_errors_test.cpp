// Bad vocab metadata is refused with a TokenizerError naming the key.
#include <gtest/gtest.h>

#include "tokenizer/synthetic_vocab.h"

namespace fdl::test {
namespace {

void expect_error(const SyntheticVocab& v, const std::string& needle) {
  try {
    v.load();
    FAIL() << "expected a TokenizerError mentioning " << needle;
  } catch (const TokenizerError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

SyntheticVocab tiny() {
  SyntheticVocab v;
  v.add("<unk>", TokenType::Unknown);
  v.add("<s>", TokenType::Control);
  v.add("</s>", TokenType::Control);
  v.add("a");
  return v;
}

TEST(VocabErrors, UnknownTokenizerModel) {
  SyntheticVocab v = tiny();
  v.model = "bert";
  expect_error(v, "tokenizer.ggml.model");
  expect_error(v, "'bert'");
}

TEST(VocabErrors, MissingTokens) {
  GgufWriter w;
  w.set_string("tokenizer.ggml.model", "llama");
  const auto path = scratch_dir() / "no-tokens.gguf";
  w.write(path);
  const GgufFile f = GgufFile::open(path);
  try {
    Tokenizer::from_gguf(f);
    FAIL();
  } catch (const TokenizerError& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.tokens"), std::string::npos) << e.what();
  }
}

TEST(VocabErrors, MissingModelKey) {
  GgufWriter w;
  w.set_array_strings("tokenizer.ggml.tokens", {"a"});
  const auto path = scratch_dir() / "no-model.gguf";
  w.write(path);
  const GgufFile f = GgufFile::open(path);
  EXPECT_THROW(Tokenizer::from_gguf(f), TokenizerError);
}

TEST(VocabErrors, ScoresCountMismatch) {
  SyntheticVocab v = tiny();
  v.scores.pop_back();
  expect_error(v, "tokenizer.ggml.scores");
}

TEST(VocabErrors, TokenTypeCountMismatch) {
  SyntheticVocab v = tiny();
  v.types.push_back(1);
  expect_error(v, "tokenizer.ggml.token_type");
}

TEST(VocabErrors, GptWithoutMerges) {
  SyntheticVocab v = byte_level_vocab();
  v.write_merges = false;
  expect_error(v, "tokenizer.ggml.merges");
}

TEST(VocabErrors, AddBosWithoutAValidBos) {
  SyntheticVocab v = byte_level_vocab();
  v.tokens.resize(5);  // the BPE default BOS id 11 is now out of range
  v.types.resize(5);
  v.bools.emplace_back("add_bos_token", true);
  expect_error(v, "bos_token_id");
}

TEST(VocabErrors, EmptyTokenList) {
  SyntheticVocab v;
  expect_error(v, "tokenizer.ggml.tokens");
}

TEST(VocabErrors, WrongTypedSpecialId) {
  SyntheticVocab v = tiny();
  GgufWriter w;
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_array_strings("tokenizer.ggml.tokens", v.tokens);
  w.set_string("tokenizer.ggml.bos_token_id", "one");
  const auto path = scratch_dir() / "bad-bos.gguf";
  w.write(path);
  const GgufFile f = GgufFile::open(path);
  try {
    Tokenizer::from_gguf(f);
    FAIL();
  } catch (const TokenizerError& e) {
    EXPECT_NE(std::string(e.what()).find("bos_token_id"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fdl::test
