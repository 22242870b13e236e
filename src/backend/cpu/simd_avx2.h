// simd_avx2.h — internal AVX2/FMA/F16C helpers shared by the *_avx2.cpp kernels. Include only
// from files compiled with -mavx2 -mfma -mf16c (guarded by FDL_HAVE_AVX2 below).
//
// The helpers (and the tiles of matmul_tiles_avx2.h) live in an inline namespace named after
// the widest ISA the including file is compiled for (FDL_ISA_NS): a *_avx512.cpp file gets
// its own copies, so the linker can never fold an AVX-512-compiled instance into the AVX2
// path (which must run on CPUs without AVX-512).
#pragma once

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define FDL_HAVE_AVX2 1
#include <immintrin.h>

#include <cstdint>

#include "flashdllm/dtype.h"

#if defined(__AVX512VNNI__)
#define FDL_ISA_NS isa_avx512vnni
#elif defined(__AVX512F__)
#define FDL_ISA_NS isa_avx512
#else
#define FDL_ISA_NS isa_avx2
#endif

namespace fdl::cpu::simd {
inline namespace FDL_ISA_NS {

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

/// hsum_canonical of four vectors at once: [h(a), h(b), h(c), h(d)], each bit-identical to
/// hsum_canonical of that vector (the same additions on the same operands, in lanes).
inline __m128 hsum4_canonical(__m256 a, __m256 b, __m256 c, __m256 d) {
  // s_j = v_j + v_{j+4}: low halves of a|b (c|d) plus their high halves.
  const __m256 s_ab = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
  const __m256 s_cd = _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20), _mm256_permute2f128_ps(c, d, 0x31));
  // t0 = s0 + s2, t1 = s1 + s3, laid out [ta0 ta1 tc0 tc1 | tb0 tb1 td0 td1].
  const __m256 t = _mm256_add_ps(_mm256_shuffle_ps(s_ab, s_cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                 _mm256_shuffle_ps(s_ab, s_cd, _MM_SHUFFLE(3, 2, 3, 2)));
  // r = t0 + t1: [ra rc ra rc | rb rd rb rd].
  const __m256 r = _mm256_hadd_ps(t, t);
  return _mm_unpacklo_ps(_mm256_castps256_ps128(r), _mm256_extractf128_ps(r, 1));
}

/// The core of an 8-lane exp(x) for x within float range: n = round(x / ln2) and p = e^r for
/// r = x - n ln2 (Cody-Waite, ln2 in two parts; |r| <= ln2/2), e^r by its degree-6 Taylor
/// polynomial (relative error < 2e-7). exp(x) = p * 2^n; callers clamp x and build 2^n in the
/// exponent bits for their range (the attention softmax's x <= 0, silu's every x).
inline void exp_reduce(__m256 x, __m256& n, __m256& p) {
  n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);  // ln2 high part
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);       // ln2 low part
  p = _mm256_set1_ps(1.f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
}

}  // namespace FDL_ISA_NS
}  // namespace fdl::cpu::simd
#endif
