// llama.cpp's token ids for texts, for the tokenizer fixtures (scripts/make_tokenizer_fixtures.py).
//
// Usage: llama_cpp_tokenize VOCAB.gguf < texts
// Each input line is one text, hex-encoded UTF-8 (so texts may hold newlines and any byte).
// Loads only the vocabulary (vocab_only) and prints one line per text: the ids without and
// with parse_special (add_special = false both times), as two space-separated lists joined by
// " | ".
//
// Build against llama.cpp's libllama as scripts/llama_cpp_reference.cpp says, e.g.
//   g++ -O2 -std=c++17 scripts/llama_cpp_tokenize.cpp -I$LLAMA/include -I$LLAMA/ggml/include \
//       -L$BUILD/bin -lllama -lggml -lggml-base -Wl,-rpath,$BUILD/bin -o build-tools/llama_cpp_tokenize
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

namespace {

void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "llama_cpp_tokenize: %s\n", what.c_str());
  std::exit(1);
}

std::string from_hex(const std::string& hex) {
  if (hex.size() % 2 != 0) die("odd-length hex line");
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) out.push_back(char(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

std::vector<llama_token> tokenize(const llama_vocab* vocab, const std::string& text, bool parse_special) {
  // A first call with no room returns minus the number of tokens needed.
  int32_t n = llama_tokenize(vocab, text.data(), int32_t(text.size()), nullptr, 0, false, parse_special);
  std::vector<llama_token> ids(size_t(n < 0 ? -n : n));
  n = llama_tokenize(vocab, text.data(), int32_t(text.size()), ids.data(), int32_t(ids.size()), false, parse_special);
  if (n < 0) die("llama_tokenize failed");
  ids.resize(size_t(n));
  return ids;
}

void print(const std::vector<llama_token>& ids) {
  for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? " " : "", ids[i]);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) die("usage: llama_cpp_tokenize VOCAB.gguf < hex-encoded texts");
  llama_log_set(quiet_log, nullptr);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  mp.vocab_only = true;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) die(std::string("cannot load ") + argv[1]);
  const llama_vocab* vocab = llama_model_get_vocab(model);
  for (std::string line; std::getline(std::cin, line);) {
    const std::string text = from_hex(line);
    print(tokenize(vocab, text, false));
    std::printf(" | ");
    print(tokenize(vocab, text, true));
    std::printf("\n");
  }
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
