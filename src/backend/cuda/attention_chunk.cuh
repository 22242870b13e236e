// attention_chunk.cuh — the tensor-core attention steps shared by the tiled kernels of
// attention_mma.cu and the batch-invariant decode block (decode_attention_block_k16.cu): Q
// fragments, K/V chunk staging, scores, masks, the online softmax step, and a chunk's own
// partial for batch-invariant steps (chunk_softmax, chunk_pv, chunk_partial). Device code
// only; include from .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cmath>
#include <type_traits>

#include "backend/cuda/attention_fold.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_elem.cuh"

namespace fdl::cuda::attn {

constexpr int kChunk = 64;

// How staged K/V reach the mma operands. KV16 = false: fp32 in the cache and in shared memory,
// rounded to the operand type per fragment; K rows at stride HD + 8 floats (8-byte fragment
// reads, banks 8g + 2c (+1)), V rows at HD + 4 (4-byte reads of rows 2c, 2c+1: banks 8c + g
// (+4)). KV16 = true: the cache holds the operand type itself (F16Op: fp16, BF16Op: bf16), so
// a K fragment register is one 4-byte read and a V one two 2-byte reads; rows at stride HD + 8
// elements (K: banks 4g + c; V: 8c + g/2, lanes g, g+1 reading one word).
template <typename Op, bool KV16>
struct KvStage;
template <typename Op>
struct KvStage<Op, false> {
  using E = float;
  __device__ static uint32_t pair(const float* p) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    return Op::pack(v.x, v.y);
  }
  __device__ static uint32_t rows2(const float* p, int stride) { return Op::pack(p[0], p[stride]); }
};
template <typename Op>
struct KvStage<Op, true> {
  using E = uint16_t;
  __device__ static uint32_t pair(const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); }
  __device__ static uint32_t rows2(const uint16_t* p, int stride) {
    return uint32_t(p[0]) | (uint32_t(p[stride]) << 16);  // the lower row in the low half, as pack()
  }
};

template <int HD, bool KV16>
struct MmaTile {
  static constexpr int kStride = HD + 8;
  static constexpr int vStride = HD + (KV16 ? 8 : 4);
  static constexpr int stage_elems = kChunk * (kStride + vStride);
  static constexpr size_t smem_bytes = 2 * size_t(stage_elems) * (KV16 ? 2 : 4);
};

// The 16-bit operand type of the products: fp16 (11 significant bits; |x| < 65504) for F16
// weights, bf16 (8 bits, fp32's range) for BF16 weights — the type the model's GEMMs
// already round activations to, so q, k and v that fit there fit here.
struct F16Op {
  __device__ static uint32_t pack(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);  // lo in the low 16 bits: the lower column
    return *reinterpret_cast<const uint32_t*>(&h);
  }
};
struct BF16Op {
  __device__ static uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
};

// D = A·B + D, A 16x16 (row), B 16x8 (col), 16-bit inputs, fp32 accumulators.
template <typename Op>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<Op, BF16Op>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 16 bytes global -> shared, asynchronously; zero-filled (nothing read) when !valid.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// ldmatrix (x4): lane l gives the shared-memory address of row l % 8 of 8x8 matrix l / 8 (16
// bytes each, 16-byte aligned) and receives, for matrix i, element (l / 4, 2 (l % 4) .. + 1)
// in r[i] — or, with TRANS, of the transposed matrix: elements (2 (l % 4) .. + 1, l / 4).
// These are exactly the B fragments of m16n8k16 that 32-bit and paired 16-bit loads would
// gather (the same operands, in one instruction per four fragments).
template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s)
                 : "memory");
}
__device__ __forceinline__ void cp_async_wait_all_but_one() { asm volatile("cp.async.wait_group 1;\n" ::); }

// Q rows r0 = 16m + g and r1 = r0 + 8 of a tile as m16n8k16 A fragments: a0 (row r0, cols
// 2c, 2c+1), a1 (row r1, same cols), a2/a3 (cols + 8). Row r is token r / group, query head
// kvh * group + r % group; rows >= `rows` are zeros.
template <int HD, typename Op>
__device__ __forceinline__ void load_q_fragments(const AttentionArgs& a, int t0, int rows, int group, int kvh, int r0,
                                                 int r1, int c, uint32_t (&qa)[HD / 16][4]) {
  const float* q0 = r0 < rows ? a.q + (int64_t(t0 + r0 / group) * a.n_head + kvh * group + r0 % group) * HD : nullptr;
  const float* q1 = r1 < rows ? a.q + (int64_t(t0 + r1 / group) * a.n_head + kvh * group + r1 % group) * HD : nullptr;
  const float2 zero = make_float2(0.f, 0.f);
  // Through L2: in the decode block other blocks of the same grid wrote q.
  auto ld = [](const float* p) { return __ldcg(reinterpret_cast<const float2*>(p)); };
#pragma unroll
  for (int k = 0; k < HD / 16; ++k) {
    const int d = 16 * k + 2 * c;
    const float2 x00 = q0 ? ld(q0 + d) : zero;
    const float2 x10 = q1 ? ld(q1 + d) : zero;
    const float2 x01 = q0 ? ld(q0 + d + 8) : zero;
    const float2 x11 = q1 ? ld(q1 + d + 8) : zero;
    qa[k][0] = Op::pack(x00.x, x00.y);
    qa[k][1] = Op::pack(x10.x, x10.y);
    qa[k][2] = Op::pack(x01.x, x01.y);
    qa[k][3] = Op::pack(x11.x, x11.y);
  }
}

// This block's share of positions [c_first, p_last] (c_first a multiple of CHUNK: 0, or the
// chunk of a sliding window's start): whole chunks of CHUNK, so a share ends at a chunk
// boundary or at p_last + 1 and no position is counted by two shares (blockIdx.z of
// gridDim.z splits). Returns {begin, end}.
// With share_chunks > 0 (batch-invariant steps) the shares are instead fixed ranges of absolute
// positions, [z, z + 1) x share_chunks x CHUNK, whatever the tile or the batch: the chunks a
// row's online softmax walks, and the partials the combine merges, are then the same in every
// step (chunks wholly before c_first are skipped: for every row of the tile they are masked,
// and a masked chunk leaves the softmax state as it was).
template <int CHUNK>
__device__ __forceinline__ int2 context_share(int c_first, int p_last, int share_chunks) {
  if (share_chunks > 0) {
    const int begin = int(blockIdx.z) * share_chunks * CHUNK;
    return make_int2(max(begin, c_first), min(p_last + 1, begin + share_chunks * CHUNK));
  }
  const int n_chunks = (p_last - c_first) / CHUNK + 1;
  const int per = (n_chunks + int(gridDim.z) - 1) / int(gridDim.z);
  const int begin = c_first + int(blockIdx.z) * per * CHUNK;
  return make_int2(begin, min(p_last + 1, begin + per * CHUNK));
}

// One 16x8 tile of S = Q·Kᵀ: krow points at K[n0 + g][2c] in shared memory (row stride
// whatever the caller staged); B fragment b0 = K[n0 + g][16k + 2c, +1], b1 = 8 dims later.
template <int HD, typename Op, bool KV16>
__device__ __forceinline__ void score_tile(float (&s)[4], const uint32_t (&qa)[HD / 16][4],
                                           const typename KvStage<Op, KV16>::E* krow) {
  using S = KvStage<Op, KV16>;
  s[0] = s[1] = s[2] = s[3] = 0.f;
#pragma unroll
  for (int k = 0; k < HD / 16; ++k) mma_16816<Op>(s, qa[k], S::pair(krow + 16 * k), S::pair(krow + 16 * k + 8));
}

// Causal mask (position > the row's position: -inf) and scale (log2 units) of one tile whose
// lane columns are positions j, j + 1, for rows at positions pos_r0 and pos_r1.
// The product is rounded on its own (__fmul_rn): the compiler may otherwise fuse it into the
// exponent's subtraction in one kernel and not in another, and every kernel must give the
// chunk the same scores.
__device__ __forceinline__ void mask_scale(float (&s)[4], int j, int pos_r0, int pos_r1, float sl2) {
  s[0] = j <= pos_r0 ? __fmul_rn(s[0], sl2) : -INFINITY;
  s[1] = j + 1 <= pos_r0 ? __fmul_rn(s[1], sl2) : -INFINITY;
  s[2] = j <= pos_r1 ? __fmul_rn(s[2], sl2) : -INFINITY;
  s[3] = j + 1 <= pos_r1 ? __fmul_rn(s[3], sl2) : -INFINITY;
}

// The kernel parameter of a variant with (MaskedAttentionArgs, kernels.h) or without masks.
template <bool MASKED>
using ArgsOf = std::conditional_t<MASKED, MaskedAttentionArgs, AttentionArgs>;

// Tile row r's masks (positions are then KV slots); rows past the tile keep all.
__device__ __forceinline__ RowMask row_mask(const MaskedAttentionArgs& a, int t0, int r, int rows, int group) {
  return r < rows ? row_mask_of(a, t0 + r / group) : RowMask{0, INT_MAX, 0};
}

// The masks of a lane's rows r0, r1 of the tile of tokens [t0, t0 + nt); returns the first
// chunk (of CHUNK positions) the tile's context share starts at.
template <int CHUNK>
__device__ __forceinline__ int tile_masks(const MaskedAttentionArgs& a, int t0, int nt, int r0, int r1, int group,
                                          RowMask& m0, RowMask& m1) {
  m0 = row_mask(a, t0, r0, nt * group, group), m1 = row_mask(a, t0, r1, nt * group, group);
  return tile_first(a, t0, nt) / CHUNK * CHUNK;
}

// mask_scale for masked tiles: also -inf where a row's masks drop the slot.
__device__ __forceinline__ void mask_scale_rows(float (&s)[4], int j, int pos_r0, int pos_r1, const RowMask& t0,
                                                const RowMask& t1, float sl2) {
  s[0] = j <= pos_r0 && t0.keeps(j) ? __fmul_rn(s[0], sl2) : -INFINITY;
  s[1] = j + 1 <= pos_r0 && t0.keeps(j + 1) ? __fmul_rn(s[1], sl2) : -INFINITY;
  s[2] = j <= pos_r1 && t1.keeps(j) ? __fmul_rn(s[2], sl2) : -INFINITY;
  s[3] = j + 1 <= pos_r1 && t1.keeps(j + 1) ? __fmul_rn(s[3], sl2) : -INFINITY;
}

// Online-softmax step of one row held by a lane quad: `mx` is this lane's maximum of the new
// scores; m (running maximum) becomes the quad's, `base` is what exponents subtract and
// `corr` rescales the old l and O. A row with nothing unmasked yet (m = -inf) uses base 0:
// p = 0, corr = 0, O stays 0.
__device__ __forceinline__ void online_softmax_step(float mx, float& m, float& base, float& corr) {
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float mn = fmaxf(m, mx);
  base = mn == -INFINITY ? 0.f : mn;
  corr = exp2f(m - base);
  m = mn;
}

// Sum over the lane quad of a row (each lane summed its own columns).
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Issues the cp.async copies of positions c0 .. c0 + CHUNK - 1 of KV head kvh (K rows at
// stride KS, then V rows at stride VS elements of E, 4-byte fp32 or 2-byte 16-bit: the
// cache's dtype) into buf, by THREADS threads (this one is tid of them); positions after p_last are
// zero-filled (P is 0 there, and V must not be NaN). A thread copies one 16-byte column of
// every (THREADS / copies per row)-th row, K and V: one block-table read and one address per
// position, not per copy (the address arithmetic, not the bytes, bounded the one-warp chunk
// kernel: Nsight Compute saw its warps issuing, not waiting on memory). Rows before first_row
// are left as they are (staged earlier).
template <typename E, int HD, int CHUNK, int THREADS, int KS, int VS>
__device__ __forceinline__ void stage_kv_chunk(const KvLayerView& kv, const int32_t* table, int kvh, int p_last,
                                               int c0, E* buf, int tid, int first_row = 0) {
  constexpr int kPer = 16 / int(sizeof(E)), kCopies = HD / kPer;  // elements per copy, copies per row
  constexpr int kRows = THREADS / kCopies;                         // rows per pass of the threads
  static_assert(HD % kPer == 0 && THREADS % kCopies == 0 && CHUNK % kRows == 0, "whole rows per pass");
  const int dc = tid % kCopies, j0 = tid / kCopies;
  const int bs = kv.block_size;
  const bool pow2 = (bs & (bs - 1)) == 0;
  const int shift = __ffs(bs) - 1;
  const int64_t slot_elems = int64_t(kv.n_head_kv) * HD;  // one slot of one layer
  const E* head = static_cast<const E*>(kv.base) + kv.layer_offset + int64_t(kvh) * HD + dc * kPer;
  E* ks = buf + dc * kPer;
  E* vs = buf + CHUNK * KS + dc * kPer;
#pragma unroll 8
  for (int i = 0; i < CHUNK / kRows; ++i) {
    const int jj = j0 + i * kRows, j = c0 + jj;
    if (jj < first_row) continue;
    const bool valid = j <= p_last;
    const E* k = static_cast<const E*>(kv.base);
    const E* v = k;
    if (valid) {
      const int b = pow2 ? j >> shift : j / bs, slot = pow2 ? j & (bs - 1) : j % bs;
      k = head + int64_t(table[b]) * kv.block_stride + int64_t(slot) * slot_elems;
      v = k + int64_t(bs) * slot_elems;  // V slots follow the block's K slots
    }
    cp_async16(ks + jj * KS, k, valid);
    cp_async16(vs + jj * VS, v, valid);
  }
}

// A chunk partial's K/V rows of the positions before tile `tile`'s first (written by earlier
// steps, so they may be staged before this step's own K/V are), by THREADS threads (this one
// is tid of them) into st, each thread's copies committed as a group; the partial
// (chunk_partial on one warp, chunk_partial_group on 32 x W threads, with staged_rows = the
// result) then stages the rest on the same THREADS, so that each thread waits for its own
// copies before it copies over their zero-filled rows. The same values in st, so the same
// bits. Unmasked attention only (no window, no tree).
template <int HD, typename Op, bool KV16, int THREADS = 32>
__device__ __forceinline__ int chunk_prestage(const AttentionArgs& a, int tile, int kvh, int z, int tid,
                                              typename KvStage<Op, KV16>::E* st) {
  using T = MmaTile<HD, KV16>;
  using E = typename KvStage<Op, KV16>::E;
  const int t0 = a.tile_starts[tile], pos0 = a.positions[t0], c0 = z * kChunk;
  if (c0 >= pos0) return 0;
  stage_kv_chunk<E, HD, kChunk, THREADS, T::kStride, T::vStride>(a.kv, a.tables + a.table_off[t0], kvh, pos0 - 1, c0,
                                                                st, tid);
  cp_async_commit();
  return min(pos0 - c0, kChunk);
}

// Batch-invariant steps (FOLD) replace the online softmax by a fold of chunk partials
// (attention_fold.cuh), so that the chunks of a share can also be computed side by side
// (attn_chunk_decode_kernel) with the same bits. Chunk i of a row gives, from nothing but its
// own 64 positions, a maximum mc, l_c = the sum over the row's quad of exp2(s - mc) (fp32,
// each lane's columns in order, then the quad sum) and O_c = P·V from zero (P those
// exponentials rounded to the operand type; the mma chain over the chunk's four k16 position
// steps). The share's folded state is its partial (attn_combine_kernel merges the shares).

// P = 2^(S - base) of a chunk's two rows, packed as 16-bit A fragments (k-step kk covers
// positions 16kk.., accumulator tiles 2kk and 2kk+1), and its row sums added to ps0 / ps1 in
// one order: the folded and the online paths share it, so their bits agree.
template <typename Op>
__device__ __forceinline__ void exp_pack_chunk(const float (&s)[kChunk / 8][4], float base0, float base1,
                                               uint32_t (&pa)[kChunk / 16][4], float& ps0, float& ps1) {
#pragma unroll
  for (int kk = 0; kk < kChunk / 16; ++kk) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float* sn = s[2 * kk + h];
      const float p00 = exp2f(sn[0] - base0), p01 = exp2f(sn[1] - base0);
      const float p10 = exp2f(sn[2] - base1), p11 = exp2f(sn[3] - base1);
      ps0 += p00 + p01;
      ps1 += p10 + p11;
      pa[kk][2 * h] = Op::pack(p00, p01);
      pa[kk][2 * h + 1] = Op::pack(p10, p11);
    }
  }
}

// Position tile n (positions c0 + 8n ..) of chunk_scores: S from zero, masked and scaled.
// LDMATRIX (16-bit caches): K's fragments by ldmatrix, one instruction per two steps (as
// chunk_pv's; the same operands).
template <int HD, typename Op, bool KV16, bool MASKED, bool LDMATRIX = false>
__device__ __forceinline__ void chunk_score_tile(const uint32_t (&qa)[HD / 16][4],
                                                 const typename KvStage<Op, KV16>::E* ks, int n, int c0, int pos_r0,
                                                 int pos_r1, const RowMask& tree0, const RowMask& tree1, float sl2,
                                                 int g, int c, float (&s)[4]) {
  using T = MmaTile<HD, KV16>;
  if constexpr (KV16 && LDMATRIX) {
    // K[8n + l % 8][16k + 8 (l / 8) ..]: matrices 0-3 are b0, b1 of step k and of step k + 1.
    const auto* row = ks + (n * 8 + (4 * g + c) % 8) * T::kStride + 8 * ((4 * g + c) / 8);
    s[0] = s[1] = s[2] = s[3] = 0.f;
#pragma unroll
    for (int k = 0; k < HD / 16; k += 2) {
      uint32_t b[4];
      ldmatrix_x4<false>(b, row + 16 * k);
      mma_16816<Op>(s, qa[k], b[0], b[1]);
      mma_16816<Op>(s, qa[k + 1], b[2], b[3]);
    }
  } else {
    score_tile<HD, Op, KV16>(s, qa, ks + (n * 8 + g) * T::kStride + 2 * c);
  }
  if constexpr (MASKED)
    mask_scale_rows(s, c0 + n * 8 + 2 * c, pos_r0, pos_r1, tree0, tree1, sl2);
  else
    mask_scale(s, c0 + n * 8 + 2 * c, pos_r0, pos_r1, sl2);
}

// S = Q·Kᵀ of a chunk for a lane's rows r0, r1 from the staged K at ks, masked and scaled (log2
// units), and the lane's maximum of each row's scores (not yet over the quad).
template <int HD, typename Op, bool KV16, bool MASKED, bool LDMATRIX = false>
__device__ __forceinline__ void chunk_scores(const uint32_t (&qa)[HD / 16][4], const typename KvStage<Op, KV16>::E* ks,
                                             int c0, int pos_r0, int pos_r1, const RowMask& tree0,
                                             const RowMask& tree1, float sl2, int g, int c, float (&s)[kChunk / 8][4],
                                             float& mx0, float& mx1) {
  mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int n = 0; n < kChunk / 8; ++n) {
    chunk_score_tile<HD, Op, KV16, MASKED, LDMATRIX>(qa, ks, n, c0, pos_r0, pos_r1, tree0, tree1, sl2, g, c, s[n]);
    mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
    mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
  }
}

// A chunk's scores, maximum, P fragments and l for a lane's rows r0, r1 (the FOLD arithmetic
// above): S from the staged K at ks, masked and scaled as the online-softmax path does.
template <int HD, typename Op, bool KV16, bool MASKED, bool LDMATRIX = false>
__device__ __forceinline__ void chunk_softmax(const uint32_t (&qa)[HD / 16][4], const typename KvStage<Op, KV16>::E* ks,
                                              int c0, int pos_r0, int pos_r1, const RowMask& tree0,
                                              const RowMask& tree1, float sl2, int g, int c,
                                              uint32_t (&pa)[kChunk / 16][4], float& mc0, float& mc1, float& lc0,
                                              float& lc1) {
  float s[kChunk / 8][4];
  float mx0, mx1;
  chunk_scores<HD, Op, KV16, MASKED, LDMATRIX>(qa, ks, c0, pos_r0, pos_r1, tree0, tree1, sl2, g, c, s, mx0, mx1);
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  mc0 = mx0, mc1 = mx1;
  const float base0 = mx0 == -INFINITY ? 0.f : mx0, base1 = mx1 == -INFINITY ? 0.f : mx1;
  float ps0 = 0.f, ps1 = 0.f;
  exp_pack_chunk<Op>(s, base0, base1, pa, ps0, ps1);
  lc0 = quad_sum(ps0);
  lc1 = quad_sum(ps1);
}

// O_c's accumulator tile dn (dims 8dn .. 8dn + 7) of a chunk: P·V from zero over the staged V.
// LDMATRIX (16-bit caches): V's fragments by ldmatrix.trans, one instruction per two steps,
// instead of paired 16-bit loads: the same operands, fewer instructions, 4 more registers (the
// 8-warp tile kernel, at its register cap, keeps the paired loads).
template <int HD, typename Op, bool KV16, bool LDMATRIX = false>
__device__ __forceinline__ void chunk_pv(const uint32_t (&pa)[kChunk / 16][4], const typename KvStage<Op, KV16>::E* vs,
                                         int dn, int g, int c, float (&oc)[4]) {
  using T = MmaTile<HD, KV16>;
  using S = KvStage<Op, KV16>;
  oc[0] = oc[1] = oc[2] = oc[3] = 0.f;
  if constexpr (KV16 && LDMATRIX) {
    // V[16 kk + l][8 dn ..], transposed: matrices 0-3 are b0, b1 of step kk and of kk + 1.
    const auto* row = vs + (4 * g + c) * T::vStride + dn * 8;
#pragma unroll
    for (int kk = 0; kk < kChunk / 16; kk += 2) {
      uint32_t b[4];
      ldmatrix_x4<true>(b, row + 16 * kk * T::vStride);
      mma_16816<Op>(oc, pa[kk], b[0], b[1]);
      mma_16816<Op>(oc, pa[kk + 1], b[2], b[3]);
    }
  } else {
    const auto* vcol = vs + (2 * c) * T::vStride + dn * 8 + g;
#pragma unroll
    for (int kk = 0; kk < kChunk / 16; ++kk) {
      const auto* v0 = vcol + 16 * kk * T::vStride;
      mma_16816<Op>(oc, pa[kk], S::rows2(v0, T::vStride), S::rows2(v0 + 8 * T::vStride, T::vStride));
    }
  }
}

// Batch-invariant steps, tiles of at most 16 rows: chunk z (of n_z, the step's splits x
// share_chunks) of KV head kvh for tile `tile`, by one warp (this lane of it) with its own
// stage `st` (MmaTile<HD, KV16>::stage_elems elements): the chunk's partial (mc, l_c, O_c;
// attention_fold.cuh) of each of the tile's rows into a.partial, record (row, z) of n_z, or
// mc = -inf where the chunk lies before the window or after every row. chunk_softmax and
// chunk_pv are the tile kernel's code, so the folded partials give the tile kernel's bits.
// LDMATRIX as chunk_scores' and chunk_pv's. staged_rows: the rows chunk_prestage staged into
// st (0: none).
template <int HD, typename Op, bool KV16, bool MASKED, bool LDMATRIX = false>
__device__ __forceinline__ void chunk_partial(const ArgsOf<MASKED>& a,
                                              int tile, int kvh, int z, int n_z, int lane,
                                              typename KvStage<Op, KV16>::E* st, int staged_rows = 0) {
  using T = MmaTile<HD, KV16>;
  using E = typename KvStage<Op, KV16>::E;
  constexpr int R = HD + 2;
  const KvLayerView& kv = a.kv;
  const int group = a.n_head / kv.n_head_kv;
  const int t0 = a.tile_starts[tile], nt = a.tile_starts[tile + 1] - t0;
  const int rows = nt * group;  // <= 16 (the dispatcher checks)
  const int pos0 = a.positions[t0];
  const int p_last = pos0 + nt - 1;
  const int32_t* table = a.tables + a.table_off[t0];
  const int g = lane / 4, c = lane % 4;
  const int r0 = g, r1 = g + 8;
  RowMask tree0{0, INT_MAX, 0}, tree1{0, INT_MAX, 0};
  int c_first = 0;
  if constexpr (MASKED) c_first = tile_masks<kChunk>(a, t0, nt, r0, r1, group, tree0, tree1);
  const int c0 = z * kChunk;
  // Row r's record of this chunk.
  auto record = [&](int r) {
    const int64_t th = int64_t(t0 + r / group) * a.n_head + kvh * group + r % group;
    return a.partial + (th * n_z + z) * R;
  };
  if (c0 < c_first || c0 > p_last) {  // before the window or after every row: nothing to fold
    if (lane < rows) record(lane)[HD] = -INFINITY;
    return;
  }
  if (staged_rows > 0) asm volatile("cp.async.wait_group 0;\n" ::);  // the staged rows and their zero fill have landed
  stage_kv_chunk<E, HD, kChunk, 32, T::kStride, T::vStride>(kv, table, kvh, p_last, c0, st, lane, staged_rows);
  cp_async_commit();
  uint32_t qa[HD / 16][4];
  load_q_fragments<HD, Op>(a, t0, rows, group, kvh, r0, r1, c, qa);
  const int pos_r0 = pos0 + r0 / group, pos_r1 = pos0 + r1 / group;
  const float sl2 = a.scale * 1.4426950408889634f;
  asm volatile("cp.async.wait_group 0;\n" ::);
  __syncwarp();
  const E* ks = st;
  const E* vs = st + kChunk * T::kStride;
  uint32_t pa[kChunk / 16][4];
  float mc0, mc1, lc0, lc1;
  chunk_softmax<HD, Op, KV16, MASKED, LDMATRIX>(qa, ks, c0, pos_r0, pos_r1, tree0, tree1, sl2, g, c, pa, mc0, mc1, lc0,
                                                lc1);
  float* rec0 = r0 < rows ? record(r0) : nullptr;
  float* rec1 = r1 < rows ? record(r1) : nullptr;
#pragma unroll
  for (int dn = 0; dn < HD / 8; ++dn) {
    float oc[4];
    chunk_pv<HD, Op, KV16, LDMATRIX>(pa, vs, dn, g, c, oc);
    if (rec0) *reinterpret_cast<float2*>(rec0 + dn * 8 + 2 * c) = make_float2(oc[0], oc[1]);
    if (rec1) *reinterpret_cast<float2*>(rec1 + dn * 8 + 2 * c) = make_float2(oc[2], oc[3]);
  }
  if (c == 0) {
    if (rec0) rec0[HD] = mc0, rec0[HD + 1] = lc0;
    if (rec1) rec1[HD] = mc1, rec1[HD + 1] = lc1;
  }
  __syncwarp();  // the stage may be refilled by this warp's next chunk
}

}  // namespace fdl::cuda::attn
