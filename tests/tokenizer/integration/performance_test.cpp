// Tokenizer speed on real vocabularies: ordinary text, and 100 kB inputs that make naive
// BPE or regex code go quadratic (one long word, long whitespace/newline/digit/punctuation
// runs). Times are thread CPU time, so a busy CI machine does not fail them; limits leave
// ~10x headroom over Release numbers (and scale up for unoptimised or sanitizer builds).
#include <gtest/gtest.h>

#include <ctime>
#include <functional>

#include "tokenizer/integration/tokenizer_data.h"
#include "test_support.h"
#include "tokenizer/synthetic_vocab.h"

namespace fdl::test {
namespace {

double cpu_ms(const std::function<void()>& f) {
  timespec a, b;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
  f();
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
  return (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6;
}

std::string prose_10kb() {
  std::string s;
  while (s.size() < 10000)
    s += "Once upon a time, there was a little girl named Lily. She loved to play outside! "
         "x = f(y) + 12345; caf\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87 \xF0\x9F\x98\x80\n";
  return s;
}

std::vector<std::pair<std::string, std::string>> pathological_100kb() {
  std::string alternating;
  while (alternating.size() < 100000) alternating += " \t";
  std::string mixed;
  while (mixed.size() < 100000) mixed += "ab1 ";
  return {
      {"one word", std::string(100000, 'a')},
      {"space run", std::string(100000, ' ') + "x"},
      {"space/tab run", alternating + "x"},
      {"newline run", std::string(100000, '\n')},
      {"digit run", std::string(100000, '7')},
      {"punctuation run", std::string(100000, '!')},
      {"short words", mixed},
  };
}

void check_speed(const Tokenizer& tok, const std::string& label) {
  const std::string prose = prose_10kb();
  std::vector<int32_t> ids;
  const double prose_ms = cpu_ms([&] { ids = tok.encode(prose, false); });
  EXPECT_LT(prose_ms, 50.0 * kSlowBuild) << label << ": 10 kB of text";
  EXPECT_EQ(tok.decode(ids), prose) << label;
  for (const auto& run : pathological_100kb()) {
    const std::string &name = run.first, &text = run.second;  // clang 14 lambdas cannot capture bindings
    const double ms = cpu_ms([&] { ids = tok.encode(text, false); });
    EXPECT_LT(ms, 300.0 * kSlowBuild) << label << ": 100 kB " << name;
    EXPECT_EQ(tok.decode(ids), text) << label << ": 100 kB " << name;
  }
}

class TokenizerSpeed : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerSpeed, TenKilobytesAndPathological100kB) {
  check_speed(shared_tokenizer(vocab_fixture_path(GetParam())), GetParam());
}

INSTANTIATE_TEST_SUITE_P(TokenizerVocabs, TokenizerSpeed,
                         ::testing::Values("llama-spm", "phi-3", "gpt-2", "starcoder",
                                           "deepseek-coder", "deepseek-llm", "falcon", "mpt"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

TEST(TokenizerSpeed, Llama3AndQwen2PreTokenizers) {
  // No real vocab of these kinds is in the shared data: a byte-level vocab exercises their
  // regexes on the same inputs (BPE has no merges here, so this times the pre-tokenizer).
  for (const char* pre : {"llama-bpe", "qwen2"}) check_speed(*byte_level_vocab(pre).load(), pre);
}

TEST(TokenizerLoad, LargeVocabLoadsQuickly) {
  // deepseek-llm: 102400 tokens, 99757 merges, 2398 user-defined tokens.
  const GgufFile f = GgufFile::open(vocab_fixture_path("deepseek-llm"));
  std::unique_ptr<Tokenizer> tok;
  const double ms = cpu_ms([&] { tok = Tokenizer::from_gguf(f); });
  EXPECT_EQ(tok->n_vocab(), 102400);
  EXPECT_LT(ms, 500.0 * kSlowBuild);
  std::printf("[          ] deepseek-llm vocab load: %.1f ms CPU\n", ms);
}

}  // namespace
}  // namespace fdl::test
