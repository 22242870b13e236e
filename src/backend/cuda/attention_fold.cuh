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

}  // namespace fdl::cuda
