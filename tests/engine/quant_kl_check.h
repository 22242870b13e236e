// quant_kl_check.h — how far codelm-16m's quantized files move the next-token distribution from
// the F16 file's, against llama.cpp on the same files (tests/data/codelm_quant_kl.json, written
// by scripts/make_quant_kl_refs.py: the token sequences and llama.cpp's KL(P_F16 || P_file) over
// every position). flashdllm's divergence is measured the same way, each file against
// flashdllm's own F16 run on the same device, and must stay within kKlMargin of llama.cpp's.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "flashdllm/kv_cache.h"
#include "flashdllm/model.h"
#include "test_support.h"

namespace fdl::test {

/// Allowed ratio of flashdllm's mean KL to llama.cpp's on a file.
constexpr double kKlMargin = 1.10;

inline nlohmann::json quant_kl_reference() {
  std::ifstream in(test_data_dir() / "codelm_quant_kl.json");
  return nlohmann::json::parse(in);
}

/// Logits ([ids.size()][n_vocab]) of one sequence in a fresh KV cache, every position wanting them.
inline std::vector<float> every_position_logits(Model& model, const std::vector<int32_t>& ids) {
  BlockPool pool(model.kv_shape(16), ids.size() / 16 + 2);
  KvCache kv(pool);
  const SeqId seq = kv.create_sequence();
  const size_t first = kv.append_slots(seq, ids.size());
  StepBatch b;
  for (size_t i = 0; i < ids.size(); ++i) b.add(ids[i], int32_t(first + i), seq, true);
  std::vector<float> logits;
  model.forward(b, kv, logits);
  kv.free_sequence(seq);
  return logits;
}

/// KL(P || Q) of the softmax of two logits rows, in double.
inline double kl_divergence(const float* p_logits, const float* q_logits, int n) {
  auto log_softmax = [n](const float* x) {
    double m = x[0];
    for (int i = 1; i < n; ++i) m = std::max(m, double(x[i]));
    double s = 0;
    for (int i = 0; i < n; ++i) s += std::exp(double(x[i]) - m);
    std::vector<double> out(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) out[size_t(i)] = double(x[i]) - m - std::log(s);
    return out;
  };
  const std::vector<double> lp = log_softmax(p_logits), lq = log_softmax(q_logits);
  double kl = 0;
  for (int i = 0; i < n; ++i) kl += std::exp(lp[size_t(i)]) * (lp[size_t(i)] - lq[size_t(i)]);
  return kl;
}

/// `file`'s mean KL from the F16 file over the reference sequences, both loaded with `options`,
/// against llama.cpp's.
inline void expect_quantized_kl_within_llama_cpp(const std::string& file, const ModelOptions& options) {
  const nlohmann::json ref = quant_kl_reference();
  ASSERT_TRUE(ref["llama_cpp_kl"].contains(file)) << file;
  const double want = ref["llama_cpp_kl"][file]["mean"].get<double>();
  const std::unique_ptr<Model> base = Model::load(model_path(ref["base"].get<std::string>()), options);
  const std::unique_ptr<Model> quant = Model::load(model_path(file), options);
  const int n_vocab = base->config().n_vocab;
  double sum = 0;
  size_t positions = 0;
  for (const auto& seq : ref["sequences"]) {
    const std::vector<int32_t> ids = seq.get<std::vector<int32_t>>();
    const std::vector<float> p = every_position_logits(*base, ids), q = every_position_logits(*quant, ids);
    for (size_t i = 0; i < ids.size(); ++i)
      sum += kl_divergence(p.data() + i * size_t(n_vocab), q.data() + i * size_t(n_vocab), n_vocab);
    positions += ids.size();
  }
  ASSERT_GT(positions, 0u);
  const double mean = sum / double(positions);
  std::cout << "  " << file << ": mean KL from F16 " << mean << " over " << positions << " positions (llama.cpp "
            << want << ", ratio " << mean / want << ")\n";
  EXPECT_LE(mean, kKlMargin * want) << file;
}

}  // namespace fdl::test
