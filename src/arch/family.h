// family.h — what distinguishes one decoder-only model family from another, as data.
//
// Every family runs the same layer plan (both backends execute it):
//   x += post_norm(wo · attention(rope(norm_q(wq·rms_norm(x) + bq)), rope(norm_k(wk·rms_norm(x) + bk)),
//                                 wv·rms_norm(x) + bv))
//   x += post_norm(w_down · (act(w_gate·rms_norm(x)) * (w_up·rms_norm(x))))
// (act: SiLU or GELU-tanh; post_norm: identity or an RMSNorm), over embeddings optionally
// scaled, with attention optionally windowed and soft-capped, logits optionally soft-capped.
// and a Family says which optional parts it has: Q/K/V biases (qwen2), a per-head RMSNorm on Q
// and K before RoPE (qwen3), how its checkpoints lay out a RoPE pair in the Q/K rows, and
// which matrices they store fused (phi3: QKV and gate/up; bound as row ranges of the mapping,
// except where Q/K rows are reordered, which copies them).
// Tensor names follow llama.cpp's GGUF conventions (blk.N.attn_q.bias, blk.N.attn_q_norm.weight,
// ...); `hf_model_types` are the Hugging Face config.json `model_type` values read as this family.
//
// A new family is one file here (a `Family` constant, listed in families.cpp) plus only what its
// plan needs beyond these switches. Thread-safety: immutable data.
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace fdl::arch {

/// Where a checkpoint keeps the two values RoPE rotates together in a Q/K head.
enum class RopePairs {
  Interleaved,  ///< dims (2i, 2i+1): llama.cpp's GGUF for `llama` (its converter permutes HF rows)
  Halves,       ///< dims (i, i + rope_dim/2): "NEOX" style, HF's rotate_half, qwen2/qwen3 GGUFs
};

struct Family {
  std::string_view name;                                  ///< general.architecture
  std::array<std::string_view, 3> hf_model_types{};        ///< config.json model_type values (empty: unused)
  RopePairs gguf_rope_pairs = RopePairs::Interleaved;     ///< layout of Q/K rows in the family's GGUF
  bool qkv_bias = false;  ///< blk.N.attn_{q,k,v}.bias, [q_dim] / [kv_dim] / [kv_dim]
  bool qk_norm = false;   ///< blk.N.attn_{q,k}_norm.weight, [head_dim], RMSNorm per head before RoPE
  /// Q, K and V as one matrix blk.N.attn_qkv.weight (rows [q | k | v]; HF self_attn.qkv_proj).
  bool fused_qkv = false;
  /// Gate and up as one matrix blk.N.ffn_up.weight (rows [gate | up]; HF mlp.gate_up_proj).
  bool fused_gate_up = false;
  float hf_default_rope_theta = 10000.f;  ///< rope_theta when config.json has none
  /// config.json's sliding_window applies only with use_sliding_window = true (Qwen's configs;
  /// false by default). Otherwise a sliding_window always applies (Mistral, Phi-3).
  bool hf_sliding_window_switch = false;
  /// The layers a GGUF `<arch>.attention.sliding_window` applies to when the file has no
  /// `<arch>.attention.sliding_window_pattern`: 0 = every layer, n = the layers il with
  /// il % n < n - 1 (llama.cpp's convention).
  int gguf_sliding_pattern = 0;
  // Gemma 2/3's parts of the plan:
  bool embed_scale = false;  ///< token embeddings times sqrt(n_embd)
  /// RMSNorm of the attention and FFN outputs before each residual add
  /// (blk.N.post_attention_norm.weight, blk.N.post_ffw_norm.weight, [n_embd]).
  bool post_norms = false;
  bool ffn_gelu = false;     ///< GeGLU: gelu_tanh(gate) * up (HF gelu_pytorch_tanh) instead of SwiGLU
  /// HF checkpoints store RMSNorm weights as scale - 1 (Gemma); the GGUFs and the engine use the scale.
  bool hf_norm_minus_one = false;
  /// Sliding layers have a RoPE of their own: base `<arch>.rope.freq_base_swa` (this value when
  /// absent) and no scaling (Gemma 3). 0: the global layers' RoPE.
  float sliding_rope_base = 0.f;
  /// Files of this many layers scale queries by 1/sqrt(n_embd / n_head) instead of
  /// 1/sqrt(head_dim) when `<arch>.attention.scale` is absent (Gemma 2/3 27B: their
  /// query_pre_attn_scalar, which the GGUFs do not carry; llama.cpp's rule). 0: none.
  int gguf_embd_query_scale_layers = 0;
};

/// The family of GGUF `general.architecture` = name; nullptr when unknown.
const Family* find_family(std::string_view name);
/// The family of a config.json `model_type`; nullptr when unknown.
const Family* find_hf_family(std::string_view model_type);
/// "llama, qwen2, qwen3, phi3" — for error messages.
std::string family_names();
/// The config.json model_type values read, comma-separated — for error messages.
std::string hf_model_type_names();

}  // namespace fdl::arch
