// Tiled prefill attention on tensor cores: the same tiles, causal (token-tree, sliding-window) masking,
// split-K shares and partial records as attn_tile_kernel in attention.cu, with Q·Kᵀ and P·V
// as mma.sync m16n8k16 products on fp16 operands with fp32 accumulation, and the softmax in fp32.
//
// Why: the fp32 tiled kernel is instruction bound (~70 GFLOP of attention in a 512-token
// Llama-3-8B prefill on CUDA cores: ~11 ms of a 24 ms TTFT).
//
// Block (tile, kv head, split) of 8 warps; warp w owns tile rows 16w..16w+15 (row r: token
// r / group, query head kvh * group + r % group), lane (g = lane / 4, c = lane % 4) the rows
// 16w + g and 16w + g + 8, as the m16n8k16 fragment layout (PTX ISA, "Matrix Fragments for
// mma.m16n8k16") assigns them. Everything a warp needs stays in registers:
//   - Q: the A fragments of the warp's 16 rows, loaded once (HD/16 x 4 registers);
//   - S = Q·Kᵀ for a chunk of 64 positions: 8 accumulator tiles of 16x8;
//   - P: the accumulator layout of two adjacent 16x8 tiles is exactly the A-fragment layout
//     of one 16x16 operand, so P is rounded to fp16 and packed without leaving registers
//     (the FlashAttention-2 arrangement, Dao 2023);
//   - O: HD/8 accumulator tiles, rescaled by the online-softmax correction per chunk.
// K and V chunks are copied from the paged arena into shared memory with cp.async, two stages
// deep (the next chunk lands while this one is multiplied), as stored (KvStage): an fp32
// cache's fragments are rounded to the 16-bit operand type in registers (row strides HD + 8
// (K) and HD + 4 (V) floats), a 16-bit cache's (its dtype is then the operand type) are
// used as they are (row strides HD + 8 elements, half the bytes); both read patterns are
// bank-conflict free.
// The operands are fp16 (11 significant bits: ~3e-4 relative error in the output) or bf16
// (8 bits and fp32's range: ~3e-3), matching the weights' type (AttentionArgs::tc_bf16);
// fp32 tiles give ~1e-6. The model uses this path where its GEMMs already round activations
// to 16 bits (F16/BF16 weights); see CudaModel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include <climits>
#include <cmath>
#include <string>

#include "backend/cuda/attention_fold.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_elem.cuh"
#include "backend/cuda/launch.h"

namespace fdl::cuda {
namespace {

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
#pragma unroll
  for (int k = 0; k < HD / 16; ++k) {
    const int d = 16 * k + 2 * c;
    const float2 x00 = q0 ? *reinterpret_cast<const float2*>(q0 + d) : zero;
    const float2 x10 = q1 ? *reinterpret_cast<const float2*>(q1 + d) : zero;
    const float2 x01 = q0 ? *reinterpret_cast<const float2*>(q0 + d + 8) : zero;
    const float2 x11 = q1 ? *reinterpret_cast<const float2*>(q1 + d + 8) : zero;
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
__device__ __forceinline__ void mask_scale(float (&s)[4], int j, int pos_r0, int pos_r1, float sl2) {
  s[0] = j <= pos_r0 ? s[0] * sl2 : -INFINITY;
  s[1] = j + 1 <= pos_r0 ? s[1] * sl2 : -INFINITY;
  s[2] = j <= pos_r1 ? s[2] * sl2 : -INFINITY;
  s[3] = j + 1 <= pos_r1 ? s[3] * sl2 : -INFINITY;
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
  s[0] = j <= pos_r0 && t0.keeps(j) ? s[0] * sl2 : -INFINITY;
  s[1] = j + 1 <= pos_r0 && t0.keeps(j + 1) ? s[1] * sl2 : -INFINITY;
  s[2] = j <= pos_r1 && t1.keeps(j) ? s[2] * sl2 : -INFINITY;
  s[3] = j + 1 <= pos_r1 && t1.keeps(j + 1) ? s[3] * sl2 : -INFINITY;
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
// cache's dtype) into buf, by the block's THREADS threads; positions after p_last are
// zero-filled (P is 0 there, and V must not be NaN).
template <typename E, int HD, int CHUNK, int THREADS, int KS, int VS>
__device__ __forceinline__ void stage_kv_chunk(const KvLayerView& kv, const int32_t* table, int kvh, int p_last,
                                               int c0, E* buf) {
  constexpr int kPer = 16 / int(sizeof(E)), kCopies = HD / kPer;  // elements per copy, copies per row
  E* ks = buf;
  E* vs = buf + CHUNK * KS;
  for (int idx = threadIdx.x; idx < 2 * CHUNK * kCopies; idx += THREADS) {
    const bool is_v = idx >= CHUNK * kCopies;
    const int i = is_v ? idx - CHUNK * kCopies : idx;
    const int jj = i / kCopies, dc = i % kCopies;
    const int j = c0 + jj;
    const bool valid = j <= p_last;
    const E* src = valid ? kv_ptr<E>(kv, table[j / kv.block_size], (is_v ? kv.block_size : 0) + j % kv.block_size,
                                     int64_t(kvh) * HD + dc * kPer)
                         : static_cast<const E*>(kv.base);
    cp_async16(is_v ? vs + jj * VS + dc * kPer : ks + jj * KS + dc * kPer, src, valid);
  }
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

// A chunk's scores, maximum, P fragments and l for a lane's rows r0, r1 (the FOLD arithmetic
// above): S from the staged K at ks, masked and scaled as the online-softmax path does.
template <int HD, typename Op, bool KV16, bool MASKED>
__device__ __forceinline__ void chunk_softmax(const uint32_t (&qa)[HD / 16][4], const typename KvStage<Op, KV16>::E* ks,
                                              int c0, int pos_r0, int pos_r1, const RowMask& tree0,
                                              const RowMask& tree1, float sl2, int g, int c,
                                              uint32_t (&pa)[kChunk / 16][4], float& mc0, float& mc1, float& lc0,
                                              float& lc1) {
  using T = MmaTile<HD, KV16>;
  float s[kChunk / 8][4];
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int n = 0; n < kChunk / 8; ++n) {
    score_tile<HD, Op, KV16>(s[n], qa, ks + (n * 8 + g) * T::kStride + 2 * c);
    if constexpr (MASKED)
      mask_scale_rows(s[n], c0 + n * 8 + 2 * c, pos_r0, pos_r1, tree0, tree1, sl2);
    else
      mask_scale(s[n], c0 + n * 8 + 2 * c, pos_r0, pos_r1, sl2);
    mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
    mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
  }
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
template <int HD, typename Op, bool KV16>
__device__ __forceinline__ void chunk_pv(const uint32_t (&pa)[kChunk / 16][4], const typename KvStage<Op, KV16>::E* vs,
                                         int dn, int g, int c, float (&oc)[4]) {
  using T = MmaTile<HD, KV16>;
  using S = KvStage<Op, KV16>;
  oc[0] = oc[1] = oc[2] = oc[3] = 0.f;
  const auto* vcol = vs + (2 * c) * T::vStride + dn * 8 + g;
#pragma unroll
  for (int kk = 0; kk < kChunk / 16; ++kk) {
    const auto* v0 = vcol + 16 * kk * T::vStride;
    mma_16816<Op>(oc, pa[kk], S::rows2(v0, T::vStride), S::rows2(v0 + 8 * T::vStride, T::vStride));
  }
}

// MASKED: the batch holds token trees or a sliding window (AttentionMasks); a separate
// instantiation with its own parameter type, so steps without masks run the kernel they ran
// before. FOLD: batch-invariant steps (the chunk fold above; always partials).
template <int HD, typename Op, bool KV16, bool MASKED, bool FOLD>
__global__ void __launch_bounds__(256, 1) attn_tile_mma_kernel(ArgsOf<MASKED> a) {
  constexpr int kThreads = 256;
  using T = MmaTile<HD, KV16>;
  using S = KvStage<Op, KV16>;
  using E = typename S::E;
  launch_dependents();
  grid_dependency_wait();
  extern __shared__ __align__(16) float smf[];
  E* sm = reinterpret_cast<E*>(smf);  // two stages of [K chunk | V chunk]
  const KvLayerView& kv = a.kv;
  const int group = a.n_head / kv.n_head_kv;
  const int kvh = blockIdx.y;
  const int t0 = a.tile_starts[blockIdx.x], nt = a.tile_starts[blockIdx.x + 1] - t0;
  const int rows = nt * group;
  const int pos0 = a.positions[t0];
  const int p_last = pos0 + nt - 1;
  const int32_t* table = a.tables + a.table_off[t0];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const int r0 = warp * 16 + g, r1 = r0 + 8;

  // Q as A fragments: a0 (row g, cols 2c, 2c+1), a1 (row g+8, same cols), a2/a3 (cols + 8).
  uint32_t qa[HD / 16][4];
  load_q_fragments<HD, Op>(a, t0, rows, group, kvh, r0, r1, c, qa);
  float o[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  // Softmax state of rows r0, r1 in log2 units (scores scaled by scale * log2 e), replicated
  // over the four lanes of a row; l holds this lane's columns only until the end.
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  const int pos_r0 = pos0 + r0 / group, pos_r1 = pos0 + r1 / group;  // rows >= `rows` are never written
  const int warp_max_pos = warp * 16 < rows ? pos0 + min(warp * 16 + 15, rows - 1) / group : -1;
  const float sl2 = a.scale * 1.4426950408889634f;
  RowMask tree0{0, INT_MAX, 0}, tree1{0, INT_MAX, 0};
  int c_first = 0;
  if constexpr (MASKED) c_first = tile_masks<kChunk>(a, t0, nt, r0, r1, group, tree0, tree1);

  const int2 share = context_share<kChunk>(c_first, p_last, a.share_chunks);
  const int c_begin = share.x, c_end = share.y;

  auto stage = [&](int c0, E* buf) {
    stage_kv_chunk<E, HD, kChunk, kThreads, T::kStride, T::vStride>(kv, table, kvh, p_last, c0, buf);
  };

  if (c_begin < c_end) stage(c_begin, sm);
  cp_async_commit();
  int buf = 0;
  for (int c0 = c_begin; c0 < c_end; c0 += kChunk, buf ^= 1) {
    if (c0 + kChunk < c_end) stage(c0 + kChunk, sm + (buf ^ 1) * T::stage_elems);
    cp_async_commit();             // possibly empty: keeps "all but the newest group" meaning this chunk
    cp_async_wait_all_but_one();
    __syncthreads();               // this chunk's copies from every thread are visible
    if (FOLD && c0 <= warp_max_pos) {
      const E* ks = sm + buf * T::stage_elems;
      const E* vs = ks + kChunk * T::kStride;
      uint32_t pa[kChunk / 16][4];
      float mc0, mc1, lc0, lc1, keep0 = 1.f, take0 = 0.f, keep1 = 1.f, take1 = 0.f;
      chunk_softmax<HD, Op, KV16, MASKED>(qa, ks, c0, pos_r0, pos_r1, tree0, tree1, sl2, g, c, pa, mc0, mc1, lc0, lc1);
      const bool f0 = fold_weights(mc0, m0, keep0, take0), f1 = fold_weights(mc1, m1, keep1, take1);
      if (f0) l0 = fold(l0, keep0, lc0, take0);
      if (f1) l1 = fold(l1, keep1, lc1, take1);
#pragma unroll
      for (int dn = 0; dn < HD / 8; ++dn) {
        float oc[4];
        chunk_pv<HD, Op, KV16>(pa, vs, dn, g, c, oc);
        if (f0) o[dn][0] = fold(o[dn][0], keep0, oc[0], take0), o[dn][1] = fold(o[dn][1], keep0, oc[1], take0);
        if (f1) o[dn][2] = fold(o[dn][2], keep1, oc[2], take1), o[dn][3] = fold(o[dn][3], keep1, oc[3], take1);
      }
    } else if (!FOLD && c0 <= warp_max_pos) {  // else every row of the warp precedes the chunk (or is absent)
      const E* ks = sm + buf * T::stage_elems;
      const E* vs = ks + kChunk * T::kStride;
      float s[kChunk / 8][4];
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int n = 0; n < kChunk / 8; ++n) {
        score_tile<HD, Op, KV16>(s[n], qa, ks + (n * 8 + g) * T::kStride + 2 * c);
        if constexpr (MASKED)
          mask_scale_rows(s[n], c0 + n * 8 + 2 * c, pos_r0, pos_r1, tree0, tree1, sl2);
        else
          mask_scale(s[n], c0 + n * 8 + 2 * c, pos_r0, pos_r1, sl2);
        mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
        mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
      }
      float base0, base1, corr0, corr1;
      online_softmax_step(mx0, m0, base0, corr0);
      online_softmax_step(mx1, m1, base1, corr1);
      // P (16-bit) as A fragments: k-step kk covers positions 16kk.. = accumulator tiles 2kk, 2kk+1.
      uint32_t pa[kChunk / 16][4];
      float ps0 = 0.f, ps1 = 0.f;
      exp_pack_chunk<Op>(s, base0, base1, pa, ps0, ps1);
      l0 = l0 * corr0 + ps0;
      l1 = l1 * corr1 + ps1;
      // O = O * corr + P·V: B fragment b0 = V[16kk + 2c, +1][n0 + g], b1 = rows + 8.
#pragma unroll
      for (int dn = 0; dn < HD / 8; ++dn) {
        o[dn][0] *= corr0, o[dn][1] *= corr0, o[dn][2] *= corr1, o[dn][3] *= corr1;
        const E* vcol = vs + (2 * c) * T::vStride + dn * 8 + g;
#pragma unroll
        for (int kk = 0; kk < kChunk / 16; ++kk) {
          const E* v0 = vcol + 16 * kk * T::vStride;
          mma_16816<Op>(o[dn], pa[kk], S::rows2(v0, T::vStride), S::rows2(v0 + 8 * T::vStride, T::vStride));
        }
      }
    }
    __syncthreads();  // every warp is done with this stage before the next iteration refills it
  }

  if constexpr (!FOLD) {  // row sums over the quad (each lane summed its own columns)
    l0 = quad_sum(l0);
    l1 = quad_sum(l1);
  }
  constexpr float kLn2 = 0.6931471805599453f;  // m back to natural-log units for the combine
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = half ? r1 : r0;
    if (r >= rows) continue;
    const float m = half ? m1 : m0, l = half ? l1 : l0;
    const int64_t th = int64_t(t0 + r / group) * a.n_head + kvh * group + r % group;
    if (!FOLD && gridDim.z == 1) {
      float* out = a.out + th * HD + 2 * c;
      const float inv = 1.f / l;
#pragma unroll
      for (int dn = 0; dn < HD / 8; ++dn)
        *reinterpret_cast<float2*>(out + dn * 8) = make_float2(o[dn][2 * half] * inv, o[dn][2 * half + 1] * inv);
    } else {  // a partial (acc, m, l) for attn_combine_kernel; m = -inf when this share was empty
      float* out = a.partial + (th * gridDim.z + blockIdx.z) * (HD + 2);
#pragma unroll
      for (int dn = 0; dn < HD / 8; ++dn)
        *reinterpret_cast<float2*>(out + dn * 8 + 2 * c) = make_float2(o[dn][2 * half], o[dn][2 * half + 1]);
      if (c == 0) out[HD] = FOLD ? share_max(m) : m == -INFINITY ? -INFINITY : m * kLn2, out[HD + 1] = l;
    }
  }
}

// Batch-invariant tiles of at most 16 rows (decode, verification, short prompt pieces): one
// warp per (tile, KV head, chunk) computes that chunk's partial (chunk_softmax, chunk_pv: the
// tile kernel's code) into the partial buffer, at chunk z of the step's splits x share_chunks;
// attn_fold_combine_kernel (attention.cu) then folds each share's chunks in order and merges
// the shares as the tile kernel's partials are. A batch-1 step would otherwise be one warp
// walking 256 positions per KV head and share; here every chunk of every head is in flight
// at once, and small blocks (one stage) let several share a multiprocessor.
template <int HD, typename Op, bool KV16, bool MASKED>
__global__ void __launch_bounds__(32) attn_chunk_decode_kernel(ArgsOf<MASKED> a) {
  using T = MmaTile<HD, KV16>;
  using E = typename KvStage<Op, KV16>::E;
  constexpr int R = HD + 2;
  launch_dependents();
  grid_dependency_wait();
  extern __shared__ __align__(16) float smf[];
  E* st = reinterpret_cast<E*>(smf);  // one stage: [K chunk | V chunk]
  const KvLayerView& kv = a.kv;
  const int group = a.n_head / kv.n_head_kv;
  const int kvh = blockIdx.y;
  const int t0 = a.tile_starts[blockIdx.x], nt = a.tile_starts[blockIdx.x + 1] - t0;
  const int rows = nt * group;  // <= 16 (the dispatcher checks)
  const int pos0 = a.positions[t0];
  const int p_last = pos0 + nt - 1;
  const int32_t* table = a.tables + a.table_off[t0];
  const int lane = threadIdx.x, g = lane / 4, c = lane % 4;
  const int r0 = g, r1 = g + 8;
  RowMask tree0{0, INT_MAX, 0}, tree1{0, INT_MAX, 0};
  int c_first = 0;
  if constexpr (MASKED) c_first = tile_masks<kChunk>(a, t0, nt, r0, r1, group, tree0, tree1);
  const int c0 = int(blockIdx.z) * kChunk;
  // Row r's record of this chunk.
  auto record = [&](int r) {
    const int64_t th = int64_t(t0 + r / group) * a.n_head + kvh * group + r % group;
    return a.partial + (th * gridDim.z + blockIdx.z) * R;
  };
  if (c0 < c_first || c0 > p_last) {  // before the window or after every row: nothing to fold
    if (lane < rows) record(lane)[HD] = -INFINITY;
    return;
  }
  stage_kv_chunk<E, HD, kChunk, 32, T::kStride, T::vStride>(kv, table, kvh, p_last, c0, st);
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
  chunk_softmax<HD, Op, KV16, MASKED>(qa, ks, c0, pos_r0, pos_r1, tree0, tree1, sl2, g, c, pa, mc0, mc1, lc0, lc1);
  float* rec0 = r0 < rows ? record(r0) : nullptr;
  float* rec1 = r1 < rows ? record(r1) : nullptr;
#pragma unroll
  for (int dn = 0; dn < HD / 8; ++dn) {
    float oc[4];
    chunk_pv<HD, Op, KV16>(pa, vs, dn, g, c, oc);
    if (rec0) *reinterpret_cast<float2*>(rec0 + dn * 8 + 2 * c) = make_float2(oc[0], oc[1]);
    if (rec1) *reinterpret_cast<float2*>(rec1 + dn * 8 + 2 * c) = make_float2(oc[2], oc[3]);
  }
  if (c == 0) {
    if (rec0) rec0[HD] = mc0, rec0[HD + 1] = lc0;
    if (rec1) rec1[HD] = mc1, rec1[HD + 1] = lc1;
  }
}

// D = A·B + D, A 16x8 (row), B 8x8 (col): the P·V step of the decode kernel, whose warps
// each own 8 positions of a chunk.
template <typename Op>
__device__ __forceinline__ void mma_1688(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t b0) {
  if constexpr (std::is_same_v<Op, BF16Op>)
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

// Tiles of at most 16 rows (decode batches: one token's query heads of one KV head, GQA):
// the tile kernel above would leave 7 of its 8 warps idle. Here a block of 4 warps shares
// the 16 rows and splits every 32-position chunk: warp w multiplies positions 8w..8w+7 of
// it (S: one 16x8 tile; P·V: m16n8k8), each warp keeps its own online softmax over its
// positions, and the four (m, l, O) states are merged through shared memory at the end —
// split-K inside the block. Smaller stages (32 positions) and <= 170 registers (151 at head_dim 128) let 3 blocks
// share a multiprocessor, so 12 warps compute and 3 stages stream per SM.
constexpr int kDecWarps = 4, kDecThreads = 32 * kDecWarps, kDecChunk = 8 * kDecWarps;

template <int HD, bool KV16>
struct DecTile {
  static constexpr int kStride = MmaTile<HD, KV16>::kStride, vStride = MmaTile<HD, KV16>::vStride;
  static constexpr int stage_elems = kDecChunk * (kStride + vStride);
  static constexpr size_t stage_bytes = 2 * size_t(stage_elems) * (KV16 ? 2 : 4);
  static constexpr size_t merge_bytes = size_t(kDecWarps) * 16 * (HD + 2) * sizeof(float);
  static constexpr size_t smem_bytes = stage_bytes > merge_bytes ? stage_bytes : merge_bytes;
};

template <int HD, typename Op, bool KV16, bool MASKED>
__global__ void __launch_bounds__(kDecThreads, 3) attn_decode_mma_kernel(ArgsOf<MASKED> a) {
  using T = DecTile<HD, KV16>;
  using S = KvStage<Op, KV16>;
  using E = typename S::E;
  launch_dependents();
  grid_dependency_wait();
  extern __shared__ __align__(16) float sm[];  // the stages (as E), then the merge (fp32)
  E* st = reinterpret_cast<E*>(sm);
  const KvLayerView& kv = a.kv;
  const int group = a.n_head / kv.n_head_kv;
  const int kvh = blockIdx.y;
  const int t0 = a.tile_starts[blockIdx.x], nt = a.tile_starts[blockIdx.x + 1] - t0;
  const int rows = nt * group;  // <= 16 (the launcher checks)
  const int pos0 = a.positions[t0];
  const int p_last = pos0 + nt - 1;
  const int32_t* table = a.tables + a.table_off[t0];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const int r0 = g, r1 = g + 8;

  uint32_t qa[HD / 16][4];
  load_q_fragments<HD, Op>(a, t0, rows, group, kvh, r0, r1, c, qa);
  float o[HD / 8][4];
#pragma unroll
  for (int i = 0; i < HD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;  // log2 units; l: this lane's columns
  const int pos_r0 = pos0 + r0 / group, pos_r1 = pos0 + r1 / group;
  const int max_pos = pos0 + (rows - 1) / group;
  const float sl2 = a.scale * 1.4426950408889634f;
  RowMask tree0{0, INT_MAX, 0}, tree1{0, INT_MAX, 0};
  int c_first = 0;
  if constexpr (MASKED) c_first = tile_masks<kDecChunk>(a, t0, nt, r0, r1, group, tree0, tree1);

  const int2 share = context_share<kDecChunk>(c_first, p_last, 0);
  const int c_begin = share.x, c_end = share.y;

  auto stage = [&](int c0, E* buf) {
    stage_kv_chunk<E, HD, kDecChunk, kDecThreads, T::kStride, T::vStride>(kv, table, kvh, p_last, c0, buf);
  };

  if (c_begin < c_end) stage(c_begin, st);
  cp_async_commit();
  int buf = 0;
  const int n0 = warp * 8;  // this warp's positions within every chunk
  for (int c0 = c_begin; c0 < c_end; c0 += kDecChunk, buf ^= 1) {
    if (c0 + kDecChunk < c_end) stage(c0 + kDecChunk, st + (buf ^ 1) * T::stage_elems);
    cp_async_commit();
    cp_async_wait_all_but_one();
    __syncthreads();
    if (c0 + n0 <= max_pos) {  // else all 8 positions are after every row (masked)
      const E* ks = st + buf * T::stage_elems;
      const E* vs = ks + kDecChunk * T::kStride;
      float s[4];
      score_tile<HD, Op, KV16>(s, qa, ks + (n0 + g) * T::kStride + 2 * c);
      if constexpr (MASKED)
        mask_scale_rows(s, c0 + n0 + 2 * c, pos_r0, pos_r1, tree0, tree1, sl2);
      else
        mask_scale(s, c0 + n0 + 2 * c, pos_r0, pos_r1, sl2);
      float base0, base1, corr0, corr1;
      online_softmax_step(fmaxf(s[0], s[1]), m0, base0, corr0);
      online_softmax_step(fmaxf(s[2], s[3]), m1, base1, corr1);
      const float p00 = exp2f(s[0] - base0), p01 = exp2f(s[1] - base0);
      const float p10 = exp2f(s[2] - base1), p11 = exp2f(s[3] - base1);
      l0 = l0 * corr0 + p00 + p01;
      l1 = l1 * corr1 + p10 + p11;
      // The 16x8 accumulator layout is the m16n8k8 A layout: P never leaves registers.
      const uint32_t pa0 = Op::pack(p00, p01), pa1 = Op::pack(p10, p11);
      const E* vrow = vs + (n0 + 2 * c) * T::vStride + g;
#pragma unroll
      for (int dn = 0; dn < HD / 8; ++dn) {
        o[dn][0] *= corr0, o[dn][1] *= corr0, o[dn][2] *= corr1, o[dn][3] *= corr1;
        mma_1688<Op>(o[dn], pa0, pa1, S::rows2(vrow + dn * 8, T::vStride));
      }
    }
    __syncthreads();
  }

  // Merge the four warps' states (shared memory is free again after the last barrier).
  l0 = quad_sum(l0);
  l1 = quad_sum(l1);
  constexpr int R = HD + 2;  // per row: O[HD], m, l
  float* mine = sm + warp * 16 * R;
#pragma unroll
  for (int dn = 0; dn < HD / 8; ++dn) {
    *reinterpret_cast<float2*>(mine + r0 * R + dn * 8 + 2 * c) = make_float2(o[dn][0], o[dn][1]);
    *reinterpret_cast<float2*>(mine + r1 * R + dn * 8 + 2 * c) = make_float2(o[dn][2], o[dn][3]);
  }
  if (c == 0) mine[r0 * R + HD] = m0, mine[r0 * R + HD + 1] = l0, mine[r1 * R + HD] = m1, mine[r1 * R + HD + 1] = l1;
  __syncthreads();
  constexpr float kLn2 = 0.6931471805599453f;
  for (int idx = threadIdx.x; idx < rows * HD; idx += kDecThreads) {
    const int r = idx / HD, d = idx % HD;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) mx = fmaxf(mx, sm[(w * 16 + r) * R + HD]);
    float acc = 0.f, l = 0.f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kDecWarps; ++w) {
        const float* rec = sm + (w * 16 + r) * R;
        const float wt = rec[HD] == -INFINITY ? 0.f : exp2f(rec[HD] - mx);
        acc += rec[d] * wt;
        l += rec[HD + 1] * wt;
      }
    }
    const int64_t th = int64_t(t0 + r / group) * a.n_head + kvh * group + r % group;
    if (gridDim.z == 1) {
      a.out[th * HD + d] = acc / l;
    } else {
      float* out = a.partial + (th * gridDim.z + blockIdx.z) * (HD + 2);
      out[d] = acc;
      if (d == 0) out[HD] = mx == -INFINITY ? -INFINITY : mx * kLn2, out[HD + 1] = l;
    }
  }
}

template <int HD, typename Op, bool KV16, bool MASKED>
void launch_decode(const ArgsOf<MASKED>& a, cudaStream_t stream) {
  constexpr size_t smem = DecTile<HD, KV16>::smem_bytes;
  static const bool configured = [] {
    FDL_CUDA_CHECK(cudaFuncSetAttribute(attn_decode_mma_kernel<HD, Op, KV16, MASKED>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return true;
  }();
  (void)configured;
  launch_pdl(attn_decode_mma_kernel<HD, Op, KV16, MASKED>,
             dim3(unsigned(a.n_tiles), unsigned(a.kv.n_head_kv), unsigned(a.n_splits)), dim3(kDecThreads), smem,
             stream, a);
}

template <int HD, typename Op, bool KV16, bool MASKED, bool FOLD>
void launch(const ArgsOf<MASKED>& a, cudaStream_t stream) {
  constexpr size_t smem = MmaTile<HD, KV16>::smem_bytes;
  static const bool configured = [] {
    FDL_CUDA_CHECK(cudaFuncSetAttribute(attn_tile_mma_kernel<HD, Op, KV16, MASKED, FOLD>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return true;
  }();
  (void)configured;
  launch_pdl(attn_tile_mma_kernel<HD, Op, KV16, MASKED, FOLD>,
             dim3(unsigned(a.n_tiles), unsigned(a.kv.n_head_kv), unsigned(a.n_splits)), dim3(256), smem, stream, a);
}

template <int HD, typename Op, bool KV16, bool MASKED>
void launch_chunk_decode(const ArgsOf<MASKED>& a, cudaStream_t stream) {
  constexpr size_t smem = MmaTile<HD, KV16>::smem_bytes / 2;  // one stage
  static const bool configured = [] {
    FDL_CUDA_CHECK(cudaFuncSetAttribute(attn_chunk_decode_kernel<HD, Op, KV16, MASKED>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    return true;
  }();
  (void)configured;
  launch_pdl(attn_chunk_decode_kernel<HD, Op, KV16, MASKED>,
             dim3(unsigned(a.n_tiles), unsigned(a.kv.n_head_kv), unsigned(a.n_splits * a.share_chunks)), dim3(32),
             smem, stream, a);
}

template <typename Op, bool KV16, bool MASKED>
void dispatch(const ArgsOf<MASKED>& a, cudaStream_t stream) {
  const bool small_tiles = a.max_tile_rows > 0 && a.max_tile_rows <= 16;
  if (a.share_chunks > 0) {  // batch-invariant steps: the chunk fold, by the tile kernel or side by side
    if (a.share_chunks > kInvariantShareChunks)
      throw CudaError("attention_tiles_tc: shares of " + std::to_string(a.share_chunks) + " chunks (at most " +
                      std::to_string(kInvariantShareChunks) + ")");
    if (attention_invariant_chunk_partials(a)) {
      if (a.kv.head_dim == 64) return launch_chunk_decode<64, Op, KV16, MASKED>(a, stream);
      if (a.kv.head_dim == 128) return launch_chunk_decode<128, Op, KV16, MASKED>(a, stream);
    }
    if (a.kv.head_dim == 64) return launch<64, Op, KV16, MASKED, true>(a, stream);
    if (a.kv.head_dim == 128) return launch<128, Op, KV16, MASKED, true>(a, stream);
  }
  if (small_tiles) {  // decode batches: the split-chunk kernel
    if (a.kv.head_dim == 64) return launch_decode<64, Op, KV16, MASKED>(a, stream);
    if (a.kv.head_dim == 128) return launch_decode<128, Op, KV16, MASKED>(a, stream);
  }
  if (a.kv.head_dim == 64) return launch<64, Op, KV16, MASKED, false>(a, stream);
  if (a.kv.head_dim == 128) return launch<128, Op, KV16, MASKED, false>(a, stream);
  throw CudaError("attention_tiles_tc: head_dim " + std::to_string(a.kv.head_dim) + " is not 64 or 128");
}

// The operand type: a 16-bit cache's own (its bytes are the operands), else tc_bf16's choice.
template <bool MASKED>
void dispatch_kv(const ArgsOf<MASKED>& a, cudaStream_t stream) {
  switch (a.kv.dtype) {
    case KvDtype::F16: return dispatch<F16Op, true, MASKED>(a, stream);
    case KvDtype::BF16: return dispatch<BF16Op, true, MASKED>(a, stream);
    case KvDtype::F32: break;
  }
  if (a.tc_bf16)
    dispatch<BF16Op, false, MASKED>(a, stream);
  else
    dispatch<F16Op, false, MASKED>(a, stream);
}

}  // namespace

void attention_tiles_tc(const AttentionArgs& a, cudaStream_t stream, const AttentionMasks& masks) {
  if (masks.any())
    dispatch_kv<true>(with_masks(a, masks), stream);
  else
    dispatch_kv<false>(a, stream);
}

}  // namespace fdl::cuda
