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
#include "flashdllm/gguf.h"
#include "flashdllm/model.h"

namespace fdl {

struct LlamaLayerWeights {
  const float* attn_norm = nullptr;  ///< [n_embd]
  cpu::WeightMatrix wq{};            ///< n_head*head_dim rows of n_embd
  cpu::WeightMatrix wk{};            ///< n_head_kv*head_dim rows of n_embd
  cpu::WeightMatrix wv{};            ///< n_head_kv*head_dim rows of n_embd
  cpu::WeightMatrix wo{};            ///< n_embd rows of n_head*head_dim
  const float* ffn_norm = nullptr;   ///< [n_embd]
  cpu::WeightMatrix w_gate{};        ///< n_ff rows of n_embd
  cpu::WeightMatrix w_up{};          ///< n_ff rows of n_embd
  cpu::WeightMatrix w_down{};        ///< n_embd rows of n_ff
};

struct LlamaWeights {
  cpu::WeightMatrix token_embd{};    ///< n_vocab rows of n_embd
  const float* output_norm = nullptr;
  cpu::WeightMatrix output{};        ///< n_vocab rows of n_embd (token_embd when tied)
  std::vector<LlamaLayerWeights> layers;
  /// Per-pair RoPE frequency divisors (rope_dim/2), empty when the model has none: from the
  /// `rope_freqs.weight` tensor, or computed from the llama3 scaling metadata.
  std::vector<float> rope_freq_factors;
  /// Norm vectors that were not F32 in the file, widened (deque: pointers stay valid).
  std::deque<std::vector<float>> owned;
};

/// Binds and validates all tensors. Throws ModelError naming the tensor for a missing tensor,
/// a shape that disagrees with `c`, or an unsupported dtype (listing F32, F16, BF16, Q8_0).
LlamaWeights bind_llama_weights(const GgufFile& f, const ModelConfig& c);

/// The Llama-3 per-pair frequency divisors for `c` (Meta's "llama3" rope scaling: pairs with
/// wavelength above orig_ctx/low_freq_factor are divided by the factor, those below
/// orig_ctx/high_freq_factor are unchanged, and those between are interpolated smoothly).
std::vector<float> llama3_rope_factors(const ModelConfig& c);

}  // namespace fdl
