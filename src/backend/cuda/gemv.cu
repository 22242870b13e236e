// Weight-streaming GEMV for up to kGemvMaxTokens tokens: the decode bottleneck. Every weight
// byte is read once per call, so the kernel is built to keep HBM busy:
//  - one warp per weight row, 8 rows per 256-thread block, many blocks per SM;
//  - each lane issues UNROLL independent 16-byte loads (8 bf16/f16 or 4 f32 weights) before
//    using any of them, with the streaming cache hint (the weights are not reused);
//  - activations (a few KB) are read as float4 through the read-only cache and stay in L1/L2;
//  - weights are widened to fp32 exactly and multiplied into fp32 accumulators (one per token),
//    then reduced across the warp.
// Rows whose byte width is not a multiple of 16 take a scalar path with the same math.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemv_widen.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"

#include <cstdlib>
#include <string>

namespace fdl::cuda {
namespace {

constexpr int kRowsPerBlock = 8;

template <int NT>
__device__ __forceinline__ void reduce_store(float (&acc)[NT], int n, float* Y, int64_t rows, int64_t r) {
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    float s = acc[t];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    acc[t] = s;
  }
  if ((threadIdx.x & 31) == 0) {
#pragma unroll
    for (int t = 0; t < NT; ++t)
      if (t < n) Y[int64_t(t) * rows + r] = acc[t];
  }
}

// RPW rows per warp, UNROLL 16-byte loads per row and lane in flight. The first batch of
// weight loads is issued before grid_dependency_wait(): with PDL it overlaps the previous
// kernel's tail (weights never depend on it; X does).
template <typename WT, int NT, int UNROLL, int RPW>
__global__ void __launch_bounds__(256) gemv_vec_kernel(const WT* __restrict__ W, const float* __restrict__ X,
                                                       float* __restrict__ Y, int64_t rows, int cols, int n) {
  launch_dependents();
  constexpr int kVec = Widen<WT>::kVec;
  const int lane = threadIdx.x & 31;
  const int64_t r0 = (int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32) * RPW;  // kRowsPerBlock warps
  if (r0 >= rows) return;
  const int nvec = cols / kVec;
  const uint4* wrow[RPW];
#pragma unroll
  for (int i = 0; i < RPW; ++i) wrow[i] = reinterpret_cast<const uint4*>(W + min(r0 + i, rows - 1) * cols);
  float acc[RPW][NT];
#pragma unroll
  for (int i = 0; i < RPW; ++i)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[i][t] = 0.f;
  uint4 w[RPW][UNROLL];
  auto load = [&](int base) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int idx = base + u * 32;
#pragma unroll
      for (int i = 0; i < RPW; ++i) w[i][u] = idx < nvec ? __ldcs(wrow[i] + idx) : make_uint4(0, 0, 0, 0);
    }
  };
  load(lane);
  grid_dependency_wait();
  for (int base = lane; base < nvec; base += 32 * UNROLL) {
    if (base != lane) load(base);
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int idx = base + u * 32;
      if (idx < nvec) {
#pragma unroll
        for (int t = 0; t < NT; ++t) {
          if (t < n) {
            const float4* xp = reinterpret_cast<const float4*>(X + int64_t(t) * cols + int64_t(idx) * kVec);
            float4 x[kVec / 4];
#pragma unroll
            for (int v = 0; v < kVec / 4; ++v) x[v] = __ldg(xp + v);
#pragma unroll
            for (int i = 0; i < RPW; ++i) {
              float wf[kVec];
              Widen<WT>::run(w[i][u], wf);
#pragma unroll
              for (int v = 0; v < kVec / 4; ++v) {
                acc[i][t] = fmaf(wf[4 * v], x[v].x, acc[i][t]);
                acc[i][t] = fmaf(wf[4 * v + 1], x[v].y, acc[i][t]);
                acc[i][t] = fmaf(wf[4 * v + 2], x[v].z, acc[i][t]);
                acc[i][t] = fmaf(wf[4 * v + 3], x[v].w, acc[i][t]);
              }
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < RPW; ++i)
    if (r0 + i < rows) reduce_store<NT>(acc[i], n, Y, rows, r0 + i);
}

template <typename WT, int NT>
__global__ void __launch_bounds__(256) gemv_scalar_kernel(const WT* __restrict__ W, const float* __restrict__ X,
                                                          float* __restrict__ Y, int64_t rows, int cols, int n) {
  launch_dependents();
  grid_dependency_wait();
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  const WT* wrow = W + r * cols;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.f;
  for (int k = lane; k < cols; k += 32) {
    const float w = Widen<WT>::one(wrow[k]);
#pragma unroll
    for (int t = 0; t < NT; ++t)
      if (t < n) acc[t] = fmaf(w, X[int64_t(t) * cols + k], acc[t]);
  }
  reduce_store<NT>(acc, n, Y, rows, r);
}

/// Tuning knob for the 1-2 token kernels: FLASHDLLM_GEMV="UNROLL,RPW" (8,1 default; also
/// 16,1 4,1 4,2), read once.
int gemv_variant() {
  static const int v = [] {
    const char* e = std::getenv("FLASHDLLM_GEMV");
    const std::string s = e ? e : "";
    if (s == "16,1") return 1;
    if (s == "4,1") return 2;
    if (s == "4,2") return 3;
    return 0;
  }();
  return v;
}

/// Tuning knob for the 3-16 token kernels: FLASHDLLM_GEMV_MULTI="UNROLL,RPW" (2,2 default;
/// also 4,2 2,4 4,1), read once. Every variant sums each row in the same order: the results
/// are bit-identical, only the speed differs (docs/GPU.md).
int gemv_multi_variant() {
  static const int v = [] {
    const char* e = std::getenv("FLASHDLLM_GEMV_MULTI");
    const std::string s = e ? e : "";
    if (s == "4,2") return 1;
    if (s == "2,4") return 2;
    if (s == "4,1") return 3;
    return 0;
  }();
  return v;
}

template <typename WT, int NT, int UNROLL, int RPW>
void launch_vec(const DeviceMatrix& W, const float* X, int n, float* Y, cudaStream_t stream) {
  const dim3 grid(unsigned((W.rows + kRowsPerBlock * RPW - 1) / (kRowsPerBlock * RPW)));
  launch_pdl(gemv_vec_kernel<WT, NT, UNROLL, RPW>, grid, dim3(256), 0, stream, static_cast<const WT*>(W.data), X, Y,
             W.rows, int(W.cols), n);
}

template <typename WT, int NT>
void launch(const DeviceMatrix& W, const float* X, int n, float* Y, cudaStream_t stream) {
  const bool aligned = (W.cols * int64_t(sizeof(WT))) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(W.data) % 16 == 0 && reinterpret_cast<uintptr_t>(X) % 16 == 0;
  if (!aligned) {
    const dim3 grid(unsigned((W.rows + kRowsPerBlock - 1) / kRowsPerBlock));
    launch_pdl(gemv_scalar_kernel<WT, NT>, grid, dim3(256), 0, stream, static_cast<const WT*>(W.data), X, Y, W.rows,
               int(W.cols), n);
    return;
  }
  if constexpr (NT <= 2) {
    switch (gemv_variant()) {
      case 1: return launch_vec<WT, NT, 16, 1>(W, X, n, Y, stream);
      case 2: return launch_vec<WT, NT, 4, 1>(W, X, n, Y, stream);
      case 3: return launch_vec<WT, NT, 4, 2>(W, X, n, Y, stream);
      default: return launch_vec<WT, NT, 8, 1>(W, X, n, Y, stream);
    }
  } else {
    // More rows per warp reuse each activation load across rows: with several tokens the
    // activations, not the weights, would otherwise fill the load path.
    switch (gemv_multi_variant()) {
      case 1: return launch_vec<WT, NT, 4, 2>(W, X, n, Y, stream);
      case 2: return launch_vec<WT, NT, 2, 4>(W, X, n, Y, stream);
      case 3: return launch_vec<WT, NT, 4, 1>(W, X, n, Y, stream);
      default: return launch_vec<WT, NT, 2, 2>(W, X, n, Y, stream);
    }
  }
}

template <typename WT>
void dispatch_tokens(const DeviceMatrix& W, const float* X, int n, float* Y, cudaStream_t stream) {
  if (n == 1) return launch<WT, 1>(W, X, n, Y, stream);
  if (n == 2) return launch<WT, 2>(W, X, n, Y, stream);
  if (n <= 4) return launch<WT, 4>(W, X, n, Y, stream);
  if (n <= 8) return launch<WT, 8>(W, X, n, Y, stream);
  return launch<WT, 16>(W, X, n, Y, stream);
}

}  // namespace

void gemv(const DeviceMatrix& W, const float* X, int n, float* Y, cudaStream_t stream) {
  if (n <= 0 || W.rows == 0) return;
  if (W.quantized()) throw CudaError("gemv: a block-quantized matrix (use gemv_quant)");
  if (n > kGemvMaxTokens) throw CudaError("gemv: " + std::to_string(n) + " tokens > " + std::to_string(kGemvMaxTokens));
  switch (W.type) {
    case WType::F32: return dispatch_tokens<float>(W, X, n, Y, stream);
    case WType::F16: return dispatch_tokens<__half>(W, X, n, Y, stream);
    case WType::BF16: return dispatch_tokens<__nv_bfloat16>(W, X, n, Y, stream);
  }
}

}  // namespace fdl::cuda
