// simd_avx2.h — internal AVX2/FMA/F16C helpers shared by the *_avx2.cpp kernels. Include only
// from files compiled with -mavx2 -mfma -mf16c (guarded by FDL_HAVE_AVX2 below).
#pragma once

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define FDL_HAVE_AVX2 1
#include <immintrin.h>

#include <cstdint>

#include "flashdllm/dtype.h"

namespace fdl::cpu::simd {

/// 8 fp16 -> 8 fp32 (exact), unaligned.
inline __m256 load8_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

/// 8 bf16 -> 8 fp32 (exact): bf16 is the high half of an fp32.
inline __m256 load8_bf16(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

/// 8 int8 scaled by d -> fp32 (exact: |q| <= 128 times an fp16 scale fits 24 bits).
inline __m256 load8_q8(const int8_t* q, __m256 d) {
  const __m256i wide = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(wide), d);
}

/// Mask whose first n (0..8) 32-bit lanes are set, for maskload/maskstore of a row tail.
inline __m256i tail_mask(int64_t n) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lane);
}

/// The canonical lane combination of matmul.h: ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)).
inline float hsum_canonical(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // a_j+a_j+4
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));  // t0 = s0+s2, t1 = s1+s3
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));  // t0 + t1
}

}  // namespace fdl::cpu::simd
#endif
