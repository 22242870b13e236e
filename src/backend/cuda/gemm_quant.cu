// The block-quantized projection of batched steps (gemm_quant.h).
//  - A block of 4 warps computes 128 weight rows x 64 tokens. The weights are the A operand of
//    mma.sync m16n8k16 (rows as M), the tokens the B operand (N): a warp owns 32 rows (two
//    m16 tiles) and all 64 tokens (eight n8 tiles), 64 fp32 accumulators per thread.
//  - K goes in stages of 128 (four 32-value units per row, quant_units.cuh: units 4s .. 4s + 3
//    hold values 128s .. 128s + 127 in every format). Each thread dequantizes four units per
//    stage into the stage's F16 tile in shared memory (each value as the CPU computes it, then
//    rounded: dequantize_to_f16's values), and the token tile arrives by cp.async (zero past
//    n). Two stages of shared memory: while the warps multiply one, the next is filled, and the
//    weights of the stage after it are already on their way into registers.
//  - Matrices with few row tiles split K into up to kMaxSplits ranges, so the grid fills the
//    GPU; each split writes its partial sums to the workspace and a second kernel adds them in
//    split order (no atomics: the same bits on every run).
//  - Shared rows are padded by 8 halves (272 bytes): the ldmatrix rows of a fragment fall in
//    distinct banks.
#include "backend/cuda/gemm_quant.h"

#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/k16_chain.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/quant_units.cuh"

namespace fdl::cuda {
namespace {

constexpr int kThreads = 128, kRows = 128, kTokens = 64, kK = kGemmQuantK;
constexpr int kLd = kK + 8;                                   // halves per shared row
constexpr int kUnitsPerThread = kRows * (kK / 32) / kThreads;  // 4
constexpr int kStageHalves = (kRows + kTokens) * kLd;         // the weight tile, then the tokens'
constexpr size_t kSmemBytes = 2 * size_t(kStageHalves) * sizeof(__half);
constexpr int kMaxSplits = 8;

struct Args {
  const uint8_t* data = nullptr;  // the run's first row
  int cols = 0;
  int64_t rows = 0;  // rows of the run
  const __half* X = nullptr;
  int n = 0;
  float* out = nullptr;  // Y, or the workspace ([split][n][ldy]) when split
  int64_t y0 = 0, ldy = 0;
  int per_split = 0;  // stages per K split
};

__device__ __forceinline__ unsigned smem_addr(const void* p) { return unsigned(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __half* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// Byte i of w as a float, less `offset`: the byte under 0x4B0000 is the float 2^23 + byte
// exactly, so one byte permute and one add give it without a conversion instruction (those
// issue at a fraction of the FP32 rate, and a step converts every weight).
__device__ __forceinline__ float byte_minus(unsigned w, int i, float offset) {
  return __int_as_float(int(__byte_perm(w, 0x4B000000u, 0x7440u + unsigned(i)))) - (8388608.f + offset);
}

// 16 values of a unit's half, as the CPU computes them (quant::value_at: d * float(q - bias) - m,
// every float here exact until the product), rounded to F16, into dst (16-byte aligned).
// Signed bytes (Q8_0) are moved to 0..255 first and 128 taken off with the bias.
__device__ __forceinline__ void store_half16(__half* dst, uint4 q, float d, float m, int bias, bool is_signed) {
  if (is_signed) q = make_uint4(q.x ^ 0x80808080u, q.y ^ 0x80808080u, q.z ^ 0x80808080u, q.w ^ 0x80808080u);
  const float offset = float(bias + (is_signed ? 128 : 0));
  const unsigned words[4] = {q.x, q.y, q.z, q.w};
  uint32_t packed[8];
#pragma unroll
  for (int i = 0; i < 16; i += 2) {
    const float a = __fsub_rn(__fmul_rn(d, byte_minus(words[i / 4], i % 4, offset)), m);
    const float b = __fsub_rn(__fmul_rn(d, byte_minus(words[i / 4], i % 4 + 1, offset)), m);
    const __half2 h = __floats2half2_rn(a, b);
    packed[i / 2] = *reinterpret_cast<const uint32_t*>(&h);
  }
  reinterpret_cast<uint4*>(dst)[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  reinterpret_cast<uint4*>(dst)[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
}

template <typename F>
__global__ void __launch_bounds__(kThreads, 2) gemm_quant_kernel(Args a) {
  extern __shared__ uint4 smem_raw[];
  __half* smem = reinterpret_cast<__half*>(smem_raw);
  launch_dependents();
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  // Token tiles are the fastest grid index: the blocks that read the same weights run together,
  // so the second reads them from L2.
  const int t0 = int(blockIdx.x) * kTokens;
  const int64_t row0 = int64_t(blockIdx.y) * kRows;
  const int split = int(blockIdx.z);
  const int stages = a.cols / kK;
  const int s_begin = split * a.per_split, s_end = min(stages, s_begin + a.per_split);
  const int64_t row_bytes = F::row_bytes(a.cols);

  // This thread's units: unit uu of every stage in rows ur + 32 j.
  const int ur = tid >> 2, uu = tid & 3;
  typename F::Raw raw[kUnitsPerThread];
  auto load_stage = [&](int s) {
#pragma unroll
    for (int j = 0; j < kUnitsPerThread; ++j) {
      const int64_t r = row0 + ur + 32 * j;
      if (r < a.rows) F::load(a.data + r * row_bytes, 4 * s + uu, a.cols, raw[j]);
    }
  };
  // Rows past the run are left as they are: their outputs are never written.
  auto dequantize_stage = [&](int s, __half* w_tile) {
#pragma unroll
    for (int j = 0; j < kUnitsPerThread; ++j) {
      if (row0 + ur + 32 * j >= a.rows) continue;
      quant::Unit w;
      F::unit(raw[j], 4 * s + uu, w);
      __half* row = w_tile + (ur + 32 * j) * kLd;
      store_half16(row + (32 * w.ga + w.oa - kK * s), w.qa, w.da, w.ma, w.bias, w.is_signed);
      store_half16(row + (32 * w.gb + w.ob - kK * s), w.qb, w.db, w.mb, w.bias, w.is_signed);
    }
  };
  // The tokens' k range of stage s into x_tile: 64 rows of 256 bytes, 16-byte copies.
  auto copy_tokens = [&](int s, __half* x_tile) {
#pragma unroll
    for (int i = 0; i < kTokens * (kK / 8) / kThreads; ++i) {
      const int v = tid + kThreads * i, t = v / (kK / 8), c = v % (kK / 8);
      const bool valid = t0 + t < a.n;
      const __half* src = a.X + int64_t(valid ? t0 + t : 0) * a.cols + int64_t(kK) * s + 8 * c;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(x_tile + t * kLd + 8 * c)),
                   "l"(src), "r"(valid ? 16 : 0));
    }
    asm volatile("cp.async.commit_group;\n" ::);
  };

  float acc[2][8][4];
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int t = 0; t < 8; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[m][t][e] = 0.f;

  // The warp's fragments of one stage: 8 k16 steps, each 2 A tiles x 8 B tiles.
  auto multiply_stage = [&](const __half* w_tile, const __half* x_tile) {
    const int a_row = warp * 32 + (lane & 7) + 8 * ((lane >> 3) & 1), a_col = 8 * (lane >> 4);
    const int b_row = (lane & 7) + 8 * (lane >> 4), b_col = 8 * ((lane >> 3) & 1);
#pragma unroll
    for (int kk = 0; kk < kK / 16; ++kk) {
      uint32_t af[2][4];
#pragma unroll
      for (int m = 0; m < 2; ++m) ldmatrix_x4(af[m], w_tile + (a_row + 16 * m) * kLd + 16 * kk + a_col);
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        uint32_t bf[4];
        ldmatrix_x4(bf, x_tile + (b_row + 16 * p) * kLd + 16 * kk + b_col);
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          k16::mma_k16<false>(acc[m][2 * p], af[m], bf[0], bf[1]);
          k16::mma_k16<false>(acc[m][2 * p + 1], af[m], bf[2], bf[3]);
        }
      }
    }
  };

  if (s_begin < s_end) {
    load_stage(s_begin);    // the weights depend on no earlier kernel
    grid_dependency_wait();  // the tokens do
    copy_tokens(s_begin, smem + kRows * kLd);
    dequantize_stage(s_begin, smem);
    if (s_begin + 1 < s_end) load_stage(s_begin + 1);
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();
    for (int s = s_begin; s < s_end; ++s) {
      __half* cur = smem + ((s - s_begin) & 1) * kStageHalves;
      __half* next = smem + (((s - s_begin) & 1) ^ 1) * kStageHalves;
      if (s + 1 < s_end) copy_tokens(s + 1, next + kRows * kLd);
      multiply_stage(cur, cur + kRows * kLd);
      if (s + 1 < s_end) {
        dequantize_stage(s + 1, next);
        if (s + 2 < s_end) load_stage(s + 2);
      }
      asm volatile("cp.async.wait_all;\n" ::: "memory");
      __syncthreads();
    }
  } else {
    grid_dependency_wait();
  }

  // acc[m][t]: rows warp * 32 + 16 m + lane / 4 (+ 8 for e >= 2), tokens 8 t + 2 (lane % 4) + e % 2.
  float* out = a.out + int64_t(split) * a.n * a.ldy;
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int t = 0; t < 8; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t r = row0 + warp * 32 + 16 * m + lane / 4 + 8 * (e >> 1);
        const int tok = t0 + 8 * t + 2 * (lane % 4) + (e & 1);
        if (r < a.rows && tok < a.n) out[int64_t(tok) * a.ldy + a.y0 + r] = acc[m][t][e];
      }
}

// Y = the splits' partial sums added in split order.
__global__ void __launch_bounds__(256) add_splits_kernel(const float* __restrict__ ws, int splits, int64_t count,
                                                         float* __restrict__ Y) {
  launch_dependents();
  grid_dependency_wait();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    float v = ws[i];
    for (int s = 1; s < splits; ++s) v += ws[int64_t(s) * count + i];
    Y[i] = v;
  }
}

bool type_ok(QType t) { return t == QType::Q4_K || t == QType::Q5_K || t == QType::Q6_K || t == QType::Q8_0; }

// K splits for W and n tokens: enough blocks for two per SM, whole stages per split, none empty.
struct Plan {
  int splits = 1, per_split = 0;
};
Plan plan_for(const DeviceMatrix& W, int n) {
  const int stages = int(W.cols / kK);
  int64_t tiles = 0;
  for (int k = 0; k < W.quant.n; ++k) tiles += (W.quant.run[k].rows + kRows - 1) / kRows;
  tiles *= (n + kTokens - 1) / kTokens;
  const int64_t want = 2 * int64_t(device_attribute_once(cudaDevAttrMultiProcessorCount));
  Plan p;
  p.splits = int(std::clamp<int64_t>((want + tiles - 1) / std::max<int64_t>(tiles, 1), 1, std::min(kMaxSplits, stages)));
  p.per_split = (stages + p.splits - 1) / p.splits;
  p.splits = (stages + p.per_split - 1) / p.per_split;
  return p;
}

template <typename F>
void launch_run(const Args& a, int splits, cudaStream_t stream) {
  auto* kernel = gemm_quant_kernel<F>;
  static const bool opted_in = [&] {
    FDL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kSmemBytes)));
    return true;
  }();
  (void)opted_in;
  const dim3 grid(unsigned((a.n + kTokens - 1) / kTokens), unsigned((a.rows + kRows - 1) / kRows), unsigned(splits));
  launch_pdl(kernel, grid, dim3(kThreads), kSmemBytes, stream, a);
}

}  // namespace

bool gemm_quant_fits(const DeviceMatrix& W, int n) {
  if (!W.quantized() || n <= kGemvMaxTokens || n > kGemmQuantMaxTokens) return false;
  if (W.cols < kK || W.cols % kK != 0 || W.cols > (1 << 24) || W.rows > int64_t(65535) * kRows) return false;
  if (size_t(device_attribute_once(cudaDevAttrMaxSharedMemoryPerBlockOptin)) < kSmemBytes) return false;
  for (int k = 0; k < W.quant.n; ++k)
    if (!type_ok(W.quant.run[k].type)) return false;
  return true;
}

size_t gemm_quant_workspace_floats(const DeviceMatrix& W, int n) {
  if (!gemm_quant_fits(W, n)) return 0;
  const Plan p = plan_for(W, n);
  return p.splits > 1 ? size_t(p.splits) * size_t(n) * size_t(W.rows) : 0;
}

void gemm_quant(const DeviceMatrix& W, const void* X, int n, float* Y, float* workspace, cudaStream_t stream) {
  if (!gemm_quant_fits(W, n)) throw CudaError("gemm_quant: the matrix or step does not fit (gemm_quant_fits)");
  const Plan p = plan_for(W, n);
  if (p.splits > 1 && workspace == nullptr) throw CudaError("gemm_quant: K is split and no workspace was given");
  int64_t y0 = 0;
  for (int k = 0; k < W.quant.n; ++k) {
    const QuantRun& run = W.quant.run[k];
    if (run.rows > 0) {
      Args a;
      a.data = static_cast<const uint8_t*>(run.data);
      a.cols = int(W.cols);
      a.rows = run.rows;
      a.X = static_cast<const __half*>(X);
      a.n = n;
      a.out = p.splits > 1 ? workspace : Y;
      a.y0 = y0;
      a.ldy = W.rows;
      a.per_split = p.per_split;
      switch (run.type) {
        case QType::Q4_K: launch_run<quant::Q4K>(a, p.splits, stream); break;
        case QType::Q5_K: launch_run<quant::Q5K>(a, p.splits, stream); break;
        case QType::Q6_K: launch_run<quant::Q6K>(a, p.splits, stream); break;
        case QType::Q8_0: launch_run<quant::Q80>(a, p.splits, stream); break;
        default: throw CudaError("gemm_quant: a run of no supported type");
      }
    }
    y0 += run.rows;
  }
  if (p.splits > 1) {
    const int64_t count = int64_t(n) * W.rows;
    const int64_t blocks = std::min<int64_t>((count + 255) / 256, 4 * int64_t(device_attribute_once(cudaDevAttrMultiProcessorCount)));
    launch_pdl(add_splits_kernel, dim3(unsigned(blocks)), dim3(256), 0, stream, static_cast<const float*>(workspace),
               p.splits, count, Y);
  }
}

}  // namespace fdl::cuda
