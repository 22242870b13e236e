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
