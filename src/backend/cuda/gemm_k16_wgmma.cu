// The batch-invariant GEMM's tilings on Hopper's warpgroup MMA (gemm_k16_wgmma.h).
//
// A wgmma m64nNk16 step gives each element the bits of mma.sync m16n8k16 on the same sixteen
// products and accumulator (measured on the H200: every element of 64 x 16 tiles over a
// 4096-long chain, A from registers or shared memory, N of 8 or 16; for these tiles' N = 128,
// tests/gpu/gemm_k16_test.cpp compares every element with the reference kernel's). So per K
// segment a chain of wgmma steps over its k16 blocks from zero, in order, then the segments'
// chains added in order in registers (or, split, one work item per segment and gemm_k16's
// fold), is gemm_k16's arithmetic.
//
// Operands: one thread of a producer warpgroup issues the copies: per k tile of
// kBK = 64, one TMA box of the tile's token rows and one of its 128 or 192 feature rows, each row's 64
// elements one 128-byte line in the 128-byte swizzle that the wgmma descriptors read (the copy
// engine swizzles; elements past the matrices' edges arrive as zeros). A full barrier per stage
// counts the bytes in; an empty barrier per stage counts the consumer warps out. The one or two
// consumer warpgroups (64 tokens each) only wait and multiply, one k tile of MMAs in flight
// while the next is issued, and free a stage once its MMAs are complete. No thread computes
// addresses for a copy and no block barrier sits in the main loop (docs/GPU.md, tuning log: a
// kernel whose threads all copied by cp.async ran at half this speed).
//
// Blocks are persistent (one per SM): work item i (a 64- or 128-token tile of 128 or 192
// features, or
// with SPLIT one K segment of it) goes to block i % grid, tokens fastest, so the blocks that read
// the same weight rows run together and share them through L2. While the consumers store a
// finished item, the producer is already filling the stages with the next item's tiles.
#include <cuda.h>  // CUtensorMap and its enums (the encoder is fetched from the driver at run time)
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm_k16.h"
#include "backend/cuda/gemm_k16_wgmma.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/sm90_async.cuh"

namespace fdl::cuda {
namespace {

constexpr int kBK = 64, kLine = kBK * 2;
constexpr int kSegTiles = kGemmK16Segment / kBK;  // k tiles per K segment
static_assert(kGemmK16Segment % kBK == 0 && kLine == 128);
// Stages of (64 CONS + TN) rows x 128 bytes: 6 of 32 KiB for two consumers and 128 features, 5 of
// 40 KiB for 192, 8 of 24 KiB for one consumer.
constexpr int stage_bytes(int cons, int tn) { return (64 * cons + tn) * kLine; }
constexpr int stages(int cons, int tn) { return tn == 192 ? 5 : cons == 1 ? 8 : 6; }
constexpr size_t smem_bytes(int cons, int tn) {
  return 1024 /* alignment of the swizzle */ + size_t(stages(cons, tn)) * stage_bytes(cons, tn) +
         2 * size_t(stages(cons, tn)) * sizeof(uint64_t);
}
static_assert(smem_bytes(2, 192) <= 227 * 1024 && smem_bytes(2, 128) <= 227 * 1024 && smem_bytes(1, 128) <= 227 * 1024);
// The consumer warpgroups, then the producer's: registers are handed out per warpgroup, and
// setmaxnreg (which moves them from the producer to the consumers) takes whole warpgroups.
constexpr int threads(int cons) { return 128 * (cons + 1); }
// Registers per thread after the hand-over: 128 x 40 + 2 x 128 x 232 <= 65536. A consumer of
// 192 features holds 2 x 96 accumulators (the running chain and the segments' total).
constexpr int kProducerRegs = 40, kConsumerRegs = 232;

// An item's place: (feature tile, segment, token tile), tokens fastest.
struct Item {
  int t_tile, f_tile, seg;
};
__device__ __forceinline__ Item decode_item(int i, int t_tiles, int segs) {
  return Item{i % t_tiles, i / t_tiles / segs, i / t_tiles % segs};
}

template <bool BF16, int CONS, int TN, bool SPLIT>
__global__ void __launch_bounds__(threads(CONS), 1)
    gemm_k16_wgmma_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap w_map,
                        float* __restrict__ Y, int n, int rows, int K) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using namespace sm90;
  constexpr int kTM = 64 * CONS, kTN = TN, kStages = stages(CONS, TN), kStageBytes = stage_bytes(CONS, TN);
  constexpr int kAcc = TN / 2;  // accumulators per thread
  constexpr int kConsumerWarps = 4 * CONS;
  extern __shared__ __align__(1024) unsigned char sm[];
  const uint32_t raw = smem_addr(sm), base = (raw + 1023u) & ~1023u;
  uint64_t* full = reinterpret_cast<uint64_t*>(sm + (base - raw) + size_t(kStages) * kStageBytes);
  uint64_t* empty = full + kStages;
  // The warp's index through a shuffle: the compiler then knows it is uniform in the warp, and
  // does not serialize the MMAs on the consumers' side of the role branch.
  const int tid = int(threadIdx.x), warp = __shfl_sync(0xffffffffu, tid / 32, 0), lane = tid % 32;
  const int t_tiles = (n + kTM - 1) / kTM, f_tiles = (rows + kTN - 1) / kTN;
  const int k_tiles = (K + kBK - 1) / kBK, segs = SPLIT ? (k_tiles + kSegTiles - 1) / kSegTiles : 1;
  const int items = t_tiles * f_tiles * segs;
  // The k tiles [first, end) of an item: all of K, or its segment.
  auto k_range = [&](const Item& it, int& first, int& end) {
    first = SPLIT ? it.seg * kSegTiles : 0;
    end = SPLIT ? min(k_tiles, first + kSegTiles) : k_tiles;
  };

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) barrier_init(&full[s], 1), barrier_init(&empty[s], kConsumerWarps);
    barrier_init_fence();
  }
  __syncthreads();
  launch_dependents();

  if (warp >= kConsumerWarps) {  // the producer: one thread of its warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    if (warp != kConsumerWarps || lane != 0) return;
    auto w_copy = [&](int s, const Item& it, int kt) {
      barrier_arrive_expect(&full[s], kStageBytes);
      tma_load_2d(base + uint32_t(s * kStageBytes + kTM * kLine), &w_map, kt * kBK, it.f_tile * kTN, &full[s]);
    };
    auto x_copy = [&](int s, const Item& it, int kt) {
      tma_load_2d(base + uint32_t(s * kStageBytes), &x_map, kt * kBK, it.t_tile * kTM, &full[s]);
    };
    // The weights depend on no earlier kernel: the first item's first stages of them are
    // requested before the PDL wait, their token rows after it.
    int primed = 0;
    if (int(blockIdx.x) < items) {
      const Item it = decode_item(int(blockIdx.x), t_tiles, segs);
      int first, end;
      k_range(it, first, end);
      for (; primed < kStages && first + primed < end; ++primed) w_copy(primed, it, first + primed);
    }
    grid_dependency_wait();
    int step = 0;  // k tiles issued by this block so far
    for (int i = int(blockIdx.x); i < items; i += int(gridDim.x)) {
      const Item it = decode_item(i, t_tiles, segs);
      int first, end;
      k_range(it, first, end);
      for (int kt = first; kt < end; ++kt, ++step) {
        const int s = step % kStages;
        if (step >= primed) {
          barrier_wait(&empty[s], ((step / kStages) & 1) ^ 1);
          w_copy(s, it, kt);
        }
        x_copy(s, it, kt);
      }
    }
    return;
  }

  // The consumers: warpgroup wg multiplies tokens [64 wg, 64 wg + 64) of the tile by its 128
  // features.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));
  grid_dependency_wait();  // Y may still be read by the previous kernel
  const int wg = warp / 4, g = lane / 4, c = lane % 4;
  float acc[kAcc], total[kAcc];
#pragma unroll
  for (int e = 0; e < kAcc; ++e) acc[e] = 0.f, total[e] = 0.f;
  auto release = [&](int s) {
    __syncwarp();
    if (lane == 0) barrier_arrive(&empty[s]);
  };
  int step = 0;
  for (int i = int(blockIdx.x); i < items; i += int(gridDim.x)) {
    const Item it = decode_item(i, t_tiles, segs);
    int first, end;
    k_range(it, first, end);
    // Segment by segment: inside one, the accumulators are written by the MMAs only; between
    // two, the chain is complete and folds into the total.
    for (int kt = first; kt < end;) {
      const bool first_seg = kt == first;
      const int seg_end = min(end, (kt / kSegTiles + 1) * kSegTiles);
      int pending = -1;  // the stage whose MMAs were issued last and may be in flight
      for (; kt < seg_end; ++kt, ++step) {
        const int s = step % kStages;
        barrier_wait(&full[s], (step / kStages) & 1);
        const uint32_t a0 = base + uint32_t(s * kStageBytes + wg * 64 * kLine);
        const uint32_t b0 = base + uint32_t(s * kStageBytes + kTM * kLine);
        fence_operands(acc);
        mma_fence();
        // Step j reads bytes [32 j, 32 j + 32) of every row; a k16 block entirely past K is
        // never multiplied (the chain has one step per block of K).
        if (kt * kBK + kBK <= K) {
#pragma unroll
          for (int j = 0; j < kBK / 16; ++j)
            mma_m64nNk16<BF16, TN>(acc, descriptor(a0 + uint32_t(32 * j)), descriptor(b0 + uint32_t(32 * j)));
        } else {
          for (int j = 0; kt * kBK + 16 * j < K; ++j)
            mma_m64nNk16<BF16, TN>(acc, descriptor(a0 + uint32_t(32 * j)), descriptor(b0 + uint32_t(32 * j)));
        }
        mma_commit();
        mma_wait<1>();  // the previous tile's MMAs are complete: its stage is free
        fence_operands(acc);
        if (pending >= 0) release(pending);
        pending = s;
      }
      mma_wait<0>();
      fence_operands(acc);
      release(pending);
#pragma unroll
      for (int e = 0; e < kAcc; ++e) total[e] = first_seg ? acc[e] : total[e] + acc[e], acc[e] = 0.f;
    }
    // Element 4 j + e: token 16 warp + g (+ 8 for e >= 2) of the warpgroup's 64, feature
    // 8 j + 2 c (+ 1).
    float* y = SPLIT ? Y + int64_t(it.seg) * n * rows : Y;
    const int t0 = it.t_tile * kTM + wg * 64 + (warp % 4) * 16 + g;
#pragma unroll
    for (int j = 0; j < kTN / 8; ++j) {
      const int f = it.f_tile * kTN + 8 * j + 2 * c;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int t = t0 + 8 * h;
        if (t >= n) continue;
        float* out = y + int64_t(t) * rows + f;
        if (f + 1 < rows)
          *reinterpret_cast<float2*>(out) = make_float2(total[4 * j + 2 * h], total[4 * j + 2 * h + 1]);
        else if (f < rows)
          out[0] = total[4 * j + 2 * h];
      }
    }
  }
#else
  __trap();  // launched only where gemm_k16_wgmma_available() (sm_90a code on sm_90)
#endif
}

// The driver's tensor-map encoder, fetched once through the runtime (no link to libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    FDL_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || p == nullptr)
      throw CudaError("gemm_k16: the driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A map of a row-major [rows][cols] 16-bit matrix read in boxes of box_rows x 64 elements,
// 128-byte swizzled (the layout the wgmma descriptors name), zeros past the edges.
CUtensorMap tile_map(const void* data, bool bf16, int64_t rows, int64_t cols, int box_rows) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols) * 2};
  const cuuint32_t box[2] = {cuuint32_t(kBK), cuuint32_t(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = tensor_map_encoder()(
      &map, bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<void*>(data), dims,
      strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw CudaError("gemm_k16: cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) + ") for a " +
                    std::to_string(rows) + " x " + std::to_string(cols) + " matrix");
  return map;
}

template <int CONS, int TN, bool SPLIT>
void launch(const DeviceMatrix& W, const uint16_t* X, int n, float* Y, cudaStream_t stream) {
  const bool bf16 = W.type == WType::BF16;
  auto kernel = bf16 ? gemm_k16_wgmma_kernel<true, CONS, TN, SPLIT> : gemm_k16_wgmma_kernel<false, CONS, TN, SPLIT>;
  static const bool configured = [] {
    for (auto k : {gemm_k16_wgmma_kernel<true, CONS, TN, SPLIT>, gemm_k16_wgmma_kernel<false, CONS, TN, SPLIT>})
      FDL_CUDA_CHECK(
          cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes(CONS, TN))));
    return true;
  }();
  (void)configured;
  const int64_t k_tiles = (W.cols + kBK - 1) / kBK;
  const int64_t segs = SPLIT ? (k_tiles + kSegTiles - 1) / kSegTiles : 1;
  const int64_t items = (n + 64 * CONS - 1) / (64 * CONS) * ((W.rows + TN - 1) / TN) * segs;
  const CUtensorMap x_map = tile_map(X, bf16, n, W.cols, 64 * CONS);
  const CUtensorMap w_map = tile_map(W.data, bf16, W.rows, W.cols, TN);
  const int64_t sms = device_attribute_once(cudaDevAttrMultiProcessorCount);
  launch_pdl(kernel, dim3(unsigned(std::min<int64_t>(items, sms))), dim3(threads(CONS)),
             smem_bytes(CONS, TN), stream, x_map, w_map, Y, n, int(W.rows), int(W.cols));
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

bool gemm_k16_wgmma_prefers_wide(int64_t rows, int n) {
  // A round (one tile per SM) of 192-feature tiles takes about 1.5 times one of 128-feature
  // tiles (measured: the wider tile is no faster per feature), so it pays only where it needs
  // fewer feature-rounds: where 128-feature tiles leave a last round mostly empty.
  const int64_t t_tiles = (n + 127) / 128, sms = device_attribute_once(cudaDevAttrMultiProcessorCount);
  const int64_t rounds128 = (t_tiles * ((rows + 127) / 128) + sms - 1) / sms;
  const int64_t rounds192 = (t_tiles * ((rows + 191) / 192) + sms - 1) / sms;
  return rounds192 * 192 < rounds128 * 128;
}

void gemm_k16_wgmma(const DeviceMatrix& W, const uint16_t* X, int n, float* Y, cudaStream_t stream, int token_rows,
                    int features, bool split) {
  if (!gemm_k16_wgmma_available())
    throw CudaError("gemm_k16: the wgmma tilings need sm_90a code (CMAKE_CUDA_ARCHITECTURES 90a) on an sm_90 GPU");
  if (token_rows == 128 && features == 128) return split ? launch<2, 128, true>(W, X, n, Y, stream)
                                                         : launch<2, 128, false>(W, X, n, Y, stream);
  if (token_rows == 128 && features == 192 && !split) return launch<2, 192, false>(W, X, n, Y, stream);
  if (token_rows == 64 && features == 128) return split ? launch<1, 128, true>(W, X, n, Y, stream)
                                                        : launch<1, 128, false>(W, X, n, Y, stream);
  throw CudaError("gemm_k16: no wgmma tiling of " + std::to_string(token_rows) + " tokens x " +
                  std::to_string(features) + " features" + (split ? " split" : ""));
}

}  // namespace fdl::cuda
