// The FFN half of a batch-1 decode layer in one kernel, in the batch-invariant arithmetic
// (contract in kernels.h: decode_ffn_block_k16). The invariant path otherwise runs it as four
// kernels for one token (norm, gate/up, SwiGLU, down); here one block per SM stays resident,
// as in decode_ffn_block, and the down projection starts behind one grid-wide counter with its
// first weight loads in flight.
//
// Arithmetic (bit for bit that of the separate kernels, tests/gpu/decode_block_test.cpp):
//   - the norm: add_rms_norm's element-to-thread map, fp64 sums and scale (rms_norm_row.cuh),
//     its first rms_norm_threads(cols) threads holding the row, the others adding +0;
//   - the projections: the k16 chains of gemm_k16 (k16_chain.cuh); a block's warps take equal
//     runs of its units (8 rows x one 1024-wide K segment), write each chain to shared memory,
//     and each row's chains are folded in segment order;
//   - SwiGLU: silu_mul's formula (ffn_act.cuh), rounded to the weights' type.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/decode_block.cuh"
#include "backend/cuda/ffn_act.cuh"
#include "backend/cuda/k16_chain.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/rms_norm_row.cuh"

namespace fdl::cuda {
namespace {

using block::kThreads;
using block::kWarps;

// Shared memory: the activations (x, then h) in the weights' type, then one float per row and
// K segment of the block's largest share (the chains before their fold), then the norm weight
// (copied in before the PDL wait).
size_t smem_bytes(int cols, int n_ff, int max_units) {
  return size_t((std::max(cols, n_ff) + 7) / 8 * 8) * 2 + size_t(max_units) * 8 * sizeof(float) +
         size_t(cols) * sizeof(float);
}
using k16::segments;
using k16::share_begin;
__host__ __device__ int max_units(int cols, int n_ff, int down_rows, int blocks) {
  const int gu = (n_ff / 8 + blocks - 1) / blocks * 2 * segments(cols);
  const int dn = (down_rows / 8 + blocks - 1) / blocks * segments(n_ff);
  return gu > dn ? gu : dn;
}

template <bool BF16, bool kGelu, bool kTrace>
__global__ void __launch_bounds__(kThreads, 1) ffn_block_k16_kernel(FfnBlockArgs a) {
  extern __shared__ float4 smem4[];
  const int cols = a.cols, n_ff = a.n_ff;
  uint16_t* xs = reinterpret_cast<uint16_t*>(smem4);  // [max(cols, n_ff)]: xn, then h
  float* parts = reinterpret_cast<float*>(xs + (max(cols, n_ff) + 7) / 8 * 8);
  float* norm_w = parts + int64_t(max_units(cols, n_ff, int(a.down_rows), int(gridDim.x))) * 8;
  __shared__ double partial[kThreads / 32];
  auto stamp = [&](int event) {
    if constexpr (kTrace) block::stamp(a.trace, event);
  };
  launch_dependents();
  stamp(kFfnEntry);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const WType type = BF16 ? WType::BF16 : WType::F16;
  const auto* Wgu = static_cast<const uint16_t*>(a.w_gate_up);
  const auto* Wd = static_cast<const uint16_t*>(a.w_down);

  // Gate/up: this block's pair groups (8 gate rows and the same 8 up rows); unit u is group
  // u / (2 S1), its gate (0) or up (1) rows, segment u % S1.
  const int s1 = segments(cols);
  const int pg0 = share_begin(n_ff / 8, blockIdx.x), pg1 = share_begin(n_ff / 8, blockIdx.x + 1);
  const int gu_units = (pg1 - pg0) * 2 * s1;
  const int gu0 = gu_units * warp / kWarps, gu1 = gu_units * (warp + 1) / kWarps;
  auto gu_unit = [&](int u) {
    const int j = u / (2 * s1), which = (u / s1) & 1;
    return k16::Unit{Wgu + (int64_t(which) * n_ff + int64_t(pg0 + j) * 8) * cols, u % s1};
  };
  uint4 buf[2][k16::kBatchLoads];
  // Before the wait (they depend on no earlier kernel): the first weights, the norm weight.
  if (gu0 < gu1) k16::load_unit_batch(gu_unit(gu0), 0, cols, lane, buf[0]);
  block::norm_weight_prefetch(a.in, cols, norm_w);
  grid_dependency_wait();
  stamp(kFfnAfterPdlWait);

  rms_norm_row_to_smem(a.in, cols, xs, type, partial, norm_w);
  stamp(kFfnNormDone);

  auto keep_chain = [&](int u, const float(&acc)[4]) { k16::keep_chains(parts, u, acc, lane); };
  k16::stream_units<BF16>(gu0, gu1, gu_unit, cols, xs, lane, buf, keep_chain);
  __syncthreads();
  // Pair p = 8 j + r of the block: gate's chains at units 2 S1 j + s, up's at 2 S1 j + S1 + s.
  for (int i = threadIdx.x; i < (pg1 - pg0) * 8; i += kThreads) {
    const float* gate = parts + (i / 8) * 2 * s1 * 8 + i % 8;
    const float g = k16::fold_chains(gate, s1, 8), u = k16::fold_chains(gate + s1 * 8, s1, 8);
    store_as(a.h, int64_t(pg0) * 8 + i, ffn_act(g, u, kGelu), type);
  }

  // Down needs all of h: its first loads go out between the arrival and the wait.
  stamp(kFfnGateUpDone);
  block::arrive(a.sync);
  const int s2 = segments(n_ff);
  const int dgroups = int(a.down_rows / 8);
  const int dg0 = share_begin(dgroups, blockIdx.x), dg1 = share_begin(dgroups, blockIdx.x + 1);
  const int dn_units = (dg1 - dg0) * s2;
  const int dn0 = dn_units * warp / kWarps, dn1 = dn_units * (warp + 1) / kWarps;
  auto dn_unit = [&](int u) { return k16::Unit{Wd + int64_t(dg0 + u / s2) * 8 * n_ff, u % s2}; };
  if (dn0 < dn1) k16::load_unit_batch(dn_unit(dn0), 0, n_ff, lane, buf[0]);
  block::wait_for(a.sync, gridDim.x);
  stamp(kFfnHHandedOff);
  {  // h into shared memory, through L2 (other blocks wrote it)
    const int n16 = n_ff / 8;
    for (int i = threadIdx.x; i < n16; i += kThreads)
      reinterpret_cast<uint4*>(xs)[i] = __ldcg(reinterpret_cast<const uint4*>(a.h) + i);
    __syncthreads();
  }
  k16::stream_units<BF16>(dn0, dn1, dn_unit, n_ff, xs, lane, buf, keep_chain);
  __syncthreads();
  for (int i = threadIdx.x; i < (dg1 - dg0) * 8; i += kThreads)
    a.y[int64_t(dg0) * 8 + i] = k16::fold_chains(parts + (i / 8) * s2 * 8 + i % 8, s2, 8);
  if constexpr (kTrace) {
    __syncthreads();
    stamp(kFfnEnd);
  }
}

using FfnKernelFn = void (*)(FfnBlockArgs);
template <bool kTrace>
FfnKernelFn ffn_kernel_for(bool bf16, bool gelu) {
  return bf16 ? (gelu ? ffn_block_k16_kernel<true, true, kTrace> : ffn_block_k16_kernel<true, false, kTrace>)
              : (gelu ? ffn_block_k16_kernel<false, true, kTrace> : ffn_block_k16_kernel<false, false, kTrace>);
}


// The shapes the kernel takes (ffn_block_k16_blocks' list), checked again at launch.
bool shape_ok(const DeviceMatrix& w_gate_up, const DeviceMatrix& w_down) {
  if (w_gate_up.type != w_down.type || (w_gate_up.type != WType::F16 && w_gate_up.type != WType::BF16)) return false;
  const int64_t cols = w_gate_up.cols, n_ff = w_down.cols, down_rows = w_down.rows;
  if (w_gate_up.rows != 2 * n_ff || cols % k16::kBatchK != 0 || cols <= 0 || n_ff % k16::kBatchK != 0 || n_ff <= 0 ||
      cols > 8192 || down_rows % 8 != 0 || down_rows <= 0 || down_rows > (int64_t(1) << 24) ||
      n_ff > (int64_t(1) << 20))
    return false;
  return reinterpret_cast<uintptr_t>(w_gate_up.data) % 16 == 0 && reinterpret_cast<uintptr_t>(w_down.data) % 16 == 0;
}

}  // namespace

int ffn_block_k16_blocks(const DeviceMatrix& w_gate_up, const DeviceMatrix& w_down, int n_sm) {
  if (n_sm < 1 || w_gate_up.quantized() || w_down.quantized() || !shape_ok(w_gate_up, w_down)) return 0;
  const int64_t cols = w_gate_up.cols, n_ff = w_down.cols, down_rows = w_down.rows;
  const size_t smem = smem_bytes(int(cols), int(n_ff), max_units(int(cols), int(n_ff), int(down_rows), n_sm));
  const bool bf16 = w_gate_up.type == WType::BF16;
  // The GeGLU instantiation has the same resources; plan with the SwiGLU one.
  const int64_t fit = block::resident_blocks(reinterpret_cast<const void*>(ffn_kernel_for<false>(bf16, false)), smem);
  return n_sm <= fit ? n_sm : 0;
}

void decode_ffn_block_k16(const FfnBlockArgs& a, cudaStream_t stream) {
  if (a.blocks < 1) throw CudaError("decode_ffn_block_k16: no blocks (use ffn_block_k16_blocks)");
  if (a.in.add_w != nullptr) throw CudaError("decode_ffn_block_k16: a post-norm of the addend is not supported");
  const DeviceMatrix w_gate_up{a.type, a.w_gate_up, 2 * int64_t(a.n_ff), a.cols}, w_down{a.type, a.w_down, a.down_rows,
                                                                                       a.n_ff};
  if (!shape_ok(w_gate_up, w_down))
    throw CudaError("decode_ffn_block_k16: shape or types not supported (see ffn_block_k16_blocks)");
  const size_t smem = smem_bytes(a.cols, a.n_ff, max_units(a.cols, a.n_ff, int(a.down_rows), a.blocks));
  const bool bf16 = a.type == WType::BF16;
  const FfnKernelFn typed = a.trace ? ffn_kernel_for<true>(bf16, a.gelu) : ffn_kernel_for<false>(bf16, a.gelu);
  const int64_t fit = block::resident_blocks(reinterpret_cast<const void*>(typed), smem);
  if (a.blocks > fit)  // the hand-off would wait forever
    throw CudaError("decode_ffn_block_k16: " + std::to_string(a.blocks) + " blocks cannot be resident at once (" +
                    std::to_string(fit) + " fit)");
  launch_pdl(typed, dim3(unsigned(a.blocks)), dim3(kThreads), smem, stream, a);
}

}  // namespace fdl::cuda
