// q8_dot.cuh — the 8-bit activations of the block-quantized GEMVs (kernels.h: Q8Activations),
// one rounding for every kernel that makes them (gemv_quant.cu, gemv_quant_staged.cu), and the
// 16-value integer dot product the formats' pairs (quant_pairs.cuh) are built from.
// Device code only; include from .cu files.
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

/// Lane i's share of storing group g's rounding into Q8Activations' layout (q [.][32], d [.],
/// s [.][2]; g counts groups across the tokens' rows).
__device__ __forceinline__ void store_group(const Q8Group& r, int64_t g, int lane, int8_t* q, float* d, int32_t* s) {
  q[g * 32 + lane] = int8_t(r.q);
  if (lane == 0) d[g] = r.d;
  if ((lane & 15) == 0) s[g * 2 + lane / 16] = r.sum16;
}

__device__ __forceinline__ int dot16(const uint4& w, const uint4& x) {
  int acc = __dp4a(int(w.x), int(x.x), 0);
  acc = __dp4a(int(w.y), int(x.y), acc);
  acc = __dp4a(int(w.z), int(x.z), acc);
  return __dp4a(int(w.w), int(x.w), acc);
}

}  // namespace fdl::cuda::quant
