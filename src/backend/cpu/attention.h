// attention.h — causal multi-head attention over the paged KV cache (PagedAttention,
// Kwon et al. 2023), fp32, on the CPU.
//
// For each query token t and head h (GQA: kv head = h / (n_head / n_head_kv)):
//   s_j  = dot(q[t][h], K[j]) * scale                 for positions j = lo .. positions[t]
//          (then softcap * tanh(s_j / softcap) with soft-capping)
//   p_j  = exp(s_j - max_j s_j) / sum_j exp(s_j - max)  (fp32, max subtraction, sum in double)
//   out[t][h] = sum_j p_j * V[j]                       (positions in increasing order)
// where lo = 0, or positions[t] - window + 1 (at least 0) with a sliding window.
// Fixed orders: the dot product in eight lanes (dims mod 8) combined as
// ((a0+a4)+(a2+a6))+((a1+a5)+(a3+a7)) (AVX2: with FMA); the softmax denominator in eight
// double lanes (positions j mod 8, increasing) combined the same way; the V sum per output
// over positions in increasing order.
// K[j]/V[j] are read from block block_tables[t][j / block_size], slot j % block_size, of the
// KV arena (layout in flashdllm/kv_cache.h), described by plain pointers and strides so the
// kernel does not depend on the KV module. The order of every reduction depends only on the
// token's own position, so a token's output is bit-identical whatever else is in the batch
// and whatever the thread count.
//
// Thread-safety: not reentrant per AttentionScratch; the KV arena is only read.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/thread_pool.h"

namespace fdl::cpu {

/// One layer of the paged KV arena: K of (block b, slot s, kv head g) is at
/// k_base + b * block_stride + s * n_head_kv * head_dim + g * head_dim, V likewise from v_base.
struct PagedKvLayer {
  const float* k_base = nullptr;  ///< K of block 0, slot 0 of this layer
  const float* v_base = nullptr;  ///< V of block 0, slot 0 of this layer
  int64_t block_stride = 0;       ///< floats from one block to the next
  int block_size = 0;             ///< token slots per block
};

struct PagedAttentionArgs {
  PagedKvLayer kv;
  int64_t n_tokens = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  float scale = 1.f;                         ///< usually 1/sqrt(head_dim)
  const float* q = nullptr;                  ///< [n_tokens][n_head][head_dim]
  const int32_t* const* block_tables = nullptr;  ///< per token: its sequence's block ids
  const int32_t* positions = nullptr;        ///< per token: attends to [0, positions[t]]
  float* out = nullptr;                      ///< [n_tokens][n_head][head_dim]
  /// Token trees (flashdllm/model.h, StepBatch::tree_parent). Optional: nullptr = none. Else
  /// per token nullptr (ordinary) or the KV slots of its *virtual* positions
  /// [tree_base[t], positions[t]]: virtual position j reads slot tree_slots[t][j - tree_base[t]]
  /// for j >= tree_base[t], slot j below. Scores, softmax and V sum run over virtual
  /// positions exactly as an ordinary token at positions[t] runs over its slots, so the
  /// output equals that of an ordinary token whose slots hold those rows, bit for bit.
  const int32_t* const* tree_slots = nullptr;
  const int32_t* tree_base = nullptr;        ///< per token (read only where tree_slots[t] is set)
  /// Sliding window (flashdllm/model.h, ModelConfig::sliding_window): token t attends to its
  /// positions (positions[t] - window, positions[t]] only (virtual positions for a tree token).
  /// 0 = the whole context.
  int window = 0;
  /// Soft-capping (Gemma 2): each scaled score s becomes softcap * tanh(s / softcap) before the
  /// softmax. 0 = none.
  float softcap = 0.f;
};

/// Per-thread score buffers, grown on demand and reused across calls (no allocation per
/// step once the longest context has been seen).
class AttentionScratch {
 public:
  /// Make room for `n_threads` threads, each holding `floats` floats.
  void reserve(int n_threads, int64_t floats);
  float* thread_buffer(int thread) { return buffers_[size_t(thread)].data(); }
  /// Token runs of the current call (see paged_attention), reused across calls.
  std::vector<int64_t>& run_starts() { return run_starts_; }

 private:
  std::vector<std::vector<float>> buffers_;
  std::vector<int64_t> run_starts_;
};

/// Runs attention for every (token, head) pair. Work items are (token, kv head): the query
/// heads sharing a KV head are processed together so each K/V vector is read once per group.
/// The AVX2 kernels go further: consecutive tokens with the same block table (one sequence's
/// speculative verification or prompt chunk; up to 16) form one item, whose loops share each
/// K/V row while it is in L1 — the arithmetic of every token stays exactly its own. Small
/// heads (head_dim <= 32, a multiple of 8) put several KV heads in one item, so their V sums
/// run as independent FMA chains.
/// A tree token (args.tree_slots) is a work item of its own, computed position by position
/// through its slot list (the same arithmetic per position as the run kernels).
/// Items are split across `threads` when the estimated work pays for the hand-off
/// (parallel_policy.h); runs are then cut shorter where there would be fewer than two items
/// per thread (a lone verification window of a model with 2 KV heads).
/// Throws std::invalid_argument for a null pointer, n_head not a positive multiple of
/// n_head_kv, a non-positive head_dim/block_size, a negative position or window. Block ids are
/// trusted (the caller takes them from a KvCache block table covering each position).
void paged_attention(ThreadPool& threads, const PagedAttentionArgs& args, AttentionScratch& scratch);

}  // namespace fdl::cpu
