// Batch-invariant GEMM on tensor cores (gemm_k16.h): every output element is a left fold over
// fixed K segments of one chain of mma.sync m16n8k16 steps each, over the segment's k16 blocks
// in order, whatever the kernel variant.
//
// Why the chains alone fix the bits (measured on the H200; the variants below place a row in
// different tile slots and order the products of a step differently, and gemm_k16_test.cpp
// compares their bits): the result of one m16n8k16 step for an element depends on the sixteen
// products and the accumulator only, not on the order of the products inside the
// step, not on the slot (row or column) the element occupies in the tile, and not on the
// other rows and columns; it does depend on which k go into which step and on the order of
// the steps. cuBLAS and cuBLASLt change both with the token count (split-K, stream-K), so a
// row of a 512-token prefill differs from the same row alone in the last bits.
//
// Orientation: the activations are the A operand (tokens as the 16 rows of a step) and the
// weights the B operand (8 output features as the columns, each feature's 16 k contiguous
// in its row: "col" B from row-major W). All variants share it.
//
// Kernels (kTilings; same arithmetic, chosen by the token count for speed only): up to 16
// tokens the register-streaming kernel (one warp per 8 features and K segment); more take
// shared-memory tilings of 16, 64 or 128 tokens, narrow blocks of features and deep k stages
// for few tokens, the usual multistage 128 x 128 tile for many. The same tile on Hopper's
// warpgroup MMA (gemm_k16_wgmma.cu, where the build has sm_90a code) gives the same bits.
// Stages are filled by cp.async (16 bytes, zero-filled past the matrix edges) and read with
// ldmatrix; rows are padded by 8 elements, so the ldmatrix reads are conflict free.
// A k16 block entirely past K is never multiplied; the last partial one is zero-padded in
// every variant. K not a multiple of 8 (rows not 16-byte aligned) runs the reference kernel,
// which loads each fragment element from global memory: slow, same chain.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm_k16.h"
#include "backend/cuda/gemm_k16_wgmma.h"
#include "backend/cuda/k16_chain.cuh"
#include "backend/cuda/launch.h"

namespace fdl::cuda {
namespace {

constexpr int kSegK = kGemmK16Segment;
// The streaming kernel: at most 8 warps per block, each taking every 8th segment; rows of up
// to kStreamMaxSegs segments (longer ones take a tiling).
constexpr int kStreamWarps = 8, kStreamMaxSegs = kGemmK16StreamMaxSegments;

using k16::mma_k16;

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t& r0, uint32_t& r1, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(smem_addr(p)));
}

// Block tile: WM x WN warps; a warp owns FM 16-token tiles x FN 8-feature tiles. BK k per
// stage, STAGES stages in flight.
template <int WM_, int WN_, int FM_, int FN_, int BK_, int STAGES_>
struct Shape {
  static constexpr int WM = WM_, WN = WN_, FM = FM_, FN = FN_, BK = BK_, STAGES = STAGES_;
  static constexpr int kThreads = 32 * WM * WN;
  static constexpr int TM = 16 * FM * WM;  // tokens per block
  static constexpr int TN = 8 * FN * WN;   // features per block
  static constexpr int LD = BK + 8;        // padded row, in elements
  static constexpr int stage_elems = (TM + TN) * LD;
  // Large tiles keep the fold of finished segments in shared memory (a thread's own slots,
  // after the stages): in registers beside the chains they would spill.
  static constexpr bool kSmemTotal = FM * FN >= 16;
  static constexpr size_t total_bytes = kSmemTotal ? size_t(kThreads) * FM * FN * 4 * sizeof(float) : 0;
  static constexpr size_t smem_bytes = size_t(STAGES) * stage_elems * 2 + total_bytes;
  static_assert(BK % 16 == 0 && (FN == 1 || FN % 2 == 0));
};

// gridDim.z > 1 (SPLIT): block z computes K segment z alone and writes its chain to
// Y + z * n * rows (the workspace); gemm_k16_fold_kernel adds the segments in order.
template <typename S, bool BF16>
__global__ void __launch_bounds__(S::kThreads) gemm_k16_kernel(const uint16_t* __restrict__ W,
                                                               const uint16_t* __restrict__ X, float* __restrict__ Y,
                                                               int n, int rows, int K) {
  extern __shared__ __align__(16) uint16_t sm[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / S::WN, wn = warp % S::WN;
  const int t_block = blockIdx.y * S::TM, f_block = blockIdx.x * S::TN;
  const int n_k16 = (K + 15) / 16;
  constexpr int kTilesPerSeg = kSegK / S::BK;
  static_assert(kSegK % S::BK == 0);
  // The k tiles [kt0, n_kt) of this block: all of K, or segment blockIdx.z.
  const int kt0 = int(blockIdx.z) * kTilesPerSeg;
  const int n_kt = gridDim.z > 1 ? min((K + S::BK - 1) / S::BK, kt0 + kTilesPerSeg) : (K + S::BK - 1) / S::BK;
  if (gridDim.z > 1) Y += int64_t(blockIdx.z) * n * rows;

  // One stage holds X rows [t_block, +TM) then W rows [f_block, +TN), BK elements each from
  // k0; copies past the matrix edges (rows beyond `limit`, k beyond K) are zero-filled.
  auto load_rows = [&](uint16_t* dst, const uint16_t* src, int first, int limit, int count, int kt) {
    const int k0 = kt * S::BK;
    for (int i = threadIdx.x; i < count * (S::BK / 8); i += S::kThreads) {
      const int r = i / (S::BK / 8), kc = (i % (S::BK / 8)) * 8;
      const int row = first + r, k = k0 + kc;
      const bool ok = row < limit && k < K;
      cp_async16(dst + r * S::LD + kc, ok ? src + int64_t(row) * K + k : src, ok);
    }
  };
  auto load_w = [&](int stage, int kt) {
    load_rows(sm + stage * S::stage_elems + S::TM * S::LD, W, f_block, rows, S::TN, kt);
  };
  auto load_x = [&](int stage, int kt) { load_rows(sm + stage * S::stage_elems, X, t_block, n, S::TM, kt); };

  // The weights depend on no earlier kernel: their first stages are issued before the PDL
  // wait. Group s then holds X stage s (and every W stage issued so far).
  launch_dependents();
#pragma unroll
  for (int s = 0; s < S::STAGES - 1; ++s)
    if (kt0 + s < n_kt) load_w(s, kt0 + s);
  grid_dependency_wait();
#pragma unroll
  for (int s = 0; s < S::STAGES - 1; ++s) {
    if (kt0 + s < n_kt) load_x(s, kt0 + s);
    cp_async_commit();
  }

  // acc: the chain of the current K segment (kSegK, a multiple of BK); the total: the fold of
  // the segments before it (the first segment's chain as it is, then + each one's), in
  // registers or in this thread's shared-memory slots (S::kSmemTotal; slot e at
  // e * kThreads + thread: conflict free).
  float acc[S::FM][S::FN][4];
  [[maybe_unused]] float reg_total[S::kSmemTotal ? 1 : S::FM][S::kSmemTotal ? 1 : S::FN][4];
  [[maybe_unused]] float* smem_total =
      reinterpret_cast<float*>(sm + S::STAGES * S::stage_elems) + threadIdx.x;
  auto total = [&](int i, int j, int e) -> float& {
    if constexpr (S::kSmemTotal)
      return smem_total[((i * S::FN + j) * 4 + e) * S::kThreads];
    else
      return reg_total[i][j][e];
  };
#pragma unroll
  for (int i = 0; i < S::FM; ++i)
#pragma unroll
    for (int j = 0; j < S::FN; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
  auto segment_end = [&](bool first) {
#pragma unroll
    for (int i = 0; i < S::FM; ++i)
#pragma unroll
      for (int j = 0; j < S::FN; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          total(i, j, e) = first ? acc[i][j][e] : total(i, j, e) + acc[i][j][e];
          acc[i][j][e] = 0.f;
        }
  };
  const int g = lane / 4, c = lane % 4;

  for (int kt = kt0; kt < n_kt; ++kt) {
    cp_async_wait<S::STAGES - 2>();
    __syncthreads();  // stage kt is visible; every warp is done with the stage refilled next
    const int next = kt + S::STAGES - 1;
    if (next < n_kt) {
      load_w((next - kt0) % S::STAGES, next);
      load_x((next - kt0) % S::STAGES, next);
    }
    cp_async_commit();
    const uint16_t* xs = sm + ((kt - kt0) % S::STAGES) * S::stage_elems;
    const uint16_t* ws = xs + S::TM * S::LD;
    // The fragments of k16 block kk (the A fragments of the warp's token tiles, the B
    // fragments of its feature tiles) into buffer `buf`; then one step of every chain. The
    // loads of block kk + 1 are issued before the steps of block kk (ldmatrix is ordered
    // with the barriers; the steps wait only for their own operands).
    uint32_t a[2][S::FM][4], b[2][S::FN][2];
    auto load = [&](int kk, int buf) {
#pragma unroll
      for (int i = 0; i < S::FM; ++i) {
        const int r = (wm * S::FM + i) * 16 + (lane % 16);
        ldmatrix_x4(a[buf][i], xs + r * S::LD + kk * 16 + (lane / 16) * 8);
      }
      if constexpr (S::FN == 1) {
        const int r = wn * 8 + (lane % 8);
        ldmatrix_x2(b[buf][0][0], b[buf][0][1], ws + r * S::LD + kk * 16 + ((lane / 8) % 2) * 8);
      } else {
#pragma unroll
        for (int j = 0; j < S::FN; j += 2) {
          const int r = (wn * S::FN + j) * 8 + (lane % 8) + (lane / 16) * 8;
          uint32_t t[4];
          ldmatrix_x4(t, ws + r * S::LD + kk * 16 + ((lane / 8) % 2) * 8);
          b[buf][j][0] = t[0], b[buf][j][1] = t[1], b[buf][j + 1][0] = t[2], b[buf][j + 1][1] = t[3];
        }
      }
    };
    auto steps = [&](int buf) {
#pragma unroll
      for (int i = 0; i < S::FM; ++i)
#pragma unroll
        for (int j = 0; j < S::FN; ++j) mma_k16<BF16>(acc[i][j], a[buf][i], b[buf][j][0], b[buf][j][1]);
    };
    const int kb_end = min(S::BK / 16, n_k16 - kt * (S::BK / 16));  // k16 blocks of this stage inside K
    if (kb_end == S::BK / 16) {
      load(0, 0);
#pragma unroll
      for (int kk = 0; kk < S::BK / 16; ++kk) {
        if (kk + 1 < S::BK / 16) load(kk + 1, (kk + 1) & 1);
        steps(kk & 1);
      }
    } else {
      for (int kk = 0; kk < kb_end; ++kk) {
        load(kk, 0);
        steps(0);
      }
    }
    if ((kt + 1) % kTilesPerSeg == 0 || kt + 1 == n_kt) segment_end(kt - kt0 < kTilesPerSeg);
  }
  cp_async_wait<0>();
#pragma unroll
  for (int i = 0; i < S::FM; ++i)
#pragma unroll
    for (int j = 0; j < S::FN; ++j) {
      const int f = f_block + (wn * S::FN + j) * 8 + 2 * c;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int t = t_block + (wm * S::FM + i) * 16 + g + 8 * h;
        if (t >= n) continue;
        float* y = Y + int64_t(t) * rows + f;
        if (f < rows) y[0] = total(i, j, 2 * h);
        if (f + 1 < rows) y[1] = total(i, j, 2 * h + 1);
      }
    }
}

// Few tokens (<= 16): no shared memory. Warp w of a block streams K segments w, w + 8, ... of
// one group of 8 features straight from global memory into its B fragments: lane (g, c) holds elements
// 16b + 4c .. 4c + 3 of feature g's row for k16 block b (8 contiguous bytes: the order of the
// products inside a step does not change its result), and the same elements of tokens g and
// g + 8 as its A fragments (from L1: every warp reads the same rows). U blocks are loaded
// ahead of the U steps that use the previous ones. The segments' results are added in order
// through shared memory. Needs K % 4 == 0 and 8-byte-aligned W and X.
template <bool BF16, bool HI, int U>
__global__ void __launch_bounds__(32 * kStreamWarps, 1) gemm_k16_stream_kernel(const uint16_t* __restrict__ W,
                                                                            const uint16_t* __restrict__ X,
                                                                            float* __restrict__ Y, int n, int rows,
                                                                            int K) {
  __shared__ float seg_out[kStreamMaxSegs][32][4];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int warps = int(blockDim.x / 32), segs = (K + kSegK - 1) / kSegK;
  const int f0 = blockIdx.x * 8;
  const bool w_ok = f0 + g < rows;
  const bool x0_ok = g < n, x1_ok = HI && g + 8 < n;
  const uint16_t* wrow = W + int64_t(min(f0 + g, rows - 1)) * K + 4 * c;
  const uint16_t* x0 = X + int64_t(g) * K + 4 * c;
  const uint16_t* x1 = X + int64_t(g + 8) * K + 4 * c;
  uint2 w[2][U], xa[2][U], xb[2][U];
  // k16 blocks b0 .. b0 + U - 1 of the segment [k_begin, k_begin + len) into buffer `buf`; a
  // lane's 4 elements past the segment (K % 4 == 0: all or none of them) are zeros.
  auto load_w = [&](int k_begin, int len, int b0, int buf) {
#pragma unroll
    for (int u = 0; u < U; ++u)
      w[buf][u] = w_ok && (b0 + u) * 16 + 4 * c < len
                      ? __ldg(reinterpret_cast<const uint2*>(wrow + k_begin + (b0 + u) * 16))
                      : make_uint2(0, 0);
  };
  auto load_x = [&](int k_begin, int len, int b0, int buf) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool in = (b0 + u) * 16 + 4 * c < len;
      xa[buf][u] = x0_ok && in ? *reinterpret_cast<const uint2*>(x0 + k_begin + (b0 + u) * 16) : make_uint2(0, 0);
      if constexpr (HI)
        xb[buf][u] = x1_ok && in ? *reinterpret_cast<const uint2*>(x1 + k_begin + (b0 + u) * 16) : make_uint2(0, 0);
    }
  };
  float acc[4];
  // Fragment slots: a0 = token g (slots 2c, 2c+1), a1 = token g + 8, a2/a3 = slots 2c+8, 2c+9;
  // here slots (2c, 2c+1) hold elements 4c, 4c+1 and (2c+8, 2c+9) elements 4c+2, 4c+3.
  auto run = [&](int n_blocks, int b0, int buf) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (b0 + u >= n_blocks) break;
      const uint32_t a[4] = {xa[buf][u].x, HI ? xb[buf][u].x : 0u, xa[buf][u].y, HI ? xb[buf][u].y : 0u};
      mma_k16<BF16>(acc, a, w[buf][u].x, w[buf][u].y);
    }
  };
  launch_dependents();
  bool waited = false;
  for (int seg = warp; seg < segs; seg += warps) {
    const int k_begin = seg * kSegK, len = min(K - k_begin, kSegK), n_blocks = (len + 15) / 16;
    acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
    load_w(k_begin, len, 0, 0);  // weights first: they depend on no earlier kernel
    if (!waited) grid_dependency_wait(), waited = true;
    load_x(k_begin, len, 0, 0);
    for (int b = 0; b < n_blocks; b += 2 * U) {
      if (b + U < n_blocks) load_w(k_begin, len, b + U, 1), load_x(k_begin, len, b + U, 1);
      run(n_blocks, b, 0);
      if (b + 2 * U < n_blocks) load_w(k_begin, len, b + 2 * U, 0), load_x(k_begin, len, b + 2 * U, 0);
      if (b + U < n_blocks) run(n_blocks, b + U, 1);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) seg_out[seg][lane][e] = acc[e];
  }
  if (!waited) grid_dependency_wait();
  __syncthreads();
  if (warp != 0) return;
  float total[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) total[e] = seg_out[0][lane][e];
  for (int s2 = 1; s2 < segs; ++s2)
#pragma unroll
    for (int e = 0; e < 4; ++e) total[e] += seg_out[s2][lane][e];
  const int f = f0 + 2 * c;
#pragma unroll
  for (int h = 0; h < (HI ? 2 : 1); ++h) {
    const int t = g + 8 * h;
    if (t >= n) continue;
    if (f < rows) Y[int64_t(t) * rows + f] = total[2 * h];
    if (f + 1 < rows) Y[int64_t(t) * rows + f + 1] = total[2 * h + 1];
  }
}

// The definition, one warp per 16 tokens x 8 features, every fragment element loaded from
// global memory with its bounds checked: any K, any alignment.
template <bool BF16>
__global__ void gemm_k16_reference_kernel(const uint16_t* __restrict__ W, const uint16_t* __restrict__ X,
                                          float* __restrict__ Y, int n, int rows, int K) {
  launch_dependents();
  grid_dependency_wait();
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const int t0 = blockIdx.y * 16, f0 = blockIdx.x * 8;
  auto x = [&](int t, int k) -> uint32_t { return t < n && k < K ? X[int64_t(t) * K + k] : 0u; };
  auto w = [&](int f, int k) -> uint32_t { return f < rows && k < K ? W[int64_t(f) * K + k] : 0u; };
  float d[4] = {0.f, 0.f, 0.f, 0.f}, total[4];
  for (int k0 = 0; k0 < K; k0 += 16) {
    const int k = k0 + 2 * c;
    const uint32_t a[4] = {x(t0 + g, k) | x(t0 + g, k + 1) << 16, x(t0 + g + 8, k) | x(t0 + g + 8, k + 1) << 16,
                           x(t0 + g, k + 8) | x(t0 + g, k + 9) << 16,
                           x(t0 + g + 8, k + 8) | x(t0 + g + 8, k + 9) << 16};
    const uint32_t b0 = w(f0 + g, k) | w(f0 + g, k + 1) << 16, b1 = w(f0 + g, k + 8) | w(f0 + g, k + 9) << 16;
    mma_k16<BF16>(d, a, b0, b1);
    if ((k0 + 16) % kSegK == 0 || k0 + 16 >= K) {  // a segment ends
      for (int e = 0; e < 4; ++e) total[e] = k0 < kSegK ? d[e] : total[e] + d[e], d[e] = 0.f;
    }
  }
  const int f = f0 + 2 * c;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int t = t0 + g + 8 * h;
    if (t >= n) continue;
    if (f < rows) Y[int64_t(t) * rows + f] = total[2 * h];
    if (f + 1 < rows) Y[int64_t(t) * rows + f + 1] = total[2 * h + 1];
  }
}

// Y[i] = P[0][i] + P[1][i] + ... (left to right), P the `segs` chains of the split tilings.
__global__ void gemm_k16_fold_kernel(const float* __restrict__ P, float* __restrict__ Y, int64_t count, int segs) {
  launch_dependents();
  grid_dependency_wait();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    float y = P[i];
    for (int s = 1; s < segs; ++s) y += P[s * count + i];
    Y[i] = y;
  }
}

int segments(int64_t K) { return int((K + kSegK - 1) / kSegK); }

// The split tilings' second half: Y = the `segs` chains in `ws` added in order.
void fold_segments(const float* ws, float* Y, int n, int64_t rows, int segs, cudaStream_t stream) {
  const int64_t count = int64_t(n) * rows;
  launch_pdl(gemm_k16_fold_kernel, dim3(unsigned(std::min<int64_t>((count + 255) / 256, 4096))), dim3(256), 0, stream,
             ws, Y, count, segs);
}
void require_workspace(const float* ws) {
  if (ws == nullptr) throw CudaError("gemm_k16: the split tilings need a workspace");
}

// SPLIT: one block per K segment into `ws` (n x W.rows floats per segment), then the fold.
template <typename S, bool BF16, bool SPLIT>
void launch_shape(const DeviceMatrix& W, const uint16_t* X, int n, float* Y, float* ws, cudaStream_t stream) {
  static const bool configured = [] {
    FDL_CUDA_CHECK(cudaFuncSetAttribute(gemm_k16_kernel<S, BF16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(S::smem_bytes)));
    return true;
  }();
  (void)configured;
  const int segs = SPLIT ? segments(W.cols) : 1;
  if (segs > 1) require_workspace(ws);
  const dim3 grid(unsigned((W.rows + S::TN - 1) / S::TN), unsigned((n + S::TM - 1) / S::TM), unsigned(segs));
  launch_pdl(gemm_k16_kernel<S, BF16>, grid, dim3(S::kThreads), S::smem_bytes, stream,
             static_cast<const uint16_t*>(W.data), X, segs > 1 ? ws : Y, n, int(W.rows), int(W.cols));
  if (segs > 1) fold_segments(ws, Y, n, W.rows, segs, stream);
}

template <bool BF16>
void launch_stream(const DeviceMatrix& W, const uint16_t* X, int n, float* Y, float*, cudaStream_t stream) {
  const int segs = int((W.cols + kSegK - 1) / kSegK);
  if (segs > kStreamMaxSegs)
    throw CudaError("gemm_k16: rows of more than " + std::to_string(kStreamMaxSegs) + " x " + std::to_string(kSegK) +
                    " elements");
  for (int t0 = 0; t0 < n; t0 += 16) {  // 16 tokens per launch (a tiling of any n, for the tests)
    const int m = std::min(16, n - t0);
    auto kernel = m > 8 ? gemm_k16_stream_kernel<BF16, true, 8> : gemm_k16_stream_kernel<BF16, false, 8>;
    launch_pdl(kernel, dim3(unsigned((W.rows + 7) / 8)), dim3(32 * unsigned(std::min(segs, kStreamWarps))), 0, stream,
               static_cast<const uint16_t*>(W.data), X + int64_t(t0) * W.cols, Y + int64_t(t0) * W.rows, m,
               int(W.rows), int(W.cols));
  }
}

// Warpgroup-MMA tiles of TOKENS x FEATURES; SPLIT as launch_shape's.
template <int TOKENS, int FEATURES, bool SPLIT>
void launch_wgmma(const DeviceMatrix& W, const uint16_t* X, int n, float* Y, float* ws, cudaStream_t stream) {
  const int segs = SPLIT ? segments(W.cols) : 1;
  if (segs <= 1) return gemm_k16_wgmma(W, X, n, Y, stream, TOKENS, FEATURES, false);
  require_workspace(ws);
  gemm_k16_wgmma(W, X, n, ws, stream, TOKENS, FEATURES, true);
  fold_segments(ws, Y, n, W.rows, segs, stream);
}

template <bool BF16>
void launch_reference(const DeviceMatrix& W, const uint16_t* X, int n, float* Y, float*, cudaStream_t stream) {
  const dim3 grid(unsigned((W.rows + 7) / 8), unsigned((n + 15) / 16));
  launch_pdl(gemm_k16_reference_kernel<BF16>, grid, dim3(32), 0, stream, static_cast<const uint16_t*>(W.data), X, Y,
             n, int(W.rows), int(W.cols));
}

// The tilings (Shape<WM, WN, FM, FN, BK, STAGES>; named tokens x features per block, k per
// stage, stages; "split": a block per K segment, gemm_k16_fold_kernel adds them). Entry 0 is the reference kernel. pick_tiling() chooses by the token count;
// the others stay for gemm_k16_bench and the tests, which check that every entry gives the
// same bits.
struct Tiling {
  const char* name;
  bool split;  // needs gemm_k16_workspace_floats() of workspace
  bool wgmma;  // runs only where gemm_k16_wgmma_available()
  void (*f16)(const DeviceMatrix&, const uint16_t*, int, float*, float*, cudaStream_t);
  void (*bf16)(const DeviceMatrix&, const uint16_t*, int, float*, float*, cudaStream_t);
};
template <typename S, bool SPLIT = false>
constexpr Tiling tiling(const char* name) {
  return Tiling{name, SPLIT, false, launch_shape<S, false, SPLIT>, launch_shape<S, true, SPLIT>};
}
constexpr Tiling kTilings[] = {
    Tiling{"reference", false, false, launch_reference<false>, launch_reference<true>},
    Tiling{"stream <=16 tokens", false, false, launch_stream<false>, launch_stream<true>},
    tiling<Shape<1, 4, 1, 1, 256, 4>>("16x32 k256 s4"),
    tiling<Shape<1, 4, 4, 1, 128, 4>>("64x32 k128 s4"),
    tiling<Shape<1, 4, 4, 2, 64, 4>>("64x64 k64 s4"),
    tiling<Shape<2, 4, 4, 4, 32, 4>>("128x128 k32 s4"),
    tiling<Shape<2, 4, 4, 4, 64, 3>>("128x128 k64 s3"),
    tiling<Shape<1, 4, 4, 2, 64, 4>, true>("64x64 k64 s4 split"),
    Tiling{"128x128 k64 wgmma", false, true, launch_wgmma<128, 128, false>, launch_wgmma<128, 128, false>},
    Tiling{"128x128 k64 wgmma split", true, true, launch_wgmma<128, 128, true>, launch_wgmma<128, 128, true>},
    Tiling{"64x128 k64 wgmma", false, true, launch_wgmma<64, 128, false>, launch_wgmma<64, 128, false>},
    Tiling{"64x128 k64 wgmma split", true, true, launch_wgmma<64, 128, true>, launch_wgmma<64, 128, true>},
    Tiling{"128x192 k64 wgmma", false, true, launch_wgmma<128, 192, false>, launch_wgmma<128, 192, false>},
};
constexpr int kTilingCount = int(sizeof(kTilings) / sizeof(kTilings[0]));

// The entry of kTilings for n tokens (speed only: every entry gives the same bits).
// The streaming kernel takes rows of up to kStreamMaxSegs segments; the split tilings need a
// workspace.
int pick_tiling(int n, int64_t rows, int64_t K, bool workspace) {
  constexpr int kStream = 1, k16x32 = 2, k64x32 = 3, k64x64 = 4, k128x128 = 6, k64x64Split = 7, kWgmma = 8,
                kWgmmaSplit = 9, kWgmma64 = 10, kWgmma64Split = 11, kWgmmaWide = 12;
  static_assert(kTilings[kStream].f16 == launch_stream<false> && kTilings[k64x64Split].split &&
                !kTilings[k128x128].split && kTilings[kWgmma].wgmma && !kTilings[kWgmma].split &&
                kTilings[kWgmmaSplit].split && kTilings[kWgmma64].wgmma && !kTilings[kWgmma64].split &&
                kTilings[kWgmma64Split].split && kTilings[kWgmmaWide].wgmma && !kTilings[kWgmmaWide].split &&
                kTilingCount == 13);
  if (n <= 16) return K <= kStreamMaxSegs * int64_t(kSegK) ? kStream : k16x32;
  const bool can_split = workspace && K > kSegK;
  if (gemm_k16_wgmma_available()) {
    // A work item per K segment where the tiles alone would leave half the SMs idle
    // (measured: docs/GPU.md, tuning log).
    if (n <= 64) return can_split && rows < 128 * 128 ? kWgmma64Split : kWgmma64;
    if (can_split && (n + 127) / 128 * ((rows + 127) / 128) < 64) return kWgmmaSplit;
    return gemm_k16_wgmma_prefers_wide(rows, n) ? kWgmmaWide : kWgmma;
  }
  // Up to 64 tokens: a block per segment while 64-feature blocks alone would not fill the GPU
  // a few times over.
  if (n <= 64) return rows >= 64 * 1024 ? k64x64 : can_split ? k64x64Split : k64x32;
  return k128x128;
}

}  // namespace

bool gemm_k16_supported(const DeviceMatrix& W) {
  return !W.quantized() && (W.type == WType::F16 || W.type == WType::BF16);
}

int gemm_k16_tilings() { return kTilingCount; }

const char* gemm_k16_tiling_name(int tiling) {
  return tiling >= 0 && tiling < kTilingCount ? kTilings[tiling].name : "";
}

bool gemm_k16_tiling_available(int tiling) {
  if (tiling < 0 || tiling >= kTilingCount) return false;
  return !kTilings[tiling].wgmma || gemm_k16_wgmma_available();
}

size_t gemm_k16_workspace_floats(const DeviceMatrix& W, int n, int tiling) {
  if (n <= 0 || tiling < -1 || tiling >= kTilingCount) return 0;
  const int t = tiling >= 0 ? tiling : pick_tiling(n, W.rows, W.cols, true);
  const int segs = segments(W.cols);
  return kTilings[t].split && segs > 1 ? size_t(n) * size_t(W.rows) * size_t(segs) : 0;
}

void gemm_k16(const DeviceMatrix& W, const void* X, int n, float* Y, cudaStream_t stream, int tiling,
              float* workspace) {
  if (n <= 0 || W.rows == 0) return;
  if (!gemm_k16_supported(W)) throw CudaError("gemm_k16: weights must be F16 or BF16");
  if (W.cols <= 0) throw CudaError("gemm_k16: weights with no columns");
  if (W.rows > INT32_MAX || W.cols > INT32_MAX || int64_t(n) * W.rows > INT64_MAX / 4)
    throw CudaError("gemm_k16: " + std::to_string(W.rows) + " x " + std::to_string(W.cols) + " is too large");
  if (tiling < -1 || tiling >= kTilingCount)
    throw CudaError("gemm_k16: no tiling " + std::to_string(tiling) + " (" + std::to_string(kTilingCount) + " exist)");
  const auto* x = static_cast<const uint16_t*>(X);
  const bool aligned = W.cols % 8 == 0 && reinterpret_cast<uintptr_t>(W.data) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(X) % 16 == 0;
  if (!aligned && tiling > 0)
    throw CudaError("gemm_k16: the tiled kernels need 16-byte rows (W.cols % 8 == 0) and 16-byte-aligned W and X");
  const int t = tiling >= 0 ? tiling : aligned ? pick_tiling(n, W.rows, W.cols, workspace != nullptr) : 0;
  (W.type == WType::BF16 ? kTilings[t].bf16 : kTilings[t].f16)(W, x, n, Y, workspace, stream);
}

}  // namespace fdl::cuda
