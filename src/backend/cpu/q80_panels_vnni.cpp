// The Q8_0 panel kernel of q8k_panels.h on AVX-512 BW + VNNI, and the 16-bit activations it
// reads. Lane r of every 512-bit vector is weight row r of the panel: a step is 32 bytes of
// int8 weights (2 elements of 16 rows) widened to 16 bits, multiplied with a token's 2
// activations by one vpdpwssd against their broadcast; each 32-value block's exact int32 sums
// then take one fused multiply-add by d * x.d. Tokens go in groups of up to 8 per pass over a
// panel, sharing each widened step; every output's operations are the same in any group, so
// its bits are too, and they are q80_panel_dot_reference's (tests/cpu/q8k_panels_test.cpp).
// Only called when use_avx512_vnni() is true.
#include "backend/cpu/q8k_panels.h"

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include "backend/cpu/panels_vnni.h"
#endif

#include <limits>
#include <stdexcept>

namespace fdl::cpu::detail {

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
namespace {

constexpr int kBlockBytes = 16 * 8 * 34;  // a panel block: 16 rows x 256 columns

// Adds the panel's rows times T tokens (block-major activations) to acc[t] (lane r: row r).
template <int T>
void panel_tokens(const uint8_t* panel, int64_t nb, const Q16Panel* x, int64_t ld, __m512 (&acc)[T]) {
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* pb = panel + b * kBlockBytes;
    const Q16Panel* xb = x + b * ld;
    for (int g = 0; g < 8; ++g) {
      // Two chains (even and odd steps) where few tokens leave the core little to overlap.
      __m512i even[T], odd[T];
      for (int t = 0; t < T; ++t) even[t] = odd[t] = _mm512_setzero_si512();
      for (int s = 0; s < 16; ++s) {
        const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 512 * g + 32 * s)));
        for (int t = 0; t < T; ++t) {
          __m512i& sum = T <= 2 && (s & 1) ? odd[t] : even[t];
          sum = _mm512_dpwssd_epi32(sum, w, bcast32(xb[t].qs + 32 * g + 2 * s));
        }
      }
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pb + 4096 + 32 * g)));
      for (int t = 0; t < T; ++t) {
        const __m512i isum = T <= 2 ? _mm512_add_epi32(even[t], odd[t]) : even[t];
        acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(xb[t].d)), _mm512_cvtepi32_ps(isum), acc[t]);
      }
    }
  }
}

}  // namespace

void q80_panels_vnni(const WeightMatrix& W, const Q16Panel* xp, int64_t n_tokens, float* Y, int64_t row_begin,
                     int64_t row_end) {
  if (W.type != GgmlType::Q8_0) throw std::invalid_argument("q80_panels_vnni: not a Q8_0 matrix");
  const int64_t nb = W.cols / 256;
  panels_by_token_groups("q80_panels_vnni", W, size_t(kBlockBytes) * size_t(nb), n_tokens, Y, row_begin, row_end,
                         [&](auto size, const uint8_t* panel, int64_t t0, auto& acc) {
                           panel_tokens<decltype(size)::value>(panel, nb, xp + t0, n_tokens, acc);
                         });
}

void quantize_rows_q16_vnni(const float* x, int64_t n_tokens, int64_t cols, Q16Panel* out) {
  const int64_t nb = cols / 256;
  const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  const __m512 lo = _mm512_set1_ps(-32767.f), hi = _mm512_set1_ps(32767.f);
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t b = 0; b < nb; ++b) {
      const float* v = x + t * cols + b * 256;
      Q16Panel& q = out[b * n_tokens + t];
      __m512 mx = _mm512_setzero_ps();
      __mmask16 bad = 0;
      for (int i = 0; i < 256; i += 16) {
        const __m512 a = _mm512_abs_ps(_mm512_loadu_ps(v + i));
        mx = _mm512_max_ps(mx, a);
        bad |= _mm512_cmp_ps_mask(a, inf, _CMP_NLT_UQ);  // NaN or infinite
      }
      if (bad != 0) {
        q = Q16Panel{};
        q.d = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      const float amax = _mm512_reduce_max_ps(mx);
      q.d = amax / 32767.f;
      const float inv = 32767.f / amax;  // a block this small that it overflows: zeros (quantize_rows_q16)
      const __m512 id = _mm512_set1_ps(amax > 0.f && inv < std::numeric_limits<float>::infinity() ? inv : 0.f);
      for (int i = 0; i < 256; i += 16) {  // round to nearest even (MXCSR's default), clamped
        const __m512i w = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_mul_ps(_mm512_loadu_ps(v + i), id), lo), hi));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q.qs + i), _mm512_cvtepi32_epi16(w));
      }
    }
}
#else  // a compiler or target without AVX-512 VNNI: never dispatched to
void q80_panels_vnni(const WeightMatrix&, const Q16Panel*, int64_t, float*, int64_t, int64_t) {
  throw std::logic_error("q80_panels_vnni: this build has no AVX-512 VNNI kernels");
}
void quantize_rows_q16_vnni(const float* x, int64_t n_tokens, int64_t cols, Q16Panel* out) {
  quantize_rows_q16(x, n_tokens, cols, out);
}
#endif

}  // namespace fdl::cpu::detail
