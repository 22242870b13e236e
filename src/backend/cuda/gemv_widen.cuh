// gemv_widen.cuh — exact widening of 16-byte weight vectors to fp32, shared by the GEMV
// kernels (gemv.cu, gemv_fused.cu). Device code only; include from .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace fdl::cuda {

/// Widen<WT>::kVec weights of type WT per uint4; run() writes them as fp32 (exact).
template <typename WT>
struct Widen;
template <>
struct Widen<float> {
  static constexpr int kVec = 4;
  __device__ static void run(const uint4& v, float* f) {
    f[0] = __uint_as_float(v.x), f[1] = __uint_as_float(v.y), f[2] = __uint_as_float(v.z), f[3] = __uint_as_float(v.w);
  }
  __device__ static float one(float w) { return w; }
};
template <>
struct Widen<__half> {
  static constexpr int kVec = 8;
  __device__ static void run(const uint4& v, float* f) {
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&u[i]));
      f[2 * i] = p.x, f[2 * i + 1] = p.y;
    }
  }
  __device__ static float one(__half w) { return __half2float(w); }
};
template <>
struct Widen<__nv_bfloat16> {
  static constexpr int kVec = 8;
  __device__ static void run(const uint4& v, float* f) {
    const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // bf16 is the top half of an fp32: widening is a shift.
      f[2 * i] = __uint_as_float(u[i] << 16), f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
  }
  __device__ static float one(__nv_bfloat16 w) { return __bfloat162float(w); }
};

}  // namespace fdl::cuda
