// AVX2/FMA build of the attention loop (attention_impl.h): dot and axpy inlined into the loop
// over positions, which matters for the small head dims (8..128) of attention.
#include <algorithm>

#include "backend/cpu/attention_impl.h"
#include "backend/cpu/simd_avx2.h"

namespace fdl::cpu::detail {

#if FDL_HAVE_AVX2
namespace {

struct VecAvx2 {
  // One 8-lane FMA accumulator over the head; lanes combined in the canonical order.
  static float dot(const float* a, const float* b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    if (i < n) {
      const __m256i m = simd::tail_mask(n - i);
      acc = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), acc);
    }
    return simd::hsum_canonical(acc);
  }
  // exp(x) for the x <= 0 of a softmax: x = n*ln2 + r with |r| <= ln2/2, e^r by its degree-6
  // Taylor polynomial (error < 2e-7 relative), scaled by 2^n through the exponent bits.
  // Inputs below -87.3 (results under FLT_MIN, < 1e-38 of the largest weight) give 0.
  static __m256 exp_nonpositive(__m256 x) {
    const __m256 too_small = _mm256_cmp_ps(x, _mm256_set1_ps(-87.33f), _CMP_LT_OQ);
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.33f));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145752f), x);  // ln2 high part
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860677e-6f), r);       // ln2 low part
    __m256 p = _mm256_set1_ps(1.f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
    const __m256i scale = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(too_small, _mm256_mul_ps(p, _mm256_castsi256_ps(scale)));
  }
  static double exp_sum(float* s, int64_t n, float max) {
    const __m256 vmax = _mm256_set1_ps(max);
    double sum = 0.0;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      _mm256_storeu_ps(s + j, exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmax)));
      for (int l = 0; l < 8; ++l) sum += double(s[j + l]);
    }
    if (j < n) {
      const __m256i m = simd::tail_mask(n - j);
      _mm256_maskstore_ps(s + j, m, exp_nonpositive(_mm256_sub_ps(_mm256_maskload_ps(s + j, m), vmax)));
      for (; j < n; ++j) sum += double(s[j]);
    }
    return sum;
  }
  // out[0 .. 8*K) (+ a masked partial vector when `tail`) = sum_j p[j] * V[j], with the
  // accumulators in registers across all positions (K is a compile-time count so they are
  // not spilled). Same per-lane FMA sequence as accumulating in memory.
  template <int K, bool Tail>
  static void weighted_chunk(const float* p, int64_t n_pos, const VRows& v, int64_t c0, __m256i m,
                             float* out) {
    __m256 acc[K + 1];
    for (int k = 0; k <= K; ++k) acc[k] = _mm256_setzero_ps();
    for (int64_t j0 = 0; j0 < n_pos; j0 += v.block_size) {
      const int64_t n_in_block = std::min<int64_t>(v.block_size, n_pos - j0);
      const float* vb = v.base + v.table[j0 / v.block_size] * v.block_stride + c0;
      for (int64_t s = 0; s < n_in_block; ++s) {
        const float* vj = vb + s * v.slot_stride;
        const __m256 pj = _mm256_set1_ps(p[j0 + s]);
        for (int k = 0; k < K; ++k) acc[k] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * k), acc[k]);
        if constexpr (Tail) acc[K] = _mm256_fmadd_ps(pj, _mm256_maskload_ps(vj + 8 * K, m), acc[K]);
      }
    }
    for (int k = 0; k < K; ++k) _mm256_storeu_ps(out + c0 + 8 * k, acc[k]);
    if constexpr (Tail) _mm256_maskstore_ps(out + c0 + 8 * K, m, acc[K]);
  }
  template <bool Tail>
  static void weighted_chunk_k(int k, const float* p, int64_t n_pos, const VRows& v, int64_t c0,
                               __m256i m, float* out) {
    switch (k) {
      case 0: return weighted_chunk<0, Tail>(p, n_pos, v, c0, m, out);
      case 1: return weighted_chunk<1, Tail>(p, n_pos, v, c0, m, out);
      case 2: return weighted_chunk<2, Tail>(p, n_pos, v, c0, m, out);
      case 3: return weighted_chunk<3, Tail>(p, n_pos, v, c0, m, out);
      case 4: return weighted_chunk<4, Tail>(p, n_pos, v, c0, m, out);
      case 5: return weighted_chunk<5, Tail>(p, n_pos, v, c0, m, out);
      case 6: return weighted_chunk<6, Tail>(p, n_pos, v, c0, m, out);
      case 7: return weighted_chunk<7, Tail>(p, n_pos, v, c0, m, out);
      default: return weighted_chunk<8, Tail>(p, n_pos, v, c0, m, out);
    }
  }
  // The head is processed in chunks of up to 64 floats (8 ymm accumulators).
  static void weighted_v_sum(const float* p, int64_t n_pos, const VRows& v, float* out) {
    for (int64_t c0 = 0; c0 < v.head_dim; c0 += 64) {
      const int64_t width = std::min<int64_t>(64, v.head_dim - c0);
      const __m256i m = simd::tail_mask(width % 8);
      if (width % 8 != 0) {
        weighted_chunk_k<true>(int(width / 8), p, n_pos, v, c0, m, out);
      } else {
        weighted_chunk_k<false>(int(width / 8), p, n_pos, v, c0, m, out);
      }
    }
  }
};

}  // namespace

void attention_items_avx2(const PagedAttentionArgs& a, int64_t begin, int64_t end, float* buf) {
  for (int64_t i = begin; i < end; ++i) attend_group<VecAvx2>(a, i / a.n_head_kv, int(i % a.n_head_kv), buf);
}

#else  // Built without AVX2 (non-x86 target): never dispatched to; keep the symbol defined.
void attention_items_avx2(const PagedAttentionArgs& a, int64_t begin, int64_t end, float* buf) {
  attention_items_portable(a, begin, end, buf);
}
#endif

}  // namespace fdl::cpu::detail
