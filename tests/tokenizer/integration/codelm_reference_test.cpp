// codelm-16m (GPT-2 style byte-level BPE, 8192 tokens, pre = gpt-2) against llama.cpp's
// reference ids in reference/codelm_tokenizer.json, and the prompt ids of codelm_greedy.json.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "tokenizer/integration/tokenizer_data.h"

namespace fdl::test {
namespace {

using nlohmann::json;

const Tokenizer& codelm() { return shared_tokenizer(model_path("codelm-16m-f16.gguf")); }

TEST(CodelmTokenizer, Metadata) {
  const Tokenizer& tok = codelm();
  EXPECT_EQ(tok.model_name(), "gpt2");
  EXPECT_EQ(tok.n_vocab(), 8192);
  EXPECT_EQ(tok.bos_id(), 0);
  EXPECT_EQ(tok.eos_id(), 0);
  EXPECT_FALSE(tok.add_bos());
  EXPECT_FALSE(tok.add_eos());
  EXPECT_FALSE(tok.add_space_prefix());
  EXPECT_TRUE(tok.is_eog(0));
  EXPECT_EQ(tok.token_text(0), "<|endoftext|>");
  EXPECT_EQ(tok.token_type(0), TokenType::Control);
}

TEST(CodelmTokenizer, EveryReferenceCase) {
  const Tokenizer& tok = codelm();
  const json ref = json::parse(read_file(reference_path("codelm_tokenizer.json")));
  ASSERT_EQ(ref["cases"].size(), 76u);
  for (const json& c : ref["cases"]) {
    const std::string text = c["text"].get<std::string>();
    const auto ids = c["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text, false, false), ids) << "'" << text << "'";
    // add_bos_token is false, so add_special changes nothing.
    EXPECT_EQ(tok.encode(text, true, false), ids) << "'" << text << "'";
    EXPECT_EQ(tok.encode(text, false, true), c["ids_parse_special"].get<std::vector<int32_t>>())
        << "'" << text << "'";
    EXPECT_EQ(tok.decode(ids), text) << "'" << text << "'";
  }
}

TEST(CodelmTokenizer, GreedyReferencePrompts) {
  const Tokenizer& tok = codelm();
  const json ref = json::parse(read_file(reference_path("codelm_greedy.json")));
  ASSERT_FALSE(ref.empty());
  for (const json& c : ref) {
    const std::string prompt = c["prompt"].get<std::string>();
    EXPECT_EQ(tok.encode(prompt, c["add_bos"].get<bool>()),
              c["prompt_token_ids"].get<std::vector<int32_t>>())
        << prompt;
  }
}

TEST(CodelmTokenizer, EndOfTextIsSplitOnlyWhenParsingSpecial) {
  const Tokenizer& tok = codelm();
  const std::vector<int32_t> parsed = tok.encode("a<|endoftext|>b", false, true);
  ASSERT_EQ(parsed.size(), 3u);
  EXPECT_EQ(parsed[1], 0);
  const std::vector<int32_t> plain = tok.encode("a<|endoftext|>b", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 0), 0);
  EXPECT_EQ(tok.decode(plain), "a<|endoftext|>b");
  EXPECT_EQ(tok.decode(parsed), "ab");
  EXPECT_EQ(tok.decode(parsed, /*render_special=*/true), "a<|endoftext|>b");
}

TEST(Stories260kGreedyPrompts, PromptIdsMatchLlamaCpp) {
  const Tokenizer& tok = shared_tokenizer(model_path("stories260K.gguf"));
  const json ref = json::parse(read_file(reference_path("stories260K_greedy.json")));
  ASSERT_FALSE(ref.empty());
  for (const json& c : ref) {
    const std::string prompt = c["prompt"].get<std::string>();
    EXPECT_EQ(tok.encode(prompt, c["add_bos"].get<bool>()),
              c["prompt_token_ids"].get<std::vector<int32_t>>())
        << prompt;
    // Generated text is the plain concatenation of pieces (a continuation keeps its space).
    StreamingDetokenizer stream(tok, false, /*continues_text=*/true);
    std::string text;
    for (int32_t id : c["output_token_ids"].get<std::vector<int32_t>>()) text += stream.push(id);
    text += stream.flush();
    EXPECT_EQ(text, c["output_text"].get<std::string>()) << prompt;
  }
}

}  // namespace
}  // namespace fdl::test
