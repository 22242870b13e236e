// Per-row fp32 ops of the Llama forward (see ops.h for the numerics they follow).
#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/vec_ops.h"

namespace fdl::cpu {

void rms_norm_rows(const float* x, const float* w, float* y, int64_t n_rows, int64_t n, float eps) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    // Double accumulation keeps the mean of squares independent of n's rounding drift and
    // matches ggml's rms_norm (which sums float products in ggml_float = double).
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += double(xr[i] * xr[i]);
    const float mean = float(sum / double(n));
    const float scale = 1.0f / std::sqrt(mean + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = (xr[i] * scale) * w[i];
  }
}

void rope_cos_sin(const RopeParams& p, int32_t pos, float* cos_sin) {
  const int n_pairs = p.rope_dim / 2;
  // ggml builds theta by repeated multiplication starting from the position; doing the same
  // keeps our angles bit-equal to llama.cpp's instead of ~n_pairs ulps away.
  const float theta_scale = std::pow(p.freq_base, -2.0f / float(p.rope_dim));
  float theta = float(pos);
  for (int i = 0; i < n_pairs; ++i) {
    const float factor = p.freq_factors.empty() ? 1.0f : p.freq_factors[size_t(i)];
    const float original = theta / factor;
    float angle = p.freq_scale * original;
    // ggml's order: the attention factor, times YaRN's scale where it applies (x * 1 is exact,
    // so files without an attention factor get the values they always had).
    float mscale = p.attn_factor;
    if (p.yarn) {
      const float y = (float(i) - p.yarn_low) / std::max(0.001f, p.yarn_high - p.yarn_low);
      const float ramp = 1.0f - std::min(1.0f, std::max(0.0f, y));
      angle = angle * (1.0f - ramp) + original * ramp;
      mscale = p.attn_factor * p.yarn_mscale;
    }
    cos_sin[2 * i] = std::cos(angle) * mscale;
    cos_sin[2 * i + 1] = std::sin(angle) * mscale;
    theta *= theta_scale;
  }
}

void set_yarn(RopeParams& p, int orig_ctx, float beta_fast, float beta_slow) {
  const auto dim = [&](float n_rot) {
    return float(p.rope_dim) * std::log(float(orig_ctx) / (n_rot * 2.0f * std::numbers::pi_v<float>)) / (2.0f * std::log(p.freq_base));
  };
  p.yarn = true;
  p.yarn_low = std::max(0.0f, std::floor(dim(beta_fast)));
  p.yarn_high = std::min(float(p.rope_dim - 1), std::ceil(dim(beta_slow)));
  p.yarn_mscale = 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
}

void rope_apply(const RopeParams& p, const float* cos_sin, float* x, int n_heads) {
  const int n_pairs = p.rope_dim / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* xh = x + int64_t(h) * p.head_dim;
    for (int i = 0; i < n_pairs; ++i) {
      const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
      const float x0 = xh[2 * i], x1 = xh[2 * i + 1];
      xh[2 * i] = x0 * c - x1 * s;
      xh[2 * i + 1] = x0 * s + x1 * c;
    }
  }
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  // The AVX2 build's exp is a polynomial (vec_ops_avx2.cpp), a few ulp from expf:
  // the scalar expf calls were ~8% of a codelm-16m verification forward on two threads.
  if (use_avx2_kernels()) return detail::silu_mul_avx2(gate, up, out, n);
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = (g / (1.0f + std::exp(-g))) * up[i];
  }
}

void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f, kCoef = 0.044715f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = ((0.5f * g) * (1.0f + std::tanh(kSqrt2OverPi * (g + ((kCoef * g) * g) * g)))) * up[i];
  }
}

void softcap_inplace(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

void scale_inplace(float* x, int64_t n, float f) {
  for (int64_t i = 0; i < n; ++i) x[i] *= f;
}

void add_inplace(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void gather_rows_f32(GgmlType type, const void* data, int64_t n_rows, int64_t n_cols,
                     const int32_t* ids, int64_t n_tokens, float* out) {
  const size_t row_bytes = weight_row_bytes(type, n_cols);
  const auto* base = static_cast<const uint8_t*>(data);
  for (int64_t t = 0; t < n_tokens; ++t) {
    if (ids[t] < 0 || ids[t] >= n_rows)
      throw std::out_of_range("embedding lookup: token id " + std::to_string(ids[t]) +
                              " outside the vocabulary [0, " + std::to_string(n_rows) + ")");
    convert_row_to_f32(type, base + size_t(ids[t]) * row_bytes, out + t * n_cols, n_cols);
  }
}

}  // namespace fdl::cpu
