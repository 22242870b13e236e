// The K-quant integer kernels of q8k.h on AVX2: the activations' Q8_K rounding, and the row
// driver of q8k_kernels_avx2.h with token groups of up to 8.
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cpu/q8k_kernels_avx2.h"

namespace fdl::cpu::detail {

#if FDL_HAVE_AVX2
void quantize_rows_q8k_avx2(const float* x, int64_t n_tokens, int64_t cols, BlockQ8K* out) {
  const __m256 sign = _mm256_set1_ps(-0.f), lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
  for (int64_t b = 0; b < n_tokens * (cols / 256); ++b) {
    const float* v = x + b * 256;
    const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
    __m256 mx = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    for (int i = 0; i < 256; i += 8) {
      const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(v + i));
      mx = _mm256_max_ps(mx, a);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));  // NaN or infinite
    }
    BlockQ8K& q = out[b];
    if (_mm256_movemask_ps(bad) != 0) {  // a NaN or infinite activation: NaN scale
      q = BlockQ8K{};
      q.d = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    float m8[8];
    _mm256_storeu_ps(m8, mx);
    float amax = 0.f;
    for (float m : m8) amax = amax < m ? m : amax;
    q.d = amax / 127.f;
    const __m256 id = _mm256_set1_ps(amax > 0.f && std::isfinite(127.f / amax) ? 127.f / amax : 0.f);  // as q8k.cpp
    for (int i = 0; i < 256; i += 32) {
      __m256i w[4];
      for (int k = 0; k < 4; ++k)  // round to nearest even (MXCSR's default), clamped
        w[k] = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i + 8 * k), id), lo), hi));
      // int32 -> int16 -> int8 packs interleave the 128-bit halves: put them back in order.
      const __m256i p16a = _mm256_packs_epi32(w[0], w[1]), p16b = _mm256_packs_epi32(w[2], w[3]);
      const __m256i p8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q.qs + i), p8);
    }
    for (int j = 0; j < 16; ++j) {  // each 16 values' sum: widen to int16 and add pairs
      const __m256i q16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q.qs + 16 * j)));
      const __m256i s32 = _mm256_madd_epi16(q16, _mm256_set1_epi16(1));
      __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
      s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
      q.bsums[j] = static_cast<int16_t>(_mm_cvtsi128_si32(s));
    }
  }
}

void q8k_rows_avx2(const WeightMatrix& W, const BlockQ8K* xq, int64_t n_tokens, float* Y, int64_t row_begin,
                   int64_t row_end) {
  q8k_rows_driver<8>(W, xq, n_tokens, Y, row_begin, row_end);
}
#else
void quantize_rows_q8k_avx2(const float* x, int64_t n_tokens, int64_t cols, BlockQ8K* out) {
  quantize_rows_q8k(x, n_tokens, cols, out);
}

void q8k_rows_avx2(const WeightMatrix& W, const BlockQ8K* xq, int64_t n_tokens, float* Y, int64_t row_begin,
                   int64_t row_end) {
  const int64_t nb = W.cols / 256;
  const size_t row_bytes = weight_row_bytes(W.type, W.cols);
  const auto* base = static_cast<const unsigned char*>(W.data);
  std::vector<BlockQ8K> token(static_cast<size_t>(nb));  // one token's blocks, gathered from the block-major xq
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t b = 0; b < nb; ++b) token[static_cast<size_t>(b)] = xq[b * n_tokens + t];
    for (int64_t r = row_begin; r < row_end; ++r)
      Y[t * W.rows + r] = q8k_dot_reference(W.type, base + r * row_bytes, token.data(), nb);
  }
}
#endif

}  // namespace fdl::cpu::detail
