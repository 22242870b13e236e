// AVX2/FMA build of attention (attention.h): the loop of attention_impl.h reorganized for
// throughput on small heads (8..128 floats), where the single-position loop is bound by the
// latency of its one dependency chain: scores four positions at a time, the softmax sum in
// eight double lanes, the V sum over several query heads at once. Every output's arithmetic
// is fixed by its own position and head (attention.h), never by the batch or the thread.
#include <algorithm>
#include <cmath>

#include "backend/cpu/attention_impl.h"
#include "backend/cpu/simd_avx2.h"

namespace fdl::cpu::detail {

#if FDL_HAVE_AVX2
namespace {

// exp(x) for the x <= 0 of a softmax: x = n*ln2 + r with |r| <= ln2/2, e^r by its degree-6
// Taylor polynomial (error < 2e-7 relative), scaled by 2^n through the exponent bits.
// Inputs below -87.3 (results under FLT_MIN, < 1e-38 of the largest weight) give 0.
inline __m256 exp_nonpositive(__m256 x) {
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

// One query head against one K row: an 8-lane FMA accumulator over the head, lanes combined
// in the canonical order (simd::hsum_canonical).
inline __m256 dot_lanes(const float* q, const float* k, int64_t steps, int tail, __m256i tail_m) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < steps; ++i) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + 8 * i), _mm256_loadu_ps(k + 8 * i), acc);
  if (tail > 0) acc = _mm256_fmadd_ps(_mm256_maskload_ps(q + 8 * steps, tail_m), _mm256_maskload_ps(k + 8 * steps, tail_m), acc);
  return acc;
}

// G query heads (q: G rows at stride hd) against four K rows at once: 4G independent FMA
// chains (the single-row loop is latency-bound on its one chain) sharing each K load, and
// one combined lane reduction per head. Each score is the arithmetic of dot_lanes +
// hsum_canonical exactly, so a position's score does not depend on whether it was computed
// in a group, nor on the group's heads. out[g] = the four scores of head g, times `scale`.
template <int G>
inline void dot_heads4(const float* q, int64_t hd, const float* const k[4], int64_t steps, int tail,
                       __m256i tail_m, __m128 scale, __m128 out[G]) {
  __m256 acc[G][4];
  for (int g = 0; g < G; ++g)
    for (int p = 0; p < 4; ++p) acc[g][p] = _mm256_setzero_ps();
  for (int64_t i = 0; i < steps; ++i) {
    __m256 kv[4];
    for (int p = 0; p < 4; ++p) kv[p] = _mm256_loadu_ps(k[p] + 8 * i);
    for (int g = 0; g < G; ++g) {
      const __m256 qv = _mm256_loadu_ps(q + g * hd + 8 * i);
      for (int p = 0; p < 4; ++p) acc[g][p] = _mm256_fmadd_ps(qv, kv[p], acc[g][p]);
    }
  }
  if (tail > 0) {
    __m256 kv[4];
    for (int p = 0; p < 4; ++p) kv[p] = _mm256_maskload_ps(k[p] + 8 * steps, tail_m);
    for (int g = 0; g < G; ++g) {
      const __m256 qv = _mm256_maskload_ps(q + g * hd + 8 * steps, tail_m);
      for (int p = 0; p < 4; ++p) acc[g][p] = _mm256_fmadd_ps(qv, kv[p], acc[g][p]);
    }
  }
  for (int g = 0; g < G; ++g)
    out[g] = _mm_mul_ps(simd::hsum4_canonical(acc[g][0], acc[g][1], acc[g][2], acc[g][3]), scale);
}

// Scores of heads [g0, g0 + G) for the four positions starting at scores column j.
template <int G>
inline void score_heads4(const float* q, int64_t hd, const float* const k[4], int64_t steps, int tail,
                         __m256i tail_m, __m128 scale, float* scores, int64_t n_pos, int64_t j) {
  __m128 out[G];
  dot_heads4<G>(q, hd, k, steps, tail, tail_m, scale, out);
  for (int g = 0; g < G; ++g) _mm_storeu_ps(scores + g * n_pos + j, out[g]);
}

float max_of(const float* s, int64_t n) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(s + j));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float r = -INFINITY;
  for (float x : lanes) r = std::max(r, x);
  for (; j < n; ++j) r = std::max(r, s[j]);
  return r;  // max is exact: the order of comparisons does not change it
}

// s[j] = exp(s[j] - max) for j < n; returns their sum in double, accumulated in eight
// lanes (lane l: the j = l mod 8, increasing j) combined as ((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7)).
// A fixed order that depends on n only (a serial sum of n terms would be a chain of n
// dependent double additions, the bottleneck of small heads).
double exp_sum(float* s, int64_t n, float max) {
  const __m256 vmax = _mm256_set1_ps(max);
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();  // lanes 0-3, 4-7
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmax));
    _mm256_storeu_ps(s + j, e);
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  if (j < n) {
    const __m256i m = simd::tail_mask(n - j);
    // Lanes past n are zeroed (exp of the padding would be 1), so they add exactly nothing.
    const __m256 e = _mm256_and_ps(exp_nonpositive(_mm256_sub_ps(_mm256_maskload_ps(s + j, m), vmax)),
                                   _mm256_castsi256_ps(m));
    _mm256_maskstore_ps(s + j, m, e);
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double u[4];
  _mm256_store_pd(u, _mm256_add_pd(lo, hi));  // u_l = a_l + a_{l+4}
  return (u[0] + u[2]) + (u[1] + u[3]);
}

void scale_in_place(float* s, int64_t n, float f) {
  const __m256 v = _mm256_set1_ps(f);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_loadu_ps(s + j), v));
  for (; j < n; ++j) s[j] *= f;
}

// out[g][c0 .. c0 + 8*K (+ a masked partial vector when Tail)) += sum_j p[g][j] * V[j] over
// positions [jb, je) (jb a multiple of the block size), for G heads sharing the KV head, with
// the accumulators in registers across those positions; each V vector is loaded once for the
// G heads. The accumulators start at zero when jb == 0, else from `out` (storing and
// reloading a float is exact), so a sum cut into position windows performs exactly the FMA
// sequence of one pass over j ascending — whatever K, G and the windows are (G > 1 only adds
// independent chains for small heads, whose single chain would be latency-bound).
template <int K, bool Tail, int G>
void weighted_chunk(const float* p, int64_t p_stride, int64_t jb, int64_t je, const VRows& v, int64_t c0, __m256i m,
                    float* out, int64_t out_stride) {
  constexpr int NV = K + (Tail ? 1 : 0);
  constexpr int kSlots = NV > 0 ? NV : 1;  // <0, false> is instantiated by the switch, never run
  __m256 acc[G][kSlots];
  for (int g = 0; g < G; ++g) {
    float* og = out + g * out_stride + c0;
    for (int k = 0; k < K; ++k) acc[g][k] = jb == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(og + 8 * k);
    if constexpr (Tail) acc[g][K] = jb == 0 ? _mm256_setzero_ps() : _mm256_maskload_ps(og + 8 * K, m);
  }
  for (int64_t j0 = jb; j0 < je; j0 += v.block_size) {
    const int64_t n_in_block = std::min<int64_t>(v.block_size, je - j0);
    const float* vb = v.base + v.table[j0 / v.block_size] * v.block_stride + c0;
    for (int64_t s = 0; s < n_in_block; ++s) {
      const float* vj = vb + s * v.slot_stride;
      __m256 vv[kSlots];
      for (int k = 0; k < K; ++k) vv[k] = _mm256_loadu_ps(vj + 8 * k);
      if constexpr (Tail) vv[K] = _mm256_maskload_ps(vj + 8 * K, m);
      for (int g = 0; g < G; ++g) {
        const __m256 pj = _mm256_set1_ps(p[g * p_stride + j0 + s]);
        for (int k = 0; k < NV; ++k) acc[g][k] = _mm256_fmadd_ps(pj, vv[k], acc[g][k]);
      }
    }
  }
  for (int g = 0; g < G; ++g) {
    float* og = out + g * out_stride + c0;
    for (int k = 0; k < K; ++k) _mm256_storeu_ps(og + 8 * k, acc[g][k]);
    if constexpr (Tail) _mm256_maskstore_ps(og + 8 * K, m, acc[g][K]);
  }
}

template <bool Tail, int G>
void weighted_chunk_k(int k, const float* p, int64_t p_stride, int64_t jb, int64_t je, const VRows& v, int64_t c0,
                      __m256i m, float* out, int64_t out_stride) {
  switch (k) {
    case 0: return weighted_chunk<0, Tail, G>(p, p_stride, jb, je, v, c0, m, out, out_stride);
    case 1: return weighted_chunk<1, Tail, G>(p, p_stride, jb, je, v, c0, m, out, out_stride);
    case 2: return weighted_chunk<2, Tail, G>(p, p_stride, jb, je, v, c0, m, out, out_stride);
    case 3: return weighted_chunk<3, Tail, G>(p, p_stride, jb, je, v, c0, m, out, out_stride);
    case 4: return weighted_chunk<4, Tail, G>(p, p_stride, jb, je, v, c0, m, out, out_stride);
    case 5: return weighted_chunk<5, Tail, G>(p, p_stride, jb, je, v, c0, m, out, out_stride);
    case 6: return weighted_chunk<6, Tail, G>(p, p_stride, jb, je, v, c0, m, out, out_stride);
    case 7: return weighted_chunk<7, Tail, G>(p, p_stride, jb, je, v, c0, m, out, out_stride);
    default: return weighted_chunk<8, Tail, G>(p, p_stride, jb, je, v, c0, m, out, out_stride);
  }
}

// Heads processed together in the V sum: enough chains to hide the FMA latency while the
// accumulators (G x vectors per head) stay within the 16 ymm registers.
template <bool Tail>
void weighted_heads(int heads, int k, const float* p, int64_t p_stride, int64_t jb, int64_t je, const VRows& v,
                    int64_t c0, __m256i m, float* out, int64_t out_stride) {
  switch (heads) {
    case 4: return weighted_chunk_k<Tail, 4>(k, p, p_stride, jb, je, v, c0, m, out, out_stride);
    case 3: return weighted_chunk_k<Tail, 3>(k, p, p_stride, jb, je, v, c0, m, out, out_stride);
    case 2: return weighted_chunk_k<Tail, 2>(k, p, p_stride, jb, je, v, c0, m, out, out_stride);
    default: return weighted_chunk_k<Tail, 1>(k, p, p_stride, jb, je, v, c0, m, out, out_stride);
  }
}

// out[g] (+)= sum_{j in [jb, je)} p[g][j] * V[j] for the `group` heads of one KV head (p: rows
// of n_pos weights), in chunks of up to 64 floats of the head (8 ymm accumulators per head).
void weighted_v_sums(const float* p, int64_t n_pos, int64_t jb, int64_t je, int group, const VRows& v, float* out) {
  for (int64_t c0 = 0; c0 < v.head_dim; c0 += 64) {
    const int64_t width = std::min<int64_t>(64, v.head_dim - c0);
    const int vecs = int((width + 7) / 8);
    const int per_pass = std::max(1, std::min(4, 8 / vecs));  // heads sharing each V load
    const __m256i m = simd::tail_mask(width % 8);
    for (int g = 0; g < group; g += per_pass) {
      const int heads = std::min(per_pass, group - g);
      const float* pg = p + g * n_pos;
      float* og = out + g * v.head_dim;
      if (width % 8 != 0) weighted_heads<true>(heads, int(width / 8), pg, n_pos, jb, je, v, c0, m, og, v.head_dim);
      else weighted_heads<false>(heads, int(width / 8), pg, n_pos, jb, je, v, c0, m, og, v.head_dim);
    }
  }
}

// Hints rows [0, n) (stride `stride` floats, `len` floats each) of the next KV block into
// the caches while the current one is computed on: blocks are scattered in the arena, so the
// hardware prefetchers only pick a block's stream up after its first misses.
inline void prefetch_rows(const float* first, int64_t n, int64_t stride, int64_t len) {
  for (int64_t r = 0; r < n; ++r)
    for (int64_t off = 0; off < len; off += 16) _mm_prefetch(reinterpret_cast<const char*>(first + r * stride + off), _MM_HINT_T0);
}

// Positions per window of the V sum: 64 rows of one KV head (16 KiB at head dim 64) stay in
// L1 while every token of the run reads them.
constexpr int64_t kVWindowPositions = 64;

// Query heads [kvh*group, (kvh+1)*group) of tokens [t0, t1) — a run of tokens of one sequence
// (they share the block table: a speculative verification, or a prompt chunk) — against KV
// head kvh. Each token's arithmetic is exactly that of running it alone (attention.h); the
// tokens only share the loops, so each K/V row is brought into L1 once for the whole run
// instead of once per token. `buf` holds (t1 - t0) * group * max n_pos floats.
void attend_run_avx2(const PagedAttentionArgs& a, int64_t t0, int64_t t1, int kvh, float* buf) {
  const PagedKvLayer& kv = a.kv;
  const int group = a.n_head / a.n_head_kv;
  const int64_t hd = a.head_dim;
  const int64_t steps = hd / 8;
  const int tail = int(hd % 8);
  const __m256i tail_m = simd::tail_mask(tail);
  const int64_t slot_stride = int64_t(a.n_head_kv) * hd;  // floats between token slots
  const int32_t* table = a.block_tables[t0];
  const __m128 scale4 = _mm_set1_ps(a.scale);
  int64_t max_pos = 0;
  for (int64_t t = t0; t < t1; ++t) max_pos = std::max<int64_t>(max_pos, int64_t(a.positions[t]) + 1);
  const int64_t stride = int64_t(group) * max_pos;  // buf floats per token: [group][n_pos]
  auto q_of = [&](int64_t t) { return a.q + (t * a.n_head + int64_t(kvh) * group) * hd; };

  // Scores, block by block of the KV; within a block four positions at a time for up to
  // three heads at once, the rest one by one.
  for (int64_t j0 = 0; j0 < max_pos; j0 += kv.block_size) {
    const float* kb = kv.k_base + table[j0 / kv.block_size] * kv.block_stride + kvh * hd;
    if (j0 + kv.block_size < max_pos)
      prefetch_rows(kv.k_base + table[j0 / kv.block_size + 1] * kv.block_stride + kvh * hd, kv.block_size,
                    slot_stride, hd);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n_pos = int64_t(a.positions[t]) + 1;
      if (j0 >= n_pos) continue;
      const int64_t n_in_block = std::min<int64_t>(kv.block_size, n_pos - j0);
      const float* q = q_of(t);
      float* scores = buf + (t - t0) * stride;
      int64_t s = 0;
      for (; s + 4 <= n_in_block; s += 4) {
        const float* k0 = kb + s * slot_stride;
        const float* const k[4] = {k0, k0 + slot_stride, k0 + 2 * slot_stride, k0 + 3 * slot_stride};
        // Up to 3 heads per pass: 12 accumulators plus the K rows fit the 16 ymm registers.
        for (int g = 0; g < group;) {
          const int left = group - g;
          const int heads = left == 4 ? 2 : std::min(left, 3);  // 4 heads: 2 + 2, not 3 + 1
          const float* qg = q + g * hd;
          float* sg = scores + g * n_pos;
          switch (heads) {
            case 3: score_heads4<3>(qg, hd, k, steps, tail, tail_m, scale4, sg, n_pos, j0 + s); break;
            case 2: score_heads4<2>(qg, hd, k, steps, tail, tail_m, scale4, sg, n_pos, j0 + s); break;
            default: score_heads4<1>(qg, hd, k, steps, tail, tail_m, scale4, sg, n_pos, j0 + s); break;
          }
          g += heads;
        }
      }
      for (; s < n_in_block; ++s)
        for (int g = 0; g < group; ++g)
          scores[g * n_pos + j0 + s] =
              simd::hsum_canonical(dot_lanes(q + g * hd, kb + s * slot_stride, steps, tail, tail_m)) * a.scale;
    }
  }
  // Softmax per token and head (fp32 exponentials, double sum); the normalizer is folded
  // into the weights before the V sum.
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n_pos = int64_t(a.positions[t]) + 1;
    for (int g = 0; g < group; ++g) {
      float* sg = buf + (t - t0) * stride + g * n_pos;
      const float inv_sum = float(1.0 / exp_sum(sg, n_pos, max_of(sg, n_pos)));
      scale_in_place(sg, n_pos, inv_sum);
    }
  }
  // V sums, window by window of positions (a whole number of KV blocks), every token of the
  // run per window.
  const VRows v{kv.v_base + kvh * hd, table, kv.block_stride, slot_stride, kv.block_size, hd};
  const int64_t window = std::max<int64_t>(1, kVWindowPositions / kv.block_size) * kv.block_size;
  for (int64_t jb = 0; jb < max_pos; jb += window) {
    for (int64_t j = jb + window; j < std::min(jb + 2 * window, max_pos); j += kv.block_size)
      prefetch_rows(v.base + table[j / kv.block_size] * kv.block_stride, std::min<int64_t>(kv.block_size, max_pos - j),
                    slot_stride, hd);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n_pos = int64_t(a.positions[t]) + 1;
      if (jb >= n_pos) continue;
      float* out = a.out + (t * a.n_head + int64_t(kvh) * group) * hd;
      weighted_v_sums(buf + (t - t0) * stride, n_pos, jb, std::min(jb + window, n_pos), group, v, out);
    }
  }
}

}  // namespace

void attention_runs_avx2(const PagedAttentionArgs& a, const int64_t* run_starts, int64_t begin, int64_t end,
                         float* buf) {
  for (int64_t i = begin; i < end; ++i) {
    const int64_t r = i / a.n_head_kv;
    attend_run_avx2(a, run_starts[r], run_starts[r + 1], int(i % a.n_head_kv), buf);
  }
}

#else  // Built without AVX2 (non-x86 target): never dispatched to; keep the symbol defined.
void attention_runs_avx2(const PagedAttentionArgs& a, const int64_t* run_starts, int64_t begin, int64_t end,
                         float* buf) {
  for (int64_t i = begin; i < end; ++i) {
    const int64_t r = i / a.n_head_kv;
    for (int64_t t = run_starts[r]; t < run_starts[r + 1]; ++t) {
      const int64_t item = t * a.n_head_kv + i % a.n_head_kv;
      attention_items_portable(a, item, item + 1, buf);
    }
  }
}
#endif

}  // namespace fdl::cpu::detail
