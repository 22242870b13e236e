// rms_norm_row.cuh — the pieces of add_rms_norm's arithmetic that other kernels repeat bit for
// bit (the batch-invariant decode block normalizes its row with them): which thread holds which
// element, the fp64 block sum, the scale, and the rounding of a stored value. Device code and
// constexpr helpers only; include from .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace fdl::cuda {

/// add_rms_norm runs one block per row of rms_norm_threads(width) threads; thread t holds
/// elements t + k * threads for k < kNormPer, all loaded before the first use (a single-row
/// decode step is pure latency otherwise).
constexpr int kNormMaxThreads = 1024, kNormPer = 16;

/// The block size add_rms_norm takes for rows of `width` floats: a whole number of warps,
/// enough for kNormPer elements each (more than kNormMaxThreads: the row is too wide).
__host__ __device__ constexpr int rms_norm_threads(int width) {
  const int warps = ((width + kNormPer - 1) / kNormPer + 31) / 32;
  return (warps < 1 ? 1 : warps) * 32;
}

/// dst[i] = v rounded to t (round to nearest even for F16 and BF16; F32 as it is).
__device__ __forceinline__ void store_as(void* p, int64_t i, float v, WType t) {
  switch (t) {
    case WType::F16: static_cast<__half*>(p)[i] = __float2half_rn(v); break;
    case WType::BF16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v); break;
    default: static_cast<float*>(p)[i] = v;
  }
}

/// Sum over the block of each thread's `sum`, in `partial` (one double per warp): a butterfly
/// in each warp, then one over the warps' totals (lane w holds warp w's). Warps whose sums are
/// +0 leave the result as it is, so a larger block whose extra warps hold nothing gives the
/// same bits. Every warp runs the second butterfly itself: an xor butterfly leaves the same
/// bits in every lane (each step adds the same two values, in either order), so each warp has
/// the total without another round through shared memory. Every thread gets the total; all
/// threads of the block must call it.
__device__ __forceinline__ double block_sum(double sum, double* partial) {
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const int n_warps = (blockDim.x + 31) / 32, lane = threadIdx.x & 31;
  if (lane == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  double s = lane < n_warps ? partial[lane] : 0.0;
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  __syncthreads();  // partial is read by every warp before a next use writes it
  return s;
}

/// 1 / sqrt(mean + eps), the mean of the squares summed in fp64 (`sum`: this thread's part, in
/// its element order): fp32 IEEE division and square root, as the CPU backend.
__device__ __forceinline__ float rms_scale(double sum, int width, float eps, double* partial) {
  const float mean = float(block_sum(sum, partial) / double(width));
  return 1.0f / sqrtf(mean + eps);
}

/// add_rms_norm of one row (no post-norm of the addend) by a block of at least
/// rms_norm_threads(cols) threads, into shared memory: v = in.x + in.add (block 0 writes v to
/// in.x_out when set), xs[i] = (v * scale) * in.w rounded to `type` — add_rms_norm's thread
/// map, order and rounding, so the same bits (threads past its block add +0 to the sum). Reads
/// x and add through L2. `w`: in.w, or a copy of it in shared memory that cp.async copies of
/// this block's threads are filling (waited for here, before the sum's barriers). Every thread
/// of the block must call it; ends with a block barrier.
__device__ __forceinline__ void rms_norm_row_to_smem(const NormIn& in, int cols, void* xs, WType type,
                                                     double* partial, const float* w) {
  const int T = rms_norm_threads(cols);
  const bool mine = int(threadIdx.x) < T;
  float v[kNormPer];
#pragma unroll
  for (int k = 0; k < kNormPer; ++k) {
    const int i = threadIdx.x + k * T;
    v[k] = mine && i < cols ? __ldcg(in.x + i) : 0.f;
  }
  if (in.add != nullptr) {
#pragma unroll
    for (int k = 0; k < kNormPer; ++k) {
      const int i = threadIdx.x + k * T;
      if (mine && i < cols) v[k] += __ldcg(in.add + i);
    }
  }
  double sum = 0.0;
  const bool write_x = in.x_out != nullptr && blockIdx.x == 0;
#pragma unroll
  for (int k = 0; k < kNormPer; ++k) {
    const int i = threadIdx.x + k * T;
    if (mine && i < cols) {
      if (write_x) in.x_out[i] = v[k];
      sum += double(__fmul_rn(v[k], v[k]));
    }
  }
  asm volatile("cp.async.wait_all;" ::: "memory");  // this thread's copies of w; rms_scale's barriers: everyone's
  const float scale = rms_scale(sum, cols, in.eps, partial);
#pragma unroll
  for (int k = 0; k < kNormPer; ++k) {
    const int i = threadIdx.x + k * T;
    if (mine && i < cols) store_as(xs, i, __fmul_rn(__fmul_rn(v[k], scale), w[i]), type);
  }
  __syncthreads();
}

}  // namespace fdl::cuda
