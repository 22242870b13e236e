// llama_weights.h — the tensors of a Llama-family GGUF model, bound as views into the mapped
// file, after checking every name, shape and dtype against the ModelConfig.
//
// Matrices are never copied (WeightMatrix points into the mapping). F32 norm vectors are used
// in place; F16/BF16 norms are widened once into owned storage. Tensor names follow
// llama.cpp's GGUF conventions (token_embd.weight, blk.N.attn_q.weight, ...).
#pragma once

#include <deque>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "flashdllm/gguf.h"
#include "flashdllm/model.h"

namespace fdl {

/// One expert's FFN (views into the file's 3-D expert tensors).
struct ExpertWeights {
  cpu::WeightMatrix gate{};  ///< n_ff rows of n_embd
  cpu::WeightMatrix up{};    ///< n_ff rows of n_embd
  cpu::WeightMatrix down{};  ///< n_embd rows of n_ff
};

struct LlamaLayerWeights {
  const float* attn_norm = nullptr;  ///< [n_embd]
  cpu::WeightMatrix wq{};            ///< n_head*head_dim rows of n_embd
  cpu::WeightMatrix wk{};            ///< n_head_kv*head_dim rows of n_embd
  cpu::WeightMatrix wv{};            ///< n_head_kv*head_dim rows of n_embd
  const float* bq = nullptr;         ///< [n_head*head_dim] Q bias, or null (ModelConfig::qkv_bias)
  const float* bk = nullptr;         ///< [n_head_kv*head_dim] K bias, or null
  const float* bv = nullptr;         ///< [n_head_kv*head_dim] V bias, or null
  const float* q_norm = nullptr;     ///< [head_dim] per-head Q RMSNorm weight, or null (qk_norm)
  const float* k_norm = nullptr;     ///< [head_dim] per-head K RMSNorm weight, or null
  cpu::WeightMatrix wo{};            ///< n_embd rows of n_head*head_dim
  const float* ffn_norm = nullptr;   ///< [n_embd]
  cpu::WeightMatrix w_gate{};        ///< n_ff rows of n_embd
  cpu::WeightMatrix w_up{};          ///< n_ff rows of n_embd
  cpu::WeightMatrix w_down{};        ///< n_embd rows of n_ff
  /// Mixture of experts (ModelConfig::n_expert > 0) instead of w_gate/w_up/w_down: the router
  /// (n_expert rows of n_embd, blk.N.ffn_gate_inp) and each expert's FFN.
  cpu::WeightMatrix router{};
  std::vector<ExpertWeights> experts;
  const float* post_attn_norm = nullptr;  ///< [n_embd] RMSNorm of wo's output, or null (post_norms)
  const float* post_ffn_norm = nullptr;   ///< [n_embd] RMSNorm of w_down's output, or null
};

struct LlamaWeights {
  cpu::WeightMatrix token_embd{};    ///< n_vocab rows of n_embd
  const float* output_norm = nullptr;
  cpu::WeightMatrix output{};        ///< n_vocab rows of n_embd (token_embd when tied)
  std::vector<LlamaLayerWeights> layers;
  /// Per-pair RoPE frequency divisors (rope_dim/2), empty when the model has none: from the
  /// `rope_freqs.weight` tensor, or computed from the llama3 scaling metadata.
  std::vector<float> rope_freq_factors;
  /// LongRoPE's two sets of per-pair divisors (rope_dim/2 each, from rope_factors_long.weight
  /// and rope_factors_short.weight; ModelConfig::rope_longrope), empty otherwise.
  std::vector<float> rope_factors_long, rope_factors_short;
  /// Vectors that were not F32 in the file (widened) or whose order changed (deque: pointers
  /// stay valid).
  std::deque<std::vector<float>> owned;
  /// Q/K matrices whose rows were reordered from half-split to interleaved RoPE pairs
  /// (ModelConfig::rope_halves): 64-byte aligned copies, the other matrices stay in the mapping.
  std::deque<std::vector<uint8_t>> owned_rows;
};

/// The row of a half-split head that holds interleaved dim `e` (ModelConfig::rope_halves):
/// pair i moves from dims (i, i + rope_dim/2) to (2i, 2i+1); dims >= rope_dim stay.
constexpr int64_t halves_source_dim(int64_t e, int64_t rope_dim) {
  return e < rope_dim ? (e % 2) * (rope_dim / 2) + e / 2 : e;
}

/// Binds and validates all tensors of the family's plan (ModelConfig's qkv_bias, qk_norm,
/// rope_halves). Throws ModelError naming the tensor for a missing tensor, a shape that
/// disagrees with `c`, an unsupported dtype (listing the supported ones), or a tensor the
/// plan does not read.
LlamaWeights bind_llama_weights(const GgufFile& f, const ModelConfig& c);

/// The RoPE of the model's global layers when it runs sequences of up to `n_ctx` tokens
/// (ModelOptions::n_ctx, 0 = the trained context): base, linear scale, YaRN, attention factor
/// and per-pair divisors — LongRoPE's long or short set (ModelConfig::rope_long_factors), else
/// rope_freq_factors. Its freq_factors points into `w`, which must outlive it. Both backends
/// build their cos/sin tables from it.
cpu::RopeParams global_rope_params(const ModelConfig& c, const LlamaWeights& w, int n_ctx);

/// The Llama-3 per-pair frequency divisors for `c` (Meta's "llama3" rope scaling: pairs with
/// wavelength above orig_ctx/low_freq_factor are divided by the factor, those below
/// orig_ctx/high_freq_factor are unchanged, and those between are interpolated smoothly).
std::vector<float> llama3_rope_factors(const ModelConfig& c);

}  // namespace fdl
