// attention_chunk_group.cuh — a batch-invariant chunk partial (attention_chunk.cuh's
// chunk_partial: a chunk's maximum, l_c and O_c = P·V from zero) computed by a group of W warps
// instead of one, for the batch-1 decode block, where a step has few chunks and each warp
// alone would be bound by its own instruction stream. Device code only; include from .cu
// files.
//
// Every value is computed by the one-warp code's own operations on the same operands, only
// spread over warps: each warp takes kChunk / 8 / W position tiles of S = Q·Kᵀ and HD / 8 / W
// dimension tiles of P·V (each tile's mma chain is the same); the lane's row maximum and row
// sum, which the one warp takes over the tiles in order, are taken in the same order from
// per-tile values exchanged through shared memory. So the partial has chunk_partial's bits
// (tests/gpu/decode_block_test.cpp compares the decode block with the separate kernels).
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/cuda/attention_chunk.cuh"

namespace fdl::cuda::attn {

/// Shared memory one group exchanges through (floats): per position tile, row half and lane,
/// the tile's maximum and exp sum of the lane's pair (2 x kChunk / 8 x 2 x 32), then the P
/// fragments (kChunk / 16 k-steps x 4 registers x 32 lanes).
constexpr int kGroupExchangeFloats = 2 * (kChunk / 8) * 2 * 32 + (kChunk / 16) * 4 * 32;

/// A barrier of the group's `threads` threads only (named barrier `id`; 0 is __syncthreads').
__device__ __forceinline__ void group_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

/// chunk_partial<HD, Op, true (a 16-bit cache), false (no masks)> of chunk z (of n_z) of KV
/// head kvh for tile `tile`, by W warps: this thread is lane `lane` of warp w of them, all of
/// which call it with the same arguments. st: the group's stage (MmaTile<HD, true>::stage_elems
/// elements), xch: its exchange area (kGroupExchangeFloats), bar: its named barrier (not 0).
/// staged_rows: the rows chunk_prestage<..., 32 * W> staged into st (0: none). Returns with
/// st and xch free for the group's next chunk.
template <int HD, typename Op, int W>
__device__ __forceinline__ void chunk_partial_group(const AttentionArgs& a, int tile, int kvh, int z, int n_z, int w,
                                                    int lane, uint16_t* st, float* xch, int bar, int staged_rows = 0) {
  using T = MmaTile<HD, true>;
  constexpr int R = HD + 2, kTiles = kChunk / 8, kNt = kTiles / W, kDn = HD / 8 / W, kThreads = 32 * W;
  static_assert(kTiles % W == 0 && (HD / 8) % W == 0, "whole tiles per warp");
  const KvLayerView& kv = a.kv;
  const int group = a.n_head / kv.n_head_kv;
  const int t0 = a.tile_starts[tile], nt = a.tile_starts[tile + 1] - t0;
  const int rows = nt * group;  // <= 16 (the dispatcher checks)
  const int pos0 = a.positions[t0];
  const int p_last = pos0 + nt - 1;
  const int g = lane / 4, c = lane % 4;
  const int r0 = g, r1 = g + 8;
  const int c0 = z * kChunk;
  auto record = [&](int r) {
    const int64_t th = int64_t(t0 + r / group) * a.n_head + kvh * group + r % group;
    return a.partial + (th * n_z + z) * R;
  };
  if (c0 > p_last) {  // after every row: nothing to fold (the same for every warp of the group)
    if (w == 0 && lane < rows) record(lane)[HD] = -INFINITY;
    return;
  }
  if (staged_rows > 0) asm volatile("cp.async.wait_group 0;\n" ::);  // this thread's staged rows and zero fill
  stage_kv_chunk<uint16_t, HD, kChunk, kThreads, T::kStride, T::vStride>(kv, a.tables + a.table_off[t0], kvh, p_last,
                                                                        c0, st, w * 32 + lane, staged_rows);
  cp_async_commit();
  uint32_t qa[HD / 16][4];
  load_q_fragments<HD, Op>(a, t0, rows, group, kvh, r0, r1, c, qa);
  const int pos_r0 = pos0 + r0 / group, pos_r1 = pos0 + r1 / group;
  const float sl2 = a.scale * 1.4426950408889634f;
  asm volatile("cp.async.wait_group 0;\n" ::);
  group_sync(bar, kThreads);  // every thread's copies have landed

  float* tile_max = xch;                   // [tile][row half][lane]
  float* tile_sum = xch + kTiles * 2 * 32;  // the same
  uint32_t* p_frag = reinterpret_cast<uint32_t*>(xch + 2 * kTiles * 2 * 32);  // [k-step][register][lane]
  const RowMask all{0, INT_MAX, 0};
  float s[kNt][4];
#pragma unroll
  for (int i = 0; i < kNt; ++i) {
    const int n = w * kNt + i;
    chunk_score_tile<HD, Op, true, false, true>(qa, st, n, c0, pos_r0, pos_r1, all, all, sl2, g, c, s[i]);
    tile_max[(2 * n) * 32 + lane] = fmaxf(s[i][0], s[i][1]);
    tile_max[(2 * n + 1) * 32 + lane] = fmaxf(s[i][2], s[i][3]);
  }
  group_sync(bar, kThreads);
  // chunk_softmax's maximum: the tiles in order, then the quad.
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int n = 0; n < kTiles; ++n) {
    mx0 = fmaxf(mx0, tile_max[(2 * n) * 32 + lane]);
    mx1 = fmaxf(mx1, tile_max[(2 * n + 1) * 32 + lane]);
  }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  const float base0 = mx0 == -INFINITY ? 0.f : mx0, base1 = mx1 == -INFINITY ? 0.f : mx1;
  // exp_pack_chunk's exponentials, pair sums and fragments of this warp's tiles.
#pragma unroll
  for (int i = 0; i < kNt; ++i) {
    const int n = w * kNt + i, kk = n / 2, h = n % 2;
    const float p00 = exp2f(s[i][0] - base0), p01 = exp2f(s[i][1] - base0);
    const float p10 = exp2f(s[i][2] - base1), p11 = exp2f(s[i][3] - base1);
    tile_sum[(2 * n) * 32 + lane] = p00 + p01;
    tile_sum[(2 * n + 1) * 32 + lane] = p10 + p11;
    p_frag[(kk * 4 + 2 * h) * 32 + lane] = Op::pack(p00, p01);
    p_frag[(kk * 4 + 2 * h + 1) * 32 + lane] = Op::pack(p10, p11);
  }
  group_sync(bar, kThreads);
  uint32_t pa[kChunk / 16][4];
#pragma unroll
  for (int kk = 0; kk < kChunk / 16; ++kk)
#pragma unroll
    for (int j = 0; j < 4; ++j) pa[kk][j] = p_frag[(kk * 4 + j) * 32 + lane];
  float* rec0 = r0 < rows ? record(r0) : nullptr;
  float* rec1 = r1 < rows ? record(r1) : nullptr;
  const uint16_t* vs = st + kChunk * T::kStride;
#pragma unroll
  for (int i = 0; i < kDn; ++i) {
    const int dn = w * kDn + i;
    float oc[4];
    chunk_pv<HD, Op, true, true>(pa, vs, dn, g, c, oc);
    if (rec0) *reinterpret_cast<float2*>(rec0 + dn * 8 + 2 * c) = make_float2(oc[0], oc[1]);
    if (rec1) *reinterpret_cast<float2*>(rec1 + dn * 8 + 2 * c) = make_float2(oc[2], oc[3]);
  }
  if (w == 0) {  // exp_pack_chunk's row sums: the tiles in order, then the quad
    float ps0 = 0.f, ps1 = 0.f;
#pragma unroll
    for (int n = 0; n < kTiles; ++n) {
      ps0 += tile_sum[(2 * n) * 32 + lane];
      ps1 += tile_sum[(2 * n + 1) * 32 + lane];
    }
    const float lc0 = quad_sum(ps0), lc1 = quad_sum(ps1);
    if (c == 0) {
      if (rec0) rec0[HD] = mx0, rec0[HD + 1] = lc0;
      if (rec1) rec1[HD] = mx1, rec1[HD + 1] = lc1;
    }
  }
  group_sync(bar, kThreads);  // the stage and the exchange area may be refilled
}

}  // namespace fdl::cuda::attn
