// Paged causal attention on the CPU: argument checks, scratch sizing, the split across
// threads, and the portable build of the loop (attention_impl.h).
#include "backend/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "backend/cpu/attention_impl.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/parallel_policy.h"

namespace fdl::cpu {

void AttentionScratch::reserve(int n_threads, int64_t floats) {
  if (buffers_.size() < size_t(n_threads)) buffers_.resize(size_t(n_threads));
  for (auto& b : buffers_)
    if (b.size() < size_t(floats)) b.resize(size_t(floats));
}

namespace detail {
namespace {

struct VecPortable {
  // Eight lanes (k mod 8) combined in the canonical order, like the AVX2 build.
  static float dot(const float* a, const float* b, int64_t n) {
    float acc[8] = {};
    for (int64_t i = 0; i < n; ++i) acc[i % 8] += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
  }
  // The sum in eight double lanes (j mod 8) combined in the canonical order, like the AVX2
  // build (attention.h).
  // s starts at a multiple of 8 positions (softmax_start), so lane j mod 8 is position j's.
  static double exp_sum(float* s, int64_t n, float max) {
    double lane[8] = {};
    for (int64_t j = 0; j < n; ++j) {
      s[j] = std::exp(s[j] - max);
      lane[j % 8] += double(s[j]);
    }
    return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  }
  static void weighted_v_sum(const float* p, int64_t lo, int64_t n_pos, const VRows& v, float* out) {
    std::fill(out, out + v.head_dim, 0.f);
    for (int64_t j = lo; j < n_pos; ++j) {
      const float* vj = v.row(j);
      for (int64_t i = 0; i < v.head_dim; ++i) out[i] += p[j] * vj[i];
    }
  }
};

}  // namespace

void attention_items_portable(const PagedAttentionArgs& a, int64_t begin, int64_t end, float* buf) {
  for (int64_t i = begin; i < end; ++i)
    attend_group<VecPortable>(a, i / a.n_head_kv, int(i % a.n_head_kv), buf);
}

}  // namespace detail

namespace {

// Longest run of one sequence's tokens handled as one work item by the AVX2 kernels.
constexpr int64_t kMaxRun = 16;
// Work items per thread when splitting, so a thread that starts late takes fewer of them.
constexpr int kChunksPerThread = 2;

// KV heads per work item of the AVX2 kernel. Small heads (head dim <= kMaxLaneHeadDim, a
// multiple of 8) share an item, up to 8 vector lanes of V sums (8 query heads at head dim 8):
// one KV head per item left the V sum of a head-dim-8 model a single latency-bound FMA chain.
// Fewer heads per item where that would leave some of `threads` without an item. Grouping
// never changes results (each head's arithmetic is its own).
int kv_heads_per_item(const PagedAttentionArgs& a, int64_t n_runs, int threads) {
  if (a.head_dim % 8 != 0 || a.head_dim > detail::kMaxLaneHeadDim) return 1;
  const int lanes_per_kv = (a.n_head / a.n_head_kv) * (a.head_dim / 8);
  int best = 1;
  for (int d = 2; d <= a.n_head_kv; ++d)
    if (a.n_head_kv % d == 0 && d * lanes_per_kv <= 8 && n_runs * (a.n_head_kv / d) >= threads) best = d;
  return best;
}

void check_args(const PagedAttentionArgs& a) {
  if (a.kv.k_base == nullptr || a.kv.v_base == nullptr || a.q == nullptr || a.out == nullptr ||
      a.block_tables == nullptr || a.positions == nullptr)
    throw std::invalid_argument("paged_attention: null argument");
  if (a.n_head <= 0 || a.n_head_kv <= 0 || a.n_head % a.n_head_kv != 0)
    throw std::invalid_argument("paged_attention: n_head " + std::to_string(a.n_head) +
                                " is not a positive multiple of n_head_kv " +
                                std::to_string(a.n_head_kv));
  if (a.head_dim <= 0 || a.kv.block_size <= 0 || a.kv.block_stride <= 0)
    throw std::invalid_argument("paged_attention: head_dim, block_size and block_stride must be positive");
  if (a.tree_slots != nullptr && a.tree_base == nullptr)
    throw std::invalid_argument("paged_attention: tree_slots without tree_base");
  if (a.window < 0) throw std::invalid_argument("paged_attention: negative window " + std::to_string(a.window));
}

}  // namespace

void paged_attention(ThreadPool& threads, const PagedAttentionArgs& args, AttentionScratch& scratch) {
  check_args(args);
  int64_t max_positions = 0, total_positions = 0;
  for (int64_t t = 0; t < args.n_tokens; ++t) {
    if (args.positions[t] < 0)
      throw std::invalid_argument("paged_attention: negative position " +
                                  std::to_string(args.positions[t]));
    max_positions = std::max<int64_t>(max_positions, int64_t(args.positions[t]) + 1);
    total_positions += int64_t(args.positions[t]) + 1 - detail::first_position(args, t);
  }
  const int group = args.n_head / args.n_head_kv;
  // The kernel set is chosen once per call. AVX2: runs of consecutive tokens sharing a block
  // table (one sequence), at most kMaxRun long so a verification or a prompt chunk still
  // splits across threads; portable: one token per run.
  const bool avx2 = use_avx2_kernels();
  std::vector<int64_t>& runs = scratch.run_starts();
  int64_t longest = 1;
  // A tree token reads its keys through its own slot list: a run of its own (before and after).
  const auto tree = [&](int64_t t) { return args.tree_slots != nullptr && args.tree_slots[t] != nullptr; };
  const auto build_runs = [&](int64_t max_run) {
    runs.clear();
    longest = 1;
    for (int64_t t = 0; t < args.n_tokens; ++t)
      if (!avx2 || t == 0 || args.block_tables[t] != args.block_tables[t - 1] || t - runs.back() == max_run ||
          tree(t) || tree(t - 1)) {
        if (!runs.empty()) longest = std::max(longest, t - runs.back());
        runs.push_back(t);
      }
    if (!runs.empty()) longest = std::max(longest, args.n_tokens - runs.back());
    runs.push_back(args.n_tokens);
  };
  build_runs(kMaxRun);
  const bool split = worth_splitting(threads, attention_cost_ns(total_positions, args.n_head, args.head_dim));
  int kv_per_item = avx2 ? kv_heads_per_item(args, int64_t(runs.size() - 1), split ? threads.size() : 1) : 1;
  // Too few items to balance (codelm-16m: 2 KV heads, so a lone verification window was one
  // item per thread, and a thread that started late held up the other): cut runs shorter
  // until there are kChunksPerThread items per thread, claimed one by one. Each token's
  // arithmetic is unchanged; a shorter run only shares each K/V row among fewer tokens.
  const int64_t want_items = int64_t(threads.size()) * kChunksPerThread;
  if (avx2 && split && kv_per_item == 1)
    while (int64_t(runs.size() - 1) * args.n_head_kv < want_items && longest > 1) build_runs((longest + 1) / 2);
  const int64_t n_runs = int64_t(runs.size() - 1);
  scratch.reserve(threads.size() * kChunksPerThread, longest * int64_t(kv_per_item) * group * (max_positions + 1));
  // One pointer is captured so std::function keeps the closure inline (no allocation).
  struct Job {
    const PagedAttentionArgs* a;
    AttentionScratch* scratch;
    bool avx2;
    int kv_per_item;
  } job{&args, &scratch, avx2, kv_per_item};
  const auto body = [&job](int64_t begin, int64_t end, int thread) {
    float* buf = job.scratch->thread_buffer(thread);
    if (job.avx2) detail::attention_runs_avx2(*job.a, job.scratch->run_starts().data(), job.kv_per_item, begin, end, buf);
    else detail::attention_items_portable(*job.a, begin, end, buf);
  };
  const int64_t n_items = n_runs * (args.n_head_kv / kv_per_item);
  // Small calls run on the calling thread (parallel_policy.h: by estimated time).
  if (n_items == 1 || !split) {
    body(0, n_items, 0);
  } else {
    threads.parallel_for(n_items, body, kChunksPerThread);
  }
}

}  // namespace fdl::cpu
