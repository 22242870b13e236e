// The block-quantized GEMV for steps of up to kStagedMaxTokens tokens (gemv_quant_staged.h).
//  - One block of 16 warps per SM takes a contiguous share of the rows; warp w takes the
//    share's rows w, w + 16, ... as one stream of batches (UNROLL pairs per lane,
//    quant_pairs.cuh) through NB register buffers, as the F16 decode blocks stream their rows (decode_block.cuh:
//    stream_rows): while a batch is multiplied, the next NB - 1 are in flight, across row
//    boundaries, so a warp's HBM requests never drain at the end of a row.
//  - Each block rounds the fp32 activations into shared memory itself (q8_dot.cuh:
//    round_group) after the PDL wait, its first weight batches already in flight: no separate
//    rounding kernel, and the dot products read the 8-bit activations from shared memory
//    instead of once per row from L1.
//  - A lane sums its pairs (lane, lane + 32, ...) in pair order, then the warp reduces: the
//    order of gemv_quant.cu's kernel, so a token's result has the same bits whichever kernel
//    or token count ran it (tests/gpu/quant_gemv_test.cpp).
//  - Pairs mode (gemv_quant_swiglu): the warp's stream is gate row p, up row n_ff + p, ..., and
//    it writes act(gate) * up (ffn_act.cuh) instead of the two dot products.
//  - Norm mode (gemv_quant_norm*, one decode token): the block computes the residual add and
//    RMSNorm itself before rounding, so a decode layer needs no norm kernel.

#include "backend/cuda/gemv_quant_staged.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/decode_block.cuh"
#include "backend/cuda/ffn_act.cuh"
#include "backend/cuda/launch.h"
#include "backend/cuda/q8_dot.cuh"
#include "backend/cuda/quant_pairs.cuh"

namespace fdl::cuda {
namespace {

constexpr int kWarps = 16, kThreads = 32 * kWarps;
// An upper bound on the kernels' static shared memory (norm mode: norm_to_smem's two arrays
// of kWarps doubles), counted with the dynamic bytes against the device's limits.
constexpr size_t kStaticSmemBound = 1024;

struct StagedArgs {
  const uint8_t* data = nullptr;  // the run's first row
  int cols = 0;
  int64_t rows = 0;      // rows of the run; pairs mode: 2 * n_ff
  int64_t per_block = 0; // rows (pairs) per block
  const float* X = nullptr;  // fp32 [n][cols]
  int n = 0;
  float* Y = nullptr;  // Y[t * ldy + y0 + r]; pairs mode: h[t * ldy + p]
  int64_t y0 = 0, ldy = 0;
  bool gelu = false;
  NormIn norm;  // kNorm: X is norm's row, normalized in the block (one token)
};

// Shared memory: the rounded activations of n tokens, q [n][cols] int8 (permuted by
// quant::swizzle16, padded to whole 128-byte lines), d [n][cols / 32], s [n][cols / 16].
// kNorm adds the normalized fp32 row, xs [cols], after them.
__host__ __device__ size_t staged_q_bytes(int n, int64_t cols) { return (size_t(n) * size_t(cols) + 127) / 128 * 128; }
__host__ __device__ size_t staged_d_bytes(int n, int64_t cols) { return (size_t(n) * size_t(cols / 32) * sizeof(float) + 15) / 16 * 16; }
__host__ __device__ size_t staged_bytes(int n, int64_t cols) {
  return staged_q_bytes(n, cols) + staged_d_bytes(n, cols) + size_t(n) * size_t(cols / 16) * sizeof(int32_t);
}
size_t norm_staged_bytes(int64_t cols) { return (staged_bytes(1, cols) + 15) / 16 * 16 + size_t(cols) * sizeof(float); }

// Lane `lane`'s share of storing group g's rounding (q8_dot.cuh: store_group, with q permuted).
__device__ __forceinline__ void stage_group(const quant::Q8Group& r, int g, int lane, int8_t* q, float* d,
                                            int32_t* s) {
  q[quant::swizzle16(g * 32 + lane)] = int8_t(r.q);
  if (lane == 0) d[g] = r.d;
  if ((lane & 15) == 0) s[g * 2 + lane / 16] = r.sum16;
}

// Rounds X's n rows into shared memory: warp w takes groups w, w + 16, ..., each lane issuing
// kBatch groups' loads before it rounds any (one L2 round trip per kBatch x 16 groups).
__device__ __forceinline__ void stage_activations(const float* X, int n, int cols, int8_t* sq, float* sd,
                                                  int32_t* ss) {
  constexpr int kBatch = 8;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int total = n * (cols / 32);
  for (int g0 = warp; g0 < total; g0 += kBatch * kWarps) {
    float v[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int g = g0 + k * kWarps;
      v[k] = g < total ? __ldcg(X + int64_t(g) * 32 + lane) : 0.f;  // written by the previous kernel
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int g = g0 + k * kWarps;
      if (g >= total) break;
      stage_group(quant::round_group(v[k]), g, lane, sq, sd, ss);
    }
  }
  __syncthreads();
}

// kNorm: the block normalizes the row itself (decode_block.cuh: norm_to_smem, as the fused F16
// GEMVs do; block 0 writes the residual row to norm.x_out) into xs, then rounds it.
__device__ __forceinline__ void stage_normalized(const NormIn& in, int cols, float* xs, int8_t* sq, float* sd,
                                                 int32_t* ss) {
  block::norm_to_smem<kThreads, true>(in, cols, in.w, xs);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int g = warp; g < cols / 32; g += kWarps) stage_group(quant::round_group(xs[g * 32 + lane]), g, lane, sq, sd, ss);
  __syncthreads();
}

// R rows a warp multiplies together (a "group"): each batch of the stream loads one pair per
// lane of each of the group's rows, and the pair's activations, read once from shared memory,
// multiply all of them. Pairs mode: R / 2 (gate, up) pairs per group, gate row p then up row p;
// with R = 1, gate row p and up row p are consecutive groups (the gate's sum waits in a
// register).
template <typename F, int NT, int R, int NB, bool kPairs, bool kNorm>
__global__ void __launch_bounds__(kThreads, 1) gemv_quant_staged_kernel(StagedArgs a) {
  static_assert(R == 1 || R == 2, "one or two rows per group");
  constexpr bool kSplitPairs = kPairs && R == 1;
  extern __shared__ uint4 smem[];
  launch_dependents();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int cols = a.cols, pairs = quant::pairs_of(cols), n = a.n;
  const int64_t row_bytes = quant_row_bytes(F::kType, cols);
  // This block's rows (pairs) [r0, r1) and this warp's count of them: its entries m = 0, 1, ...
  // are rows (pairs) r0 + warp + 16 m.
  const int64_t span = kPairs ? a.rows / 2 : a.rows;
  const int64_t r0 = ::min(span, int64_t(blockIdx.x) * a.per_block), r1 = ::min(span, r0 + a.per_block);
  const int mine = r0 + warp < r1 ? int((r1 - r0 - warp + kWarps - 1) / kWarps) : 0;
  constexpr int kEntries = kSplitPairs ? 1 : kPairs ? R / 2 : R;  // entries per group
  const int groups = kSplitPairs ? 2 * mine : (mine + kEntries - 1) / kEntries;
  // The entry of row j of group i (it exists if below `mine`: warp-uniform), and its row.
  auto entry = [&](int i, int j) {
    if constexpr (kSplitPairs) return i >> 1;
    return kEntries * i + (kPairs ? j / 2 : j);
  };
  auto row_index = [&](int i, int j) -> int64_t {
    const int64_t e = r0 + warp + int64_t(kWarps) * entry(i, j);
    if constexpr (kSplitPairs) return (i & 1) * span + e;
    if constexpr (kPairs) return (j & 1) * span + e;
    return e;
  };
  const int per_row = (pairs + 31) / 32, total = groups * per_row;  // batches per group, in all
  using Raw = typename F::Raw;
  Raw buf[NB][R];
  int load_i = 0, load_k = 0;  // the next batch to load: group load_i, pairs lane + 32 load_k
  auto load_next = [&](Raw(&w)[R]) {
    const int P = lane + 32 * load_k;
    if (load_i < groups && P < pairs) {
#pragma unroll
      for (int j = 0; j < R; ++j)
        if (entry(load_i, j) < mine) F::load(a.data + row_index(load_i, j) * row_bytes, P, cols, w[j]);
    }
    if (++load_k == per_row) load_k = 0, ++load_i;
  };
#pragma unroll
  for (int j = 0; j < NB - 1; ++j) load_next(buf[j]);

  int8_t* sq = reinterpret_cast<int8_t*>(smem);
  float* sd = reinterpret_cast<float*>(sq + staged_q_bytes(n, cols));
  int32_t* ss = reinterpret_cast<int32_t*>(reinterpret_cast<int8_t*>(sd) + staged_d_bytes(n, cols));
  grid_dependency_wait();  // the activations come from the previous kernel; the weights do not
  if constexpr (kNorm) {
    const size_t at = (staged_bytes(1, cols) + 15) / 16 * 16;
    stage_normalized(a.norm, cols, reinterpret_cast<float*>(reinterpret_cast<int8_t*>(smem) + at), sq, sd, ss);
  } else {
    stage_activations(a.X, n, cols, sq, sd, ss);
  }

  float acc[R][NT];
  [[maybe_unused]] float gate[NT];
#pragma unroll
  for (int j = 0; j < R; ++j)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[j][t] = 0.f;
  int use_i = 0, use_k = 0;  // the next batch to multiply
  auto consume = [&](const Raw(&w)[R]) {
    const int P = lane + 32 * use_k;
    if (P < pairs) {
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if (t >= n) break;
        const quant::PairAct x = F::act(P, cols, quant::SwizzledQ8Row{sq, t * cols, sd + t * (cols / 32), ss + t * (cols / 16)});
#pragma unroll
        for (int j = 0; j < R; ++j)
          if (entry(use_i, j) < mine) F::dot_act(w[j], P, cols, x, acc[j][t]);
      }
    }
    if (++use_k != per_row) return;
    // The group's rows are complete: reduce each over the warp and write it.
#pragma unroll
    for (int j = 0; j < R; ++j) {
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        float v = acc[j][t];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        acc[j][t] = v;
      }
    }
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const bool here = entry(use_i, j) < mine;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        if constexpr (kSplitPairs) {
          if (!(use_i & 1)) {
            gate[t] = acc[j][t];
          } else if (lane == 0 && t < n) {
            a.Y[int64_t(t) * a.ldy + row_index(use_i, j) - span] = ffn_act(gate[t], acc[j][t], a.gelu);
          }
        } else if constexpr (kPairs) {
          if ((j & 1) && here && lane == 0 && t < n)
            a.Y[int64_t(t) * a.ldy + row_index(use_i, j) - span] = ffn_act(acc[j - 1][t], acc[j][t], a.gelu);
        } else {
          if (here && lane == 0 && t < n) a.Y[int64_t(t) * a.ldy + a.y0 + row_index(use_i, j)] = acc[j][t];
        }
      }
    }
#pragma unroll
    for (int j = 0; j < R; ++j)
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[j][t] = 0.f;
    use_k = 0;
    ++use_i;
  };
  for (int k = 0; k < total; k += NB) {
#pragma unroll
    for (int j = 0; j < NB; ++j) {  // buffer indices are compile-time: the ring stays in registers
      if (k + j >= total) break;
      load_next(buf[(j + NB - 1) % NB]);
      consume(buf[j]);
    }
  }
}

/// FLASHDLLM_GEMV_QUANT_STAGED=0 (read once) turns the staged kernels off: gemv_quant's other
/// kernel, and silu_mul after it, run every step (for A/B timing).
bool staged_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("FLASHDLLM_GEMV_QUANT_STAGED");
    return !(e != nullptr && std::string(e) == "0");
  }();
  return on;
}

/// FLASHDLLM_GEMV_QUANT_ROWS (read once): rows a warp multiplies together in one-token steps,
/// 1 or 2 (default 2).
int rows_per_group() {
  static const int rows = [] {
    const char* e = std::getenv("FLASHDLLM_GEMV_QUANT_ROWS");
    return e != nullptr && std::string(e) == "1" ? 1 : 2;
  }();
  return rows;
}

// Register buffers for R rows per group: one pair per lane per row per batch, NB - 1 batches
// in flight while one is multiplied. A Q4_K pair's raw bytes take 12 registers, the others'
// 17-20, so with two rows their rings are shallower (three buffers would spill).
template <typename F, int R>
constexpr int buffers_for() {
  if constexpr (R == 1) return 4;
  return std::is_same_v<F, quant::Q4KPair> ? 3 : 2;
}

size_t shared_memory_limit() { return size_t(device_attribute_once(cudaDevAttrMaxSharedMemoryPerBlockOptin)); }

template <typename F, int NT, int R, bool kPairs, bool kNorm>
void launch_typed(StagedArgs a, cudaStream_t stream) {
  auto* kernel = gemv_quant_staged_kernel<F, NT, R, buffers_for<F, R>(), kPairs, kNorm>;
  const size_t smem = kNorm ? norm_staged_bytes(a.cols) : staged_bytes(a.n, a.cols);
  // Opted in once per kernel to all the dynamic shared memory the fits() checks allow (the 48
  // KiB default counts the static reductions of norm mode too), not with a runtime call per
  // launch.
  static const bool opted_in = [&] {
    const int most = int(shared_memory_limit() - kStaticSmemBound);
    FDL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
    return true;
  }();
  (void)opted_in;
  const int64_t span = kPairs ? a.rows / 2 : a.rows;
  const int64_t sms = device_attribute_once(cudaDevAttrMultiProcessorCount);
  const int64_t blocks = std::min<int64_t>(sms, (span + kWarps - 1) / kWarps);
  a.per_block = (span + blocks - 1) / blocks;
  launch_pdl(kernel, dim3(unsigned(blocks)), dim3(kThreads), smem, stream, a);
}

// Rows per group: one-token steps as rows_per_group() says; longer ones (whose activations
// are read once per token anyway) one row, or one gate/up pair.
template <typename F, int NT, bool kPairs, bool kNorm>
void launch_rows(const StagedArgs& a, cudaStream_t stream) {
  if constexpr (NT > 1) {
    return launch_typed<F, NT, 1, kPairs, kNorm>(a, stream);
  } else {
    if (rows_per_group() == 1) return launch_typed<F, 1, 1, kPairs, kNorm>(a, stream);
    return launch_typed<F, 1, 2, kPairs, kNorm>(a, stream);
  }
}

template <int NT, bool kPairs, bool kNorm>
void launch_nt(QType type, const StagedArgs& a, cudaStream_t stream) {
  switch (type) {
    case QType::Q4_K: return launch_rows<quant::Q4KPair, NT, kPairs, kNorm>(a, stream);
    case QType::Q5_K: return launch_rows<quant::Q5KPair, NT, kPairs, kNorm>(a, stream);
    case QType::Q6_K: return launch_rows<quant::Q6KPair, NT, kPairs, kNorm>(a, stream);
    case QType::Q8_0: return launch_rows<quant::Q80Pair, NT, kPairs, kNorm>(a, stream);
    default: throw CudaError("gemv_quant: a run of no type");
  }
}

template <bool kPairs>
void launch(QType type, const StagedArgs& a, cudaStream_t stream) {
  if (a.norm.x != nullptr) return launch_nt<1, kPairs, true>(type, a, stream);
  if (a.n == 1) return launch_nt<1, kPairs, false>(type, a, stream);
  if (a.n == 2) return launch_nt<2, kPairs, false>(type, a, stream);
  return launch_nt<4, kPairs, false>(type, a, stream);
}

// The launch of one run of W's rows, rows y0 .. of Y ([n][ldy]).
StagedArgs run_args(const QuantRun& run, int64_t cols, int n, float* Y, int64_t y0, int64_t ldy) {
  StagedArgs a;
  a.data = static_cast<const uint8_t*>(run.data);
  a.cols = int(cols);
  a.rows = run.rows;
  a.n = n;
  a.Y = Y;
  a.y0 = y0;
  a.ldy = ldy;
  return a;
}

bool norm_ok(const NormIn& in) { return in.x != nullptr && in.w != nullptr && in.x_out != in.x; }

}  // namespace

bool gemv_quant_staged_fits(const DeviceMatrix& W, int n) {
  return staged_enabled() && W.quantized() && n >= 1 && n <= kStagedMaxTokens && W.cols <= INT32_MAX / kStagedMaxTokens &&
         staged_bytes(n, W.cols) + kStaticSmemBound <= shared_memory_limit();
}

void gemv_quant_staged(const DeviceMatrix& W, const float* X, int n, float* Y, cudaStream_t stream) {
  if (!gemv_quant_staged_fits(W, n)) throw CudaError("gemv_quant_staged: the step does not fit (gemv_quant_staged_fits)");
  int64_t y0 = 0;
  for (int k = 0; k < W.quant.n; ++k) {
    const QuantRun& run = W.quant.run[k];
    if (run.rows > 0) {
      StagedArgs a = run_args(run, W.cols, n, Y, y0, W.rows);
      a.X = X;
      launch<false>(run.type, a, stream);
    }
    y0 += run.rows;
  }
}

bool gemv_quant_swiglu_fits(const DeviceMatrix& W, int n) {
  return gemv_quant_staged_fits(W, n) && W.quant.n == 1 && W.rows % 2 == 0;
}

void gemv_quant_swiglu(const DeviceMatrix& W, const float* X, int n, float* H, bool gelu, cudaStream_t stream) {
  if (!gemv_quant_swiglu_fits(W, n))
    throw CudaError("gemv_quant_swiglu: the matrix or step does not fit (gemv_quant_swiglu_fits)");
  StagedArgs a = run_args(W.quant.run[0], W.cols, n, H, 0, W.rows / 2);
  a.X = X;
  a.gelu = gelu;
  launch<true>(W.quant.run[0].type, a, stream);
}

bool gemv_quant_norm_fits(const DeviceMatrix& W) {
  return staged_enabled() && W.quantized() && norm_staged_bytes(W.cols) + kStaticSmemBound <= shared_memory_limit();
}

void gemv_quant_norm(const DeviceMatrix& W, const NormIn& in, float* Y, cudaStream_t stream) {
  if (!gemv_quant_norm_fits(W)) throw CudaError("gemv_quant_norm: the matrix does not fit (gemv_quant_norm_fits)");
  if (!norm_ok(in)) throw CudaError("gemv_quant_norm: no row, no norm weight, or x_out aliasing x");
  NormIn run_in = in;
  int64_t y0 = 0;
  for (int k = 0; k < W.quant.n; ++k) {
    const QuantRun& run = W.quant.run[k];
    if (run.rows > 0) {
      StagedArgs a = run_args(run, W.cols, 1, Y, y0, W.rows);
      a.norm = run_in;
      launch<false>(run.type, a, stream);
      // Later runs normalize the residual row the first one wrote (the same v, so the same
      // bits), and write nothing.
      if (run_in.x_out != nullptr) run_in = NormIn{in.x_out, nullptr, in.w, nullptr, in.eps, nullptr};
    }
    y0 += run.rows;
  }
}

bool gemv_quant_norm_swiglu_fits(const DeviceMatrix& W) {
  return gemv_quant_norm_fits(W) && W.quant.n == 1 && W.rows % 2 == 0;
}

void gemv_quant_norm_swiglu(const DeviceMatrix& W, const NormIn& in, float* H, bool gelu, cudaStream_t stream) {
  if (!gemv_quant_norm_swiglu_fits(W))
    throw CudaError("gemv_quant_norm_swiglu: the matrix does not fit (gemv_quant_norm_swiglu_fits)");
  if (!norm_ok(in)) throw CudaError("gemv_quant_norm_swiglu: no row, no norm weight, or x_out aliasing x");
  StagedArgs a = run_args(W.quant.run[0], W.cols, 1, H, 0, W.rows / 2);
  a.gelu = gelu;
  a.norm = in;
  launch<true>(W.quant.run[0].type, a, stream);
}

}  // namespace fdl::cuda
