// Helpers for the model tests: cached model loading, reference JSON, a minimal greedy loop
// written directly against Model::forward and KvCache (no tokenizer, no decode module).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <tuple>
#include <optional>
#include <memory>
#include <stdexcept>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "flashdllm/kv_cache.h"
#include "flashdllm/model.h"
#include "test_support.h"

namespace fdl::test {

/// Loads (once per process) a model from the shared folder with `n_threads` threads.
inline Model& shared_model(const std::string& file, int n_threads = 1) {
  static std::map<std::pair<std::string, int>, std::unique_ptr<Model>> cache;
  auto& slot = cache[{file, n_threads}];
  if (!slot) slot = Model::load(model_path(file), ModelOptions{.n_threads = n_threads});
  return *slot;
}

/// Loads (once per process) a model from the shared folder onto the GPU (--device cuda), with
/// KV cache dtype `kv` (nullopt: auto, the weights' 16-bit type for a 16-bit model).
/// `batch_invariant` false (--batch-invariant off) unless asked: most GPU tests check the
/// fastest kernels; the invariant ones have tests of their own (tests/gpu).
inline Model& cuda_model(const std::string& file, std::optional<KvDtype> kv = std::nullopt,
                         bool batch_invariant = false) {
  static std::map<std::tuple<std::string, int, bool>, std::unique_ptr<Model>> cache;
  auto& slot = cache[{file, kv ? int(*kv) : -1, batch_invariant}];
  if (!slot)
    slot = Model::load(model_path(file),
                       ModelOptions{.device = Device::Cuda, .kv_dtype = kv, .batch_invariant = batch_invariant});
  return *slot;
}

inline nlohmann::json load_reference(const std::string& file) {
  std::ifstream in(reference_path(file));
  if (!in) throw std::runtime_error("cannot open reference " + reference_path(file).string());
  return nlohmann::json::parse(in);
}

/// How many cases a reference holds, for registering parameterized tests. A missing or broken
/// file counts as one case, whose load_reference then fails that test: throwing while tests
/// are registered would abort the whole binary, every other suite with it.
inline size_t reference_case_count(const std::string& file) {
  try {
    return std::max<size_t>(1, load_reference(file).size());
  } catch (const std::exception&) {
    return 1;
  }
}

/// Greedy choice: the largest logit, the lowest id on ties (as the references do).
inline int32_t argmax(const float* logits, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; ++i)
    if (logits[i] > logits[best]) best = i;
  return best;
}

/// A pool big enough for `n_tokens` tokens in blocks of 16.
inline std::unique_ptr<BlockPool> make_pool(const Model& m, size_t n_tokens, int block_size = 16) {
  return std::make_unique<BlockPool>(m.kv_shape(block_size), (n_tokens + block_size - 1) / block_size);
}

/// Logits at the last token of a one-forward prefill of `prompt` in a fresh cache.
inline std::vector<float> prefill_logits(Model& m, const std::vector<int32_t>& prompt) {
  auto pool = make_pool(m, prompt.size());
  KvCache kv(*pool);
  const SeqId s = kv.create_sequence();
  StepBatch b;
  const size_t f = kv.append_slots(s, prompt.size());
  for (size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], int32_t(f + i), s, i + 1 == prompt.size());
  std::vector<float> logits;
  m.forward(b, kv, logits);
  return logits;
}

/// Prefills `prompt` into a new sequence in one forward (no logits); returns the sequence.
inline SeqId prefill_sequence(Model& m, KvCache& kv, const std::vector<int32_t>& prompt) {
  const SeqId seq = kv.create_sequence();
  StepBatch b;
  const size_t first = kv.append_slots(seq, prompt.size());
  for (size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], int32_t(first + i), seq, false);
  std::vector<float> logits;
  m.forward(b, kv, logits);
  return seq;
}

/// The logits after feeding `path` to a fresh copy of `prompt`, one token per plain step
/// (the reference a tree node's logits must equal). The sequence is freed again; the same
/// cache is used (the CUDA model keeps the device K/V of one pool at a time).
inline std::vector<float> plain_path_logits(Model& m, KvCache& kv, const std::vector<int32_t>& prompt,
                                            const std::vector<int32_t>& path) {
  const SeqId seq = prefill_sequence(m, kv, prompt);
  StepBatch b;
  std::vector<float> logits;
  for (int32_t t : path) {
    b.clear();
    b.add(t, int32_t(kv.append_slots(seq, 1)), seq, true);
    m.forward(b, kv, logits);
  }
  kv.free_sequence(seq);
  return logits;
}

/// Feeds `m` malformed variants of a valid tree batch (root at slot `pos` of `seq` with two
/// children; slots pos..pos+2 reserved; `other` a second live sequence) and expects each to
/// throw the exception the model.h contract names (std::out_of_range for an unreserved
/// slot, else std::invalid_argument); then calls unchanged(what) so the test can check that
/// nothing was written. Shared by the CPU and CUDA tree tests: both models must refuse the
/// same trees the same way. Returns the valid batch.
template <typename Unchanged>
StepBatch expect_malformed_trees_refused(Model& m, KvCache& kv, SeqId seq, SeqId other, size_t pos,
                                         Unchanged unchanged) {
  StepBatch base;
  base.add(5, int32_t(pos), seq, true);
  base.add_child(6, 0, true);
  base.add_child(7, 0, true);
  std::vector<float> logits;
  const auto check = [&](const StepBatch& b, const char* what, bool out_of_range) {
    if (out_of_range)
      EXPECT_THROW(m.forward(b, kv, logits), std::out_of_range) << what;
    else
      EXPECT_THROW(m.forward(b, kv, logits), std::invalid_argument) << what;
    unchanged(what);
  };
  StepBatch b = base;
  b.tree_parent[2] = 2;  // itself
  check(b, "parent not before the child", false);
  b = base;
  b.tree_parent[1] = -2;
  check(b, "negative parent other than -1", false);
  b = base;
  b.tree_parent.pop_back();
  check(b, "tree_parent of the wrong length", false);
  b = base;
  b.positions[2] += 1;
  check(b, "position not the parent's + 1", false);
  b = base;
  b.seqs[2] = other;
  b.positions[2] = b.positions[0] + 1;
  check(b, "child in another sequence", false);
  b.clear();
  b.add(5, int32_t(pos), seq, true);
  b.add(9, int32_t(kv.length(other) - 1), other, true);
  b.add_child(6, 0, true);  // not contiguous with its tree
  check(b, "tree interrupted by another token", false);
  b = base;
  b.add_child(8, 2, true);  // slot pos + 3 is not reserved
  check(b, "unreserved tree slot", true);
  return base;
}

/// Feeds `prompt` to a fresh sequence — in one forward, or one token per forward when
/// `token_by_token` — then `n_predict` greedy tokens, one forward each. Returns the ids;
/// if `step_logits` is given, also the logits behind each chosen id.
inline std::vector<int32_t> greedy_decode(Model& m, KvCache& kv, const std::vector<int32_t>& prompt,
                                          int n_predict, bool token_by_token = false,
                                          std::vector<std::vector<float>>* step_logits = nullptr) {
  const SeqId seq = kv.create_sequence();
  StepBatch batch;
  std::vector<float> logits;
  const int n_vocab = m.config().n_vocab;
  if (token_by_token) {
    for (size_t i = 0; i < prompt.size(); ++i) {
      batch.clear();
      batch.add(prompt[i], int32_t(kv.append_slots(seq, 1)), seq, i + 1 == prompt.size());
      m.forward(batch, kv, logits);
    }
  } else {
    const size_t first = kv.append_slots(seq, prompt.size());
    for (size_t i = 0; i < prompt.size(); ++i)
      batch.add(prompt[i], int32_t(first + i), seq, i + 1 == prompt.size());
    m.forward(batch, kv, logits);
  }
  std::vector<int32_t> out;
  for (int step = 0; step < n_predict; ++step) {
    if (step_logits) step_logits->push_back(logits);
    out.push_back(argmax(logits.data(), n_vocab));
    if (step + 1 == n_predict) break;
    batch.clear();
    batch.add(out.back(), int32_t(kv.append_slots(seq, 1)), seq, true);
    m.forward(batch, kv, logits);
  }
  kv.free_sequence(seq);
  return out;
}

/// How many leading output ids of a reference case are binding: all of them, unless the
/// reference's smallest top-1/top-2 margin is below 1e-3 — then a last-bit difference could
/// flip that step legitimately, so only the ids before `argmin_margin_step` count.
inline size_t binding_prefix(const nlohmann::json& ref_case) {
  const size_t n = ref_case["output_token_ids"].size();
  if (ref_case["min_top1_top2_logit_margin"].get<double>() < 1e-3)
    return std::min(n, ref_case["argmin_margin_step"].get<size_t>());
  return n;
}

}  // namespace fdl::test
