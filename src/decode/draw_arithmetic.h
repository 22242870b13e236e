// Internal: the arithmetic of a sampled draw, shared bit for bit by the host Sampler
// (sampler.cpp, candidate_filters.cpp, row_ops.cpp) and the GPU's sample_rows
// (backend/cuda/sampling.cu). A seeded request then draws the same token from the same
// logits wherever its step is sampled: on the host (speculative verification, logprobs) or on
// the device (plain steps).
//
// What makes the two sides agree:
// - the exponential is this file's polynomial with every operation rounded on its own (the
//   device's intrinsics forbid fused multiply-adds; the decode library and whatever links it
//   compile with -ffp-contract=off), not the platform's exp;
// - weights become exact integers, Mass (w * 2^44, truncated), so sums and running sums do
//   not depend on the order or grouping of the additions (the GPU sums in parallel, the host
//   in id order). Weights below 2^-44 of the top one count as 0: such a token is never drawn
//   and adds nothing to top-p's mass. Rows of fewer than 2^20 tokens fit 64 bits (Sampler
//   refuses larger vocabularies).
// - the cuts compare integers (top-p) or the same float expression (min-p: exp(v - top)
//   against min_p).
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FDL_DRAW_FN __host__ __device__ __forceinline__
#else
#define FDL_DRAW_FN inline
#endif

namespace fdl::draw {

using Mass = unsigned long long;
inline constexpr double kMassScale = 0x1p44;

// exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2], exp(r) by its
// degree-7 Taylor polynomial (truncation error < 1e-8 there; float rounding dominates, ~2e-7
// relative). x is clamped to [-87, 0], so 2^n stays a normal float.
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f;  // ln 2 in two parts: n * kLn2Hi is exact
inline constexpr float kLn2Lo = -2.12194440e-4f;
inline constexpr float kMinArg = -87.0f;  // exp(-87) ~ 1.6e-38, the smallest normal range

FDL_DRAW_FN float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
FDL_DRAW_FN float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
FDL_DRAW_FN float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
FDL_DRAW_FN float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

/// exp(r) * 2^n for r in [-ln2/2, ln2/2] (the polynomial part; row_ops.cpp runs the same
/// operations on vectors).
FDL_DRAW_FN float exp_reduced(float x, int32_t n) {
  const float nf = float(n);
  const float r = sub(sub(x, mul(nf, kLn2Hi)), mul(nf, kLn2Lo));
  float p = add(mul(r, 1.0f / 5040.0f), 1.0f / 720.0f);
  p = add(mul(p, r), 1.0f / 120.0f);
  p = add(mul(p, r), 1.0f / 24.0f);
  p = add(mul(p, r), 1.0f / 6.0f);
  p = add(mul(p, r), 0.5f);
  p = add(mul(p, r), 1.0f);
  p = add(mul(p, r), 1.0f);
  const int32_t bits = (n + 127) << 23;
#if defined(__CUDA_ARCH__)
  const float scale = __int_as_float(bits);
#else
  float scale;
  __builtin_memcpy(&scale, &bits, sizeof scale);
#endif
  return mul(p, scale);
}

/// exp(x) for x <= 0 (larger x counts as 0): exactly 1 at 0, 0 at or below -87 and for -Inf.
FDL_DRAW_FN float exp_nonpositive(float x) {
  x = x > 0.0f ? 0.0f : x;
  if (!(x > kMinArg)) return 0.0f;
  // Truncation of (x * log2e - 0.5) rounds to nearest for x <= 0.
  return exp_reduced(x, int32_t(sub(mul(x, kLog2e), 0.5f)));
}

/// A survivor's weight at temperature t: exp((v - top) / t) for v <= top (dividing, not
/// multiplying by 1/t: 1/t overflows for a denormal t).
FDL_DRAW_FN float tempered(float v, float top, float t) { return exp_nonpositive(div(sub(v, top), t)); }

/// A weight in [0, 1] as an exact integer.
FDL_DRAW_FN Mass to_mass(float w) { return Mass(double(w) * kMassScale); }

/// The draw: the first survivor, in id order, whose running mass exceeds this target (u in
/// [0, 1) clamped; total the survivors' mass).
FDL_DRAW_FN Mass draw_target(double u, Mass total) {
  u = u >= 0.0 ? (u < 1.0 ? u : 1.0 - 0x1.0p-53) : 0.0;
  return Mass(u * double(total));
}

/// top-p keeps the shortest prefix in rank order whose untempered mass reaches this target.
FDL_DRAW_FN Mass top_p_target(float top_p, Mass total) {
  const double t = double(top_p) * double(total);
  const Mass m = Mass(t);
  return double(m) < t ? m + 1 : m;  // ceil, without the platform's ceil
}

/// min-p keeps v iff p(v) >= min_p * p(top), i.e. exp(v - top) >= min_p.
FDL_DRAW_FN bool min_p_keeps(float v, float top, float min_p) {
  return min_p <= 0.0f || exp_nonpositive(sub(v, top)) >= min_p;
}

}  // namespace fdl::draw

#undef FDL_DRAW_FN
