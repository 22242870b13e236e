// SPM (`tokenizer.ggml.model = llama`) behaviour on small hand-made vocabularies: merge
// order by score, byte fallback, space prefix, special-token splitting, BOS/EOS.
#include <gtest/gtest.h>

#include "tokenizer/synthetic_vocab.h"

namespace fdl::test {
namespace {

using Ids = std::vector<int32_t>;

/// <unk> <s> </s> a b c, plus whatever the test adds; no space prefix unless asked.
SyntheticVocab abc_vocab(bool space_prefix = false) {
  SyntheticVocab v;
  v.add("<unk>", TokenType::Unknown);
  v.add("<s>", TokenType::Control);
  v.add("</s>", TokenType::Control);
  v.add("a");
  v.add("b");
  v.add("c");
  v.bools.emplace_back("add_space_prefix", space_prefix);
  return v;
}

TEST(SpmMerge, HighestScoringPairMergesFirst) {
  SyntheticVocab v = abc_vocab();
  const int32_t ab = v.add("ab", TokenType::Normal, -1.0f);
  const int32_t bc = v.add("bc", TokenType::Normal, -0.5f);
  EXPECT_EQ(v.load()->encode("abc", false), (Ids{3, bc}));
  v.scores[ab] = 0.0f;  // now "ab" scores higher
  EXPECT_EQ(v.load()->encode("abc", false), (Ids{ab, 5}));
}

TEST(SpmMerge, LeftmostPairWinsATie) {
  SyntheticVocab v = abc_vocab();
  const int32_t ab = v.add("ab", TokenType::Normal, -1.0f);
  v.add("bc", TokenType::Normal, -1.0f);
  EXPECT_EQ(v.load()->encode("abc", false), (Ids{ab, 5}));
  SyntheticVocab w = abc_vocab();
  const int32_t aa = w.add("aa", TokenType::Normal, -1.0f);
  EXPECT_EQ(w.load()->encode("aaa", false), (Ids{aa, 3}));
}

TEST(SpmMerge, MergesKeepGoingThroughLongerPieces) {
  SyntheticVocab v = abc_vocab();
  v.add("ab", TokenType::Normal, -1.0f);
  v.add("bc", TokenType::Normal, -0.5f);
  const int32_t abc = v.add("abc", TokenType::Normal, -3.0f);
  EXPECT_EQ(v.load()->encode("abcabc", false), (Ids{abc, abc}));
}

TEST(SpmByteFallback, UsesByteTokensForCharactersNotInVocab) {
  SyntheticVocab v = abc_vocab();
  const int32_t first_byte = static_cast<int32_t>(v.tokens.size());
  v.add_byte_tokens();
  const auto tok = v.load();
  EXPECT_EQ(tok->encode("a\xC3\xA9", false), (Ids{3, first_byte + 0xC3, first_byte + 0xA9}));
  EXPECT_EQ(tok->decode(tok->encode("a\xC3\xA9", false)), "a\xC3\xA9");
}

TEST(SpmByteFallback, FallsBackToUnknownWithoutByteTokens) {
  const auto tok = abc_vocab().load();
  EXPECT_EQ(tok->encode("a\xC3\xA9", false), (Ids{3, 0, 0}));
}

TEST(SpmByteFallback, UnknownIdComesFromMetadataElseDefaultsToZero) {
  SyntheticVocab v;
  v.add("a");
  v.add("<s>", TokenType::Control);
  v.add("</s>", TokenType::Control);
  v.add("?", TokenType::Unknown);
  v.bools.emplace_back("add_space_prefix", false);
  // Without the key llama.cpp assumes id 0, whatever that token is.
  EXPECT_EQ(v.load()->encode("\xC3", false), (Ids{0}));
  v.uints.emplace_back("unknown_token_id", 3);
  EXPECT_EQ(v.load()->encode("\xC3", false), (Ids{3}));
  // An out-of-range id (0xFFFFFFFF is how converters write "none") keeps the default.
  v.uints.back().second = 0xFFFFFFFFu;
  EXPECT_EQ(v.load()->encode("\xC3", false), (Ids{0}));
}

TEST(SpmSpacePrefix, EscapesSpacesAndPrefixesTheText) {
  SyntheticVocab v = abc_vocab(/*space_prefix=*/true);
  const int32_t mark = v.add("\xE2\x96\x81");
  const int32_t mark_a = v.add("\xE2\x96\x81" "a", TokenType::Normal, 1.0f);
  const auto tok = v.load();
  EXPECT_TRUE(tok->add_space_prefix());
  EXPECT_EQ(tok->encode("a a", false), (Ids{mark_a, mark_a}));
  EXPECT_EQ(tok->encode("", false), Ids{});
  EXPECT_EQ(tok->encode(" ", false), (Ids{mark, mark}));
  EXPECT_EQ(tok->decode({mark_a, mark_a}), "a a");
  EXPECT_EQ(tok->token_to_piece(mark_a), " a");
}

TEST(SpmSpacePrefix, DefaultsToOnForLlamaVocabs) {
  SyntheticVocab v = abc_vocab();
  v.bools.clear();
  EXPECT_TRUE(v.load()->add_space_prefix());
}

TEST(SpmSpecialTokens, UserDefinedTextIsSplitEvenWithoutParseSpecial) {
  SyntheticVocab v = abc_vocab(/*space_prefix=*/true);
  const int32_t mark = v.add("\xE2\x96\x81");
  const int32_t tag = v.add("<tag>", TokenType::UserDefined);
  const auto tok = v.load();
  // Text after a special token gets the space prefix again, as in llama.cpp.
  EXPECT_EQ(tok->encode("a<tag>b", false), (Ids{mark, 3, tag, mark, 4}));
  EXPECT_EQ(tok->token_to_piece(tag), "<tag>");
}

TEST(SpmSpecialTokens, ControlTextNeedsParseSpecial) {
  const auto tok = abc_vocab().load();
  EXPECT_EQ(tok->encode("a</s>", false, true), (Ids{3, 2}));
  const Ids plain = tok->encode("a</s>", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 2), 0);
}

TEST(SpmSpecialTokens, LongestTextIsSplitFirst) {
  SyntheticVocab v = abc_vocab();
  const int32_t ab = v.add("ab", TokenType::UserDefined);
  const int32_t bca = v.add("bca", TokenType::UserDefined);
  // "bca" (longer) claims its text before "ab" is looked for.
  EXPECT_EQ(v.load()->encode("abcab", false), (Ids{3, bca, 4}));
  EXPECT_EQ(v.load()->encode("abab", false), (Ids{ab, ab}));
}

TEST(SpmSpecialTokens, Phi3SpecialTokensSwallowFollowingWhitespace) {
  SyntheticVocab v = abc_vocab(/*space_prefix=*/true);
  v.name = "Phi3 mini";
  const int32_t mark = v.add("\xE2\x96\x81");
  const int32_t end = v.add("<|end|>", TokenType::Control);
  const auto tok = v.load();
  EXPECT_EQ(tok->encode("a<|end|> \n b", false, true), (Ids{mark, 3, end, mark, 4}));
  EXPECT_TRUE(tok->is_eog(end));
  // Other models keep the whitespace.
  SyntheticVocab w = abc_vocab(/*space_prefix=*/true);
  w.add("\xE2\x96\x81");
  w.add("<|end|>", TokenType::Control);
  EXPECT_GT(w.load()->encode("a<|end|> \n b", false, true).size(), 5u);
}

TEST(SpmSpecialTokens, BosAndEosFollowMetadata) {
  SyntheticVocab v = abc_vocab();
  EXPECT_EQ(v.load()->encode("a", true), (Ids{1, 3}));
  v.bools.emplace_back("add_eos_token", true);
  v.bools.emplace_back("add_bos_token", false);
  const auto tok = v.load();
  EXPECT_EQ(tok->encode("a", true), (Ids{3, 2}));
  EXPECT_EQ(tok->encode("a", false), (Ids{3}));
  EXPECT_EQ(tok->encode("", true), (Ids{2}));
}

TEST(SpmSpecialTokens, EndOfTurnTextsAreEogAndControl) {
  SyntheticVocab v = abc_vocab();
  const int32_t eot = v.add("<|eot_id|>");  // stored as NORMAL by a careless converter
  const auto tok = v.load();
  EXPECT_TRUE(tok->is_eog(eot));
  EXPECT_TRUE(tok->is_eog(2));
  EXPECT_EQ(tok->token_type(eot), TokenType::Control);
  EXPECT_EQ(tok->token_to_piece(eot), "");
  EXPECT_EQ(tok->token_to_piece(eot, true), "<|eot_id|>");
}

TEST(SpmPieces, UnusedAndUndefinedTokensRenderEmpty) {
  SyntheticVocab v = abc_vocab();
  const int32_t unused = v.add("zz", TokenType::Unused);
  const int32_t undefined = v.add("yy", TokenType::Undefined);
  const auto tok = v.load();
  EXPECT_EQ(tok->token_to_piece(unused, true), "");
  EXPECT_EQ(tok->token_to_piece(undefined, true), "");
  EXPECT_EQ(tok->token_text(unused), "zz");
}

}  // namespace
}  // namespace fdl::test
