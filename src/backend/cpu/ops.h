// ops.h — the element-wise and per-row fp32 ops of a Llama forward pass on the CPU:
// RMSNorm, RoPE (llama.cpp's "normal" mode), SwiGLU's silu(gate) * up, residual add and the
// embedding gather.
//
// Batch invariance: every op works on one row (one token) at a time with a fixed order of
// operations, so a row's result depends only on that row's inputs, never on how many rows
// are processed together or on the thread count.
//
// Numerics follow ggml's CPU ops so that logits match llama.cpp closely:
//  - rms_norm: sum of squares accumulated in double, scale = 1 / sqrtf(mean + eps) in float;
//  - rope: theta of pair i = pos * base^(-2i/rope_dim) built by repeated multiplication in
//    float, divided by the pair's frequency factor (Llama-3 `rope_freqs`, LongRoPE's long or
//    short factors) and multiplied by the linear frequency scale; cosf/sinf of that angle, times
//    the attention factor (LongRoPE) and YaRN's magnitude scale where they apply.
//
// Thread-safety: pure functions of their arguments; safe to call concurrently on
// non-overlapping outputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "flashdllm/dtype.h"

namespace fdl::cpu {

/// y[r][i] = x[r][i] / sqrt(mean_i(x[r][i]^2) + eps) * w[i] for r < n_rows, i < n.
/// x, y: n_rows x n row-major fp32 (y may equal x); w: n fp32. n > 0.
void rms_norm_rows(const float* x, const float* w, float* y, int64_t n_rows, int64_t n, float eps);

/// Parameters of rotary position embedding in llama.cpp's NORMAL mode: adjacent pairs
/// (x[2i], x[2i+1]) of the first `rope_dim` dims of each head are rotated by angle
/// theta_i = freq_scale * pos * base^(-2i/rope_dim) / freq_factors[i]; dims >= rope_dim pass through.
struct RopeParams {
  int head_dim = 0;
  int rope_dim = 0;           ///< even, <= head_dim
  float freq_base = 10000.f;
  float freq_scale = 1.f;     ///< linear scaling (1 / factor); 1 = none
  std::span<const float> freq_factors;  ///< empty, or rope_dim/2 per-pair divisors (Llama 3, LongRoPE)
  /// cos and sin are multiplied by this (ggml's attn_factor: LongRoPE's attention factor,
  /// `rope.scaling.attn_factor`), and by yarn_mscale on top with YaRN; 1 = none.
  float attn_factor = 1.f;
  /// YaRN (arXiv:2309.00071; ggml's rope_yarn): when set, pair i's angle mixes the original
  /// angle a_i (freq_scale not applied) and the interpolated one freq_scale * a_i with weight
  /// r_i = 1 - clamp((i - yarn_low) / max(0.001, yarn_high - yarn_low), 0, 1) on the original,
  /// and cos/sin are multiplied by yarn_mscale.
  bool yarn = false;
  float yarn_low = 0.f, yarn_high = 0.f;
  float yarn_mscale = 1.f;
};

/// The YaRN correction range of ggml/HF: pairs below `low` keep their original frequency, pairs
/// above `high` are fully interpolated; dim(n) = rope_dim * ln(orig_ctx / (2 pi n)) / (2 ln base),
/// low = max(0, floor(dim(beta_fast))), high = min(rope_dim - 1, ceil(dim(beta_slow))).
/// Fills p.yarn_low/high and p.yarn_mscale = 1 + 0.1 ln(1 / p.freq_scale); sets p.yarn.
void set_yarn(RopeParams& p, int orig_ctx, float beta_fast, float beta_slow);

/// Fills cos_sin[2*i] = cos(theta_i), cos_sin[2*i+1] = sin(theta_i) for i < rope_dim/2 at
/// position `pos` (rope_dim floats in total), both multiplied by attn_factor; with YaRN, theta_i
/// is the mixed angle and both values are multiplied by attn_factor * yarn_mscale.
void rope_cos_sin(const RopeParams& p, int32_t pos, float* cos_sin);

/// Rotates `n_heads` consecutive heads of head_dim floats in place using a table from
/// rope_cos_sin.
void rope_apply(const RopeParams& p, const float* cos_sin, float* x, int n_heads);

/// out[i] = silu(gate[i]) * up[i] with silu(g) = g / (1 + exp(-g)). out may equal gate or up.
/// Element-wise (no result depends on n or on an element's index); the AVX2 kernel set uses a
/// polynomial exp (a few ulp; silu tested within 1e-6 relative), the portable set std::exp.
void silu_mul(const float* gate, const float* up, float* out, int64_t n);

/// out[i] = gelu_tanh(gate[i]) * up[i] (GeGLU) with gelu_tanh(g) =
/// 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) (PyTorch's approximate="tanh"). out may
/// equal gate or up. Element-wise, std::tanh.
void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n);

/// x[i] = cap * tanh(x[i] / cap) (soft-capping: Gemma 2's attention scores and logits). cap > 0.
void softcap_inplace(float* x, int64_t n, float cap);

/// x[i] *= f.
void scale_inplace(float* x, int64_t n, float f);

/// x[i] += y[i].
void add_inplace(float* x, const float* y, int64_t n);

/// Embedding lookup: for each of `n_tokens` ids, converts row ids[t] of a [n_rows x n_cols]
/// matrix of ggml type `type` to fp32 into out[t*n_cols ...]. Throws std::out_of_range for an
/// id outside [0, n_rows).
void gather_rows_f32(GgmlType type, const void* data, int64_t n_rows, int64_t n_cols,
                     const int32_t* ids, int64_t n_tokens, float* out);

}  // namespace fdl::cpu
