// UTF-8 helpers: the lenient decoder mirrors llama.cpp; the strict one follows the Unicode
// standard (examples from The Unicode Standard, section 3.9, Table 3-8).
#include <gtest/gtest.h>

#include "tokenizer/byte_unicode.h"
#include "tokenizer/utf8.h"

namespace fdl::tok {
namespace {

TEST(Utf8Lenient, DecodesWellFormedText) {
  EXPECT_EQ(decode_utf8_lenient("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"),
            (std::vector<uint32_t>{'a', 0xE9, 0x20AC, 0x1F600}));
}

TEST(Utf8Lenient, AcceptsWhatLlamaCppAcceptsAndReplacesTheRest) {
  // Overlong forms and surrogates pass (only the continuation bits are checked) ...
  EXPECT_EQ(decode_utf8_lenient("\xC0\x80"), (std::vector<uint32_t>{0}));
  EXPECT_EQ(decode_utf8_lenient("\xED\xA0\x80"), (std::vector<uint32_t>{0xD800}));
  // ... stray continuation bytes, truncated sequences and F8..FF become U+FFFD, one per byte.
  EXPECT_EQ(decode_utf8_lenient("\x80" "a"), (std::vector<uint32_t>{0xFFFD, 'a'}));
  EXPECT_EQ(decode_utf8_lenient("\xE2\x82"), (std::vector<uint32_t>{0xFFFD, 0xFFFD}));
  EXPECT_EQ(decode_utf8_lenient("\xFF"), (std::vector<uint32_t>{0xFFFD}));
  // Beyond U+10FFFF.
  EXPECT_EQ(decode_utf8_lenient("\xF7\xBF\xBF\xBF"), (std::vector<uint32_t>{0xFFFD}));
}

TEST(Utf8Strict, UnicodeTable3_8MaximalSubparts) {
  // 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 -> a FFFD FFFD FFFD b FFFD c FFFD FFFD d
  const std::string in = "\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64";
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(to_well_formed_utf8(in), "a" + r + r + r + "b" + r + "c" + r + r + "d");
}

TEST(Utf8Strict, RejectsOverlongsSurrogatesAndOutOfRange) {
  EXPECT_FALSE(is_well_formed_utf8("\xC0\x80"));
  EXPECT_FALSE(is_well_formed_utf8("\xE0\x80\x80"));
  EXPECT_FALSE(is_well_formed_utf8("\xED\xA0\x80"));
  EXPECT_FALSE(is_well_formed_utf8("\xF4\x90\x80\x80"));
  EXPECT_TRUE(is_well_formed_utf8("\xF4\x8F\xBF\xBF"));
  EXPECT_TRUE(is_well_formed_utf8(""));
}

TEST(Utf8Strict, TruncatedSequenceIsReportedAsSuch) {
  const std::string s = "\xF0\x9F\x98";
  const Utf8Step step = utf8_step(s, 0);
  EXPECT_FALSE(step.well_formed);
  EXPECT_TRUE(step.truncated);
  EXPECT_EQ(step.length, 3u);
  const std::string bad = "\xF0\x9F" "A";
  EXPECT_FALSE(utf8_step(bad, 0).truncated);
  EXPECT_EQ(utf8_step(bad, 0).length, 2u);
}

TEST(Utf8Encode, AppendsEveryLength) {
  std::string s;
  for (uint32_t c : {0x41u, 0xE9u, 0x20ACu, 0x1F600u}) append_utf8(s, c);
  EXPECT_EQ(s, "A\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
}

TEST(Utf8LeadLength, JudgesByHighNibble) {
  EXPECT_EQ(utf8_len_from_lead('a'), 1u);
  EXPECT_EQ(utf8_len_from_lead(0x80), 1u);
  EXPECT_EQ(utf8_len_from_lead(0xC3), 2u);
  EXPECT_EQ(utf8_len_from_lead(0xE2), 3u);
  EXPECT_EQ(utf8_len_from_lead(0xF0), 4u);
  EXPECT_EQ(utf8_len_from_lead(0xFF), 4u);
}

TEST(Gpt2ByteMap, KnownSpellings) {
  EXPECT_EQ(bytes_to_mapped(" "), "\xC4\xA0");   // Ġ U+0120
  EXPECT_EQ(bytes_to_mapped("\n"), "\xC4\x8A");  // Ċ U+010A
  EXPECT_EQ(bytes_to_mapped("A~"), "A~");
  EXPECT_EQ(bytes_to_mapped("\xE9"), "\xC3\xA9");  // printable Latin-1 maps to itself
  EXPECT_EQ(bytes_to_mapped("\xAD"), "\xC5\x83");  // soft hyphen is the 68th remapped byte
}

TEST(Gpt2ByteMap, IsABijectionOverAllBytes) {
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  const std::string mapped = bytes_to_mapped(all);
  EXPECT_TRUE(is_well_formed_utf8(mapped));
  EXPECT_EQ(mapped_to_bytes(mapped), all);
  EXPECT_EQ(mapped_to_bytes("\xE4\xB8\xAD"), std::nullopt);  // 中 is not a mapped character
  EXPECT_EQ(mapped_to_bytes(" "), std::nullopt);             // a raw space is not either
  EXPECT_EQ(mapped_to_bytes("\xC4"), std::nullopt);          // truncated
}

}  // namespace
}  // namespace fdl::tok
