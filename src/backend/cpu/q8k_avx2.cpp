// The K-quant integer dot products of q8k.h on AVX2: per 32 weights and token one maddubs
// (unsigned levels x signed activations into 16-bit pair sums, which cannot saturate at these
// ranges: 2 x 63 x 127 at most) and one madd by the group's integer scale into 32-bit lanes;
// per 256-weight block one float step per lane, in block order, exactly as q8k_dot_reference
// writes it.
#include "backend/cpu/q8k.h"

#include <cstring>
#include <limits>

#include "backend/cpu/simd_avx2.h"
#include "flashdllm/dtype.h"

namespace fdl::cpu::detail {

#if FDL_HAVE_AVX2
namespace {

__m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// The eight lane totals, combined as q8k_dot_reference combines them.
float combined(__m256 v) {
  float l[8];
  _mm256_storeu_ps(l, v);
  return combine_lanes(l);
}

// Q4_K (kQ5 false: 144-byte blocks) and Q5_K (176 bytes: the fifth bits before the nibbles)
// against T token rows x[0..T): each block's levels and scales are unpacked once for all T.
template <bool kQ5, int T>
void dot_k4(const unsigned char* row, const BlockQ8K* const (&x)[T], int64_t nb, float (&out)[T]) {
  constexpr int kBytes = kQ5 ? 176 : 144;
  const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
  __m256 lanes[T];
  for (int t = 0; t < T; ++t) lanes[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const unsigned char* w = row + b * kBytes;
    const unsigned char* qs = w + (kQ5 ? 48 : 16);
    int sc[8], m[8];
    k4_scales(w + 4, sc, m);
    [[maybe_unused]] const __m256i qh = kQ5 ? load32(w + 16) : _mm256_setzero_si256();
    __m256i acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      const __m256i q4 = load32(qs + 32 * c);
      __m256i lo = _mm256_and_si256(q4, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), m4);
      if constexpr (kQ5) {  // bit 2c of qh[l] for the low nibbles, bit 2c + 1 for the high ones
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c), one), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * c + 1), one), 4));
      }
      const __m256i s0 = _mm256_set1_epi16(static_cast<int16_t>(sc[2 * c]));
      const __m256i s1 = _mm256_set1_epi16(static_cast<int16_t>(sc[2 * c + 1]));
      for (int t = 0; t < T; ++t) {
        const int8_t* q8 = x[t][b].qs + 64 * c;
        const __m256i p0 = _mm256_maddubs_epi16(lo, load32(q8)), p1 = _mm256_maddubs_epi16(hi, load32(q8 + 32));
        acc[t] = _mm256_add_epi32(acc[t], _mm256_add_epi32(_mm256_madd_epi16(p0, s0), _mm256_madd_epi16(p1, s1)));
      }
    }
    const float d = half_at(w), dmin = half_at(w + 2);
    // m[g] beside both 16-value sums of group g: one madd gives m[g] * (bsums[2g] + bsums[2g + 1]).
    const __m256i mv = _mm256_setr_epi16(
        static_cast<int16_t>(m[0]), static_cast<int16_t>(m[0]), static_cast<int16_t>(m[1]), static_cast<int16_t>(m[1]),
        static_cast<int16_t>(m[2]), static_cast<int16_t>(m[2]), static_cast<int16_t>(m[3]), static_cast<int16_t>(m[3]),
        static_cast<int16_t>(m[4]), static_cast<int16_t>(m[4]), static_cast<int16_t>(m[5]), static_cast<int16_t>(m[5]),
        static_cast<int16_t>(m[6]), static_cast<int16_t>(m[6]), static_cast<int16_t>(m[7]), static_cast<int16_t>(m[7]));
    for (int t = 0; t < T; ++t) {
      const BlockQ8K& xb = x[t][b];
      const __m256 msum = _mm256_cvtepi32_ps(_mm256_madd_epi16(load32(xb.bsums), mv));
      const __m256 dd = _mm256_set1_ps(d * xb.d), dm = _mm256_set1_ps(dmin * xb.d);
      lanes[t] = _mm256_add_ps(lanes[t], _mm256_sub_ps(_mm256_mul_ps(dd, _mm256_cvtepi32_ps(acc[t])),
                                                       _mm256_mul_ps(dm, msum)));
    }
  }
  for (int t = 0; t < T; ++t) out[t] = combined(lanes[t]);
}

// Q6_K: 210-byte blocks; levels u = q + 32 in [0, 63], the offset taken out through bsums.
template <int T>
void dot_q6k(const unsigned char* row, const BlockQ8K* const (&x)[T], int64_t nb, float (&out)[T]) {
  const __m256i m4 = _mm256_set1_epi8(0x0f), m3 = _mm256_set1_epi8(3);
  __m256 lanes[T];
  for (int t = 0; t < T; ++t) lanes[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const unsigned char* w = row + b * 210;
    const auto* scales = reinterpret_cast<const int8_t*>(w + 192);
    __m256i acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = load32(w + 64 * h), ql1 = load32(w + 64 * h + 32), qh = load32(w + 128 + 32 * h);
      auto high = [&](int shift) { return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, shift), m3), 4); };
      const __m256i u[4] = {_mm256_or_si256(_mm256_and_si256(ql0, m4), high(0)),
                            _mm256_or_si256(_mm256_and_si256(ql1, m4), high(2)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), high(4)),
                            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), high(6))};
      for (int r = 0; r < 4; ++r) {
        const int g = 8 * h + 2 * r;  // elements 0-15 of the 32 (low 128 bits): group g; 16-31: g + 1
        const __m256i sv = _mm256_set_m128i(_mm_set1_epi16(scales[g + 1]), _mm_set1_epi16(scales[g]));
        for (int t = 0; t < T; ++t) {
          const __m256i p = _mm256_maddubs_epi16(u[r], load32(x[t][b].qs + 128 * h + 32 * r));
          acc[t] = _mm256_add_epi32(acc[t], _mm256_madd_epi16(p, sv));
        }
      }
    }
    const float d = half_at(w + 208);
    const __m256i sv16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales)));
    for (int t = 0; t < T; ++t) {
      const __m256i offset = _mm256_madd_epi16(load32(x[t][b].bsums), sv16);
      const __m256i v = _mm256_sub_epi32(acc[t], _mm256_slli_epi32(offset, 5));
      lanes[t] = _mm256_add_ps(lanes[t], _mm256_mul_ps(_mm256_set1_ps(d * x[t][b].d), _mm256_cvtepi32_ps(v)));
    }
  }
  for (int t = 0; t < T; ++t) out[t] = combined(lanes[t]);
}

// One weight row against tokens [t0, t0 + T) of xq (nb blocks per token), into Y.
template <int T>
void row_tokens(GgmlType type, const unsigned char* row, const BlockQ8K* xq, int64_t nb, int64_t t0, float* Y,
                int64_t y_stride) {
  const BlockQ8K* x[T];
  for (int t = 0; t < T; ++t) x[t] = xq + (t0 + t) * nb;
  float out[T];
  if (type == GgmlType::Q4_K) dot_k4<false, T>(row, x, nb, out);
  else if (type == GgmlType::Q5_K) dot_k4<true, T>(row, x, nb, out);
  else dot_q6k<T>(row, x, nb, out);
  for (int t = 0; t < T; ++t) Y[(t0 + t) * y_stride] = out[t];
}

}  // namespace

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
    const __m256 id = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
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
  // Tokens in groups of 8, then 4, per weight row (each block unpacked once per group), the rest
  // one by one: every output's operations are the same in any group, so its bits are too.
  const int64_t nb = W.cols / 256;
  const size_t row_bytes = weight_row_bytes(W.type, W.cols);
  const auto* base = static_cast<const unsigned char*>(W.data);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const unsigned char* row = base + r * row_bytes;
    int64_t t = 0;
    for (; t + 8 <= n_tokens; t += 8) row_tokens<8>(W.type, row, xq, nb, t, Y + r, W.rows);
    for (; t + 4 <= n_tokens; t += 4) row_tokens<4>(W.type, row, xq, nb, t, Y + r, W.rows);
    for (; t < n_tokens; ++t) row_tokens<1>(W.type, row, xq, nb, t, Y + r, W.rows);
  }
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
  for (int64_t r = row_begin; r < row_end; ++r)
    for (int64_t t = 0; t < n_tokens; ++t)
      Y[t * W.rows + r] = q8k_dot_reference(W.type, base + r * row_bytes, xq + t * nb, nb);
}
#endif

}  // namespace fdl::cpu::detail
