// q8_dot.cuh — the 8-bit activations of the block-quantized GEMVs (kernels.h: Q8Activations)
// and a unit's dot product with them, one definition for every kernel that rounds or
// multiplies them (gemv_quant.cu, gemv_quant_staged.cu): whichever kernel runs a token, its
// activations and its sums have the same bits. Device code only; include from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/quant_units.cuh"

namespace fdl::cuda::quant {

/// One 32-value group rounded by a whole warp, lane i holding value v of position i:
/// amax over the group, d = amax / 127, q = round-to-nearest-even(v / d) clamped to ±127 (0 for
/// a group of zeros, and for a group holding NaN or Inf, whose d is NaN). `q` is lane i's
/// integer; `sum16` the sum of q over the lane's half of the group (lanes 0-15 or 16-31), the
/// same on every lane of the half; `d` the group's scale on every lane.
struct Q8Group {
  int q;
  int sum16;
  float d;
};
__device__ __forceinline__ Q8Group round_group(float v) {
  const bool bad = __any_sync(0xffffffffu, !isfinite(v));
  float amax = fabsf(v);
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float scale = amax / 127.f;
  const int qi = amax == 0.f || bad ? 0 : max(-127, min(127, __float2int_rn(v / scale)));
  int sum = qi;
  for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);  // within each half-warp
  return Q8Group{qi, sum, bad ? __int_as_float(0x7fc00000) : scale};
}

__device__ __forceinline__ int dot16(const uint4& w, const uint4& x) {
  int acc = __dp4a(int(w.x), int(x.x), 0);
  acc = __dp4a(int(w.y), int(x.y), acc);
  acc = __dp4a(int(w.z), int(x.z), acc);
  return __dp4a(int(w.w), int(x.w), acc);
}

/// One half's contribution to a token's dot product: the half's 16 integers q (group g, offset
/// o) against the token's rounded activations xq [cols], xd [cols / 32], xs [cols / 16]:
///   xd[g] * (dw * (Σ q·xq - bias Σ xq) - mw Σ xq)
/// The pointers may be global or shared memory.
__device__ __forceinline__ float half_dot(const uint4& q, int g, int o, float dw, float mw, int bias,
                                          const int8_t* xq, const float* xd, const int32_t* xs) {
  const int isum = dot16(q, *reinterpret_cast<const uint4*>(xq + 32 * g + o));
  const int qsum = xs[2 * g + o / 16];
  return xd[g] * (dw * float(isum - bias * qsum) - mw * float(qsum));
}

/// A whole unit (both halves, a then b) added to acc: the order every GEMV keeps.
__device__ __forceinline__ void unit_dot(const Unit& w, const int8_t* xq, const float* xd, const int32_t* xs,
                                         float& acc) {
  acc += half_dot(w.qa, w.ga, w.oa, w.da, w.ma, w.bias, xq, xd, xs);
  acc += half_dot(w.qb, w.gb, w.ob, w.db, w.mb, w.bias, xq, xd, xs);
}

}  // namespace fdl::cuda::quant
