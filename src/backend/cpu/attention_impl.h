// attention_impl.h — internal: the per-(token, KV head) attention loop shared by the portable
// and AVX2 builds. `Vec` supplies the vector primitives as static inline functions,
//   float  Vec::dot(const float* a, const float* b, int64_t n);
//   double Vec::exp_sum(float* s, int64_t n, float max);  // s[j] = exp(s[j] - max); returns
//                                                          // the sum in double, in the order of attention.h
//   void   Vec::weighted_v_sum(const float* p, int64_t lo, int64_t n_pos, const VRows& v, float* out);
//                                                          // out = sum_j p[j] * V[j], j = lo.. ascending
// so each translation unit (compiled with its own ISA flags) inlines its own version.
// Reduction order per output is fixed: positions in increasing order, whatever the batch.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cpu/attention.h"

namespace fdl::cpu::detail {

/// The V vectors of one KV head for one token's positions, addressed through its block table.
struct VRows {
  const float* base;     ///< V of block 0, slot 0, this KV head
  const int32_t* table;  ///< block ids
  int64_t block_stride;  ///< floats between blocks
  int64_t slot_stride;   ///< floats between slots of a block
  int block_size;
  int64_t head_dim;
  const int32_t* tree = nullptr;  ///< a tree token's slot list (PagedAttentionArgs::tree_slots)
  int64_t tree_base = 0;          ///< first virtual position read through `tree`
  /// The sequence slot virtual position j reads (j itself for an ordinary token).
  int64_t slot(int64_t j) const { return tree != nullptr && j >= tree_base ? tree[j - tree_base] : j; }
  const float* row(int64_t j) const {
    const int64_t s = slot(j);
    return base + table[s / block_size] * block_stride + (s % block_size) * slot_stride;
  }
};

/// The first position token t attends to (PagedAttentionArgs::window).
inline int64_t first_position(const PagedAttentionArgs& a, int64_t t) {
  return a.window > 0 ? std::max<int64_t>(0, int64_t(a.positions[t]) - a.window + 1) : 0;
}

/// Where the softmax sum of a token whose first position is `lo` starts: lo rounded down to a
/// multiple of 8, so its eight lanes hold the positions j mod 8 whatever lo is. The caller sets
/// the scores of [softmax_start(lo), lo) to -inf (weights of exactly 0, which add nothing).
inline int64_t softmax_start(int64_t lo) { return lo & ~int64_t(7); }

/// Soft-caps positions [lo, n_pos) of `heads` score rows (stride n_pos) in place; with
/// `max_score`, also recomputes each row's maximum over them.
inline void soft_cap_scores(float* scores, int heads, int64_t n_pos, int64_t lo, float cap, float* max_score = nullptr) {
  for (int h = 0; h < heads; ++h) {
    float* sh = scores + h * n_pos;
    float mx = -INFINITY;
    for (int64_t j = lo; j < n_pos; ++j) mx = std::max(mx, sh[j] = cap * std::tanh(sh[j] / cap));
    if (max_score != nullptr) max_score[h] = mx;
  }
}

/// The VRows of token t's KV head `kvh` (tree slots included).
inline VRows v_rows(const PagedAttentionArgs& a, int64_t t, int kvh) {
  const int64_t hd = a.head_dim, slot_stride = int64_t(a.n_head_kv) * hd;
  VRows v{a.kv.v_base + kvh * hd, a.block_tables[t], a.kv.block_stride, slot_stride, a.kv.block_size, hd};
  if (a.tree_slots != nullptr && a.tree_slots[t] != nullptr) {
    v.tree = a.tree_slots[t];
    v.tree_base = a.tree_base[t];
  }
  return v;
}

/// Query heads [kvh*group, (kvh+1)*group) of token t against KV head kvh. `buf` must hold
/// group * (positions[t] + 2) floats: the scores, then the per-head maxima.
template <class Vec>
void attend_group(const PagedAttentionArgs& a, int64_t t, int kvh, float* buf) {
  const PagedKvLayer& kv = a.kv;
  const int group = a.n_head / a.n_head_kv;
  const int64_t hd = a.head_dim;
  const int64_t slot_stride = int64_t(a.n_head_kv) * hd;  // floats between token slots
  const int64_t n_pos = int64_t(a.positions[t]) + 1;
  const int32_t* table = a.block_tables[t];
  const float* q = a.q + (t * a.n_head + int64_t(kvh) * group) * hd;
  float* out = a.out + (t * a.n_head + int64_t(kvh) * group) * hd;
  float* scores = buf;                     // [group][n_pos]
  float* max_score = buf + group * n_pos;  // [group]

  const int64_t lo = first_position(a, t), s8 = softmax_start(lo);
  std::fill(max_score, max_score + group, -INFINITY);
  for (int g = 0; g < group; ++g) std::fill(scores + g * n_pos + s8, scores + g * n_pos + lo, -INFINITY);
  if (a.tree_slots != nullptr && a.tree_slots[t] != nullptr) {
    // A tree token: the same dot per virtual position, its K row found through the slot list.
    const VRows k{kv.k_base + kvh * hd, table, kv.block_stride, slot_stride, kv.block_size, hd,
                  a.tree_slots[t], a.tree_base[t]};
    for (int64_t j = lo; j < n_pos; ++j)
      for (int g = 0; g < group; ++g) {
        const float score = Vec::dot(q + g * hd, k.row(j), hd) * a.scale;
        scores[g * n_pos + j] = score;
        max_score[g] = std::max(max_score[g], score);
      }
  } else {
    for (int64_t j = lo; j < n_pos;) {
      const int64_t s0 = j % kv.block_size;
      const int64_t n_in_block = std::min<int64_t>(kv.block_size - s0, n_pos - j);
      const float* kb = kv.k_base + table[j / kv.block_size] * kv.block_stride + kvh * hd;
      for (int64_t s = s0; s < s0 + n_in_block; ++s)
        for (int g = 0; g < group; ++g) {
          const float score = Vec::dot(q + g * hd, kb + s * slot_stride, hd) * a.scale;
          scores[g * n_pos + j + (s - s0)] = score;
          max_score[g] = std::max(max_score[g], score);
        }
      j += n_in_block;
    }
  }
  if (a.softcap > 0) soft_cap_scores(scores, group, n_pos, lo, a.softcap, max_score);
  // Softmax per head (fp32 exponentials, double sum); the normalizer is folded into the
  // weights before the V sum.
  for (int g = 0; g < group; ++g) {
    float* sg = scores + g * n_pos;
    const float inv_sum = float(1.0 / Vec::exp_sum(sg + s8, n_pos - s8, max_score[g]));
    for (int64_t j = lo; j < n_pos; ++j) sg[j] *= inv_sum;
  }
  const VRows v = v_rows(a, t, kvh);
  for (int g = 0; g < group; ++g) Vec::weighted_v_sum(scores + g * n_pos, lo, n_pos, v, out + g * hd);
}

/// Runs work items [begin, end) — item i is (token i / n_head_kv, KV head i % n_head_kv).
/// `buf` holds group * (positions[t] + 2) floats.
void attention_items_portable(const PagedAttentionArgs& a, int64_t begin, int64_t end, float* buf);
/// Largest head dim whose V sums the AVX2 kernel runs as independent 8-float lanes across
/// heads (several KV heads per work item pay only there; see attention_avx2.cpp).
inline constexpr int kMaxLaneHeadDim = 32;

/// Runs work items [begin, end). With m = n_head_kv / kv_per_item items per run, item i is
/// run i / m and KV heads [(i % m) * kv_per_item, +kv_per_item), run r being tokens
/// [run_starts[r], run_starts[r + 1]) of one sequence. kv_per_item divides n_head_kv. `buf`
/// holds run length * kv_per_item * group * (max position + 1) floats. A tree token
/// (PagedAttentionArgs::tree_slots) is always a run of its own.
void attention_runs_avx2(const PagedAttentionArgs& a, const int64_t* run_starts, int kv_per_item, int64_t begin,
                         int64_t end, float* buf);

}  // namespace fdl::cpu::detail
