// Fused single-token (decode) projections: residual add + RMSNorm in the GEMV's prologue,
// and RoPE + K/V store or SwiGLU in its epilogue (contracts in kernels.h). At batch 1 the
// per-layer chain was norm -> qkv -> rope -> ... -> norm -> gate_up -> silu -> down: three
// of those kernels were single-block or tiny and each cost a launch, a ramp-up and a PDL
// hand-off while the GPU's HBM idled. Here every block of the projection
//  1. issues its first weight loads (they depend on nothing), then waits for the previous
//     kernel (PDL);
//  2. recomputes v = x + add and sum(v²) for the whole row (a few KB from L2; the fp64 sum in
//     the same order in every block, so every block gets the same scale), and writes the
//     normalized row into shared memory — block 0 also writes v to x_out (the residual
//     stream ping-pongs between two buffers: no block may overwrite x while others read it);
//  3. streams groups of 8 weight rows (one warp each, as gemv.cu) against the shared-memory
//     row — the grid is one wave of resident blocks, each taking several groups, so step 2
//     runs once per block (~500 times), not once per group (3584 times for gate/up);
//  4. finishes each group in the epilogue: rotates q/k pairs and stores q, K and V (the 8 rows
//     of a block are 4 whole RoPE pairs), or combines gate row p with up row p.
// The arithmetic is the unfused kernels' operation for operation (fp32, no FMA contraction
// where they avoid it), so the fused path gives the same values up to the fp64 sum order.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/decode_block.cuh"
#include "backend/cuda/ffn_act.cuh"
#include "backend/cuda/gemv_widen.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_elem.cuh"
#include "backend/cuda/launch.h"

#include <string>

namespace fdl::cuda {
namespace {

constexpr int kWarps = 8, kThreads = 32 * kWarps, kUnroll = 8;
constexpr int kMaxCols = 16384;  // 64 KiB of shared memory for the normalized row
enum Epilogue { kRopeQkv = 0, kSwiglu = 1, kPlain = 2, kGeglu = 3 };  // kGeglu: kSwiglu with GELU-tanh
constexpr bool gated(int epi) { return epi == kSwiglu || epi == kGeglu; }

struct RopeOut {  // the rope_qkv_store arguments for token 0
  const float* cos_sin;
  const int32_t* positions;
  const int32_t* dst_block;
  int n_head, rope_dim;
  KvLayerView kv;
  float* q_out;
  const float* bias;  // [q | k | v] biases, or null
};

// kAddW: the norm's addend has a post-norm (NormIn::add_w), compiled in only where used.
template <typename WT, int EPI, bool kAddW>
__global__ void __launch_bounds__(kThreads)
    gemv_norm_kernel(const WT* __restrict__ W, int64_t rows, int cols, NormIn in, RopeOut ro, float* __restrict__ h) {
  extern __shared__ float4 xs4[];
  float* xs = reinterpret_cast<float*>(xs4);
  __shared__ float res[kWarps];
  launch_dependents();
  constexpr int kVec = Widen<WT>::kVec;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  // Groups of 8 rows (SwiGLU: 4 gate rows and the 4 matching up rows) are dealt round-robin
  // to a grid sized to the resident blocks, so the norm prologue runs once per block, not
  // once per group.
  const int64_t n_groups = gated(EPI) ? (rows / 2 + kWarps / 2 - 1) / (kWarps / 2) : (rows + kWarps - 1) / kWarps;
  int64_t r = 0;
  bool valid = false;
  auto row_of = [&](int64_t g) {  // this warp's weight row in group g, and whether it exists
    if constexpr (gated(EPI)) {
      const int64_t n_ff = rows / 2, p = g * (kWarps / 2) + (warp & 3);
      valid = p < n_ff;
      r = warp < 4 ? p : n_ff + p;
    } else {
      r = g * kWarps + warp;
      valid = r < rows;
    }
  };
  const int nvec = cols / kVec;
  const uint4* wrow = nullptr;
  uint4 w[kUnroll];
  auto load = [&](int base) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int idx = base + u * 32;
      w[u] = idx < nvec ? __ldcs(wrow + idx) : make_uint4(0, 0, 0, 0);
    }
  };
  int64_t g = blockIdx.x;
  row_of(g);
  wrow = reinterpret_cast<const uint4*>(W + (valid ? r : 0) * cols);
  load(lane);
  grid_dependency_wait();

  // Residual add + RMSNorm of the single row into shared memory.
  block::norm_to_smem<kThreads, kAddW>(in, cols, in.w, xs);

  for (; g < n_groups; g += gridDim.x) {
    // The weight row against the normalized row (gemv.cu's loop with X in shared memory).
    float acc = 0.f;
    for (int base = lane; base < nvec; base += 32 * kUnroll) {
      if (base != lane) load(base);
      block::dot_batch<WT, kUnroll>(w, xs, base, nvec, acc);
    }
    // Start the next group's loads now: they fly during the reduction and the epilogue.
    if (g + gridDim.x < n_groups) {
      row_of(g + gridDim.x);
      wrow = reinterpret_cast<const uint4*>(W + (valid ? r : 0) * cols);
      load(lane);
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) res[warp] = acc;
    __syncthreads();

    if constexpr (gated(EPI)) {
      // out[p] = silu(gate[p]) * up[p] (GeGLU: gelu_tanh), as silu_mul_kernel computes it.
      if (threadIdx.x < kWarps / 2) {
        const int64_t p = g * (kWarps / 2) + threadIdx.x;
        if (p < rows / 2) {
          const float gt = res[threadIdx.x], u = res[threadIdx.x + kWarps / 2];
          h[p] = ffn_act(gt, u, EPI == kGeglu);
        }
      }
    } else if constexpr (EPI == kPlain) {
      if (threadIdx.x < kWarps) {
        const int64_t row = g * kWarps + threadIdx.x;
        if (row < rows) h[row] = res[threadIdx.x];
      }
    } else {
      // Pair j of the group: rows r0, r0+1 = elements 2i, 2i+1 of a q, k or v head (head_dim
      // is even and groups start at multiples of 8, so a pair never straddles two groups).
      if (threadIdx.x < kWarps / 2) {
        const int64_t r0 = g * kWarps + 2 * threadIdx.x;
        if (r0 < rows) {
          const KvLayerView& kv = ro.kv;
          const int hd = kv.head_dim, q_dim = ro.n_head * hd, kv_dim = kv.n_head_kv * hd;
          const int pos = ro.positions[0];
          const int slot = pos % kv.block_size;
          float x0 = res[2 * threadIdx.x], x1 = res[2 * threadIdx.x + 1];
          const int ri = int(r0);
          if (ro.bias) {  // rope_qkv_kernel's order: the bias before RoPE
            x0 = __fadd_rn(x0, ro.bias[ri]);
            x1 = __fadd_rn(x1, ro.bias[ri + 1]);
          }
          if (ri >= q_dim + kv_dim) {  // v: stored as computed
            kv_store2(kv, kv_index(kv, ro.dst_block[0], kv.block_size + slot, ri - q_dim - kv_dim), x0, x1);
          } else {
            const int e = ri % hd;  // element within its head (q and k heads start at multiples of hd)
            float y0 = x0, y1 = x1;
            if (e < ro.rope_dim) {
              const float c = ro.cos_sin[e], sn = ro.cos_sin[e + 1];  // pair e/2: cos at 2i, sin at 2i+1
              y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
              y1 = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c));
            }
            if (ri < q_dim) {
              ro.q_out[ri] = y0;
              ro.q_out[ri + 1] = y1;
            } else {
              kv_store2(kv, kv_index(kv, ro.dst_block[0], slot, ri - q_dim), y0, y1);
            }
          }
        }
      }
    }
    __syncthreads();  // res is consumed before the next group writes it
  }
}

template <typename WT, int EPI, bool kAddW>
void launch_fused(const DeviceMatrix& W, const NormIn& in, const RopeOut& ro, float* h, cudaStream_t stream) {
  const int64_t groups = gated(EPI) ? (W.rows / 2 + kWarps / 2 - 1) / (kWarps / 2) : (W.rows + kWarps - 1) / kWarps;
  const size_t smem = size_t(W.cols) * sizeof(float);
  // One wave of resident blocks, each taking the same number of groups (no partial last wave).
  // Cached per kernel on first use (launches come from one thread: forward is not reentrant),
  // with the shared-memory opt-in for that size (block::opt_in_shared_memory).
  static int n_sm = 0;
  static size_t occ_smem = 0;
  static int per_sm = 0;
  if (n_sm == 0) FDL_CUDA_CHECK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0));
  if (occ_smem != smem || per_sm == 0) {
    if (!block::opt_in_shared_memory(reinterpret_cast<const void*>(gemv_norm_kernel<WT, EPI, kAddW>), smem, 0))
      throw CudaError("gemv_norm: a row of " + std::to_string(W.cols) + " floats does not fit in shared memory");
    FDL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_norm_kernel<WT, EPI, kAddW>, kThreads, smem));
    per_sm = per_sm > 0 ? per_sm : 1;
    occ_smem = smem;
  }
  const int64_t resident = int64_t(n_sm) * per_sm;
  const int64_t per_block = (groups + resident - 1) / resident;
  const int64_t blocks = (groups + per_block - 1) / per_block;
  launch_pdl(gemv_norm_kernel<WT, EPI, kAddW>, dim3(unsigned(blocks)), dim3(kThreads), smem, stream,
             static_cast<const WT*>(W.data), W.rows, int(W.cols), in, ro, h);
}

template <int EPI>
void dispatch(const DeviceMatrix& W, const NormIn& in, const RopeOut& ro, float* h, cudaStream_t stream) {
  if (!gemv_norm_supported(W))
    throw CudaError("gemv_norm: unsupported matrix (" + std::to_string(W.rows) + "x" + std::to_string(W.cols) + " " +
                    wtype_name(W.type) + ")");
  const bool add_w = in.add_w != nullptr && in.add != nullptr;
  switch (W.type) {
    case WType::F32:
      return add_w ? launch_fused<float, EPI, true>(W, in, ro, h, stream) : launch_fused<float, EPI, false>(W, in, ro, h, stream);
    case WType::F16:
      return add_w ? launch_fused<__half, EPI, true>(W, in, ro, h, stream) : launch_fused<__half, EPI, false>(W, in, ro, h, stream);
    case WType::BF16:
      return add_w ? launch_fused<__nv_bfloat16, EPI, true>(W, in, ro, h, stream)
                   : launch_fused<__nv_bfloat16, EPI, false>(W, in, ro, h, stream);
  }
}

}  // namespace

bool gemv_norm_supported(const DeviceMatrix& W) {
  return !W.quantized() && W.cols > 0 && W.cols <= kMaxCols && W.cols % 4 == 0 &&
         (W.cols * int64_t(wtype_size(W.type))) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(W.data) % 16 == 0 && W.rows > 0 && W.rows % 2 == 0;
}

void gemv_norm_rope_qkv(const DeviceMatrix& W, const NormIn& in, const float* cos_sin, const int32_t* positions,
                        const int32_t* dst_block, int n_head, int rope_dim, const KvLayerView& kv, float* q_out,
                        cudaStream_t stream, const float* bias) {
  if (W.rows != int64_t(n_head + 2 * kv.n_head_kv) * kv.head_dim || kv.head_dim % 2 != 0)
    throw CudaError("gemv_norm_rope_qkv: " + std::to_string(W.rows) + " rows do not match the heads");
  dispatch<kRopeQkv>(W, in, RopeOut{cos_sin, positions, dst_block, n_head, rope_dim, kv, q_out, bias}, nullptr, stream);
}

void gemv_norm_qkv(const DeviceMatrix& W, const NormIn& in, float* y, cudaStream_t stream) {
  dispatch<kPlain>(W, in, RopeOut{}, y, stream);
}

void gemv_norm_swiglu(const DeviceMatrix& W, const NormIn& in, float* h, cudaStream_t stream, bool gelu) {
  if (gelu) return dispatch<kGeglu>(W, in, RopeOut{}, h, stream);
  dispatch<kSwiglu>(W, in, RopeOut{}, h, stream);
}

}  // namespace fdl::cuda
