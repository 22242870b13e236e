// attention_fold.cuh — the fold of chunk partials that batch-invariant attention steps use
// (attention_mma.cu computes the partials; attention.cu folds a decode step's). Device code
// only; include from .cu files.
//
// A chunk (64 KV positions at fixed absolute positions) gives a partial of its own: its
// maximum score mc (log2 units; -inf when every position is masked), l_c (the sum of
// exp2(s - mc) over its positions) and O_c (P·V from zero). A state (m, l, O) starts at
// (-inf, 0, 0) and takes the chunks of its 256-position share in order:
//   keep = exp2(m - max(m, mc)), take = exp2(mc - max(m, mc)), m = max(m, mc),
//   l = l * keep + l_c * take, O = O * keep + O_c * take   (one fma over one product each);
// a chunk with mc = -inf leaves the state as it is (skipped). Every kernel that folds calls these, so a
// row's bits do not depend on which kernel folded it.
#pragma once

#include <cmath>

namespace fdl::cuda {

/// ln 2: a share's partial stores its maximum in natural-log units (attn_combine_kernel's).
constexpr float kFoldLn2 = 0.6931471805599453f;

/// The weights of folding a chunk of maximum mc into a state of maximum m (updated); false
/// (nothing to fold, the state stays as it is) when the chunk has nothing unmasked.
__device__ __forceinline__ bool fold_weights(float mc, float& m, float& keep, float& take) {
  if (mc == -INFINITY) return false;
  const float mn = fmaxf(m, mc);
  keep = exp2f(m - mn);  // 0 from the empty state
  take = exp2f(mc - mn);
  m = mn;
  return true;
}

/// run * keep + chunk * take, rounded the same way everywhere.
__device__ __forceinline__ float fold(float run, float keep, float chunk, float take) {
  return __fmaf_rn(run, keep, __fmul_rn(chunk, take));
}

/// A share's maximum as its partial stores it.
__device__ __forceinline__ float share_max(float m) { return m == -INFINITY ? -INFINITY : m * kFoldLn2; }

/// Threads of the merge of a row's split partials (attn_combine_kernel, attn_fold_combine_kernel
/// and the invariant decode block): part of the arithmetic, since block_reduce's order follows
/// it.
__host__ __device__ constexpr int combine_threads(int hd) { return hd < 128 ? (hd + 31) / 32 * 32 : 128; }

/// The maximum (is_max) or sum of v over the first n_threads threads of the block (a whole
/// number of warps; the others' v is ignored): a butterfly in each warp, then the warps'
/// results in order. Every thread of the block must call it and gets the result; `red` holds
/// one float per warp.
__device__ __forceinline__ float block_reduce(float v, bool is_max, float* red, int n_threads) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, ov) : v + ov;
  }
  const int n_warps = (n_threads + 31) / 32;
  __syncthreads();  // red may still be read by a previous reduction
  if ((threadIdx.x & 31) == 0 && int(threadIdx.x) < n_threads) red[threadIdx.x / 32] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < n_warps; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
  return r;
}

/// A float of a partial record: through L2 from global memory (another block of the grid may
/// have written it) or from this block's shared-memory copy.
template <bool kShared>
__device__ __forceinline__ float load_record(const float* p) {
  if constexpr (kShared)
    return *p;
  else
    return __ldcg(p);
}

/// combine_row on records in global memory (kShared false) or shared memory.
template <bool kShared, typename Out>
__device__ __forceinline__ void combine_row_from(const float* p, Out out, int n_splits, int hd, float* weight,
                                                 float* red, int n_threads) {
  const int rec = hd + 2, tid = threadIdx.x;
  float mx = -INFINITY;
  const int first = tid < n_threads ? tid : n_splits;  // threads past n_threads take no splits
  for (int s = first; s < n_splits; s += n_threads) mx = fmaxf(mx, load_record<kShared>(p + int64_t(s) * rec + hd));
  mx = block_reduce(mx, true, red, n_threads);
  float l = 0.f;
  for (int s = first; s < n_splits; s += n_threads) {
    const float m_s = load_record<kShared>(p + int64_t(s) * rec + hd);
    const float w = m_s == -INFINITY ? 0.f : expf(m_s - mx);  // -inf: a split past the context
    weight[s] = w;
    l += load_record<kShared>(p + int64_t(s) * rec + hd + 1) * w;
  }
  l = block_reduce(l, false, red, n_threads);  // its barriers also publish `weight`
  for (int d = tid < n_threads ? tid : hd; d < hd; d += n_threads) {
    float o = 0.f;
#pragma unroll 8
    for (int s = 0; s < n_splits; ++s) o += load_record<kShared>(p + int64_t(s) * rec + d) * weight[s];
    out(d, o / l);
  }
}

/// The merge of one row's n_splits share partials p[s] = (O_s, m_s, l_s) (records of hd + 2
/// floats; m in natural-log units, -inf for a share past the context): split weights
/// exp(m_s - M) computed once into shared memory `weight` (n_splits floats; in parallel over
/// splits), then out(d, sum_s O_s[d] w_s / sum_s l_s w_s) for each dim d. Done by the first
/// n_threads threads of the block (every thread must call it: block barriers); p is read
/// through L2 (other blocks of the grid may have written it).
template <typename Out>
__device__ __forceinline__ void combine_row(const float* p, Out out, int n_splits, int hd, float* weight, float* red,
                                            int n_threads) {
  combine_row_from<false>(p, out, n_splits, hd, weight, red, n_threads);
}

/// Each share's chunk records cp[s * share_chunks + i] (records of hd + 2) folded in order into
/// the share's record sp[s], by the first n_threads threads (a dim each).
template <bool kShared>
__device__ __forceinline__ void fold_shares(const float* cp, float* sp, int n_splits, int share_chunks, int hd,
                                            int n_threads) {
  const int rec = hd + 2;
  for (int d = threadIdx.x; d < hd && int(threadIdx.x) < n_threads; d += n_threads)
    for (int s = 0; s < n_splits; ++s) {
      float m = -INFINITY, l = 0.f, o = 0.f;
      for (int i = s * share_chunks; i < (s + 1) * share_chunks; ++i) {
        const float* r = cp + int64_t(i) * rec;
        float keep, take;
        if (!fold_weights(load_record<kShared>(r + hd), m, keep, take)) continue;  // nothing unmasked (O_c may be unwritten)
        l = fold(l, keep, load_record<kShared>(r + hd + 1), take);
        o = fold(o, keep, load_record<kShared>(r + d), take);
      }
      sp[int64_t(s) * rec + d] = o;
      if (d == 0) sp[int64_t(s) * rec + hd] = share_max(m), sp[int64_t(s) * rec + hd + 1] = l;
    }
}

/// Floats of shared memory fold_combine_row needs to work from a copy of the row's records
/// (its chunk records, then its share records).
__host__ __device__ constexpr int64_t fold_stage_floats(int n_splits, int share_chunks, int hd) {
  return (int64_t(n_splits) * share_chunks + n_splits) * (hd + 2);
}

/// Batch-invariant steps whose chunks ran side by side: row th (of n_th rows, token * n_head +
/// head) folds each share's share_chunks chunk partials (partial[th][chunk], records of hd + 2)
/// in order into the share's partial, then merges the shares (combine_row): the same
/// operations on the same values as for a row whose shares the tile kernel folded. By the
/// first n_threads threads of the block (all must call).
/// Where `stage` (shared memory, 8-byte aligned) holds fold_stage_floats, every thread of the
/// block first copies the row's chunk records there, all loads in flight at once, and the
/// fold and merge read them and keep the share records there: one L2 round trip instead of one
/// per chunk and three over the share records. Otherwise the share records go after all rows'
/// chunk records in `partial`. The values, and so the bits, are the same either way.
template <typename Out>
__device__ __forceinline__ void fold_combine_row(float* partial, int64_t th, int64_t n_th, int n_splits,
                                                 int share_chunks, int hd, Out out, float* weight, float* red,
                                                 int n_threads, float* stage = nullptr, int64_t stage_floats = 0) {
  const int rec = hd + 2, chunks = n_splits * share_chunks;
  const float* cp = partial + th * chunks * rec;
  if (stage != nullptr && fold_stage_floats(n_splits, share_chunks, hd) <= stage_floats) {
    // rec is even, so the row's records start and end on 8 bytes.
    const int n2 = chunks * rec / 2, step = int(blockDim.x);
    const float2* src = reinterpret_cast<const float2*>(cp);
    float2* dst = reinterpret_cast<float2*>(stage);
    constexpr int kInFlight = 8;
    for (int base = int(threadIdx.x); base < n2; base += kInFlight * step) {
      float2 v[kInFlight];
#pragma unroll
      for (int k = 0; k < kInFlight; ++k)
        if (base + k * step < n2) v[k] = __ldcg(src + base + k * step);
#pragma unroll
      for (int k = 0; k < kInFlight; ++k)
        if (base + k * step < n2) dst[base + k * step] = v[k];
    }
    __syncthreads();
    float* sp = stage + int64_t(chunks) * rec;
    fold_shares<true>(stage, sp, n_splits, share_chunks, hd, n_threads);
    __syncthreads();
    combine_row_from<true>(sp, out, n_splits, hd, weight, red, n_threads);
    return;
  }
  float* sp = partial + n_th * chunks * rec + th * n_splits * rec;
  fold_shares<false>(cp, sp, n_splits, share_chunks, hd, n_threads);
  __syncthreads();  // the block's share partials are visible to all its threads
  combine_row_from<false>(sp, out, n_splits, hd, weight, red, n_threads);
}

}  // namespace fdl::cuda
