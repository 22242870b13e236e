// The output head of a batch-1 decode step in one kernel, in the batch-invariant arithmetic
// (contract in kernels.h: decode_output_block_k16): the invariant path otherwise runs the
// final norm and gemm_k16's streaming kernel (8 rows per block, a block's warps on the K
// segments of one row group). Here one block per SM normalizes the row into shared memory
// (add_rms_norm's arithmetic: rms_norm_row.cuh) and its warps stream equal runs of the block's
// units (8 rows x one K segment: k16_chain.cuh), first loads before the PDL wait; each row's
// chains are folded in segment order. No block waits for another.
#include <algorithm>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/decode_block.cuh"
#include "backend/cuda/k16_chain.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/rms_norm_row.cuh"

namespace fdl::cuda {
namespace {

using block::kThreads;
using block::kWarps;
using k16::segments;
using k16::share_begin;

// Rows of a block's share are folded through shared memory in rounds of this many groups.
constexpr int kRoundGroups = 128;

size_t smem_bytes(int cols) {
  return size_t((cols + 7) / 8 * 8) * 2 + size_t(kRoundGroups) * segments(cols) * 8 * sizeof(float);
}

template <bool BF16>
__global__ void __launch_bounds__(kThreads, 1) output_block_k16_kernel(OutputBlockArgs a) {
  extern __shared__ float4 smem4[];
  __shared__ double partial[kThreads / 32];
  const int cols = a.cols;
  uint16_t* xs = reinterpret_cast<uint16_t*>(smem4);
  float* parts = reinterpret_cast<float*>(xs + (cols + 7) / 8 * 8);
  launch_dependents();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const auto* W = static_cast<const uint16_t*>(a.w);
  const int s = segments(cols);
  const int groups = int(a.rows / 8);
  const int g0 = share_begin(groups, blockIdx.x), g1 = share_begin(groups, blockIdx.x + 1);
  // Rounds of kRoundGroups groups (the chains of a round fit in shared memory); in each, the
  // warps take equal runs of its units, unit u being group r0 + u / s, segment u % s.
  uint4 buf[2][k16::kBatchLoads];
  int r0 = g0, u0 = 0, u1 = 0;
  auto unit = [&](int u) { return k16::Unit{W + int64_t(r0 + u / s) * 8 * cols, u % s}; };
  auto start_round = [&] {  // this warp's run of the round at r0, its first batch loading
    const int units = (min(g1, r0 + kRoundGroups) - r0) * s;
    u0 = units * warp / kWarps, u1 = units * (warp + 1) / kWarps;
    if (u0 < u1) k16::load_unit_batch(unit(u0), 0, cols, lane, buf[0]);
  };
  if (r0 < g1) start_round();  // before the wait: the weights depend on no earlier kernel
  grid_dependency_wait();
  if (r0 >= g1) return;
  rms_norm_row_to_smem(a.in, cols, xs, BF16 ? WType::BF16 : WType::F16, partial, a.in.w);
  for (;;) {
    k16::stream_units<BF16>(u0, u1, unit, cols, xs, lane, buf,
                            [&](int u, const float(&acc)[4]) { k16::keep_chains(parts, u, acc, lane); });
    __syncthreads();
    const int r1 = min(g1, r0 + kRoundGroups);
    for (int i = threadIdx.x; i < (r1 - r0) * 8; i += kThreads)
      a.y[int64_t(r0) * 8 + i] = k16::fold_chains(parts + (i / 8) * s * 8 + i % 8, s, 8);
    __syncthreads();  // the chains are read before the next round writes them
    r0 = r1;
    if (r0 >= g1) return;
    start_round();
  }
}

}  // namespace

bool output_block_k16_supported(const DeviceMatrix& W) {
  return !W.quantized() && (W.type == WType::F16 || W.type == WType::BF16) && W.cols % k16::kBatchK == 0 && W.cols > 0 &&
         W.cols <= 8192 && W.rows % 8 == 0 && W.rows > 0 && W.rows / 8 <= (int64_t(1) << 30) &&
         reinterpret_cast<uintptr_t>(W.data) % 16 == 0;
}

void decode_output_block_k16(const OutputBlockArgs& a, cudaStream_t stream) {
  const DeviceMatrix W{a.type, a.w, a.rows, a.cols};
  if (!output_block_k16_supported(W)) throw CudaError("decode_output_block_k16: matrix not supported");
  if (a.blocks < 1) throw CudaError("decode_output_block_k16: no blocks");
  if (a.in.add_w != nullptr || a.in.x_out != nullptr || a.softcap > 0.f)
    throw CudaError("decode_output_block_k16: a post-norm of the addend, a residual out or a softcap is not supported");
  const size_t smem = smem_bytes(a.cols);
  auto* typed = a.type == WType::BF16 ? output_block_k16_kernel<true> : output_block_k16_kernel<false>;
  if (block::resident_blocks(reinterpret_cast<const void*>(typed), smem) < 1)
    throw CudaError("decode_output_block_k16: " + std::to_string(smem) + " bytes of shared memory do not fit");
  launch_pdl(typed, dim3(unsigned(a.blocks)), dim3(kThreads), smem, stream, a);
}

}  // namespace fdl::cuda
