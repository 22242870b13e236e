// Per-row kernels of the forward pass: embedding gather, residual add + RMSNorm, RoPE with
// the K/V store into the paged cache, SwiGLU, casts and argmax (contracts in kernels.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/ffn_act.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_elem.cuh"
#include "backend/cuda/embed_id.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/rms_norm_row.cuh"
#include "backend/cuda/rope_qkv_item.cuh"
#include "backend/cuda/row_loads.cuh"

namespace fdl::cuda {
namespace {

__device__ __forceinline__ float load_as_float(const void* p, int64_t i, WType t) {
  switch (t) {
    case WType::F16: return __half2float(static_cast<const __half*>(p)[i]);
    case WType::BF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__global__ void embed_kernel(WType type, const void* E, int64_t rows, int64_t cols, const int32_t* ids,
                             const int32_t* prev_ids, float* out, float scale) {
  launch_dependents();
  grid_dependency_wait();
  const int t = blockIdx.x;
  const int64_t row = embed_row_id(ids, prev_ids, t, rows);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x)
    out[t * cols + c] = scale == 1.f ? load_as_float(E, row * cols + c, type) : load_as_float(E, row * cols + c, type) * scale;
}

// kAddW: add's own RMSNorm with weight add_w first (a post-norm of the addend, Gemma). Its
// elements are read twice (for the sum, then for the sum into v) rather than held: more
// registers would cap the block below the 1024 threads that wide rows need.
template <bool kAddW>
__global__ void add_rms_norm_kernel(float* x, const float* add, const float* w, void* y, WType y_type,
                                    const int32_t* row_idx, int width, float eps, bool write_back,
                                    const float* add_w) {
  launch_dependents();
  grid_dependency_wait();
  const int r = blockIdx.x;
  const int64_t src = row_idx ? row_idx[r] : r;
  float* xr = x + src * width;
  const float* ar = add ? add + src * width : nullptr;
  float v[kNormPer];
#pragma unroll
  for (int k = 0; k < kNormPer; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    v[k] = i < width ? xr[i] : 0.f;
  }
  __shared__ double partial[kNormMaxThreads / 32];
  if (kAddW && ar) {
    double sa = 0.0;
#pragma unroll
    for (int k = 0; k < kNormPer; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      const float a = i < width ? ar[i] : 0.f;
      sa += double(__fmul_rn(a, a));
    }
    const float scale_a = rms_scale(sa, width, eps, partial);
#pragma unroll
    for (int k = 0; k < kNormPer; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      if (i < width) v[k] += __fmul_rn(__fmul_rn(ar[i], scale_a), add_w[i]);
    }
  } else if (ar) {
#pragma unroll
    for (int k = 0; k < kNormPer; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      if (i < width) v[k] += ar[i];
    }
  }
  // fp64 sum of fp32 squares, as the CPU backend (and ggml) do: the order of the partial sums
  // then no longer matters at fp32 precision.
  double sum = 0.0;
#pragma unroll
  for (int k = 0; k < kNormPer; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < width) {
      if (ar && write_back) xr[i] = v[k];
      sum += double(__fmul_rn(v[k], v[k]));
    }
  }
  const float scale = rms_scale(sum, width, eps, partial);
#pragma unroll
  for (int k = 0; k < kNormPer; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i < width) store_as(y, int64_t(r) * width + i, __fmul_rn(__fmul_rn(v[k], scale), w[i]), y_type);
  }
}

// Grid (token, item chunk): item i < (n_head + n_head_kv) * head_dim/2 rotates one pair of a
// q or k head; the following kv_dim items copy v. One item per thread.
__global__ void rope_qkv_kernel(const float* qkv, const float* cos_sin, const int32_t* positions,
                                const int32_t* dst_block, int n_head, int rope_dim, KvLayerView kv,
                                float* q_out, const float* bias) {
  launch_dependents();
  grid_dependency_wait();
  const int t = blockIdx.x;
  const int item = blockIdx.y * blockDim.x + threadIdx.x;
  if (item >= rope_qkv_items(n_head, kv)) return;
  const int q_dim = n_head * kv.head_dim, kv_dim = kv.n_head_kv * kv.head_dim;
  const float* row = qkv + int64_t(t) * (q_dim + 2 * kv_dim);
  rope_qkv_item([&](int i) { return row[i]; }, cos_sin + int64_t(t) * rope_dim, positions[t], dst_block[t], n_head,
                rope_dim, kv, q_out + int64_t(t) * q_dim, bias, item);
}

// Grid (token, head): one warp per q, k or v head of the row. Bias, then (q and k heads) the
// head's RMSNorm — the fp64 sum of squares of the whole head, reduced across the warp — then
// RoPE on pairs (2i, 2i+1), then the stores of rope_qkv_kernel. head_dim <= 256 (8 per lane).
__global__ void rope_qkv_norm_kernel(const float* qkv, const float* cos_sin, const int32_t* positions,
                                     const int32_t* dst_block, int n_head, int rope_dim, KvLayerView kv,
                                     float* q_out, QkvExtras ex) {
  launch_dependents();
  grid_dependency_wait();
  constexpr int kPer = 8;
  const int t = blockIdx.x, head = blockIdx.y, lane = threadIdx.x;
  const int hd = kv.head_dim, q_dim = n_head * hd, kv_dim = kv.n_head_kv * hd;
  const float* row = qkv + int64_t(t) * (q_dim + 2 * kv_dim);
  const int64_t base = int64_t(head) * hd;  // the head's first element in [q | k | v]
  const int pos = positions[t];
  const int32_t block = dst_block[t];
  const int slot = pos % kv.block_size;
  float x[kPer];  // elements 2 * (lane + 32 k) and +1: whole pairs per lane
  double sum = 0.0;
#pragma unroll
  for (int k = 0; k < kPer / 2; ++k) {
    const int e = 2 * (lane + 32 * k);
    x[2 * k] = x[2 * k + 1] = 0.f;
    if (e < hd) {
      x[2 * k] = row[base + e];
      x[2 * k + 1] = row[base + e + 1];
      if (ex.bias) {
        x[2 * k] = __fadd_rn(x[2 * k], ex.bias[base + e]);
        x[2 * k + 1] = __fadd_rn(x[2 * k + 1], ex.bias[base + e + 1]);
      }
      sum += double(__fmul_rn(x[2 * k], x[2 * k])) + double(__fmul_rn(x[2 * k + 1], x[2 * k + 1]));
    }
  }
  const bool is_v = head >= n_head + kv.n_head_kv;
  if (is_v) {
#pragma unroll
    for (int k = 0; k < kPer / 2; ++k) {
      const int e = 2 * (lane + 32 * k);
      if (e < hd)
        kv_store2(kv, kv_index(kv, block, kv.block_size + slot, int64_t(head - n_head - kv.n_head_kv) * hd + e),
                  x[2 * k], x[2 * k + 1]);
    }
    return;
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float scale = 1.0f / sqrtf(__fadd_rn(float(sum / double(hd)), ex.eps));
  const float* w = head < n_head ? ex.q_norm : ex.k_norm;
  const float* cs = cos_sin + int64_t(t) * rope_dim;
#pragma unroll
  for (int k = 0; k < kPer / 2; ++k) {
    const int e = 2 * (lane + 32 * k);
    if (e >= hd) continue;
    const float x0 = __fmul_rn(__fmul_rn(x[2 * k], scale), w[e]);
    const float x1 = __fmul_rn(__fmul_rn(x[2 * k + 1], scale), w[e + 1]);
    float y0 = x0, y1 = x1;
    if (e < rope_dim) {
      const float c = cs[e], sn = cs[e + 1];
      y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
      y1 = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c));
    }
    if (head < n_head) {
      float* dst = q_out + int64_t(t) * q_dim + base + e;
      dst[0] = y0;
      dst[1] = y1;
    } else {
      kv_store2(kv, kv_index(kv, block, slot, base - q_dim + e), y0, y1);
    }
  }
}

__global__ void silu_mul_kernel(const float* gu, void* out, WType out_type, int n_ff, bool gelu) {
  launch_dependents();
  grid_dependency_wait();
  const int t = blockIdx.y;
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= n_ff) return;
  const float g = gu[int64_t(t) * 2 * n_ff + c], u = gu[int64_t(t) * 2 * n_ff + n_ff + c];
  store_as(out, int64_t(t) * n_ff + c, ffn_act(g, u, gelu), out_type);
}

// Four columns per thread (silu_mul picks it when n_ff and the pointers allow): 16-byte loads
// of gate and up, one store of the four results; each element's arithmetic is
// silu_mul_kernel's, so the bits are the same. Scalar loads and 2-byte stores left the
// prompt's activation at a third of the memory bandwidth.
template <typename OutT>
__global__ void silu_mul4_kernel(const float* gu, OutT* out, int n_ff, bool gelu) {
  launch_dependents();
  grid_dependency_wait();
  const int t = blockIdx.y;
  const int c = 4 * int(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= n_ff) return;
  const float* row = gu + int64_t(t) * 2 * n_ff;
  const float4 g = __ldcs(reinterpret_cast<const float4*>(row + c));
  const float4 u = __ldcs(reinterpret_cast<const float4*>(row + n_ff + c));
  const float r0 = ffn_act(g.x, u.x, gelu), r1 = ffn_act(g.y, u.y, gelu), r2 = ffn_act(g.z, u.z, gelu),
              r3 = ffn_act(g.w, u.w, gelu);
  OutT* dst = out + int64_t(t) * n_ff + c;
  if constexpr (std::is_same_v<OutT, float>) {
    *reinterpret_cast<float4*>(dst) = make_float4(r0, r1, r2, r3);
  } else if constexpr (std::is_same_v<OutT, __half>) {
    const __half2 a = __halves2half2(__float2half_rn(r0), __float2half_rn(r1));
    const __half2 b = __halves2half2(__float2half_rn(r2), __float2half_rn(r3));
    *reinterpret_cast<uint2*>(dst) = make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
  } else {
    const __nv_bfloat162 a = __halves2bfloat162(__float2bfloat16_rn(r0), __float2bfloat16_rn(r1));
    const __nv_bfloat162 b = __halves2bfloat162(__float2bfloat16_rn(r2), __float2bfloat16_rn(r3));
    *reinterpret_cast<uint2*>(dst) = make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
  }
}

__global__ void softcap_kernel(float* x, size_t n, float cap) {
  launch_dependents();
  grid_dependency_wait();
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    x[i] = __fmul_rn(cap, tanhf(__fdiv_rn(x[i], cap)));
}

__global__ void cast_kernel(const float* x, size_t count, WType type, void* dst) {
  launch_dependents();
  grid_dependency_wait();
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
    if (type == WType::F16)
      static_cast<__half*>(dst)[i] = __float2half_rn(x[i]);
    else
      static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16_rn(x[i]);
  }
}

// Each row is scanned by one or more blocks, each with one SM's worth of loads in flight
// (row_loads.cuh): 1024 threads, four 16-byte loads each (a kernel with one 4-byte load in
// flight per thread of 512 was 0.05 ms slower per batch-64 step: docs/GPU.md, tuning log). A row
// of 128k floats read by one block takes ~8 L2 round trips; split over several blocks (rows
// of a small batch; argmax_rows) it takes one, and the row's last block to finish reduces the
// blocks' results (a counter per row, left at zero for the next launch).
constexpr int kArgmaxThreads = 1024;
constexpr int kArgmaxNone = 0x7fffffff;  // no finite maximum yet

struct ArgmaxPartial {
  float best;
  int index;  // kArgmaxNone: nothing but -Inf / NaN in the slice
  int bad;    // NaN or +Inf seen
};

__device__ __forceinline__ bool argmax_better(float v, int i, float best, int best_i) {
  return v > best || (v == best && i < best_i);
}

template <bool kChecked>
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_kernel(const float* logits, int n_cols, int slice, int32_t* ids, ArgmaxPartial* partial, unsigned* counters,
                  int32_t* ids_copy) {
  launch_dependents();
  grid_dependency_wait();
  // Rows on x (up to 2^31 - 1 of them), a row's slices on y.
  const int r = blockIdx.x, begin = blockIdx.y * slice;
  const float* row = logits + int64_t(r) * n_cols;
  float best = -INFINITY;
  int best_i = kArgmaxNone, bad = 0;
  for_each_in_row<kArgmaxThreads>(row + begin, min(slice, n_cols - begin), [&](int i, float v) {
    if (kChecked && (v != v || v > FLT_MAX)) bad = 1;
    if (v > best) best = v, best_i = begin + i;  // increasing i within a thread: its first maximum
  });
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (argmax_better(ov, oi, best, best_i)) best = ov, best_i = oi;
  }
  if (kChecked) bad = __any_sync(0xffffffffu, bad);
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int si[kArgmaxThreads / 32], sb[kArgmaxThreads / 32];
  if ((threadIdx.x & 31) == 0) sv[threadIdx.x / 32] = best, si[threadIdx.x / 32] = best_i, sb[threadIdx.x / 32] = bad;
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kArgmaxThreads / 32; ++w) {
    if (argmax_better(sv[w], si[w], best, best_i)) best = sv[w], best_i = si[w];
    bad |= sb[w];
  }
  if (gridDim.y > 1) {
    partial[r * gridDim.y + blockIdx.y] = ArgmaxPartial{best, best_i, bad};
    __threadfence();  // the partial is visible before the count says so
    if (atomicAdd(&counters[r], 1u) != gridDim.y - 1) return;
    __threadfence();
    counters[r] = 0;  // the last block of the row: every partial is written
    best = -INFINITY, best_i = kArgmaxNone, bad = 0;
    for (unsigned b = 0; b < gridDim.y; ++b) {
      const ArgmaxPartial* p = partial + r * gridDim.y + b;  // written by other blocks: read through L2
      const float pv = __ldcg(&p->best);
      const int pi = __ldcg(&p->index);
      if (argmax_better(pv, pi, best, best_i)) best = pv, best_i = pi;
      bad |= __ldcg(&p->bad);
    }
  }
  const int32_t id = kChecked ? (bad || best_i == kArgmaxNone ? -1 : best_i) : (best_i == kArgmaxNone ? 0 : best_i);
  ids[r] = id;
  if (ids_copy) ids_copy[r] = id;
}

int grid_for(int64_t total, int threads) {
  const int64_t blocks = (total + threads - 1) / threads;
  return int(blocks < 65536 ? (blocks > 0 ? blocks : 1) : 65536);
}

}  // namespace

const char* wtype_name(WType t) {
  switch (t) {
    case WType::F16: return "F16";
    case WType::BF16: return "BF16";
    default: return "F32";
  }
}

void embed_rows(const DeviceMatrix& E, const int32_t* ids, const int32_t* prev_ids, int n, float* out,
                cudaStream_t stream, float scale) {
  if (n <= 0) return;
  if (E.quantized()) return embed_quant_rows(E, ids, prev_ids, n, out, stream, scale);
  launch_pdl(embed_kernel, dim3(n), dim3(256), 0, stream, E.type, E.data, E.rows, E.cols, ids, prev_ids, out, scale);
}

void softcap(float* x, size_t n, float cap, cudaStream_t stream) {
  if (n == 0) return;
  launch_pdl(softcap_kernel, dim3(grid_for(int64_t(n), 256)), dim3(256), 0, stream, x, n, cap);
}

void add_rms_norm(float* x, const float* add, const float* w, void* y, const int32_t* row_idx,
                  int n_rows, int width, float eps, bool write_back, cudaStream_t stream, WType y_type,
                  const float* add_w) {
  if (n_rows <= 0) return;
  if (width > kNormMaxThreads * kNormPer)
    throw CudaError("add_rms_norm: rows wider than " + std::to_string(kNormMaxThreads * kNormPer) + " are not supported");
  const int threads = rms_norm_threads(width);
  // The kernel's registers cap its block below 1024 threads (115 registers: 512), so the
  // widest row it can take is that times kNormPer; wider rows would fail at launch with
  // "too many resources requested".
  const bool post_norm = add && add_w;
  auto* kernel = post_norm ? add_rms_norm_kernel<true> : add_rms_norm_kernel<false>;
  auto limit = [](auto* k) {
    cudaFuncAttributes attr{};
    FDL_CUDA_CHECK(cudaFuncGetAttributes(&attr, k));
    return attr.maxThreadsPerBlock;
  };
  static const int limits[2] = {limit(add_rms_norm_kernel<false>), limit(add_rms_norm_kernel<true>)};
  const int max_threads = limits[post_norm];
  if (threads > max_threads)
    throw CudaError("add_rms_norm: rows of " + std::to_string(width) + " floats need " + std::to_string(threads) +
                    " threads; this kernel launches at most " + std::to_string(max_threads) + " (rows up to " +
                    std::to_string(max_threads * kNormPer) + " floats)");
  launch_pdl(kernel, dim3(n_rows), dim3(threads), 0, stream, x, add, w, y, y_type, row_idx, width, eps, write_back,
             add_w);
}

void rope_qkv_store(const float* qkv, const float* cos_sin, const int32_t* positions,
                    const int32_t* dst_block, int n, int n_head, int rope_dim, const KvLayerView& kv,
                    float* q_out, cudaStream_t stream, const QkvExtras& extras) {
  if (n <= 0) return;
  if ((extras.q_norm == nullptr) != (extras.k_norm == nullptr))
    throw CudaError("rope_qkv_store: q_norm and k_norm must be set together");
  if (extras.q_norm) {
    if (kv.head_dim > 256 || kv.head_dim % 2 != 0)
      throw CudaError("rope_qkv_store: per-head norms need an even head_dim <= 256, not " +
                      std::to_string(kv.head_dim));
    launch_pdl(rope_qkv_norm_kernel, dim3(unsigned(n), unsigned(n_head + 2 * kv.n_head_kv)), dim3(32), 0, stream, qkv,
               cos_sin, positions, dst_block, n_head, rope_dim, kv, q_out, extras);
    return;
  }
  const int items = rope_qkv_items(n_head, kv);
  launch_pdl(rope_qkv_kernel, dim3(unsigned(n), unsigned((items + 127) / 128)), dim3(128), 0, stream, qkv, cos_sin,
             positions, dst_block, n_head, rope_dim, kv, q_out, extras.bias);
}

void silu_mul(const float* gu, void* out, int n, int n_ff, cudaStream_t stream, WType out_type, bool gelu) {
  const int64_t total = int64_t(n) * n_ff;
  if (total <= 0) return;
  const auto aligned = [](const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  if (n_ff % 4 == 0 && aligned(gu, 16) && aligned(out, out_type == WType::F32 ? 16 : 8)) {
    const dim3 grid(unsigned((n_ff / 4 + 127) / 128), unsigned(n));
    if (out_type == WType::F16)
      launch_pdl(silu_mul4_kernel<__half>, grid, dim3(128), 0, stream, gu, static_cast<__half*>(out), n_ff, gelu);
    else if (out_type == WType::BF16)
      launch_pdl(silu_mul4_kernel<__nv_bfloat16>, grid, dim3(128), 0, stream, gu, static_cast<__nv_bfloat16*>(out),
                 n_ff, gelu);
    else
      launch_pdl(silu_mul4_kernel<float>, grid, dim3(128), 0, stream, gu, static_cast<float*>(out), n_ff, gelu);
    return;
  }
  launch_pdl(silu_mul_kernel, dim3(unsigned((n_ff + 255) / 256), unsigned(n)), dim3(256), 0, stream, gu, out, out_type,
             n_ff, gelu);
}

void cast_f32(const float* X, size_t count, WType type, void* dst, cudaStream_t stream) {
  if (count == 0) return;
  launch_pdl(cast_kernel, dim3(grid_for(int64_t(count), 256)), dim3(256), 0, stream, X, count, type, dst);
}

int argmax_blocks_per_row(int n_rows, int n_cols, int n_sm) {
  // Enough blocks that each issues about one round of its four loads per thread, at most
  // what fills the SMs once.
  const int rounds = (n_cols + 16 * kArgmaxThreads - 1) / (16 * kArgmaxThreads);
  return std::clamp(std::min(n_sm / std::max(n_rows, 1), rounds), 1, 32);
}

size_t argmax_partial_bytes(int n_rows, int n_cols, int n_sm) {
  const int g = argmax_blocks_per_row(n_rows, n_cols, n_sm);
  return g == 1 ? 0 : size_t(n_rows) * size_t(g) * sizeof(ArgmaxPartial);
}

void argmax_rows(const float* logits, int n_rows, int n_cols, int32_t* ids, cudaStream_t stream, bool checked,
                 const ArgmaxScratch& scratch, int32_t* ids_copy) {
  if (n_rows <= 0) return;
  const int g = scratch.counters && scratch.partials ? argmax_blocks_per_row(n_rows, n_cols, scratch.n_sm) : 1;
  // Slices of whole 16-byte vectors, so every block's loads stay aligned like the row's.
  const int slice = g == 1 ? n_cols : ((n_cols + g - 1) / g + 3) / 4 * 4;
  auto* partial = static_cast<ArgmaxPartial*>(scratch.partials);
  unsigned* counters = scratch.counters;
  const dim3 grid{unsigned(n_rows), unsigned(g)};
  if (checked)
    launch_pdl(argmax_kernel<true>, grid, dim3(kArgmaxThreads), 0, stream, logits, n_cols, slice, ids, partial, counters,
               ids_copy);
  else
    launch_pdl(argmax_kernel<false>, grid, dim3(kArgmaxThreads), 0, stream, logits, n_cols, slice, ids, partial, counters,
               ids_copy);
}

}  // namespace fdl::cuda
