// The batch-invariant GEMM's prompt tiling on Hopper's warpgroup MMA (gemm_k16_wgmma.h).
//
// A wgmma m64nNk16 step gives each element the bits of mma.sync m16n8k16 on the same sixteen
// products and accumulator (measured on the H200: every element of 64 x 16 tiles over a
// 4096-long chain, A from registers or shared memory, N of 8 or 16; for these tiles' N = 128,
// tests/gpu/gemm_k16_test.cpp compares every element with the reference kernel's), so a
// chain of wgmma steps over a segment's k16 blocks is gemm_k16's chain.
//
// Block: one or two warpgroups, 64 or 128 tokens x 128 features; warpgroup w multiplies tokens
// [64 w, 64 w + 64) by all 128 features, its accumulators in registers (64 floats per thread)
// beside the total of the finished segments. The MMAs of one k tile run while the next
// tile's are issued (the hardware keeps a warpgroup's steps on one accumulator in order).
// K goes through kStages shared-memory stages of kBK = 64 by cp.async (16 bytes, zero-filled
// past the edges) in the 128-byte-swizzled K-major layout: a row's 64 elements are one 128-byte
// line whose 16-byte chunk c sits at chunk c ^ (row % 8), 8 rows to a 1024-byte atom. Eight
// lanes then copy one whole line of global memory (one L2 request, not eight) into eight
// different banks, and the tensor cores undo the swizzle as they read. A fence makes the
// cp.async data visible to the tensor cores' (async) proxy.
#include "backend/cuda/gemm_k16_wgmma.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm_k16.h"
#include "backend/cuda/launch.h"

namespace fdl::cuda {
namespace {

constexpr int kTN = 128, kBK = 64;
// Stages: 5 for 128-token blocks (one per SM), 4 for 64-token ones (two per SM). Tiles are
// loaded stages - 2 ahead: a stage is refilled two tiles after its MMAs were issued, once they
// are known complete (one group of MMAs stays in flight while the next is issued).
constexpr int stages(int wgm) { return wgm == 1 ? 4 : 5; }
constexpr int kLineBytes = kBK * 2;                 // one row of a stage: 128 bytes
constexpr int kAtomBytes = 8 * kLineBytes;          // 8 rows: the swizzle's period
// WGM warpgroups of 64 tokens per block; + an atom of alignment.
constexpr int stage_bytes(int wgm) { return (64 * wgm + kTN) * kLineBytes; }
constexpr size_t smem_bytes(int wgm) { return size_t(stages(wgm)) * stage_bytes(wgm) + kAtomBytes; }
static_assert(kLineBytes == 128, "the 128-byte swizzle takes rows of 64 16-bit elements");
constexpr int kSegK = kGemmK16Segment;
static_assert(kSegK % kBK == 0 && kBK % 16 == 0);

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
// Shared-memory matrix descriptor: start, leading byte offset (unused by swizzled K-major
// layouts: 1), stride byte offset between 8-row atoms, layout 1 = 128-byte swizzle.
__device__ __forceinline__ uint64_t descriptor(uint32_t addr) {
  return uint64_t((addr >> 4) & 0x3FFF) | uint64_t(1) << 16 | uint64_t(kAtomBytes >> 4) << 32 | uint64_t(1) << 62;
}
// Pins the accumulators around the asynchronous MMA (no copy may move across it).
__device__ __forceinline__ void fence_operands(float (&d)[64]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <bool BF16>
__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t da, uint64_t db) {
  if constexpr (BF16)
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(1));
  else
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(1));
}
#endif

// SPLIT (gridDim.z = the K segments): block z computes segment z alone and writes its chain
// to Y + z * n * rows (the caller's workspace; gemm_k16 then adds the segments in order).
template <bool BF16, int WGM, bool SPLIT>
__global__ void __launch_bounds__(128 * WGM) gemm_k16_wgmma_kernel(const uint16_t* __restrict__ W,
                                                                      const uint16_t* __restrict__ X,
                                                                      float* __restrict__ Y, int n, int rows, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kTM = 64 * WGM, kThreads = 128 * WGM, kStageBytes = stage_bytes(WGM);
  constexpr int kStages = stages(WGM), kAhead = kStages - 2;
  extern __shared__ __align__(16) unsigned char sm[];
  const int tid = int(threadIdx.x), wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;
  const int t_block = int(blockIdx.y) * kTM, f_block = int(blockIdx.x) * kTN;
  // The k tiles [kt0, n_kt) of this block: all of K, or segment blockIdx.z.
  const int kt0 = SPLIT ? int(blockIdx.z) * (kSegK / kBK) : 0;
  const int n_kt = SPLIT ? min((K + kBK - 1) / kBK, kt0 + kSegK / kBK) : (K + kBK - 1) / kBK;
  if (SPLIT) Y += int64_t(blockIdx.z) * n * rows;
  const uint32_t base = (smem_addr(sm) + kAtomBytes - 1) / kAtomBytes * kAtomBytes;

  // Stage s <- k tile kt: the token rows [t_block, +kTM), then the feature rows. Chunk i is row
  // i / 8, 16-byte chunk i % 8 of it.
  auto load = [&](int s, int kt, bool weights, bool tokens) {
    const uint32_t st = base + uint32_t(s * kStageBytes);
    const int k0 = kt * kBK;
    for (int i = tid; i < (kTM + kTN) * (kBK / 8); i += kThreads) {
      const int r = i / 8, kc = i % 8;
      const bool is_w = r >= kTM;
      if (is_w ? !weights : !tokens) continue;
      const int row = is_w ? f_block + r - kTM : t_block + r;
      const int k = k0 + kc * 8;
      const bool ok = row < (is_w ? rows : n) && k < K;
      const uint16_t* src = is_w ? W : X;
      cp_async16(st + uint32_t(r * kLineBytes + ((kc ^ (r % 8)) * 16)),
                 ok ? src + int64_t(row) * K + k : src, ok);
    }
  };

  // The weights depend on no earlier kernel: their first stages are issued before the PDL
  // wait; commit group s then holds token stage s (and every weight stage issued so far).
  launch_dependents();
#pragma unroll
  for (int s = 0; s < kAhead; ++s)
    if (kt0 + s < n_kt) load(s, kt0 + s, true, false);
  grid_dependency_wait();
#pragma unroll
  for (int s = 0; s < kAhead; ++s) {
    if (kt0 + s < n_kt) load(s, kt0 + s, false, true);
    asm volatile("cp.async.commit_group;\n" ::);
  }

  float acc[64], total[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.f, total[i] = 0.f;
  // Segment by segment: inside one, the accumulators are written by the MMAs only (no copy
  // of them can wait on an MMA in flight); between two, the chain is complete and folds.
  for (int kt = kt0; kt < n_kt;) {
    const int seg_first = kt, seg_end = min(n_kt, kt + kSegK / kBK);
    for (; kt < seg_end; ++kt) {
      asm volatile("cp.async.wait_group %0;\n" ::"n"(kAhead - 1));
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      // Stage kt is visible to the tensor cores; both warpgroups' MMAs of tile kt - 2 are
      // complete (each waited for them last iteration), so its stage is refilled now.
      __syncthreads();
      const int next = kt + kAhead;
      if (next < n_kt) load((next - kt0) % kStages, next, true, true);
      asm volatile("cp.async.commit_group;\n" ::);

      const uint32_t st = base + uint32_t(((kt - kt0) % kStages) * kStageBytes);
      // Step j reads bytes [32 j, 32 j + 32) of every row: the start moves along the line and
      // the hardware's swizzle (on the address bits) finds the chunks.
      const uint32_t a0 = st + uint32_t(wg * 64 * kLineBytes), b0 = st + uint32_t(kTM * kLineBytes);
      auto step = [&](int j) {
        wgmma_m64n128k16<BF16>(acc, descriptor(a0 + uint32_t(32 * j)), descriptor(b0 + uint32_t(32 * j)));
      };
      fence_operands(acc);
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
      if (kt * kBK + kBK <= K) {
#pragma unroll
        for (int j = 0; j < kBK / 16; ++j) step(j);
      } else {  // the last tile: a k16 block entirely past K is never multiplied
        for (int j = 0; kt * kBK + 16 * j < K; ++j) step(j);
      }
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // tile kt - 1's are complete
      fence_operands(acc);
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    fence_operands(acc);
    const bool first = seg_first == kt0;
#pragma unroll
    for (int i = 0; i < 64; ++i) total[i] = first ? acc[i] : total[i] + acc[i], acc[i] = 0.f;
  }
  asm volatile("cp.async.wait_group 0;\n" ::);
  // Element 4 j + e of a thread: token 16 warp + g (+ 8 for e >= 2), feature 8 j + 2 c (+ 1).
#pragma unroll
  for (int j = 0; j < kTN / 8; ++j) {
    const int f = f_block + 8 * j + 2 * c;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = t_block + wg * 64 + warp * 16 + g + 8 * h;
      if (t >= n) continue;
      float* y = Y + int64_t(t) * rows + f;
      if (f < rows) y[0] = total[4 * j + 2 * h];
      if (f + 1 < rows) y[1] = total[4 * j + 2 * h + 1];
    }
  }
#else
  __trap();  // launched only where gemm_k16_wgmma_available() (sm_90a code on sm_90)
#endif
}

}  // namespace

bool gemm_k16_wgmma_available() {
#if defined(FDL_HAVE_SM90A)
  static const bool ok = [] {
    int dev = 0, major = 0, minor = 0;
    FDL_CUDA_CHECK(cudaGetDevice(&dev));
    FDL_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    FDL_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return major == 9 && minor == 0;
  }();
  return ok;
#else
  return false;
#endif
}

namespace {

template <int WGM, bool SPLIT>
void launch(const DeviceMatrix& W, const uint16_t* X, int n, float* Y, cudaStream_t stream) {
  auto kernel = W.type == WType::BF16 ? gemm_k16_wgmma_kernel<true, WGM, SPLIT> : gemm_k16_wgmma_kernel<false, WGM, SPLIT>;
  static const bool configured = [] {
    for (auto k : {gemm_k16_wgmma_kernel<true, WGM, SPLIT>, gemm_k16_wgmma_kernel<false, WGM, SPLIT>})
      FDL_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes(WGM))));
    return true;
  }();
  (void)configured;
  const int segs = SPLIT ? int((W.cols + kSegK - 1) / kSegK) : 1;
  const dim3 grid(unsigned((W.rows + kTN - 1) / kTN), unsigned((n + 64 * WGM - 1) / (64 * WGM)), unsigned(segs));
  launch_pdl(kernel, grid, dim3(128 * WGM), smem_bytes(WGM), stream, static_cast<const uint16_t*>(W.data), X, Y, n,
             int(W.rows), int(W.cols));
}

}  // namespace

void gemm_k16_wgmma(const DeviceMatrix& W, const uint16_t* X, int n, float* Y, cudaStream_t stream, int token_rows,
                    bool split) {
  if (!gemm_k16_wgmma_available())
    throw CudaError("gemm_k16: the wgmma tilings need sm_90a code (CMAKE_CUDA_ARCHITECTURES 90a) on an sm_90 GPU");
  if (token_rows == 128 && !split) return launch<2, false>(W, X, n, Y, stream);
  if (token_rows == 64 && !split) return launch<1, false>(W, X, n, Y, stream);
  if (token_rows == 64 && split) return launch<1, true>(W, X, n, Y, stream);
  throw CudaError("gemm_k16: no wgmma tiling of " + std::to_string(token_rows) + " tokens" + (split ? " split" : ""));
}

}  // namespace fdl::cuda
