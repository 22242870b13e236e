// Byte-level BPE (`tokenizer.ggml.model = gpt2`) on small hand-made vocabularies: merge
// ranks, ties, ignore_merges, pre-tokenizer selection and defaults, pieces.
#include <gtest/gtest.h>

#include "tokenizer/synthetic_vocab.h"

namespace fdl::test {
namespace {

using Ids = std::vector<int32_t>;

int32_t byte_id(char c) { return static_cast<uint8_t>(c); }

TEST(BpeMerge, LowerRankMergesFirst) {
  SyntheticVocab v = byte_level_vocab();
  const int32_t ab = v.add("ab");
  const int32_t bc = v.add("bc");
  v.merges = {"a b", "b c"};
  EXPECT_EQ(v.load()->encode("abc", false), (Ids{ab, byte_id('c')}));
  v.merges = {"b c", "a b"};
  EXPECT_EQ(v.load()->encode("abc", false), (Ids{byte_id('a'), bc}));
}

TEST(BpeMerge, MergedPiecesMergeFurther) {
  SyntheticVocab v = byte_level_vocab();
  v.add("ab");
  const int32_t abc = v.add("abc");
  v.merges = {"a b", "ab c"};
  EXPECT_EQ(v.load()->encode("abcabc", false), (Ids{abc, abc}));
}

TEST(BpeMerge, LeftmostPairWinsATie) {
  SyntheticVocab v = byte_level_vocab();
  const int32_t aa = v.add("aa");
  v.merges = {"a a"};
  EXPECT_EQ(v.load()->encode("aaa", false), (Ids{aa, byte_id('a')}));
}

TEST(BpeMerge, FirstOccurrenceOfADuplicateRuleCounts) {
  SyntheticVocab v = byte_level_vocab();
  const int32_t ab = v.add("ab");
  v.add("bc");
  v.merges = {"a b", "b c", "a b"};
  EXPECT_EQ(v.load()->encode("abc", false), (Ids{ab, byte_id('c')}));
}

TEST(BpeMerge, SpacesAreSpelledWithTheByteMap) {
  SyntheticVocab v = byte_level_vocab();
  const int32_t sp_a = v.add(gpt2_spelling(" a"));
  v.merges = {gpt2_spelling(" ") + " a"};
  const auto tok = v.load();
  EXPECT_EQ(tok->encode("a a", false), (Ids{byte_id('a'), sp_a}));
  EXPECT_EQ(tok->token_to_piece(sp_a), " a");
  EXPECT_EQ(tok->token_text(sp_a), "\xC4\xA0" "a");
}

TEST(BpeMerge, MergesNeverCrossPreTokenizerChunks) {
  SyntheticVocab v = byte_level_vocab();
  v.add("a,");
  v.merges = {"a ,"};
  EXPECT_EQ(v.load()->encode("a,", false), (Ids{byte_id('a'), byte_id(',')}));
}

TEST(BpeIgnoreMerges, Llama3EmitsWholeVocabEntriesDirectly) {
  SyntheticVocab v = byte_level_vocab("llama-bpe");
  const int32_t xyz = v.add("xyz");
  const int32_t bos = v.add("<|begin_of_text|>", TokenType::Control);
  v.uints.emplace_back("bos_token_id", bos);
  const auto tok = v.load();
  EXPECT_TRUE(tok->add_bos());  // Llama-3 pre-tokenizers default to adding BOS
  EXPECT_EQ(tok->encode("xyz", true), (Ids{bos, xyz}));
  SyntheticVocab g = byte_level_vocab("gpt-2");
  g.add("xyz");
  const auto tok2 = g.load();
  EXPECT_FALSE(tok2->add_bos());
  EXPECT_EQ(tok2->encode("xyz", true), (Ids{byte_id('x'), byte_id('y'), byte_id('z')}));
}

TEST(BpePreTokenizer, AbsentPreMeansLlamaCppDefault) {
  // The default list cuts digit runs in threes after the GPT-2 regex; gpt-2 does not.
  SyntheticVocab v = byte_level_vocab();
  const int32_t t34 = v.add("34");
  v.merges = {"3 4"};
  EXPECT_EQ(v.load()->encode("12345", false), (Ids{'1', '2', t34, '5'}));
  v.pre.reset();
  EXPECT_EQ(v.load()->encode("12345", false), (Ids{'1', '2', '3', '4', '5'}));
  v.pre = "default";
  EXPECT_EQ(v.load()->encode("12345", false), (Ids{'1', '2', '3', '4', '5'}));
}

TEST(BpePreTokenizer, UnknownPreIsRefusedWithTheSupportedList) {
  SyntheticVocab v = byte_level_vocab("no-such-pre");
  try {
    v.load();
    FAIL() << "expected TokenizerError";
  } catch (const TokenizerError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("tokenizer.ggml.pre"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'no-such-pre'"), std::string::npos) << msg;
    for (const char* name : {"gpt-2", "llama-bpe", "qwen2", "deepseek-coder", "falcon", "mpt"})
      EXPECT_NE(msg.find(name), std::string::npos) << name << " missing from: " << msg;
  }
}

TEST(BpeSpecialTokens, ControlTextNeedsParseSpecialUserDefinedDoesNot) {
  SyntheticVocab v = byte_level_vocab();
  const int32_t eot = v.add("<|endoftext|>", TokenType::Control);
  const int32_t ud = v.add("<fn>", TokenType::UserDefined);
  const auto tok = v.load();
  EXPECT_EQ(tok->encode("a<|endoftext|>", false, true), (Ids{byte_id('a'), eot}));
  EXPECT_EQ(tok->encode("a<|endoftext|>", false, false).size(), 14u);
  EXPECT_EQ(tok->encode("<fn>a", false, false), (Ids{ud, byte_id('a')}));
  EXPECT_TRUE(tok->is_eog(eot));
}

TEST(BpePieces, EntriesOutsideTheByteMapStayVisible) {
  SyntheticVocab v = byte_level_vocab();
  const int32_t raw = v.add("\xE4\xB8\xAD");  // "中" spelled raw: not a byte-map spelling
  const auto tok = v.load();
  EXPECT_EQ(tok->token_to_piece(raw), "[UNK_BYTE_0xe4b8ad\xE4\xB8\xAD]");
}

TEST(BpeDefaults, SpecialIdsDefaultLikeLlamaCpp) {
  SyntheticVocab v = byte_level_vocab();
  const auto tok = v.load();
  EXPECT_EQ(tok->bos_id(), 11);  // llama.cpp's historical BPE default
  EXPECT_EQ(tok->eos_id(), 11);
  EXPECT_FALSE(tok->add_space_prefix());
  EXPECT_EQ(tok->model_name(), "gpt2");
}

TEST(BpeRoundTrip, ArbitraryBytesSurvive) {
  const auto tok = byte_level_vocab().load();
  const std::string text = "caf\xC3\xA9 \xF0\x9F\x98\x80 \t\n  x=1;\r\n\xE4\xB8\xAD\xE6\x96\x87";
  EXPECT_EQ(tok->decode(tok->encode(text, false)), text);
}

TEST(BpeRoundTrip, MalformedUtf8IsNormalisedNotFatal) {
  const auto tok = byte_level_vocab().load();
  // A stray continuation byte becomes U+FFFD, as in llama.cpp.
  EXPECT_EQ(tok->decode(tok->encode("a\x80z", false)), "a\xEF\xBF\xBDz");
}

}  // namespace
}  // namespace fdl::test
