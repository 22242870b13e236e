// quant_reference_check.h — codelm-16m quantized by llama.cpp's llama-quantize
// (../shared/models/codelm-16m-{Q4_0, Q4_K_M, Q5_K_M, Q6_K, Q8_0}.gguf: mixes of Q4_0, Q5_0,
// Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) against llama.cpp's greedy text on the same files
// (codelm_quant_greedy.json, 12 prompts x 32 tokens), for any device.
//
// The two engines' arithmetic differs (flashdllm's CPU multiplies fp32 activations, or rounds
// them per 256 values; llama.cpp and flashdllm's GPU round them per 32), so their greedy paths
// may part where two tokens' logits are close. Each case that differs feeds llama.cpp's
// continuation back: at the first step where flashdllm's top token differs, llama.cpp's token
// must be within kNearTie of it (a near-tie); a case that never differs agrees outright.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "engine/engine_test_support.h"
#include "flashdllm/kv_cache.h"

namespace fdl::test {

// Logit gap below which a step counts as a near-tie between the two engines' arithmetic:
// llama.cpp's 8-bit activations move codelm-16m's logits (|logit| ~ 10-25) by a few hundredths;
// the largest gap measured over the five files is 0.11.
constexpr float kNearTie = 0.25f;

struct Divergence {
  bool found = false;
  size_t step = 0;
  float gap = 0.f;  // flashdllm's top logit minus llama.cpp's token's logit there
};

// Prompt + llama.cpp's continuation in one forward; the first step whose top token is not
// llama.cpp's.
inline Divergence first_divergence(Model& model, const std::vector<int32_t>& prompt, const std::vector<int32_t>& cont) {
  BlockPool pool(model.kv_shape(16), (prompt.size() + cont.size()) / 16 + 2);
  KvCache kv(pool);
  const SeqId seq = kv.create_sequence();
  StepBatch b;
  const size_t first = kv.append_slots(seq, prompt.size() + cont.size());
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), cont.begin(), cont.end());
  for (size_t i = 0; i < all.size(); ++i) b.add(all[i], int32_t(first + i), seq, i + 1 >= prompt.size());
  std::vector<float> logits;
  model.forward(b, kv, logits);
  const int n_vocab = model.config().n_vocab;
  Divergence d;
  for (size_t s = 0; s < cont.size(); ++s) {
    const float* row = logits.data() + s * size_t(n_vocab);
    const int32_t top = int32_t(std::max_element(row, row + n_vocab) - row);
    if (top != cont[s]) {
      d = {true, s, row[top] - row[cont[s]]};
      break;
    }
  }
  kv.free_sequence(seq);
  return d;
}

inline std::string trim_newlines(std::string s) {
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

/// The quantized files codelm_quant_greedy.json has cases for.
inline const std::vector<std::string>& quantized_codelm_files() {
  static const std::vector<std::string> files = {"codelm-16m-Q4_0.gguf", "codelm-16m-Q4_K_M.gguf",
                                                 "codelm-16m-Q5_K_M.gguf", "codelm-16m-Q6_K.gguf",
                                                 "codelm-16m-Q8_0.gguf"};
  return files;
}

/// Runs `file`'s reference cases on the model loaded with `options` and checks the rule above;
/// at least half of its texts must equal llama.cpp's.
inline void expect_quantized_codelm_follows_llama_cpp(const std::string& file, const ModelOptions& options) {
  const auto ref = read_reference("codelm_quant_greedy.json");
  std::vector<const nlohmann::json*> cases;
  for (const auto& c : ref)
    if (c["model"].get<std::string>() == file) cases.push_back(&c);
  ASSERT_FALSE(cases.empty()) << file << " has no reference cases";
  const LoadedModel m = load_model(model_path(file), options);
  auto gen = make_generator(m);
  int same_text = 0;
  for (const nlohmann::json* c : cases) {
    const std::string prompt_text = (*c)["prompt"];
    const std::vector<int32_t> prompt = encode_prompt(*m.tokenizer, prompt_text);
    const int n = (*c)["n_predict"].get<int>();
    const auto res = gen.generate({greedy_request(prompt, n)});
    ASSERT_EQ(res.size(), 1u);
    const std::string want = trim_newlines((*c)["output_text"].get<std::string>());
    if (trim_newlines(res[0].text) == want) {
      ++same_text;
      continue;
    }
    const std::vector<int32_t> cont = m.tokenizer->encode(want, false);
    const Divergence d = first_divergence(*m.model, prompt, cont);
    std::cout << "  " << file << " " << testing::PrintToString(prompt_text) << ": text differs; ";
    if (d.found)
      std::cout << "fed llama.cpp's tokens, the top token differs first at step " << d.step << " by " << d.gap << "\n";
    else
      std::cout << "fed llama.cpp's tokens, every top token is llama.cpp's (the text splits into other tokens)\n";
    EXPECT_TRUE(!d.found || d.gap < kNearTie)
        << file << " " << prompt_text << ": llama.cpp's token at step " << d.step << " is " << d.gap
        << " below flashdllm's top logit";
  }
  std::cout << "  " << file << ": " << same_text << " of " << cases.size() << " texts equal llama.cpp's\n";
  // Near-ties are rare: most of 32-token continuations come out the same (8-11 of 12 measured).
  EXPECT_GE(2 * same_text, int(cases.size())) << file;
}

}  // namespace fdl::test
