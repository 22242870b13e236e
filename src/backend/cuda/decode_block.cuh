// decode_block.cuh — device helpers shared by the persistent batch-1 decode kernels
// (decode_attention_block.cu, decode_ffn_block.cu, decode_output_block.cu, and the hand-offs
// and residency checks of the invariant decode_*_block_k16.cu): one block of kThreads per SM stays
// resident for a whole phase chain, and the phases hand over through counters in global
// memory instead of kernel boundaries. Device code only; include from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <tuple>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemv_widen.cuh"
#include "backend/cuda/kernels.h"

namespace fdl::cuda::block {

constexpr int kWarps = 16, kThreads = 32 * kWarps;

__device__ __forceinline__ float4 ldcg4(const float* p) { return __ldcg(reinterpret_cast<const float4*>(p)); }

/// Hand-offs between the blocks of a persistent grid (cooperative groups' grid sync, scoped
/// to the blocks that share the counter; only correct when every block that must arrive is
/// resident: callers size grids to the SMs). Split in two so that loads which do not depend on
/// the hand-off (the next phase's first weights) are issued between them:
///   arrive(counter): all threads of the block arrive (bar.sync), then thread 0 adds one to
///     `counter` with release semantics: every write the block's threads made before is
///     visible to whoever acquires the count;
///   wait_for(counter, target): thread 0 polls with acquire loads until the count reaches
///     `target`, then the block meets (bar.sync): writes of every arrived block are visible.
/// No full fences (CUTLASS's GenericBarrier does the same): a fence, like a release issued
/// after them, would also wait for the thread's weight loads still in flight, an HBM round trip
/// on every hand-off (measured: docs/GPU.md, tuning log, "hand-offs without full fences").
__device__ __forceinline__ void arrive(unsigned* counter) {
  __syncthreads();
  if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
}
__device__ __forceinline__ void wait_for(unsigned* counter, unsigned target) {
  if (threadIdx.x == 0) {
    unsigned v;
    for (;;) {
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
      if (v >= target) break;
      __nanosleep(32);
    }
  }
  __syncthreads();
}

/// Profiling: thread 0 records the global timer (ns) as `event` of this block in `trace`
/// ([events][gridDim.x]); nothing when trace is null (the default).
__device__ __forceinline__ void stamp(uint64_t* trace, int event) {
  if (trace != nullptr && threadIdx.x == 0) {
    uint64_t t;
    // The memory clobber keeps the read after the barrier before it (a stamp is a phase's end).
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t) : : "memory");
    trace[int64_t(event) * gridDim.x + blockIdx.x] = t;
  }
}

/// The first batch of a weight row's 16-byte vectors (lane + 32 u, u < UNROLL): issued early
/// (before a hand-off or the previous row's reduction), consumed by dot_row.
template <int UNROLL>
__device__ __forceinline__ void load_first(const uint4* wrow, uint4 (&w)[UNROLL], int nvec, int lane) {
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int idx = lane + u * 32;
    w[u] = idx < nvec ? __ldcs(wrow + idx) : make_uint4(0, 0, 0, 0);
  }
}

/// acc += the fp32 products of one batch (weights w at vectors base + 32 u) with x.
template <typename WT, int UNROLL>
__device__ __forceinline__ void dot_batch(const uint4 (&w)[UNROLL], const float* x, int base, int nvec, float& acc) {
  constexpr int kVec = Widen<WT>::kVec;
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int idx = base + u * 32;
    if (idx < nvec) {
      float wf[kVec];
      Widen<WT>::run(w[u], wf);
#pragma unroll
      for (int v = 0; v < kVec / 4; ++v) {
        const float4 xv = *reinterpret_cast<const float4*>(x + (int64_t(idx) * kVec + 4 * v));
        acc = fmaf(wf[4 * v], xv.x, acc);
        acc = fmaf(wf[4 * v + 1], xv.y, acc);
        acc = fmaf(wf[4 * v + 2], xv.z, acc);
        acc = fmaf(wf[4 * v + 3], xv.w, acc);
      }
    }
  }
}

/// W[row] · x over `nvec` 16-byte weight vectors (x in shared memory, fp32), reduced over the
/// warp: gemv.cu's loop (fp32 fmaf in the same lane order), so the value is the unfused
/// GEMV's. `w` holds the row's first batch on entry; when `next` is set, its first batch is in
/// `w` on return (issued before the reduction). Waits for each batch before loading the next
/// (registers for one batch); stream_rows overlaps them.
template <typename WT, int UNROLL>
__device__ __forceinline__ float dot_row(const uint4* wrow, uint4 (&w)[UNROLL], const float* x, int nvec, int lane,
                                         const uint4* next = nullptr) {
  float acc = 0.f;
  for (int base = lane; base < nvec; base += 32 * UNROLL) {
    if (base != lane) {
#pragma unroll
      for (int u = 0; u < UNROLL; ++u) {
        const int idx = base + u * 32;
        w[u] = idx < nvec ? __ldcs(wrow + idx) : make_uint4(0, 0, 0, 0);
      }
    }
    dot_batch<WT, UNROLL>(w, x, base, nvec, acc);
  }
  if (next) load_first<UNROLL>(next, w, nvec, lane);
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  return acc;
}

/// Batch k of a sequence of rows of per_row batches each (stream_batches' numbering) into w.
template <int UNROLL, typename RowPtr>
__device__ __forceinline__ void load_batch(RowPtr row_ptr, int k, int per_row, int nvec, int lane, uint4 (&w)[UNROLL]) {
  const uint4* row = row_ptr(k / per_row);
  const int base = lane + (k % per_row) * 32 * UNROLL;
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int idx = base + u * 32;
    w[u] = idx < nvec ? __ldcs(row + idx) : make_uint4(0, 0, 0, 0);
  }
}

/// A warp's dot products with `n_rows` weight rows, row_ptr(i) for i < n_rows, streamed as
/// one sequence of batches through NB register buffers: while batch k is multiplied, the loads
/// of batches k + 1 .. k + NB - 1 (of the same or the next rows) are in flight, so a warp keeps
/// up to (NB - 1) x UNROLL x 512 bytes coming (dot_row waits for each batch). Same products in
/// the same order as dot_row; out(i, value) receives row i's reduced value (all lanes).
/// buf[0] holds row 0's first batch on entry (load_first).
template <typename WT, int UNROLL, int NB, typename RowPtr, typename Out>
__device__ __forceinline__ void stream_rows(int n_rows, RowPtr row_ptr, const float* x, int nvec, int lane,
                                            uint4 (&buf)[NB][UNROLL], Out out) {
  const int per_row = (nvec + 32 * UNROLL - 1) / (32 * UNROLL);
  const int total = n_rows * per_row;
  float acc = 0.f;
  auto load = [&](uint4(&w)[UNROLL], int k) {
    if (k < total) load_batch<UNROLL>(row_ptr, k, per_row, nvec, lane, w);
  };
  auto consume = [&](const uint4(&w)[UNROLL], int k) {
    dot_batch<WT, UNROLL>(w, x, lane + (k % per_row) * 32 * UNROLL, nvec, acc);
    if (k % per_row == per_row - 1) {
      float s = acc;
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      out(k / per_row, s);
      acc = 0.f;
    }
  };
#pragma unroll
  for (int j = 1; j < NB - 1; ++j) load(buf[j], j);
  for (int k = 0; k < total; k += NB) {
#pragma unroll
    for (int j = 0; j < NB; ++j) {  // buffer indices are compile-time: the ring stays in registers
      if (k + j >= total) break;
      load(buf[(j + NB - 1) % NB], k + j + NB - 1);
      consume(buf[j], k + j);
    }
  }
}

/// stream_rows over batches [k0, k1) of a sequence of rows of per_row batches each (row i's
/// batches are i * per_row .. + per_row - 1): a warp's contiguous share of a block's rows cut
/// at batch boundaries, so warps get equal shares when the rows do not divide evenly among
/// them. out(i, value) receives the reduced sum of row i's batches inside the range, once per
/// row the range touches. buf[0] holds batch k0 on entry (load_batch).
template <typename WT, int UNROLL, int NB, typename RowPtr, typename Out>
__device__ __forceinline__ void stream_batches(int k0, int k1, int per_row, RowPtr row_ptr, const float* x, int nvec,
                                               int lane, uint4 (&buf)[NB][UNROLL], Out out) {
  float acc = 0.f;
  auto load = [&](uint4(&w)[UNROLL], int k) {
    if (k < k1) load_batch<UNROLL>(row_ptr, k, per_row, nvec, lane, w);
  };
  auto consume = [&](const uint4(&w)[UNROLL], int k) {
    dot_batch<WT, UNROLL>(w, x, lane + (k % per_row) * 32 * UNROLL, nvec, acc);
    if (k % per_row == per_row - 1 || k == k1 - 1) {
      float s = acc;
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      out(k / per_row, s);
      acc = 0.f;
    }
  };
#pragma unroll
  for (int j = 1; j < NB - 1; ++j) load(buf[j], k0 + j);
  for (int k = k0; k < k1; k += NB) {
#pragma unroll
    for (int j = 0; j < NB; ++j) {
      if (k + j >= k1) break;
      load(buf[(j + NB - 1) % NB], k + j + NB - 1);
      consume(buf[j], k + j);
    }
  }
}

/// Starts copying the norm weight in.w (cols floats, 16-byte aligned, cols a multiple of 4)
/// into shared memory `ws` (cp.async): it depends on no earlier kernel, so callers issue it
/// before grid_dependency_wait and its HBM round trip leaves the critical path.
__device__ __forceinline__ void norm_weight_prefetch(const NormIn& in, int cols, float* ws) {
  for (int i = threadIdx.x; i < cols / 4; i += kThreads) {
    const unsigned dst = unsigned(__cvta_generic_to_shared(ws + 4 * i));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(in.w + 4 * i) : "memory");
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
}

/// v = in.x + in.add (block 0 also writes v to in.x_out), xs = (v * scale) * w with
/// scale = 1/sqrt(mean(v²) + eps), the mean summed in fp64, for a block of THREADS threads.
/// w is in.w, or the copy norm_weight_prefetch started in shared memory (waited for here,
/// after the first pass). Ends with a block barrier (xs is complete). Shared with the fused
/// GEMVs of gemv_fused.cu, so the norm is written once.
/// Each thread loads kNormBatch of its elements (x and add) before it stores any: a store to
/// x_out between them would keep the compiler from hoisting the next loads over it (x_out may
/// alias x for all it knows), and the prologue would pay one L2 round trip per element
/// (measured: ~2 µs of a Llama-3-8B layer's kernels; docs/GPU.md, tuning log, "norm loads
/// batched"). The sum keeps
/// the per-thread element order, so the result is bit-identical.
constexpr int kNormBatch = 8;
/// kAddW: in.add is first RMS-normalized and scaled by in.add_w (a post-norm of the addend,
/// NormIn::add_w); compiled in only where a family needs it, so the plain norm keeps its code.
/// Its sum needs a second block reduction; rows of up to kNormBatch x THREADS elements stay in
/// registers across it, so x, add and add_w cost one L2 round trip, as the plain norm's loads do.
template <int THREADS = kThreads, bool kAddW = false>
__device__ __forceinline__ void norm_to_smem(const NormIn& in, int cols, const float* w, float* xs) {
  __shared__ double red[THREADS / 32];
  [[maybe_unused]] __shared__ double red_add[THREADS / 32];  // kAddW's first reduction
  static_assert(THREADS <= 1024, "one per-warp total per lane of a warp");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double sum = 0.0;
  const bool write_x = in.x_out != nullptr && blockIdx.x == 0;
  // v = x + add for element i (add post-normed by add_scale where kAddW), into xs and the sum.
  auto emit = [&](int i, float xv, float av) {
    const float v = in.add ? xv + av : xv;
    if (write_x) in.x_out[i] = v;
    xs[i] = v;
    sum += double(__fmul_rn(v, v));
  };
  // kAddW: the block's fp64 total of every thread's `part` for the addend's norm. Its own
  // array (no second barrier before reuse), and each warp sums the per-warp totals with a
  // butterfly, which gives every lane the same bits without a serial chain of shared loads.
  [[maybe_unused]] auto addend_total = [&](double part) {
    for (int o = 16; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
    if (lane == 0) red_add[warp] = part;
    __syncthreads();
    double total = lane < THREADS / 32 ? red_add[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    return total;
  };
  bool done = false;
  if constexpr (kAddW) {
    if (in.add_w != nullptr && in.add != nullptr) {
      if (cols <= kNormBatch * THREADS) {
        // The whole row in registers: x, add and add_w in one L2 round trip, the addend's sum,
        // then v — the same per-thread order as the loop below, so the same bits.
        float xv[kNormBatch], av[kNormBatch], wv[kNormBatch];
        double asum = 0.0;
#pragma unroll
        for (int k = 0; k < kNormBatch; ++k) {
          const int i = threadIdx.x + k * THREADS;
          xv[k] = i < cols ? __ldcg(in.x + i) : 0.f;
          av[k] = i < cols ? __ldcg(in.add + i) : 0.f;
          wv[k] = i < cols ? in.add_w[i] : 0.f;
        }
#pragma unroll
        for (int k = 0; k < kNormBatch; ++k) asum += double(__fmul_rn(av[k], av[k]));  // zeros past cols add nothing
        const float add_scale = 1.0f / sqrtf(float(addend_total(asum) / double(cols)) + in.eps);
#pragma unroll
        for (int k = 0; k < kNormBatch; ++k) {
          const int i = threadIdx.x + k * THREADS;
          if (i < cols) emit(i, xv[k], __fmul_rn(__fmul_rn(av[k], add_scale), wv[k]));
        }
        done = true;
      } else {
        // Longer rows: the addend's sum first, kNormBatch loads in flight per thread.
        double asum = 0.0;
        for (int i0 = threadIdx.x; i0 < cols; i0 += kNormBatch * THREADS) {
          float av[kNormBatch];
#pragma unroll
          for (int k = 0; k < kNormBatch; ++k) av[k] = i0 + k * THREADS < cols ? __ldcg(in.add + i0 + k * THREADS) : 0.f;
#pragma unroll
          for (int k = 0; k < kNormBatch; ++k) asum += double(__fmul_rn(av[k], av[k]));
        }
        const float add_scale = 1.0f / sqrtf(float(addend_total(asum) / double(cols)) + in.eps);
        for (int i0 = threadIdx.x; i0 < cols; i0 += kNormBatch * THREADS) {
          float xv[kNormBatch], av[kNormBatch], wv[kNormBatch];
#pragma unroll
          for (int k = 0; k < kNormBatch; ++k) {
            const int i = i0 + k * THREADS;
            xv[k] = i < cols ? __ldcg(in.x + i) : 0.f;
            av[k] = i < cols ? __ldcg(in.add + i) : 0.f;
            wv[k] = i < cols ? in.add_w[i] : 0.f;
          }
#pragma unroll
          for (int k = 0; k < kNormBatch; ++k) {
            const int i = i0 + k * THREADS;
            if (i >= cols) break;
            emit(i, xv[k], __fmul_rn(__fmul_rn(av[k], add_scale), wv[k]));
          }
        }
        done = true;
      }
    }
  }
  if (!done) {
    for (int i0 = threadIdx.x; i0 < cols; i0 += kNormBatch * THREADS) {
      float xv[kNormBatch], av[kNormBatch];
#pragma unroll
      for (int k = 0; k < kNormBatch; ++k) {
        const int i = i0 + k * THREADS;
        xv[k] = i < cols ? __ldcg(in.x + i) : 0.f;  // written by the previous kernel: from L2
        av[k] = in.add && i < cols ? __ldcg(in.add + i) : 0.f;
      }
#pragma unroll
      for (int k = 0; k < kNormBatch; ++k) {
        const int i = i0 + k * THREADS;
        if (i >= cols) break;
        emit(i, xv[k], av[k]);
      }
    }
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) red[warp] = sum;
  asm volatile("cp.async.wait_all;" ::: "memory");  // this thread's part of a prefetched w has landed
  __syncthreads();                                   // ... and everyone's
  double total = 0.0;
#pragma unroll
  for (int k = 0; k < THREADS / 32; ++k) total += red[k];
  const float scale = 1.0f / sqrtf(float(total / double(cols)) + in.eps);
  for (int i = threadIdx.x; i < cols; i += THREADS) xs[i] = __fmul_rn(__fmul_rn(xs[i], scale), w[i]);
  __syncthreads();
}

/// Asks L2 to fetch [p, p + bytes) from HBM (p 16-byte aligned, bytes a multiple of 16);
/// nothing waits for it.
__device__ __forceinline__ void prefetch_l2(const void* p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#else
  (void)p, (void)bytes;  // a hint only: older GPUs go without
#endif
}

/// Copies n floats (n a multiple of 4, 16-byte aligned) written by other blocks of this grid
/// into shared memory, through L2; ends with a block barrier. Each thread issues up to eight
/// 16-byte loads before its first store: one L2 round trip for up to 64 KiB.
__device__ __forceinline__ void stage_to_smem(const float* src, int n, float* dst) {
  constexpr int kBatch = 8;
  const int n4 = n / 4;
  for (int i0 = threadIdx.x; i0 < n4; i0 += kBatch * kThreads) {
    float4 v[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (i0 + k * kThreads < n4) v[k] = ldcg4(src + 4 * (i0 + k * kThreads));
#pragma unroll
    for (int k = 0; k < kBatch; ++k)
      if (i0 + k * kThreads < n4) reinterpret_cast<float4*>(dst)[i0 + k * kThreads] = v[k];
  }
  __syncthreads();
}

/// Host side: lets `kernel` launch with `smem` bytes of dynamic shared memory on device `dev`.
/// The default limit, 48 KiB per block, counts the kernel's static shared memory too
/// (norm_to_smem's reduction array: 48 KiB of dynamic memory alone fails to launch); above it
/// the kernel opts in, up to the device's opt-in limit. False when even that is too small.
/// Not cached (three runtime calls): callers cache per size.
inline bool opt_in_shared_memory(const void* kernel, size_t smem, int dev) {
  int optin = 0;
  FDL_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  cudaFuncAttributes attr{};
  FDL_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  if (smem + attr.sharedSizeBytes > size_t(optin)) return false;
  if (smem + attr.sharedSizeBytes > 48 * 1024)
    FDL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  return true;
}

/// Host side: prepares `kernel` (blocks of kThreads) for `smem` bytes of dynamic shared memory
/// on the current device and returns how many of its blocks can be resident there at once
/// (0 when the device cannot give a block that much shared memory). Cached per (device,
/// kernel, size): launches call it too, and it must be cheap. Thread-safe.
inline int64_t resident_blocks(const void* kernel, size_t smem) {
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, size_t>, int64_t> cache;
  int dev = 0;
  FDL_CUDA_CHECK(cudaGetDevice(&dev));
  const std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(dev, kernel, smem);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  int n_sm = 0, per_sm = 0;
  FDL_CUDA_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
  if (opt_in_shared_memory(kernel, smem, dev))
    FDL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, smem));
  return cache[key] = int64_t(per_sm) * n_sm;
}

}  // namespace fdl::cuda::block
