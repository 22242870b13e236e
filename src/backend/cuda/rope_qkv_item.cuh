// rope_qkv_item.cuh — one work item of rope_qkv_store (kernels.h) for one token: the kernel
// runs one per thread, the batch-invariant decode block (decode_attention_block_k16.cu) those
// of its own rows, with the same bits. Device code only; include from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_elem.cuh"

namespace fdl::cuda {

/// Items of a token: a pair (2i, 2i + 1) of each q and k head, then each v element.
__host__ __device__ inline int rope_qkv_items(int n_head, const KvLayerView& kv) {
  return (n_head + kv.n_head_kv) * (kv.head_dim / 2) + kv.n_head_kv * kv.head_dim;
}

/// Item `item` of a token at position `pos` whose K/V go to block `block`: row(i) is element i of
/// its fused projection [q | k | v] (fp32), cs its RoPE table (cos, sin per pair), q_out its q
/// row. A pair item rotates elements 2i, 2i + 1 of its head (after the bias) when 2i <
/// rope_dim and writes them to q_out (q heads) or the cache (k heads); a v item copies its
/// element (after the bias) to the cache. Pair item p covers elements 2p, 2p + 1 of the row.
template <typename Row>
__device__ __forceinline__ void rope_qkv_item(Row row, const float* cs, int pos, int32_t block, int n_head,
                                              int rope_dim, const KvLayerView& kv, float* q_out, const float* bias,
                                              int item) {
  const int hd = kv.head_dim;
  const int q_dim = n_head * hd, kv_dim = kv.n_head_kv * hd;
  const int half_hd = hd / 2;
  const int n_pairs = (n_head + kv.n_head_kv) * half_hd;
  const int slot = pos % kv.block_size;
  if (item >= n_pairs) {  // v copy
    const int i = item - n_pairs;
    const float b = bias ? bias[q_dim + kv_dim + i] : 0.f;
    kv_store1(kv, kv_index(kv, block, kv.block_size + slot, i), __fadd_rn(row(q_dim + kv_dim + i), b));
    return;
  }
  const int head = item / half_hd, i = item % half_hd;  // pair i of a q head (head < n_head) or k head
  const int e = head * hd + 2 * i;                      // k heads follow q heads in the row
  float x0 = row(e), x1 = row(e + 1);
  if (bias) {
    x0 = __fadd_rn(x0, bias[e]);
    x1 = __fadd_rn(x1, bias[e + 1]);
  }
  float y0 = x0, y1 = x1;
  if (2 * i < rope_dim) {
    const float c = cs[2 * i], s = cs[2 * i + 1];
    // Same operation order as the CPU (x0*c - x1*s), without FMA contraction.
    y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    y1 = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
  }
  if (head < n_head) {
    q_out[e] = y0;
    q_out[e + 1] = y1;
  } else {
    kv_store2(kv, kv_index(kv, block, slot, int64_t(head - n_head) * hd + 2 * i), y0, y1);
  }
}

}  // namespace fdl::cuda
