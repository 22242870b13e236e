// tokenizer.json variants that cannot be read as llama.cpp's tokenizers without changing ids
// (or that are malformed): each is refused with one line naming the file and the setting.
// Also the settings that are accepted and what they turn into.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "hf/one_line_error.h"
#include "hf/tokenizer_json_support.h"

namespace fdl::test {
namespace {

using nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr const char* kMark = "\xE2\x96\x81";  // U+2581
constexpr const char* kLabel = "fixture/tokenizer.json";

class TokenizerJsonVariant : public ::testing::Test {
 protected:
  void load(const std::string& name) {
    const auto dir = tokenizer_fixture_dir(name);
    tokenizer_ = read_json_file(dir / "tokenizer.json");
    config_ = read_json_file(dir / "tokenizer_config.json");
    n_vocab_ = read_json_file(dir / "expected.json")["n_vocab"].get<int>();
  }
  GgufFile convert() const { return convert_tokenizer_json(tokenizer_, config_, n_vocab_, kLabel); }
  /// The error converting the current variant gives; fails the test if there is none.
  std::string error() const {
    return one_line_error([&] { convert(); });
  }
  json& model() { return tokenizer_["model"]; }
  json tokenizer_, config_;
  int n_vocab_ = 0;
};

class SpmVariant : public TokenizerJsonVariant {
 protected:
  void SetUp() override { load("spm-legacy"); }
};

class TekkenVariant : public TokenizerJsonVariant {
 protected:
  void SetUp() override { load("tekken"); }
};

TEST_F(SpmVariant, OtherModelsAndBpeOptions) {
  model()["type"] = "Unigram";
  EXPECT_THAT(error(), AllOf(StartsWith(kLabel), HasSubstr("unsupported tokenizer model 'Unigram'")));
  model()["type"] = "WordPiece";
  EXPECT_THAT(error(), HasSubstr("unsupported tokenizer model 'WordPiece'"));
  model()["type"] = "BPE";
  model()["dropout"] = 0.1;
  EXPECT_THAT(error(), AllOf(StartsWith(kLabel), HasSubstr("BPE dropout")));
  model()["dropout"] = nullptr;
  model()["ignore_merges"] = true;
  EXPECT_THAT(error(), HasSubstr("model.ignore_merges = true is not supported for SentencePiece-style BPE"));
  model()["ignore_merges"] = false;
  model()["continuing_subword_prefix"] = "##";
  EXPECT_THAT(error(), HasSubstr("continuing_subword_prefix"));
}

TEST_F(SpmVariant, Normalizers) {
  tokenizer_["normalizer"] = {{"type", "NFKC"}};
  EXPECT_THAT(error(), AllOf(StartsWith(kLabel), HasSubstr("unsupported normalizer \"NFKC\"")));
  tokenizer_["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "Lowercase"}}}}};
  EXPECT_THAT(error(), HasSubstr("unsupported normalizer \"Lowercase\""));
  tokenizer_["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", kMark}};
  EXPECT_THAT(error(), HasSubstr("normalizer Replace pattern {\"Regex\":\" {2,}\"} is not supported"));
  tokenizer_["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "_"}};
  EXPECT_THAT(error(), HasSubstr("normalizer Replace(\" \", \"_\") is not supported"));
  tokenizer_["normalizer"] = {{"type", "Sequence"},
                              {"normalizers", {{{"type", "Prepend"}, {"prepend", "x"}}, {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMark}}}}};
  EXPECT_THAT(error(), HasSubstr("normalizer Prepend(\"x\") is not supported"));
  // Spaces left as spaces: nothing writes them as the mark.
  tokenizer_["normalizer"] = nullptr;
  EXPECT_THAT(error(), HasSubstr("neither the normalizer nor the pre_tokenizer turns spaces into"));
}

TEST_F(SpmVariant, PreTokenizersAndDecoders) {
  tokenizer_["pre_tokenizer"] = {{"type", "ByteLevel"}};
  EXPECT_THAT(error(), AllOf(StartsWith(kLabel), HasSubstr("unsupported pre_tokenizer \"ByteLevel\" for SentencePiece-style BPE")));
  tokenizer_["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", "x"}}}, {"behavior", "Isolated"}, {"invert", false}};
  EXPECT_THAT(error(), HasSubstr("pre_tokenizer Split is only supported on \" \""));
  tokenizer_["normalizer"] = nullptr;
  tokenizer_["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}, {"prepend_scheme", "first"}, {"split", false}};
  EXPECT_THAT(error(), HasSubstr("pre_tokenizer Metaspace replacement \"_\" is not supported"));
  tokenizer_["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kMark}, {"prepend_scheme", "sometimes"}};
  EXPECT_THAT(error(), HasSubstr("prepend_scheme \"sometimes\" is not always, first or never"));
  tokenizer_["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kMark}, {"prepend_scheme", "never"}, {"add_prefix_space", true}};
  EXPECT_THAT(error(), HasSubstr("add_prefix_space contradicts its prepend_scheme \"never\""));
  tokenizer_["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kMark}, {"prepend_scheme", "first"}, {"split", false}};
  tokenizer_["decoder"] = {{"type", "WordPiece"}};
  EXPECT_THAT(error(), HasSubstr("unsupported decoder \"WordPiece\""));
  tokenizer_["decoder"] = {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "CTC"}}}}};
  EXPECT_THAT(error(), HasSubstr("unsupported decoder \"CTC\" in decoder.decoders"));
}

TEST_F(SpmVariant, VocabularyAndMerges) {
  model()["vocab"].erase("<0xE2>");
  EXPECT_THAT(error(), AllOf(StartsWith(kLabel), HasSubstr("model.vocab lacks the byte token \"<0xE2>\"")));
  model()["vocab"]["<0xE2>"] = 229;
  model()["unk_token"] = "<nope>";
  EXPECT_THAT(error(), HasSubstr("model.unk_token \"<nope>\" is not in the vocabulary"));
  model()["unk_token"] = "<unk>";
  json& merges = model()["merges"];
  const json first = merges[0];  // ["▁", "t"]
  merges.erase(merges.begin());
  EXPECT_THAT(error(), HasSubstr(std::string("model.merges lacks \"") + kMark + " t\" although \"" + kMark + "t\" is in model.vocab"));
  merges.insert(merges.begin(), first);
  merges.push_back({"zz", "t"});
  EXPECT_THAT(error(), HasSubstr("model.merges entry \"zz t\": \"zz\" is not in model.vocab"));
  merges.back() = {"<s>", "<s>"};
  EXPECT_THAT(error(), HasSubstr("model.merges entry \"<s> <s>\" makes \"<s><s>\", which is not in model.vocab"));
  merges.back() = "lonely";
  EXPECT_THAT(error(), HasSubstr("model.merges entry \"lonely\" is not two tokens separated by one space"));
  merges.erase(merges.size() - 1);
  // A token made of a character the vocabulary lacks (byte fallback spells it as bytes in HF).
  n_vocab_ += 1;
  model()["vocab"]["\xCE\xA9t"] = n_vocab_ - 1;  // "Ωt"
  EXPECT_THAT(error(), HasSubstr("model.vocab has \"\xCE\xA9t\" but not its character \"\xCE\xA9\""));
  model()["vocab"].erase("\xCE\xA9t");
  model()["vocab"]["t"] = 1;  // the id of <s>
  EXPECT_THAT(error(), HasSubstr("id 1 is given to both"));
}

TEST_F(SpmVariant, MetaspaceThatSplitsAtMarks) {
  tokenizer_["normalizer"] = nullptr;
  tokenizer_["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kMark}, {"add_prefix_space", true}};
  // No token holds a mark after its start, so splitting before every mark changes nothing.
  EXPECT_TRUE(convert().get_bool_or("tokenizer.ggml.add_space_prefix", false));
  n_vocab_ += 1;
  model()["vocab"][std::string(kMark) + kMark] = n_vocab_ - 1;
  model()["merges"].push_back({kMark, kMark});
  EXPECT_THAT(error(), HasSubstr("pre_tokenizer Metaspace with split = true cuts the text before every"));
  tokenizer_["pre_tokenizer"]["split"] = false;
  EXPECT_NO_THROW(convert());
}

TEST_F(SpmVariant, SpacePrefixFollowsThePipelineThenTokenizerConfig) {
  EXPECT_TRUE(convert().get_bool_or("tokenizer.ggml.add_space_prefix", false));
  tokenizer_["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMark}};
  EXPECT_FALSE(convert().get_bool_or("tokenizer.ggml.add_space_prefix", true));
  tokenizer_["normalizer"] = nullptr;
  tokenizer_["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kMark}, {"prepend_scheme", "never"}, {"split", false}};
  EXPECT_FALSE(convert().get_bool_or("tokenizer.ggml.add_space_prefix", true));
  tokenizer_["pre_tokenizer"]["prepend_scheme"] = "always";
  EXPECT_TRUE(convert().get_bool_or("tokenizer.ggml.add_space_prefix", false));
  // tokenizer_config.json's add_prefix_space wins, as in llama.cpp's converter.
  config_["add_prefix_space"] = false;
  EXPECT_FALSE(convert().get_bool_or("tokenizer.ggml.add_space_prefix", true));
  config_["add_prefix_space"] = "yes";
  EXPECT_THAT(error(), HasSubstr("fixture/tokenizer_config.json: tokenizer_config.add_prefix_space must be true or false"));
}

TEST_F(SpmVariant, TokenTypes) {
  const GgufFile f = convert();
  const auto types = f.array_int("tokenizer.ggml.token_type");
  const auto tokens = f.array_strings("tokenizer.ggml.tokens");
  EXPECT_EQ(types[0], 3);      // <unk>: an added special token, so control, as llama.cpp's converter makes it
  EXPECT_EQ(types[3], 6);      // <0x00>
  EXPECT_EQ(types[512], 3);    // <|im_start|>: special
  EXPECT_EQ(types[513], 3);    // <|end|>: not special, but looks it
  EXPECT_EQ(types[514], 4);    // user-defined, its mark written as a space
  EXPECT_EQ(tokens[514], "hello world");
  EXPECT_EQ(f.get_uint("tokenizer.ggml.unknown_token_id"), 0u);
  // Not an added token: the unknown token's type.
  tokenizer_["added_tokens"].erase(0);
  EXPECT_EQ(convert().array_int("tokenizer.ggml.token_type")[0], 2);
  // Ids up to vocab_size that nothing names are padding.
  n_vocab_ += 2;
  const GgufFile padded = convert();
  EXPECT_EQ(padded.array_strings("tokenizer.ggml.tokens")[size_t(n_vocab_ - 1)], "[PAD" + std::to_string(n_vocab_ - 1) + "]");
  EXPECT_EQ(padded.array_int("tokenizer.ggml.token_type")[size_t(n_vocab_ - 1)], 5);
}

TEST_F(TekkenVariant, TheSplitAndIgnoreMergesMustBeTekkens) {
  EXPECT_EQ(convert().get_string("tokenizer.ggml.pre"), "tekken");
  model()["ignore_merges"] = false;
  EXPECT_THAT(error(), AllOf(StartsWith(kLabel), HasSubstr("model.ignore_merges = false does not match the tekken pre-tokenizer's (true)")));
  model()["ignore_merges"] = true;
  std::string pattern = tokenizer_["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"];
  pattern.replace(pattern.find("\\p{N}|"), 6, "\\p{N}{1,3}|");  // Tekken's split with digit triples: unknown
  tokenizer_["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = pattern;
  EXPECT_THAT(error(), HasSubstr("is not one this build knows (supported: the GPT-2, Llama 3, Qwen2 and Tekken splits)"));
}

TEST_F(TekkenVariant, ByteFallbackMakesItSentencePieceStyleWhichThisVocabularyIsNot) {
  model()["byte_fallback"] = true;
  EXPECT_THAT(error(), HasSubstr("model.ignore_merges = true is not supported for SentencePiece-style BPE"));
  model()["ignore_merges"] = false;
  // A byte-level pipeline is not a SentencePiece one: refused by its pre-tokenizer.
  EXPECT_THAT(error(), HasSubstr("unsupported pre_tokenizer \"Sequence\" for SentencePiece-style BPE"));
}

}  // namespace
}  // namespace fdl::test
