// The attention half of a batch-1 decode layer in one kernel, in the batch-invariant
// arithmetic (contract in kernels.h: decode_attention_block_k16). The invariant path otherwise
// runs it as seven kernels for one token (norm, QKV, RoPE + K/V store, chunk partials, their
// fold and merge, the cast, wo); here one block per SM stays resident, as in
// decode_attention_block, and the phases hand over through three grid-wide counters:
//   1. norm, QKV (k16 chains, each block a share of 8-row groups), the fold of each row's
//      chains, then RoPE and the K/V store of the block's own rows (a RoPE pair is two adjacent
//      rows: never split between blocks);
//   2. after all q, k and v are stored: each (KV head, 64-position chunk) partial by a group of
//      warps (chunk_partial_group: the chunk kernel's arithmetic), spread over the grid;
//   3. after all partials: each query head's fold and merge (fold_combine_row: the fold
//      kernel's code, on its thread count), rounded to the weights' type;
//   4. after the whole attention output: wo, whose first weights were loaded during 3.
// Every step is the separate kernel's own device code or its exact order (rms_norm_row.cuh,
// k16_chain.cuh, rope_qkv_item.cuh, attention_chunk.cuh, attention_fold.cuh), so the bits are
// theirs (tests/gpu/decode_block_test.cpp compares q, the cache, the residual and y).
// Data other blocks wrote is read through L2 (ld.global.cg or cp.async.cg).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "backend/cuda/attention_chunk.cuh"
#include "backend/cuda/attention_chunk_group.cuh"
#include "backend/cuda/attention_fold.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/decode_block.cuh"
#include "backend/cuda/k16_chain.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/rms_norm_row.cuh"
#include "backend/cuda/rope_qkv_item.cuh"

namespace fdl::cuda {
namespace {

using block::kThreads;
using block::kWarps;
using k16::segments;
using k16::share_begin;

// Chunk partials: kAttnGroups groups of kGroupWarps warps per block, each group one chunk at a
// time in a stage of its own (chunk_partial_group: a warp alone is bound by its instruction
// stream). Two groups of 8 warps measured fastest on the H200 (docs/GPU.md, tuning log): 1.5%
// of the step faster than two of 4 from warp 1 (which kept warp 0's thread, the one that polls
// the hand-offs, free of prestage copies), ~9% faster than one warp per chunk.
constexpr int kAttnGroups = 2, kGroupWarps = 8, kFirstAttnWarp = 0;
static_assert(kFirstAttnWarp + kAttnGroups * kGroupWarps <= block::kWarps, "partial warps within the block");

// Shared memory, in order: the activations (xn, then the attention output) in the weights'
// type; the chains of the block's largest share; its folded q/k/v rows; the merge's split
// weights; the groups' chunk stages; their exchange areas. The same on the host (launch size)
// and the device (offsets).
struct Layout {
  size_t parts, qf, weight, stages, exchange, bytes;
  __host__ __device__ Layout(int cols, int q_dim, int qkv_rows, int wo_rows, int hd, int blocks) {
    const int groups_qkv = (qkv_rows / 8 + blocks - 1) / blocks, groups_wo = (wo_rows / 8 + blocks - 1) / blocks;
    const int units = max(groups_qkv * segments(cols), groups_wo * segments(q_dim));
    parts = size_t((max(cols, q_dim) + 7) / 8 * 8) * 2;
    qf = parts + size_t(units) * 8 * sizeof(float);
    weight = qf + size_t(groups_qkv) * 8 * sizeof(float);
    stages = (weight + size_t(kAttentionBlockK16MaxSplits) * sizeof(float) + 15) / 16 * 16;
    const int stage_elems = hd == 64 ? attn::MmaTile<64, true>::stage_elems : attn::MmaTile<128, true>::stage_elems;
    exchange = stages + size_t(kAttnGroups) * stage_elems * 2;
    bytes = exchange + size_t(kAttnGroups) * attn::kGroupExchangeFloats * sizeof(float);
  }
};

template <bool BF16, int HD, bool kTrace>
__global__ void __launch_bounds__(kThreads, 1) attention_block_k16_kernel(AttentionBlockK16Args a) {
  using Op = std::conditional_t<BF16, attn::BF16Op, attn::F16Op>;
  using E = typename attn::KvStage<Op, true>::E;
  constexpr int kStage = attn::MmaTile<HD, true>::stage_elems;
  extern __shared__ float4 smem4[];
  __shared__ double partial[kThreads / 32];
  __shared__ float red[32];
  const AttentionArgs& att = a.att;
  const int cols = a.cols, n_head = att.n_head, n_kv = att.kv.n_head_kv;
  const int q_dim = n_head * HD, kv_dim = n_kv * HD, qkv_rows = q_dim + 2 * kv_dim;
  const Layout lay(cols, q_dim, qkv_rows, a.wo_rows, HD, int(gridDim.x));
  char* base = reinterpret_cast<char*>(smem4);
  uint16_t* xs = reinterpret_cast<uint16_t*>(base);
  float* parts = reinterpret_cast<float*>(base + lay.parts);
  float* qf = reinterpret_cast<float*>(base + lay.qf);
  float* weight = reinterpret_cast<float*>(base + lay.weight);
  E* stages = reinterpret_cast<E*>(base + lay.stages);
  float* exchange = reinterpret_cast<float*>(base + lay.exchange);
  auto stamp = [&](int event) {
    if constexpr (kTrace) block::stamp(a.trace, event);
  };
  launch_dependents();
  stamp(kAttnEntry);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const WType type = BF16 ? WType::BF16 : WType::F16;
  const auto* Wqkv = static_cast<const uint16_t*>(a.wqkv);
  const auto* Wo = static_cast<const uint16_t*>(a.wo);
  auto keep_chain = [&](int u, const float(&acc)[4]) { k16::keep_chains(parts, u, acc, lane); };

  // 1. QKV: this block's 8-row groups; unit u is group u / S1, segment u % S1.
  const int s1 = segments(cols);
  const int qg0 = share_begin(qkv_rows / 8, blockIdx.x), qg1 = share_begin(qkv_rows / 8, blockIdx.x + 1);
  const int q_units = (qg1 - qg0) * s1;
  const int qu0 = q_units * warp / kWarps, qu1 = q_units * (warp + 1) / kWarps;
  auto qkv_unit = [&](int u) { return k16::Unit{Wqkv + int64_t(qg0 + u / s1) * 8 * cols, u % s1}; };
  // Before the wait, what depends on no earlier kernel: the first weights; the norm weight and
  // the token's RoPE row into the chunk stages (free until the partials; the row only where it
  // is 16-byte aligned, else it is read from L2 after QKV); its position and slot.
  uint4 buf[2][k16::kBatchLoads];
  if (qu0 < qu1) k16::load_unit_batch(qkv_unit(qu0), 0, cols, lane, buf[0]);
  float* norm_w = reinterpret_cast<float*>(stages);
  block::norm_weight_prefetch(a.in, cols, norm_w);
  const bool cs_copied = a.rope_dim % 4 == 0 && reinterpret_cast<uintptr_t>(a.cos_sin) % 16 == 0;
  float* cs_smem = norm_w + cols;
  if (cs_copied && int(threadIdx.x) < a.rope_dim / 4) {
    const unsigned dst = unsigned(__cvta_generic_to_shared(cs_smem + 4 * threadIdx.x));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(a.cos_sin + 4 * threadIdx.x) : "memory");
  }
  const int pos = att.positions[0];
  const int32_t dst = a.dst_block[0];
  grid_dependency_wait();
  stamp(kAttnAfterPdlWait);
  rms_norm_row_to_smem(a.in, cols, xs, type, partial, norm_w);  // waits for the copies
  stamp(kAttnNormDone);
  k16::stream_units<BF16>(qu0, qu1, qkv_unit, cols, xs, lane, buf, keep_chain);
  __syncthreads();
  stamp(kAttnQkvDone);
  const int r0 = qg0 * 8, r1 = qg1 * 8;
  for (int i = threadIdx.x; i < r1 - r0; i += kThreads) qf[i] = k16::fold_chains(parts + (i / 8) * s1 * 8 + i % 8, s1, 8);
  __syncthreads();
  {  // rope_qkv_store's items of these rows: a pair per even q/k row, an element per v row
    const int qk_rows = q_dim + kv_dim;
    const float* cs = cs_copied ? cs_smem : a.cos_sin;
    for (int r = r0 + int(threadIdx.x); r < r1; r += kThreads) {
      if (r < qk_rows && (r & 1)) continue;
      const int item = r < qk_rows ? r / 2 : qk_rows / 2 + (r - qk_rows);
      rope_qkv_item([&](int i) { return qf[i - r0]; }, cs, pos, dst, n_head, a.rope_dim, att.kv, a.q_out, a.bias, item);
    }
  }
  block::arrive(a.sync);
  // The first chunk of each group: its K/V of earlier positions staged while the other blocks
  // finish (cos_sin's copy above is read: the block arrived after a barrier).
  const int n_z = att.n_splits * att.share_chunks, items = n_kv * n_z;
  const int aw = warp - kFirstAttnWarp;  // this warp's index among the partial warps
  const bool attn_warp = aw >= 0 && aw < kAttnGroups * kGroupWarps;
  const int grp = aw / kGroupWarps, gw = aw % kGroupWarps;  // its group, and its index there
  const int first_item = grp * int(gridDim.x) + int(blockIdx.x);
  int staged_rows = 0;
  if (attn_warp && first_item < items)
    staged_rows = attn::chunk_prestage<HD, Op, true, 32 * kGroupWarps>(att, 0, first_item / n_z, first_item % n_z,
                                                                      gw * 32 + lane, stages + grp * kStage);
  // wo's units; their first batch goes into registers after the chunk partials (during them
  // the registers would spill the chunk's).
  const int s2 = segments(q_dim);
  const int wg0 = share_begin(a.wo_rows / 8, blockIdx.x), wg1 = share_begin(a.wo_rows / 8, blockIdx.x + 1);
  const int w_units = (wg1 - wg0) * s2;
  const int wu0 = w_units * warp / kWarps, wu1 = w_units * (warp + 1) / kWarps;
  auto wo_unit = [&](int u) { return k16::Unit{Wo + int64_t(wg0 + u / s2) * 8 * q_dim, u % s2}; };
  block::wait_for(a.sync, gridDim.x);
  stamp(kAttnQkvHandedOff);

  // 2. The chunk partials: item i = (KV head i / n_z, chunk i % n_z) on block i % grid, by
  // group (i / grid) % kAttnGroups.
  if (attn_warp)
    for (int j = grp;; j += kAttnGroups) {
      const int i = j * int(gridDim.x) + int(blockIdx.x);
      if (i >= items) break;
      attn::chunk_partial_group<HD, Op, kGroupWarps>(att, 0, i / n_z, i % n_z, n_z, gw, lane, stages + grp * kStage,
                                                     exchange + grp * attn::kGroupExchangeFloats, 1 + grp,
                                                     j == grp ? staged_rows : 0);
    }
  if constexpr (kTrace) __syncthreads();
  stamp(kAttnPartialDone);
  block::arrive(a.sync + 1);
  if (wu0 < wu1) k16::load_unit_batch(wo_unit(wu0), 0, q_dim, lane, buf[0]);
  block::wait_for(a.sync + 1, gridDim.x);
  stamp(kAttnPartialsHandedOff);

  // 3. Each query head's fold and merge, on the fold kernel's thread count (paged_attention),
  // from a copy of the head's chunk records in the chunk stages (free from here on).
  constexpr int kFoldThreads = combine_threads(HD);
  for (int h = blockIdx.x; h < n_head; h += gridDim.x)
    fold_combine_row(
        att.partial, h, n_head, att.n_splits, att.share_chunks, HD,
        [&](int d, float v) { store_as(a.attn16, int64_t(h) * HD + d, v, type); }, weight, red, kFoldThreads,
        reinterpret_cast<float*>(stages), int64_t(kAttnGroups) * kStage * int64_t(sizeof(E)) / int64_t(sizeof(float)));
  if constexpr (kTrace) __syncthreads();
  stamp(kAttnMergeDone);
  block::arrive(a.sync + 2);
  block::wait_for(a.sync + 2, gridDim.x);
  stamp(kAttnOutHandedOff);

  // 4. wo over the attention output.
  for (int i = threadIdx.x; i < q_dim / 8; i += kThreads)
    reinterpret_cast<uint4*>(xs)[i] = __ldcg(reinterpret_cast<const uint4*>(a.attn16) + i);
  __syncthreads();
  k16::stream_units<BF16>(wu0, wu1, wo_unit, q_dim, xs, lane, buf, keep_chain);
  __syncthreads();
  for (int i = threadIdx.x; i < (wg1 - wg0) * 8; i += kThreads)
    a.y[int64_t(wg0) * 8 + i] = k16::fold_chains(parts + (i / 8) * s2 * 8 + i % 8, s2, 8);
  if constexpr (kTrace) {
    __syncthreads();
    stamp(kAttnEnd);
  }
}

using KernelFn = void (*)(AttentionBlockK16Args);
template <bool BF16, bool kTrace = false>
KernelFn kernel_for(int hd) {
  return hd == 64 ? attention_block_k16_kernel<BF16, 64, kTrace> : attention_block_k16_kernel<BF16, 128, kTrace>;
}


// The shapes the kernel takes (attention_block_k16_blocks' list), checked again at launch.
bool shape_ok(const DeviceMatrix& wqkv, const DeviceMatrix& wo, int n_head, const KvLayerView& kv) {
  if (wqkv.type != wo.type || (wqkv.type != WType::F16 && wqkv.type != WType::BF16)) return false;
  const bool bf16 = wqkv.type == WType::BF16;
  const int hd = kv.head_dim, n_kv = kv.n_head_kv;
  if (kv.dtype != (bf16 ? KvDtype::BF16 : KvDtype::F16) || (hd != 64 && hd != 128)) return false;
  if (n_kv < 1 || n_head % n_kv != 0 || n_head / n_kv > 16) return false;
  // The chunk stages hold the norm weight and the RoPE row before the partials.
  const size_t stage_bytes = size_t(kAttnGroups) * 2 *
                             (hd == 64 ? attn::MmaTile<64, true>::stage_elems : attn::MmaTile<128, true>::stage_elems);
  if ((size_t(wqkv.cols) + size_t(hd)) * sizeof(float) > stage_bytes) return false;
  const int64_t q_dim = int64_t(n_head) * hd;
  if (wqkv.rows != q_dim + 2 * int64_t(n_kv) * hd || wqkv.cols % k16::kBatchK != 0 || wqkv.cols <= 0 ||
      wqkv.cols > 8192 || wo.cols != q_dim || q_dim % k16::kBatchK != 0 || wo.rows % 8 != 0 || wo.rows <= 0 ||
      wo.rows > (1 << 24))
    return false;
  return reinterpret_cast<uintptr_t>(wqkv.data) % 16 == 0 && reinterpret_cast<uintptr_t>(wo.data) % 16 == 0;
}

}  // namespace

int attention_block_k16_blocks(const DeviceMatrix& wqkv, const DeviceMatrix& wo, int n_head, const KvLayerView& kv,
                               int n_sm) {
  if (n_sm < 1 || wqkv.quantized() || wo.quantized() || !shape_ok(wqkv, wo, n_head, kv)) return 0;
  const bool bf16 = wqkv.type == WType::BF16;
  const int hd = kv.head_dim;
  const int64_t q_dim = int64_t(n_head) * hd;
  const Layout lay(int(wqkv.cols), int(q_dim), int(wqkv.rows), int(wo.rows), hd, n_sm);
  const KernelFn kernel = bf16 ? kernel_for<true>(hd) : kernel_for<false>(hd);
  const int64_t fit = block::resident_blocks(reinterpret_cast<const void*>(kernel), lay.bytes);
  return n_sm <= fit ? n_sm : 0;
}

void decode_attention_block_k16(const AttentionBlockK16Args& a, cudaStream_t stream) {
  const AttentionArgs& att = a.att;
  if (a.blocks < 1) throw CudaError("decode_attention_block_k16: no blocks (use attention_block_k16_blocks)");
  if (a.in.add_w != nullptr) throw CudaError("decode_attention_block_k16: a post-norm of the addend is not supported");
  const int hd = att.kv.head_dim, q_dim = att.n_head * hd;
  const DeviceMatrix wqkv{a.type, a.wqkv, q_dim + 2 * int64_t(att.kv.n_head_kv) * hd, a.cols};
  const DeviceMatrix wo{a.type, a.wo, a.wo_rows, q_dim};
  if (!shape_ok(wqkv, wo, att.n_head, att.kv))
    throw CudaError("decode_attention_block_k16: shape or types not supported (see attention_block_k16_blocks)");
  if (a.q_out == nullptr || att.q != a.q_out)
    throw CudaError("decode_attention_block_k16: q_out must be the attention's q (att.q)");
  if (att.n_tokens != 1 || att.n_tiles != 1 || !attention_invariant_chunk_partials(att))
    throw CudaError("decode_attention_block_k16: one token's batch-invariant chunk attention only");
  if (att.n_splits < 1 || att.n_splits > kAttentionBlockK16MaxSplits)
    throw CudaError("decode_attention_block_k16: " + std::to_string(att.n_splits) + " context splits (at most " +
                    std::to_string(kAttentionBlockK16MaxSplits) + ")");
  const Layout lay(a.cols, q_dim, q_dim + 2 * att.kv.n_head_kv * hd, a.wo_rows, hd, a.blocks);
  const bool bf16 = a.type == WType::BF16;
  const KernelFn typed = a.trace ? (bf16 ? kernel_for<true, true>(hd) : kernel_for<false, true>(hd))
                                 : (bf16 ? kernel_for<true>(hd) : kernel_for<false>(hd));
  const int64_t fit = block::resident_blocks(reinterpret_cast<const void*>(typed), lay.bytes);
  if (a.blocks > fit)  // the hand-offs would wait forever
    throw CudaError("decode_attention_block_k16: " + std::to_string(a.blocks) + " blocks cannot be resident at once (" +
                    std::to_string(fit) + " fit)");
  launch_pdl(typed, dim3(unsigned(a.blocks)), dim3(kThreads), lay.bytes, stream, a);
}

}  // namespace fdl::cuda
