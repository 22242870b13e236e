// AVX2/FMA build of attention (attention.h): the loop of attention_impl.h reorganized for
// throughput on small heads (8..128 floats), where the single-position loop is bound by the
// latency of its one dependency chain: scores four positions at a time, the softmax sum in
// eight double lanes, the V sum over several query heads at once. Every output's arithmetic
// is fixed by its own position and head (attention.h), never by the batch or the thread.
#include <algorithm>
#include <cmath>
#include <vector>

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
  __m256 n, p;
  simd::exp_reduce(x, n, p);
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

// Most 8-float V vectors summed together by the lane kernel below (one accumulator each).
constexpr int kMaxLanes = 8;

// The V sums of small heads (head_dim a multiple of 8, at most kMaxLaneHeadDim), several heads
// at once: lane l accumulates out_l (8 floats) += p_l[j] * V[j][voff_l .. +8) over positions
// [jb, je), where each lane may belong to a different query head *and* KV head (voff_l is its
// offset in the slot). weighted_chunk shares one V load between the heads of one KV head; at
// head dim 8 and one query head per KV head (stories260K) that left a single FMA chain per
// item, bound by its 4-cycle latency. Here up to 8 independent chains share the loop. Every
// lane performs exactly the FMA sequence of weighted_chunk (fma(p_j, v, acc), j ascending,
// from zero at jb == 0, else from `out`), so results are bit-identical to it.
template <int NL>
void weighted_lanes(const float* const* p, const int64_t* voff, float* const* out, int64_t jb, int64_t je,
                    const VRows& v) {
  __m256 acc[NL];
  for (int l = 0; l < NL; ++l) acc[l] = jb == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(out[l]);
  for (int64_t j0 = jb; j0 < je; j0 += v.block_size) {
    const int64_t n_in_block = std::min<int64_t>(v.block_size, je - j0);
    const float* vb = v.base + v.table[j0 / v.block_size] * v.block_stride;
    for (int64_t s = 0; s < n_in_block; ++s) {
      const float* vj = vb + s * v.slot_stride;
      for (int l = 0; l < NL; ++l)
        acc[l] = _mm256_fmadd_ps(_mm256_set1_ps(p[l][j0 + s]), _mm256_loadu_ps(vj + voff[l]), acc[l]);
    }
  }
  for (int l = 0; l < NL; ++l) _mm256_storeu_ps(out[l], acc[l]);
}

// weighted_lanes for the regular layout of one query head per KV head (group 1): lane l is
// vector l % VPH of head l / VPH, so its V offset and output are both 8 * l floats from the
// item's first head, and its weights are row l / VPH of p (row stride p_stride). The same FMA
// sequence per lane as weighted_lanes; it only keeps no per-lane pointers (those spilled).
template <int NL, int VPH>
void weighted_lanes_mha(const float* p, int64_t p_stride, float* out, int64_t jb, int64_t je, const VRows& v) {
  __m256 acc[NL];
  for (int l = 0; l < NL; ++l) acc[l] = jb == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(out + 8 * l);
  for (int64_t j0 = jb; j0 < je; j0 += v.block_size) {
    const int64_t n_in_block = std::min<int64_t>(v.block_size, je - j0);
    const float* vb = v.base + v.table[j0 / v.block_size] * v.block_stride;
    const float* pj = p + j0;
    for (int64_t s = 0; s < n_in_block; ++s, ++pj) {
      const float* vj = vb + s * v.slot_stride;
      for (int h = 0; h < NL / VPH; ++h) {
        const __m256 w = _mm256_set1_ps(pj[h * p_stride]);
        for (int c = 0; c < VPH; ++c)
          acc[h * VPH + c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vj + 8 * (h * VPH + c)), acc[h * VPH + c]);
      }
    }
  }
  for (int l = 0; l < NL; ++l) _mm256_storeu_ps(out + 8 * l, acc[l]);
}

// Lanes [0, n) of the regular layout in passes of 8 (4 or 2 whole heads) and a remainder
// pass; returns false when VPH does not fit (the caller then uses the generic lanes).
bool weighted_mha(int vph, int n, const float* p, int64_t p_stride, float* out, int64_t jb, int64_t je, const VRows& v) {
  const auto run = [&]<int VPH>() {
    int l = 0;
    for (; l + 8 <= n; l += 8) weighted_lanes_mha<8, VPH>(p + (l / VPH) * p_stride, p_stride, out + 8 * l, jb, je, v);
    const VRows vl{v.base + 8 * l, v.table, v.block_stride, v.slot_stride, v.block_size, v.head_dim};
    const float* pl = p + (l / VPH) * p_stride;
    switch (n - l) {
      case 0: break;
      case 4: weighted_lanes_mha<4, VPH>(pl, p_stride, out + 8 * l, jb, je, vl); break;
      case 6: if constexpr (VPH != 4) weighted_lanes_mha<6, VPH>(pl, p_stride, out + 8 * l, jb, je, vl); break;
      case 2: if constexpr (VPH != 4) weighted_lanes_mha<2, VPH>(pl, p_stride, out + 8 * l, jb, je, vl); break;
      default: if constexpr (VPH == 1) {
          for (int i = l; i < n; ++i)
            weighted_lanes_mha<1, 1>(p + i * p_stride, p_stride, out + 8 * i, jb, je,
                                     VRows{v.base + 8 * i, v.table, v.block_stride, v.slot_stride, v.block_size, v.head_dim});
        }
        break;
    }
  };
  switch (vph) {
    case 1: run.template operator()<1>(); return true;
    case 2: run.template operator()<2>(); return true;
    case 4: run.template operator()<4>(); return true;
    default: return false;
  }
}

void weighted_lanes_n(int n, const float* const* p, const int64_t* voff, float* const* out, int64_t jb, int64_t je,
                      const VRows& v) {
  switch (n) {
    case 8: return weighted_lanes<8>(p, voff, out, jb, je, v);
    case 7: return weighted_lanes<7>(p, voff, out, jb, je, v);
    case 6: return weighted_lanes<6>(p, voff, out, jb, je, v);
    case 5: return weighted_lanes<5>(p, voff, out, jb, je, v);
    case 4: return weighted_lanes<4>(p, voff, out, jb, je, v);
    case 3: return weighted_lanes<3>(p, voff, out, jb, je, v);
    case 2: return weighted_lanes<2>(p, voff, out, jb, je, v);
    default: return weighted_lanes<1>(p, voff, out, jb, je, v);
  }
}

// Query heads [kvh0*group, kvh1*group) of tokens [t0, t1) — a run of tokens of one sequence
// (they share the block table: a speculative verification, or a prompt chunk) — against KV
// heads [kvh0, kvh1). Each token's arithmetic is exactly that of running it alone, one KV
// head at a time (attention.h); tokens and heads only share the loops, so each K/V row is
// brought into L1 once for the whole run, and small heads give the V sum independent chains.
// `buf` holds (t1 - t0) * (kvh1 - kvh0) * group * max n_pos floats.
void attend_run_avx2(const PagedAttentionArgs& a, int64_t t0, int64_t t1, int kvh0, int kvh1, float* buf) {
  const PagedKvLayer& kv = a.kv;
  const int group = a.n_head / a.n_head_kv;
  const int n_kv = kvh1 - kvh0;
  const int nh = n_kv * group;  // query heads of this item
  const int64_t hd = a.head_dim;
  const int64_t steps = hd / 8;
  const int tail = int(hd % 8);
  const __m256i tail_m = simd::tail_mask(tail);
  const int64_t slot_stride = int64_t(a.n_head_kv) * hd;  // floats between token slots
  const int32_t* table = a.block_tables[t0];
  const __m128 scale4 = _mm_set1_ps(a.scale);
  int64_t max_pos = 0;
  for (int64_t t = t0; t < t1; ++t) max_pos = std::max<int64_t>(max_pos, int64_t(a.positions[t]) + 1);
  const int64_t stride = int64_t(nh) * max_pos;  // buf floats per token: [nh][n_pos]
  auto q_of = [&](int64_t t) { return a.q + (t * a.n_head + int64_t(kvh0) * group) * hd; };
  const int64_t head_off = int64_t(kvh0) * hd;  // this item's first KV head within a slot
  // With a sliding window, the run reads from the KV block holding its earliest first position;
  // positions of that stretch a token does not attend to get weight exactly 0.
  int64_t first = max_pos;
  for (int64_t t = t0; t < t1; ++t) first = std::min(first, first_position(a, t));
  const int64_t jstart = first / kv.block_size * kv.block_size;

  // Scores, block by block of the KV; within a block four positions at a time for up to
  // three heads of one KV head at once, the rest one by one.
  for (int64_t j0 = jstart; j0 < max_pos; j0 += kv.block_size) {
    const float* kb = kv.k_base + table[j0 / kv.block_size] * kv.block_stride + head_off;
    if (j0 + kv.block_size < max_pos)
      prefetch_rows(kv.k_base + table[j0 / kv.block_size + 1] * kv.block_stride + head_off, kv.block_size,
                    slot_stride, n_kv * hd);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n_pos = int64_t(a.positions[t]) + 1;
      if (j0 >= n_pos) continue;
      const int64_t n_in_block = std::min<int64_t>(kv.block_size, n_pos - j0);
      float* scores = buf + (t - t0) * stride;
      for (int c = 0; c < n_kv; ++c) {
        const float* q = q_of(t) + int64_t(c) * group * hd;
        const float* kc = kb + c * hd;
        float* sc = scores + int64_t(c) * group * n_pos;
        int64_t s = 0;
        for (; s + 4 <= n_in_block; s += 4) {
          const float* k0 = kc + s * slot_stride;
          const float* const k[4] = {k0, k0 + slot_stride, k0 + 2 * slot_stride, k0 + 3 * slot_stride};
          // Up to 3 heads per pass: 12 accumulators plus the K rows fit the 16 ymm registers.
          for (int g = 0; g < group;) {
            const int left = group - g;
            const int heads = left == 4 ? 2 : std::min(left, 3);  // 4 heads: 2 + 2, not 3 + 1
            const float* qg = q + g * hd;
            float* sg = sc + g * n_pos;
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
            sc[g * n_pos + j0 + s] =
                simd::hsum_canonical(dot_lanes(q + g * hd, kc + s * slot_stride, steps, tail, tail_m)) * a.scale;
      }
    }
  }
  // Softmax per token and head (fp32 exponentials, double sum); the normalizer is folded
  // into the weights before the V sum.
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t n_pos = int64_t(a.positions[t]) + 1;
    const int64_t lo = first_position(a, t), s8 = softmax_start(lo);
    if (a.softcap > 0) soft_cap_scores(buf + (t - t0) * stride, nh, n_pos, lo, a.softcap);
    for (int h = 0; h < nh; ++h) {
      float* sg = buf + (t - t0) * stride + h * n_pos;
      std::fill(sg + std::min(jstart, s8), sg + lo, -INFINITY);
      const float inv_sum = float(1.0 / exp_sum(sg + s8, n_pos - s8, max_of(sg + s8, n_pos - s8)));
      scale_in_place(sg + s8, n_pos - s8, inv_sum);
      if (jstart < s8) std::fill(sg + jstart, sg + s8, 0.f);  // read by the V sum, outside the softmax
    }
  }
  // V sums, window by window of positions (a whole number of KV blocks), every token of the
  // run per window.
  const VRows v{kv.v_base + head_off, table, kv.block_stride, slot_stride, kv.block_size, hd};
  const int64_t window = std::max<int64_t>(1, kVWindowPositions / kv.block_size) * kv.block_size;
  const bool lanes = hd % 8 == 0 && hd <= kMaxLaneHeadDim;
  const int vecs = int(hd / 8);  // lane path: vectors per head
  // The V sums start from zero at jb == 0, else from `out`: from zeros at a later start.
  if (jstart > 0)
    for (int64_t t = t0; t < t1; ++t) {
      float* out = a.out + (t * a.n_head + int64_t(kvh0) * group) * hd;
      std::fill(out, out + int64_t(nh) * hd, 0.f);
    }
  for (int64_t jb = jstart; jb < max_pos; jb += window) {
    for (int64_t j = jb + window; j < std::min(jb + 2 * window, max_pos); j += kv.block_size)
      prefetch_rows(v.base + table[j / kv.block_size] * kv.block_stride, std::min<int64_t>(kv.block_size, max_pos - j),
                    slot_stride, n_kv * hd);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t n_pos = int64_t(a.positions[t]) + 1;
      if (jb >= n_pos) continue;
      const int64_t je = std::min(jb + window, n_pos);
      float* out = a.out + (t * a.n_head + int64_t(kvh0) * group) * hd;
      const float* p = buf + (t - t0) * stride;
      if (!lanes) {
        for (int c = 0; c < n_kv; ++c) {
          const VRows vc{v.base + c * hd, table, kv.block_stride, slot_stride, kv.block_size, hd};
          weighted_v_sums(p + int64_t(c) * group * n_pos, n_pos, jb, je, group, vc, out + int64_t(c) * group * hd);
        }
        continue;
      }
      const int n_lanes = nh * vecs;
      if (group == 1 && weighted_mha(vecs, n_lanes, p, n_pos, out, jb, je, v)) continue;
      // Lane i = (query head h, vector c) of this item, in passes of up to kMaxLanes.
      for (int i0 = 0; i0 < n_lanes; i0 += kMaxLanes) {
        const int n = std::min(kMaxLanes, n_lanes - i0);
        const float* pl[kMaxLanes];
        int64_t voff[kMaxLanes];
        float* ol[kMaxLanes];
        for (int l = 0; l < n; ++l) {
          const int h = (i0 + l) / vecs, c = (i0 + l) % vecs;
          pl[l] = p + int64_t(h) * n_pos;
          voff[l] = int64_t(h / group) * hd + 8 * c;
          ol[l] = out + int64_t(h) * hd + 8 * c;
        }
        weighted_lanes_n(n, pl, voff, ol, jb, je, v);
      }
    }
  }
}

// A tree token (PagedAttentionArgs::tree_slots) against KV heads [kvh0, kvh1), position by
// position through its slot list. The arithmetic per position and head is that of
// attend_run_avx2: the score is dot_lanes + hsum_canonical (which the four-position tiles
// reproduce exactly), the softmax is the same exp_sum/scale over the same virtual-position
// array, and each V output vector is the chain fma(p_j, V_j, acc) from zero, j ascending,
// that weighted_chunk and weighted_lanes perform. So the output equals an ordinary token's
// at the end of the same path, bit for bit. The row offsets are computed once per token (an
// integer division per position and head was most of the cost), and up to 8 output vectors
// (heads x vectors of a head) are summed together, as independent FMA chains.
// `buf` holds group * (positions[t] + 1) floats.
void attend_tree_avx2(const PagedAttentionArgs& a, int64_t t, int kvh0, int kvh1, float* buf) {
  const int group = a.n_head / a.n_head_kv;
  const int64_t hd = a.head_dim;
  const int64_t steps = hd / 8;
  const int tail = int(hd % 8);
  const __m256i tail_m = simd::tail_mask(tail);
  const int64_t n_pos = int64_t(a.positions[t]) + 1;
  const int64_t lo = first_position(a, t), s8 = softmax_start(lo);
  const VRows rows = v_rows(a, t, 0);
  // Grows to the longest context seen, then allocates nothing.
  thread_local std::vector<int64_t> offset;
  if (offset.size() < size_t(n_pos)) offset.resize(size_t(n_pos));
  for (int64_t j = lo; j < n_pos; ++j) {
    const int64_t s = rows.slot(j);
    offset[size_t(j)] = rows.table[s / rows.block_size] * rows.block_stride + (s % rows.block_size) * rows.slot_stride;
  }
  const int nvec = int((hd + 7) / 8);
  const int n_lanes = group * nvec;  // output vectors of one KV head's query heads
  for (int kvh = kvh0; kvh < kvh1; ++kvh) {
    const float* kb = a.kv.k_base + kvh * hd;
    const float* vb = a.kv.v_base + kvh * hd;
    const float* q = a.q + (t * a.n_head + int64_t(kvh) * group) * hd;
    float* out = a.out + (t * a.n_head + int64_t(kvh) * group) * hd;
    for (int64_t j = lo; j < n_pos; ++j) {
      const float* kj = kb + offset[size_t(j)];
      for (int g = 0; g < group; ++g)
        buf[g * n_pos + j] = simd::hsum_canonical(dot_lanes(q + g * hd, kj, steps, tail, tail_m)) * a.scale;
    }
    if (a.softcap > 0) soft_cap_scores(buf, group, n_pos, lo, a.softcap);
    for (int g = 0; g < group; ++g) {
      float* sg = buf + g * n_pos;
      std::fill(sg + s8, sg + lo, -INFINITY);
      const float inv_sum = float(1.0 / exp_sum(sg + s8, n_pos - s8, max_of(sg + s8, n_pos - s8)));
      scale_in_place(sg + s8, n_pos - s8, inv_sum);
    }
    for (int l0 = 0; l0 < n_lanes; l0 += kMaxLanes) {
      const int n = std::min(kMaxLanes, n_lanes - l0);
      __m256 acc[kMaxLanes];
      const float* p[kMaxLanes];
      int64_t col[kMaxLanes];
      bool part[kMaxLanes];
      for (int l = 0; l < n; ++l) {
        const int g = (l0 + l) / nvec, c = (l0 + l) % nvec;
        acc[l] = _mm256_setzero_ps();
        p[l] = buf + g * n_pos;
        col[l] = int64_t(g) * hd + 8 * c;  // offset in `out`; the V offset is 8 * c
        part[l] = tail > 0 && c == nvec - 1;
      }
      for (int64_t j = lo; j < n_pos; ++j) {
        const float* vj = vb + offset[size_t(j)];
        for (int l = 0; l < n; ++l) {
          const float* v = vj + col[l] % hd;
          acc[l] = _mm256_fmadd_ps(_mm256_set1_ps(p[l][j]), part[l] ? _mm256_maskload_ps(v, tail_m) : _mm256_loadu_ps(v),
                                   acc[l]);
        }
      }
      for (int l = 0; l < n; ++l) {
        if (part[l]) _mm256_maskstore_ps(out + col[l], tail_m, acc[l]);
        else _mm256_storeu_ps(out + col[l], acc[l]);
      }
    }
  }
}

}  // namespace

void attention_runs_avx2(const PagedAttentionArgs& a, const int64_t* run_starts, int kv_per_item, int64_t begin,
                         int64_t end, float* buf) {
  const int64_t items_per_run = a.n_head_kv / kv_per_item;
  for (int64_t i = begin; i < end; ++i) {
    const int64_t r = i / items_per_run;
    const int kvh0 = int(i % items_per_run) * kv_per_item;
    if (a.tree_slots != nullptr && a.tree_slots[run_starts[r]] != nullptr)
      attend_tree_avx2(a, run_starts[r], kvh0, kvh0 + kv_per_item, buf);
    else
      attend_run_avx2(a, run_starts[r], run_starts[r + 1], kvh0, kvh0 + kv_per_item, buf);
  }
}

#else  // Built without AVX2 (non-x86 target): never dispatched to; keep the symbol defined.
void attention_runs_avx2(const PagedAttentionArgs& a, const int64_t* run_starts, int kv_per_item, int64_t begin,
                         int64_t end, float* buf) {
  const int64_t items_per_run = a.n_head_kv / kv_per_item;
  for (int64_t i = begin; i < end; ++i) {
    const int64_t r = i / items_per_run;
    for (int64_t t = run_starts[r]; t < run_starts[r + 1]; ++t)
      for (int c = 0; c < kv_per_item; ++c) {
        const int64_t item = t * a.n_head_kv + int(i % items_per_run) * kv_per_item + c;
        attention_items_portable(a, item, item + 1, buf);
      }
  }
}
#endif

}  // namespace fdl::cpu::detail
