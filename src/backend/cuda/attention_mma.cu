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

#include "backend/cuda/attention_chunk.cuh"
#include "backend/cuda/attention_fold.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_elem.cuh"
#include "backend/cuda/launch.h"

namespace fdl::cuda {
namespace {

using namespace attn;

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
    stage_kv_chunk<E, HD, kChunk, kThreads, T::kStride, T::vStride>(kv, table, kvh, p_last, c0, buf, threadIdx.x);
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
      float mx0, mx1;
      chunk_scores<HD, Op, KV16, MASKED>(qa, ks, c0, pos_r0, pos_r1, tree0, tree1, sl2, g, c, s, mx0, mx1);
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
  launch_dependents();
  grid_dependency_wait();
  extern __shared__ __align__(16) float smf[];
  chunk_partial<HD, Op, KV16, MASKED, true>(a, blockIdx.x, blockIdx.y, blockIdx.z, gridDim.z, threadIdx.x,
                                      reinterpret_cast<typename KvStage<Op, KV16>::E*>(smf));
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
    stage_kv_chunk<E, HD, kDecChunk, kDecThreads, T::kStride, T::vStride>(kv, table, kvh, p_last, c0, buf, threadIdx.x);
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
