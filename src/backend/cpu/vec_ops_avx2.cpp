// AVX2/F16C implementations of vec_ops.h (row conversion, dot, axpy).
#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_avx2.h"

namespace fdl::cpu::detail {

#if FDL_HAVE_AVX2
void f16_to_f32_avx2(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, simd::load8_f16(src + i));
  for (; i < n; ++i) dst[i] = _cvtsh_ss(src[i]);
}

void bf16_to_f32_avx2(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, simd::load8_bf16(src + i));
  for (; i < n; ++i) dst[i] = bf16_to_fp32(src[i]);
}

void q8_0_to_f32_avx2(const BlockQ8_0* src, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(src[b].d));
    for (int j = 0; j < 32; j += 8) _mm256_storeu_ps(dst + b * 32 + j, simd::load8_q8(src[b].qs + j, d));
  }
}

// exp(x) for every float x, 8 lanes: x = n*ln2 + r with |r| <= ln2/2 (Cody-Waite, ln2 in
// two parts), e^r by its degree-6 Taylor polynomial (relative error < 2e-7), times 2^n built
// in the exponent bits. x > 88.7 gives +inf (like expf); x < -87.3 gives 0 (expf would give
// a subnormal; silu only adds it to 1).
inline __m256 exp_lanes(__m256 x) {
  const __m256 too_small = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33f), _CMP_LT_OQ);
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33f)), _mm256_set1_ps(88.8f));
  __m256 n, p;
  simd::exp_reduce(x, n, p);
  // n = 128 (x in (88.4, 88.8]) would need 2^128: split as 2^(n-1) * 2, which overflows to
  // +inf only when the product does.
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(126)), 23);
  const __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, _mm256_castsi256_ps(e)), _mm256_set1_ps(2.f));
  return _mm256_andnot_ps(too_small, y);
}

inline __m256 silu_mul8(__m256 g, __m256 u) {
  const __m256 e = exp_lanes(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), e)), u);
}

void silu_mul_avx2(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, silu_mul8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i < n) {  // the same lane arithmetic on a masked vector: no element depends on where n ends
    const __m256i m = simd::tail_mask(n - i);
    _mm256_maskstore_ps(out + i, m, silu_mul8(_mm256_maskload_ps(gate + i, m), _mm256_maskload_ps(up + i, m)));
  }
}

float dot_f32_avx2(const float* a, const float* b, int64_t n) {
  // Four accumulators hide the 4-cycle FMA latency; combined in a fixed order.
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  if (i < n) {
    const __m256i m = simd::tail_mask(n - i);
    acc1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), acc1);
  }
  return simd::hsum_canonical(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
}

void axpy_f32_avx2(float a, const float* x, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  if (i < n) {
    const __m256i m = simd::tail_mask(n - i);
    _mm256_maskstore_ps(y + i, m, _mm256_fmadd_ps(va, _mm256_maskload_ps(x + i, m), _mm256_maskload_ps(y + i, m)));
  }
}

#else  // Built without AVX2 (non-x86 target): never dispatched to; keep the symbols defined.
void f16_to_f32_avx2(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(src[i]);
}
void bf16_to_f32_avx2(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(src[i]);
}
void q8_0_to_f32_avx2(const BlockQ8_0* src, float* dst, int64_t n_blocks) {
  dequantize_row(GgmlType::Q8_0, src, dst, static_cast<size_t>(n_blocks) * 32);
}
float dot_f32_avx2(const float* a, const float* b, int64_t n) { return dot_f32_portable(a, b, n); }
void axpy_f32_avx2(float a, const float* x, float* y, int64_t n) { axpy_f32_portable(a, x, y, n); }
#endif

}  // namespace fdl::cpu::detail
