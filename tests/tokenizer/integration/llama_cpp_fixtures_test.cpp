// llama.cpp's own tokenizer test suite (models/ggml-vocab-*.gguf + .inp/.out) run against
// our tokenizers: every string, no BOS, special-token text left as text.
//
// Not covered: ggml-vocab-bert-bge (a WordPiece / BERT vocabulary, `tokenizer.ggml.model =
// bert`), which is not a Llama-family tokenizer and is out of scope; the test below checks
// that loading it is refused with a clear error instead.
#include <gtest/gtest.h>

#include <sstream>

#include "tokenizer/integration/tokenizer_data.h"

namespace fdl::test {
namespace {

struct FixtureCase {
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<FixtureCase> read_fixture(const std::string& vocab) {
  const std::string inp = read_file(vocab_fixture_path(vocab).string() + ".inp");
  const std::string out = read_file(vocab_fixture_path(vocab).string() + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0;;) {
    const size_t next = inp.find(sep, pos);
    if (next == std::string::npos) break;
    texts.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<FixtureCase> cases;
  std::istringstream lines(out);
  std::string line;
  size_t i = 0;
  while (std::getline(lines, line)) {
    if (i >= texts.size()) throw std::runtime_error(vocab + ": more .out lines than .inp cases");
    FixtureCase c{texts[i++], {}};
    std::istringstream ids(line);
    int32_t id;
    while (ids >> id) c.ids.push_back(id);
    cases.push_back(std::move(c));
  }
  if (cases.size() != texts.size()) throw std::runtime_error(vocab + ": .inp/.out case counts differ");
  return cases;
}

class LlamaCppVocabFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaCppVocabFixture, EveryCaseMatchesLlamaCpp) {
  const std::string vocab = GetParam();
  const Tokenizer& tok = shared_tokenizer(vocab_fixture_path(vocab));
  const std::vector<FixtureCase> cases = read_fixture(vocab);
  ASSERT_EQ(cases.size(), 46u);
  int failures = 0;
  for (const FixtureCase& c : cases) {
    const std::vector<int32_t> got = tok.encode(c.text, /*add_special=*/false, /*parse_special=*/false);
    EXPECT_EQ(got, c.ids) << vocab << " text: '" << c.text << "'";
    failures += got != c.ids;
  }
  EXPECT_EQ(failures, 0);
}

TEST_P(LlamaCppVocabFixture, DecodeRoundTripsEveryCase) {
  // Every fixture string is valid UTF-8, so pieces must concatenate back to the input.
  const std::string vocab = GetParam();
  const Tokenizer& tok = shared_tokenizer(vocab_fixture_path(vocab));
  for (const FixtureCase& c : read_fixture(vocab)) {
    std::string expected = c.text;
    EXPECT_EQ(tok.decode(tok.encode(c.text, false)), expected) << vocab;
  }
}

INSTANTIATE_TEST_SUITE_P(TokenizerVocabs, LlamaCppVocabFixture,
                         ::testing::Values("llama-spm", "phi-3", "gpt-2", "llama-bpe", "qwen2", "starcoder", "refact",
                                           "deepseek-coder", "deepseek-llm", "falcon", "mpt"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

TEST(LlamaCppVocabFixtureScope, BertWordPieceIsRefusedClearly) {
  const GgufFile f = GgufFile::open(vocab_fixture_path("bert-bge"));
  try {
    Tokenizer::from_gguf(f);
    FAIL() << "a WordPiece vocab must be rejected";
  } catch (const TokenizerError& e) {
    EXPECT_NE(std::string(e.what()).find("'bert'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("llama, gpt2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fdl::test
