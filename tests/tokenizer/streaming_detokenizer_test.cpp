// StreamingDetokenizer: whole UTF-8 only, held partial sequences, U+FFFD for bad bytes, and
// the first-piece space rule shared with decode().
#include <gtest/gtest.h>

#include "tokenizer/synthetic_vocab.h"
#include "tokenizer/utf8.h"

namespace fdl::test {
namespace {

const std::string kReplacement = "\xEF\xBF\xBD";

struct ByteVocab {
  std::unique_ptr<Tokenizer> tok;
  int32_t first_byte = 0;
  int32_t space_hello = 0;
  int32_t byte(uint8_t b) const { return first_byte + b; }
};

ByteVocab make_vocab() {
  SyntheticVocab v;
  v.add("<unk>", TokenType::Unknown);
  v.add("<s>", TokenType::Control);
  v.add("</s>", TokenType::Control);
  ByteVocab bv;
  bv.first_byte = static_cast<int32_t>(v.tokens.size());
  v.add_byte_tokens();
  bv.space_hello = v.add("\xE2\x96\x81hello");
  bv.tok = v.load();
  return bv;
}

TEST(StreamingDetokenizer, HoldsASplitFourByteSequenceUntilComplete) {
  const ByteVocab v = make_vocab();
  StreamingDetokenizer s(*v.tok);
  const std::string emoji = "\xF0\x9F\x98\x80";
  EXPECT_EQ(s.push(v.byte(0xF0)), "");
  EXPECT_EQ(s.push(v.byte(0x9F)), "");
  EXPECT_EQ(s.push(v.byte(0x98)), "");
  EXPECT_EQ(s.push(v.byte(0x80)), emoji);
  EXPECT_EQ(s.flush(), "");
}

TEST(StreamingDetokenizer, EmitsCompleteCharactersBeforeAHeldTail) {
  const ByteVocab v = make_vocab();
  StreamingDetokenizer s(*v.tok);
  EXPECT_EQ(s.push(v.byte('a')), "a");
  EXPECT_EQ(s.push(v.byte(0xC3)), "");
  EXPECT_EQ(s.push(v.byte(0xA9)), "\xC3\xA9");
}

TEST(StreamingDetokenizer, BrokenSequencesBecomeReplacementCharacters) {
  const ByteVocab v = make_vocab();
  StreamingDetokenizer s(*v.tok);
  EXPECT_EQ(s.push(v.byte(0xE2)), "");
  EXPECT_EQ(s.push(v.byte('x')), kReplacement + "x");  // the held lead byte never completed
  EXPECT_EQ(s.push(v.byte(0xFF)), kReplacement);         // never valid anywhere
  EXPECT_EQ(s.push(v.byte(0xF0)), "");
  EXPECT_EQ(s.push(v.byte(0x9F)), "");
  EXPECT_EQ(s.flush(), kReplacement);  // one U+FFFD for the incomplete sequence
  EXPECT_EQ(s.flush(), "");
}

TEST(StreamingDetokenizer, FirstPieceLosesItsSpaceLikeDecode) {
  const ByteVocab v = make_vocab();
  const std::vector<int32_t> ids = {v.space_hello, v.space_hello};
  StreamingDetokenizer s(*v.tok);
  std::string out;
  for (int32_t id : ids) out += s.push(id);
  EXPECT_EQ(out, "hello hello");
  EXPECT_EQ(out, v.tok->decode(ids));
  StreamingDetokenizer cont(*v.tok, false, /*continues_text=*/true);
  EXPECT_EQ(cont.push(v.space_hello), " hello");
}

TEST(StreamingDetokenizer, ConcatenationEqualsWellFormedDecode) {
  const ByteVocab v = make_vocab();
  const std::string text = "h\xC3\xA9llo \xF0\x9F\x98\x80!\xE2\x82";  // ends mid-sequence
  std::vector<int32_t> ids = {1};  // BOS, rendered empty
  for (char c : text) ids.push_back(v.byte(static_cast<uint8_t>(c)));
  StreamingDetokenizer s(*v.tok);
  std::string out;
  for (int32_t id : ids) {
    const std::string part = s.push(id);
    EXPECT_TRUE(tok::is_well_formed_utf8(part));
    out += part;
  }
  out += s.flush();
  EXPECT_EQ(out, tok::to_well_formed_utf8(v.tok->decode(ids)));
}

TEST(StreamingDetokenizer, RendersControlTokensOnlyWhenAsked) {
  const ByteVocab v = make_vocab();
  StreamingDetokenizer plain(*v.tok);
  EXPECT_EQ(plain.push(2), "");
  StreamingDetokenizer special(*v.tok, /*render_special=*/true);
  EXPECT_EQ(special.push(2), "</s>");
  EXPECT_THROW(special.push(100000), TokenizerError);
}

}  // namespace
}  // namespace fdl::test
