// k16_chain.cuh — the step of the batch-invariant projection (gemm_k16.h: the chain of
// mma.sync m16n8k16 steps over each 1024-element K segment) and a warp's streaming of one
// token's chains, for the kernels that compute it inside a larger kernel (the persistent
// batch-1 decode kernels decode_*_block_k16.cu). Device code only; include from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/gemm_k16.h"

namespace fdl::cuda::k16 {

/// acc = the m16n8k16 step on (A = a, B = b0, b1, C = acc), fp32 accumulation of 16-bit
/// products. Not volatile: a register-only instruction the compiler may schedule between the
/// fragment loads (the accumulator operands keep each chain's steps in order).
template <bool BF16>
__device__ __forceinline__ void mma_k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (BF16)
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

constexpr int kSeg = kGemmK16Segment;
/// One token's chains are streamed in batches of kBatchSteps k16 blocks (256 k): a lane's 8
/// 16-byte weight loads, 4 KiB per warp. K must be a multiple of kBatchK.
constexpr int kBatchSteps = 16, kBatchK = 16 * kBatchSteps, kBatchLoads = kBatchSteps / 2;

/// A unit of work: the chains of 8 consecutive weight rows (row `first` of W) over K segment
/// `seg`. Lane (g, c) serves row first + g. It loads 16 contiguous bytes per pair of k16 blocks
/// (elements 8c .. 8c + 7 of the pair's 32) and swaps half of them with lane c ^ 2, so that in
/// each step it holds elements e(c) .. e(c) + 3 of the step's block, e(c) = 8 (c & 1) + 4 (c >> 1),
/// as its B fragment (the order of the products inside a step does not change its result);
/// lanes 0-3 hold the token's same elements as the A fragment's row 0 (the other rows are
/// zero). The chain of row first + 2c + e (e < 2) ends in acc[e] of lane c < 4.
struct Unit {
  const uint16_t* w;  ///< row `first` of W ([rows][K] of 16-bit weights)
  int seg;
};

__device__ __forceinline__ int block_offset(int c) { return 8 * (c & 1) + 4 * (c >> 1); }

/// Batches in unit u's segment (the last segment of K may be short).
__device__ __forceinline__ int unit_batches(int seg, int K) { return min(kSeg, K - seg * kSeg) / kBatchK; }

/// Lane's weights of batch b of a unit into buf (streaming loads: weights are read once).
__device__ __forceinline__ void load_unit_batch(const Unit& u, int b, int K, int lane, uint4 (&buf)[kBatchLoads]) {
  const uint16_t* p = u.w + int64_t(lane / 4) * K + int64_t(u.seg) * kSeg + int64_t(b) * kBatchK + 8 * (lane % 4);
#pragma unroll
  for (int s = 0; s < kBatchLoads; ++s) buf[s] = __ldcs(reinterpret_cast<const uint4*>(p + 32 * s));
}

/// A warp's chains for units u_begin .. u_end - 1 (unit_of(u) -> Unit), the token's K
/// activations in shared memory `xs` (16-bit, the weights' type). One sequence of batches
/// through two register buffers: the next batch (of the same or the next unit) is loaded
/// while one is multiplied. buf[0] holds unit u_begin's first batch on entry
/// (load_unit_batch, issued early: the weights depend on no earlier kernel). out(u, acc)
/// receives each unit's chain (valid in lanes 0-3, see Unit), in unit order.
template <bool BF16, typename UnitOf, typename Out>
__device__ __forceinline__ void stream_units(int u_begin, int u_end, UnitOf unit_of, int K, const uint16_t* xs,
                                             int lane, uint4 (&buf)[2][kBatchLoads], Out out) {
  if (u_begin >= u_end) return;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  const int c = lane % 4;
  const bool row0 = lane < 4;  // the A fragment's row 0: the token
  const bool low = c < 2;      // keeps the first half of its 16 bytes for the pair's first step
  auto step = [&](const uint16_t* x, uint32_t w0, uint32_t w1) {
    const uint2 xv = row0 ? *reinterpret_cast<const uint2*>(x) : make_uint2(0, 0);
    const uint32_t a[4] = {xv.x, 0u, xv.y, 0u};
    mma_k16<BF16>(acc, a, w0, w1);
  };
  auto consume = [&](const uint4(&w)[kBatchLoads], int u, const Unit& un, int b) {
    const uint16_t* x = xs + un.seg * kSeg + b * kBatchK + block_offset(c);
#pragma unroll
    for (int s = 0; s < kBatchLoads; ++s) {
      const uint32_t send0 = low ? w[s].z : w[s].x, send1 = low ? w[s].w : w[s].y;
      const uint32_t recv0 = __shfl_xor_sync(0xffffffffu, send0, 2), recv1 = __shfl_xor_sync(0xffffffffu, send1, 2);
      step(x + 32 * s, low ? w[s].x : recv0, low ? w[s].y : recv1);
      step(x + 32 * s + 16, low ? recv0 : w[s].z, low ? recv1 : w[s].w);
    }
    if (b + 1 == unit_batches(un.seg, K)) {
      out(u, acc);
      acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
    }
  };
  // The cursor (u, b) of the batch after (u, b), and whether it is inside the range.
  auto advance = [&](int& u, Unit& un, int& b) {
    if (++b == unit_batches(un.seg, K)) {
      b = 0;
      if (++u < u_end) un = unit_of(u);
    }
    return u < u_end;
  };
  int u0 = u_begin, b0 = 0;
  Unit un0 = unit_of(u0);
  for (;;) {  // buffer indices are compile-time: the ring stays in registers
    int u1 = u0, b1 = b0;
    Unit un1 = un0;
    const bool more1 = advance(u1, un1, b1);
    if (more1) load_unit_batch(un1, b1, K, lane, buf[1]);
    consume(buf[0], u0, un0, b0);
    if (!more1) return;
    u0 = u1, b0 = b1, un0 = un1;
    const bool more0 = advance(u0, un0, b0);
    if (more0) load_unit_batch(un0, b0, K, lane, buf[0]);
    consume(buf[1], u1, un1, b1);
    if (!more0) return;
  }
}

/// Segments of K (the chains per row).
__host__ __device__ constexpr int segments(int K) { return (K + kSeg - 1) / kSeg; }

/// Block b's share [share_begin(g, b), share_begin(g, b + 1)) of g groups of 8 rows among the
/// grid's blocks (shares differ by at most one group).
__device__ __forceinline__ int share_begin(int groups, int b) { return int(int64_t(groups) * b / gridDim.x); }

/// stream_units' out() that keeps unit u's chains in parts[8u .. 8u + 7], in row order.
__device__ __forceinline__ void keep_chains(float* parts, int u, const float (&acc)[4], int lane) {
  if (lane < 4) parts[u * 8 + 2 * lane] = acc[0], parts[u * 8 + 2 * lane + 1] = acc[1];
}

/// The fold of a row's segment chains, in segment order (gemm_k16.h): parts[s * stride].
__device__ __forceinline__ float fold_chains(const float* parts, int segs, int stride) {
  float total = parts[0];
  for (int s = 1; s < segs; ++s) total += parts[s * stride];
  return total;
}

}  // namespace fdl::cuda::k16
