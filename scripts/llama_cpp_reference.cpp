// llama.cpp reference outputs for the family fixtures (scripts/make_family_fixtures.py).
//
// Usage: llama_cpp_reference MODEL.gguf N_GREEDY < prompts
// Each input line is one prompt as space-separated token ids. For each prompt, in a fresh
// context (float32 KV cache, no flash attention, one thread): the logits after the last prompt
// token, then N_GREEDY greedy tokens (argmax, no EOS stop) with the top-1 minus top-2 logit
// margin at each step. Prints one JSON array, an object per prompt, on stdout.
//
// Build against llama.cpp's libllama (see tests/data/families/README.md), e.g.
//   g++ -O2 -std=c++17 scripts/llama_cpp_reference.cpp -I$LLAMA/include -I$LLAMA/ggml/include \
//       -L$BUILD/bin -lllama -lggml -lggml-base -Wl,-rpath,$BUILD/bin -o build-tools/llama_cpp_reference
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

void quiet_log(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_ERROR) std::fputs(text, stderr);
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "llama_cpp_reference: %s\n", what.c_str());
  std::exit(1);
}

struct Top2 {
  int best;
  float margin;
};

Top2 top2(const float* logits, int n_vocab) {
  int best = 0;
  for (int i = 1; i < n_vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  float second = -1e30f;
  for (int i = 0; i < n_vocab; ++i)
    if (i != best && logits[i] > second) second = logits[i];
  return {best, logits[best] - second};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) die("usage: llama_cpp_reference MODEL.gguf N_GREEDY < prompts");
  const int n_greedy = std::atoi(argv[2]);
  llama_log_set(quiet_log, nullptr);
  llama_backend_init();

  llama_model_params mp = llama_model_default_params();
  mp.n_gpu_layers = 0;
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (!model) die(std::string("cannot load ") + argv[1]);
  const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

  std::vector<std::vector<llama_token>> prompts;
  for (std::string line; std::getline(std::cin, line);) {
    std::istringstream in(line);
    std::vector<llama_token> ids;
    for (long v; in >> v;) ids.push_back(llama_token(v));
    if (!ids.empty()) prompts.push_back(ids);
  }

  std::printf("[");
  for (size_t p = 0; p < prompts.size(); ++p) {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 256;
    cp.n_batch = 256;
    cp.n_ubatch = 256;
    cp.n_seq_max = 1;
    cp.n_threads = 1;
    cp.n_threads_batch = 1;
    cp.type_k = GGML_TYPE_F32;
    cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cp.swa_full = true;
    llama_context* ctx = llama_init_from_model(model, cp);
    if (!ctx) die("cannot create a context");

    std::vector<llama_token> tokens = prompts[p];
    if (llama_decode(ctx, llama_batch_get_one(tokens.data(), int32_t(tokens.size()))) != 0) die("llama_decode failed");
    const float* logits = llama_get_logits_ith(ctx, -1);
    std::printf("%s{\"last_logits\":[", p ? "," : "");
    for (int i = 0; i < n_vocab; ++i) std::printf("%s%.9g", i ? "," : "", logits[i]);
    std::printf("]");

    std::vector<int> greedy;
    std::vector<float> margins;
    for (int step = 0; step < n_greedy; ++step) {
      const Top2 t = top2(llama_get_logits_ith(ctx, -1), n_vocab);
      greedy.push_back(t.best);
      margins.push_back(t.margin);
      if (step + 1 == n_greedy) break;
      llama_token next = t.best;
      if (llama_decode(ctx, llama_batch_get_one(&next, 1)) != 0) die("llama_decode failed");
    }
    std::printf(",\"greedy\":[");
    for (size_t i = 0; i < greedy.size(); ++i) std::printf("%s%d", i ? "," : "", greedy[i]);
    std::printf("],\"greedy_margin\":[");
    for (size_t i = 0; i < margins.size(); ++i) std::printf("%s%.9g", i ? "," : "", margins[i]);
    std::printf("]}");
    llama_free(ctx);
  }
  std::printf("]\n");
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
