// Token-mask cost of grammar-constrained sampling (src/grammar/token_masker.h) on a real
// vocabulary: a cold mask (the trie walk of a state never seen), a warm one (a cached state:
// the copy and -inf pass a constrained row pays per token), and whole random JSON outputs
// with a fresh masker (what one request pays, misses included), per token.
//   build/bin/bench_token_mask [--vocab FILE.gguf]   (default: Llama 3's vocabulary from
//   $FLASHDLLM_SHARED, else ../shared)
#include <benchmark/benchmark.h>

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "flashdllm/gguf.h"
#include "flashdllm/grammar.h"
#include "flashdllm/tokenizer.h"
#include "grammar/token_masker.h"

namespace {

std::string g_vocab;

const char* kJson = R"(
root   ::= "{" ws "\"id\":" ws int "," ws "\"name\":" ws str "," ws "\"tags\":" ws "[" (str ("," ws str){0,4})? "]" "," ws "\"active\":" ws ("true" | "false") ws "}"
str    ::= "\"" ([^"\\\x00-\x1F] | "\\" ["\\/bfnrt])* "\""
int    ::= "-"? ("0" | [1-9] [0-9]{0,8})
ws     ::= " "?
)";

struct Fixture {
  std::unique_ptr<fdl::Tokenizer> tok;
  std::shared_ptr<const fdl::Grammar> grammar;
  std::shared_ptr<const fdl::grammar::TokenTrie> trie;
  static Fixture& get() {
    static Fixture f = [] {
      Fixture x;
      const fdl::GgufFile file = fdl::GgufFile::open(g_vocab);
      x.tok = fdl::Tokenizer::from_gguf(file);
      x.grammar = fdl::Grammar::compile(kJson);
      x.trie = std::make_shared<const fdl::grammar::TokenTrie>(*x.tok, false);
      return x;
    }();
    return f;
  }
};

// Inside the "name" string: almost every token is allowed, the largest walk.
fdl::GrammarMatcher in_string(const Fixture& f) {
  fdl::GrammarMatcher m(f.grammar);
  m.accept_bytes("{\"id\": 12, \"name\": \"ab");
  return m;
}

void BM_ColdMask(benchmark::State& state) {
  Fixture& f = Fixture::get();
  const fdl::GrammarMatcher m = in_string(f);
  for (auto _ : state) {
    fdl::grammar::TokenMasker masker(f.grammar, f.trie);
    benchmark::DoNotOptimize(masker.mask(m).data());
  }
  state.counters["vocab"] = double(f.tok->n_vocab());
  state.counters["trie_nodes"] = double(f.trie->nodes().size());
}

void BM_WarmMaskedRow(benchmark::State& state) {
  Fixture& f = Fixture::get();
  const fdl::GrammarMatcher m = in_string(f);
  fdl::grammar::TokenMasker masker(f.grammar, f.trie);
  std::vector<float> logits(size_t(f.tok->n_vocab()), 0.5f), row;
  masker.mask(m);
  row.resize(logits.size());
  for (auto _ : state) benchmark::DoNotOptimize(masker.apply(m, logits, row));
}

// Random outputs of the grammar, token by token (a random allowed token each step), with a
// fresh masker per output: the mean cost per generated token, cold states included.
void BM_RandomOutputPerToken(benchmark::State& state) {
  Fixture& f = Fixture::get();
  std::mt19937 rng(1);
  std::vector<float> logits(size_t(f.tok->n_vocab()), 0.0f), row;
  int64_t tokens = 0;
  for (auto _ : state) {
    fdl::grammar::TokenMasker masker(f.grammar, f.trie);
    fdl::GrammarMatcher m(f.grammar);
    row.resize(logits.size());
    for (int step = 0; step < 200; ++step) {
      if (masker.apply(m, logits, row) == 0) break;
      // A random allowed token: the first finite one from a random place on (as cheap as
      // the sampler's own pass, so it does not hide the mask's cost).
      size_t t = rng() % row.size();
      while (!(row[t] == 0.0f)) t = (t + 1) % row.size();
      const auto pick = int32_t(t);
      ++tokens;
      if (f.tok->is_eog(pick) || !masker.accept(m, pick)) break;
    }
  }
  state.counters["tokens"] = benchmark::Counter(double(tokens), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["s_per_token"] =
      benchmark::Counter(double(tokens), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

BENCHMARK(BM_ColdMask)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_WarmMaskedRow)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_RandomOutputPerToken)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  CLI::App app{"token-mask micro-benchmarks"};
  const char* shared = std::getenv("FLASHDLLM_SHARED");
  g_vocab = (std::filesystem::path(shared != nullptr && *shared ? shared : "../shared") / "llama-cpp-vocab-fixtures" /
             "ggml-vocab-llama-bpe.gguf")
                .string();
  app.add_option("--vocab", g_vocab, "GGUF file whose vocabulary to use");
  CLI11_PARSE(app, argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  return 0;
}
