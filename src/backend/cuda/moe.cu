// The mixture-of-experts kernels (contract in moe.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/decode_block.cuh"
#include "backend/cuda/gemv_widen.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/moe.h"

namespace fdl::cuda {
namespace {

constexpr int kMaxGridY = 65535;  // the grid's y limit: longer row counts loop

// One thread per token: k passes over at most kMoeMaxExperts probabilities are a few
// thousand operations, and a sequential order is what keeps the sums the CPU's.
__global__ void moe_route_kernel(const float* logits, int n, int n_expert, int k, int32_t* ids, float* w) {
  launch_dependents();
  grid_dependency_wait();
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const float* x = logits + int64_t(t) * n_expert;
  float p[kMoeMaxExperts];
  float mx = x[0];
  for (int e = 1; e < n_expert; ++e) mx = mx < x[e] ? x[e] : mx;  // std::max's choice
  double sum = 0;
  for (int e = 0; e < n_expert; ++e) {
    p[e] = float(exp(double(x[e] - mx)));  // route_top_k's: in double, rounded once
    sum += double(p[e]);
  }
  for (int e = 0; e < n_expert; ++e) p[e] = float(double(p[e]) / sum);
  int32_t* out = ids + int64_t(t) * k;
  for (int r = 0; r < k; ++r) {
    int best = -1;
    for (int e = 0; e < n_expert; ++e) {
      bool taken = false;
      for (int q = 0; q < r; ++q) taken |= out[q] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    out[r] = best;
  }
  double chosen = 0;
  for (int r = 0; r < k; ++r) chosen += double(p[out[r]]);
  for (int r = 0; r < k; ++r) w[int64_t(t) * k + r] = float(double(p[out[r]]) / chosen);
}

constexpr int kRowsPerBlock = 8;  // one warp per row, as gemv.cu
constexpr int kUnroll = 8;        // gemv.cu's default for one token

// gemv.cu's one-token loop (block::dot_row: the same loads, fmaf order and warp sum) on pair
// blockIdx.y's expert and row. The expert id comes from the previous kernel, so no weight
// load can go out before grid_dependency_wait.
template <typename WT>
__global__ void __launch_bounds__(256) moe_gemv_vec_kernel(const WT* __restrict__ W, int64_t expert_elems,
                                                           const int32_t* __restrict__ ids, const float* __restrict__ X,
                                                           int x_div, float* __restrict__ Y, int64_t rows, int cols) {
  launch_dependents();
  const int lane = threadIdx.x & 31, p = blockIdx.y;
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  grid_dependency_wait();
  if (r >= rows) return;
  const uint4* wrow = reinterpret_cast<const uint4*>(W + int64_t(ids[p]) * expert_elems + r * cols);
  const int nvec = cols / Widen<WT>::kVec;
  uint4 w[kUnroll];
  block::load_first<kUnroll>(wrow, w, nvec, lane);
  const float acc = block::dot_row<WT, kUnroll>(wrow, w, X + int64_t(p / x_div) * cols, nvec, lane);
  if (lane == 0) Y[int64_t(p) * rows + r] = acc;
}

// Rows whose byte width is not a multiple of 16: gemv_scalar_kernel's loop.
template <typename WT>
__global__ void __launch_bounds__(256) moe_gemv_scalar_kernel(const WT* __restrict__ W, int64_t expert_elems,
                                                              const int32_t* __restrict__ ids,
                                                              const float* __restrict__ X, int x_div,
                                                              float* __restrict__ Y, int64_t rows, int cols) {
  launch_dependents();
  grid_dependency_wait();
  const int lane = threadIdx.x & 31, p = blockIdx.y;
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  if (r >= rows) return;
  const WT* wrow = W + int64_t(ids[p]) * expert_elems + r * cols;
  const float* x = X + int64_t(p / x_div) * cols;
  float acc = 0.f;
  for (int c = lane; c < cols; c += 32) acc = fmaf(Widen<WT>::one(wrow[c]), x[c], acc);
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) Y[int64_t(p) * rows + r] = acc;
}

template <typename WT>
void launch_gemv(const ExpertMatrices& W, const int32_t* ids, const float* X, int x_div, int pairs, float* Y,
                 cudaStream_t stream) {
  const dim3 grid(unsigned((W.rows + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(pairs));
  const auto* w = static_cast<const WT*>(W.data);
  const int64_t elems = W.rows * W.cols;
  const bool aligned = (W.cols * int64_t(sizeof(WT))) % 16 == 0 && reinterpret_cast<uintptr_t>(W.data) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(X) % 16 == 0;
  if (aligned)
    launch_pdl(moe_gemv_vec_kernel<WT>, grid, dim3(256), 0, stream, w, elems, ids, X, x_div, Y, W.rows, int(W.cols));
  else
    launch_pdl(moe_gemv_scalar_kernel<WT>, grid, dim3(256), 0, stream, w, elems, ids, X, x_div, Y, W.rows,
               int(W.cols));
}

// One block, one thread per expert: a stable counting sort over chunks of the ids staged in
// shared memory (every thread scans each chunk; a few thousand pairs per step).
constexpr int kGroupChunk = 4096;

__global__ void __launch_bounds__(kMoeMaxExperts) moe_group_kernel(const int32_t* ids, int pairs, int n_expert,
                                                                   int32_t* offsets, int32_t* perm, int32_t* slot) {
  launch_dependents();
  grid_dependency_wait();
  __shared__ int32_t chunk[kGroupChunk];
  __shared__ int32_t start[kMoeMaxExperts];
  const int e = threadIdx.x;
  auto each_chunk = [&](auto&& visit) {
    for (int c0 = 0; c0 < pairs; c0 += kGroupChunk) {
      const int m = min(kGroupChunk, pairs - c0);
      __syncthreads();  // the previous chunk has been read by every thread
      for (int i = threadIdx.x; i < m; i += blockDim.x) chunk[i] = ids[c0 + i];
      __syncthreads();
      if (e < n_expert)
        for (int i = 0; i < m; ++i)
          if (chunk[i] == e) visit(c0 + i);
    }
  };
  int count = 0;
  each_chunk([&](int) { ++count; });
  if (e < n_expert) start[e] = count;
  __syncthreads();
  if (threadIdx.x == 0) {
    int at = 0;
    for (int x = 0; x < n_expert; ++x) {
      const int c = start[x];
      start[x] = offsets[x] = at;
      at += c;
    }
    offsets[n_expert] = at;
  }
  __syncthreads();
  int j = e < n_expert ? start[e] : 0;
  each_chunk([&](int p) {
    perm[j] = p;
    slot[p] = j++;
  });
}

__global__ void moe_gather_kernel(const float* X, const int32_t* perm, int m, int k, int width, float* out) {
  launch_dependents();
  grid_dependency_wait();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= width) return;
  for (int j = blockIdx.y; j < m; j += gridDim.y) out[int64_t(j) * width + i] = X[int64_t(perm[j] / k) * width + i];
}

__global__ void moe_combine_kernel(const float* Y, const int32_t* slot, const float* w, int n, int k, int width,
                                   float* out) {
  launch_dependents();
  grid_dependency_wait();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= width) return;
  for (int t = blockIdx.y; t < n; t += gridDim.y) {
    float acc = 0.f;
    for (int r = 0; r < k; ++r) {
      const int p = t * k + r;
      const int row = slot ? slot[p] : p;
      acc = __fadd_rn(acc, __fmul_rn(w[p], Y[int64_t(row) * width + i]));  // no FMA: the CPU's two roundings
    }
    out[int64_t(t) * width + i] = acc;
  }
}

void check_experts(int n_expert, int k, const char* who) {
  if (n_expert < 1 || n_expert > kMoeMaxExperts || k < 1 || k > n_expert)
    throw CudaError(std::string(who) + ": " + std::to_string(k) + " of " + std::to_string(n_expert) +
                    " experts (1 <= k <= experts <= " + std::to_string(kMoeMaxExperts) + ")");
}

}  // namespace

void moe_route(const float* logits, int n, int n_expert, int k, int32_t* ids, float* w, cudaStream_t stream) {
  check_experts(n_expert, k, "moe_route");
  if (n <= 0) return;
  launch_pdl(moe_route_kernel, dim3(unsigned((n + 63) / 64)), dim3(64), 0, stream, logits, n, n_expert, k, ids, w);
}

void moe_gemv(const ExpertMatrices& W, const int32_t* ids, const float* X, int x_div, int pairs, float* Y,
              cudaStream_t stream) {
  if (pairs <= 0 || W.rows == 0) return;
  if (pairs > kMaxGridY || x_div < 1)
    throw CudaError("moe_gemv: " + std::to_string(pairs) + " pairs (at most " + std::to_string(kMaxGridY) +
                    "), x_div " + std::to_string(x_div));
  switch (W.type) {
    case WType::F32: return launch_gemv<float>(W, ids, X, x_div, pairs, Y, stream);
    case WType::F16: return launch_gemv<__half>(W, ids, X, x_div, pairs, Y, stream);
    case WType::BF16: return launch_gemv<__nv_bfloat16>(W, ids, X, x_div, pairs, Y, stream);
  }
}

void moe_group(const int32_t* ids, int pairs, int n_expert, int32_t* offsets, int32_t* perm, int32_t* slot,
               cudaStream_t stream) {
  check_experts(n_expert, 1, "moe_group");
  launch_pdl(moe_group_kernel, dim3(1), dim3(kMoeMaxExperts), 0, stream, ids, pairs, n_expert, offsets, perm, slot);
}

void moe_gather(const float* X, const int32_t* perm, int m, int k, int width, float* out, cudaStream_t stream) {
  if (m <= 0 || width <= 0) return;
  launch_pdl(moe_gather_kernel, dim3(unsigned((width + 255) / 256), unsigned(std::min(m, kMaxGridY))), dim3(256), 0,
             stream, X, perm, m, k, width, out);
}

void moe_combine(const float* Y, const int32_t* slot, const float* w, int n, int k, int width, float* out,
                 cudaStream_t stream) {
  if (n <= 0 || width <= 0) return;
  launch_pdl(moe_combine_kernel, dim3(unsigned((width + 255) / 256), unsigned(std::min(n, kMaxGridY))), dim3(256), 0,
             stream, Y, slot, w, n, k, width, out);
}

}  // namespace fdl::cuda
