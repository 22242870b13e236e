// Internal: the truncation stages of the sampler (top-k, top-p, min-p) and the tempered
// softmax, as functions over a candidate list so each can be tested on its own.
// Candidates are (id, logit) pairs with finite logits; "sorted" always means descending
// logit, lower id first on ties, which makes every stage deterministic.
//
// Cost matters here: these run once per generated token over the whole vocabulary (up to
// ~150k entries), so no stage sorts the full list. Each is a linear pass plus, at most, a
// sort of the few candidates that survive or that straddle a cut-off.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "decode/draw_arithmetic.h"
#include "flashdllm/sampling.h"

namespace fdl::detail {

/// Ordering used everywhere: higher logit first, then lower id. A function object rather
/// than a function so that std::sort / std::push_heap inline it instead of calling through
/// a pointer.
struct RanksBefore {
  bool operator()(const TokenLogit& a, const TokenLogit& b) const {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  }
};
inline constexpr RanksBefore ranks_before{};

/// The `k` best finite entries of `row` (id = index), sorted, into `out`. One pass with a
/// k-entry heap whose worst element rejects almost every entry in one comparison:
/// O(n + k log k log n) instead of building and partially sorting n candidates.
void select_top_k(std::span<const float> row, size_t k, std::vector<TokenLogit>& out);

/// All finite entries of `row` with logit >= `threshold` (in id order) into `out`.
void select_at_least(std::span<const float> row, double threshold,
                     std::vector<TokenLogit>& out);

/// Keep the smallest set of best-ranked candidates whose softmax probability sums to >= p
/// (at least one); i.e. the shortest sorted prefix reaching p. p in (0, 1]. Probabilities as
/// draw::Mass (exact integers; the target draw::top_p_target), as the GPU cuts.
/// If `sorted`, walks the list. Otherwise buckets candidates by their distance below the
/// maximum logit, finds the bucket where the cumulative probability crosses p, and sorts
/// only that bucket: O(n) plus a small sort. Survivors keep no particular order unless the
/// input was sorted. `weights` and `bucket_mass` are scratch memory.
void keep_top_p(std::vector<TokenLogit>& candidates, double p, bool sorted,
                std::vector<float>& weights, std::vector<draw::Mass>& bucket_mass);

/// Keep candidates with probability >= min_p * p_max (draw::min_p_keeps). Preserves the
/// order of the survivors. min_p <= 0 keeps everything.
void keep_min_p(std::vector<TokenLogit>& candidates, float min_p);

/// weights[i] = exp((logit_i - max) / temperature) (draw::tempered); returns their mass
/// (sum_mass; >= 2^44, since the maximum weighs exactly 1). Subtracting the max first
/// keeps tiny temperatures finite: every non-maximal weight underflows to 0 instead of
/// overflowing to Inf/NaN.
draw::Mass tempered_weights(const std::vector<TokenLogit>& candidates, float temperature,
                            std::vector<float>& weights);

}  // namespace fdl::detail
