// The BPE pre-tokenizers on their own: expected chunks worked out by hand from each
// regex list's semantics (leftmost-first alternation, text between matches kept).
#include <gtest/gtest.h>

#include "flashdllm/tokenizer.h"
#include "tokenizer/pre_tokenizer.h"

namespace fdl::tok {
namespace {

using Chunks = std::vector<std::string>;

Chunks split(std::string_view pre, std::string_view text) {
  PreTokenizer p(resolve_pre_tokenizer(pre).kind);
  Chunks out;
  p.split(text, out);
  return out;
}

TEST(PreTokenizerGpt2, ContractionsWordsNumbersPunctuationWhitespace) {
  EXPECT_EQ(split("gpt-2", "Hello world, it's 2024!!  ok\n"),
            (Chunks{"Hello", " world", ",", " it", "'s", " 2024", "!!", " ", " ok", "\n"}));
  EXPECT_EQ(split("gpt-2", "a   b"), (Chunks{"a", "  ", " b"}));  // \s+(?!\S) leaves one space
  // NBSP is White_Space: `\s+(?!\S)` takes the space, then NBSP alone (only a literal
  // space may lead a word).
  EXPECT_EQ(split("gpt-2", "x \xC2\xA0y"), (Chunks{"x", " ", "\xC2\xA0", "y"}));
}

TEST(PreTokenizerLlama3, DigitsInThreesNewlinesAndCaseInsensitiveContractions) {
  EXPECT_EQ(split("llama-bpe", "Hello world 12345 it's\n\n  x"),
            (Chunks{"Hello", " world", " ", "123", "45", " it", "'s", "\n\n", " ", " x"}));
  EXPECT_EQ(split("llama3", "I'LL DON'T"), (Chunks{"I", "'LL", " DON", "'T"}));
  EXPECT_EQ(split("llama3", "a+=b;\r\n"), (Chunks{"a", "+=", "b", ";\r\n"}));
}

TEST(PreTokenizerQwen2, SingleDigits) {
  EXPECT_EQ(split("qwen2", "x 12345"), (Chunks{"x", " ", "1", "2", "3", "4", "5"}));
}

TEST(PreTokenizerStarcoder, EveryDigitIsItsOwnChunk) {
  EXPECT_EQ(split("starcoder", "v12 ab"), (Chunks{"v", "1", "2", " ab"}));
}

TEST(PreTokenizerFalcon, PunctuationRunsFirstThenDigitTriples) {
  EXPECT_EQ(split("falcon", "a<=b 12345"), (Chunks{"a", "<=", "b", " ", "123", "45"}));
}

TEST(PreTokenizerDeepseekLlm, TrailingWhitespaceAndCjkRuns) {
  EXPECT_EQ(split("deepseek-llm", "ab  "), (Chunks{"ab", "  "}));
  // Multi-byte White_Space (U+3000) counts too.
  EXPECT_EQ(split("deepseek-llm", "\xE4\xB8\xAD \xE3\x80\x80"), (Chunks{"\xE4\xB8\xAD", " \xE3\x80\x80"}));
  // A whitespace run inside a chunk is not "trailing": only the run at its end is cut.
  EXPECT_EQ(split("deepseek-llm", "\xE4\xB8\xAD\xE6\x96\x87 12"),
            (Chunks{"\xE4\xB8\xAD\xE6\x96\x87", " ", "12"}));
}

TEST(PreTokenizerDeepseekCoder, LettersPunctuationAndDigits) {
  EXPECT_EQ(split("deepseek-coder", "foo(x1)\n"), (Chunks{"foo", "(", "x", "1", ")", "\n"}));
}

TEST(PreTokenizerTekken, AsciiCaseRunsSingleDigitsAndSlashes) {
  // A capital run keeps the lower-case letters after it; a new capital after lower case starts
  // a new chunk; digits go one by one; punctuation takes trailing slashes and newlines.
  EXPECT_EQ(split("tekken", "HelloWorld iPhone ABCdef 2024"),
            (Chunks{"Hello", "World", " i", "Phone", " ABCdef", " ", "2", "0", "2", "4"}));
  EXPECT_EQ(split("tekken", "a+/b\n\n  x"), (Chunks{"a", "+/", "b", "\n\n", " ", " x"}));
  EXPECT_EQ(split("tekken", "don't"), (Chunks{"don", "'t"}));
}

TEST(PreTokenizerTekken, NonAsciiLettersHaveNoCaseAndMarksAreNotLetters) {
  // llama.cpp's rewrite of the pattern: a non-ASCII letter counts as upper and lower case at
  // once, so "\u00c9COLE" cuts after the \u00c9 (the tokenizer.json pattern keeps it whole); a
  // combining mark (U+0301) is not a letter, so it ends the word and, like punctuation, leads
  // the next one.
  EXPECT_EQ(split("tekken", "\xC3\x89" "COLE \xC3\xA9" "cole"), (Chunks{"\xC3\x89", "COLE", " \xC3\xA9" "cole"}));
  EXPECT_EQ(split("tekken", "e\xCC\x81t\xC3\xA9"), (Chunks{"e", "\xCC\x81t\xC3\xA9"}));
  EXPECT_EQ(resolve_pre_tokenizer("tekken").ignore_merges, true);
  EXPECT_EQ(resolve_pre_tokenizer("tekken").add_bos, true);
}

TEST(PreTokenizer, MalformedUtf8IsDecodedLikeLlamaCpp) {
  // The stray byte becomes U+FFFD (a symbol for the regexes); an overlong NUL becomes NUL.
  EXPECT_EQ(split("gpt-2", "ab\xFF" "cd"), (Chunks{"ab", "\xEF\xBF\xBD", "cd"}));
  EXPECT_EQ(split("gpt-2", "a\xC0\x80"), (Chunks{"a", std::string("\0", 1)}));
  // A surrogate (never valid UTF-8) still survives as its 3 bytes.
  EXPECT_EQ(split("gpt-2", "\xED\xA0\x80"), (Chunks{"\xED\xA0\x80"}));
}

TEST(PreTokenizer, ChunksCoverTheInput) {
  const std::string text = "Mixed: caf\xC3\xA9, \xF0\x9F\x98\x80\xF0\x9F\x98\x80 42\t\ttabs\n\n\nend   ";
  for (const char* pre : {"default", "gpt-2", "llama3", "qwen2", "starcoder", "falcon",
                          "deepseek-llm", "deepseek-coder", "tekken"}) {
    std::string joined;
    for (const std::string& c : split(pre, text)) {
      EXPECT_FALSE(c.empty()) << pre;
      joined += c;
    }
    EXPECT_EQ(joined, text) << pre;
  }
}

TEST(PreTokenizer, UnknownNameThrows) {
  EXPECT_THROW(resolve_pre_tokenizer("gpt-5"), TokenizerError);
  EXPECT_NE(supported_pre_tokenizers().find("deepseek-llm"), std::string::npos);
}

}  // namespace
}  // namespace fdl::tok
