// Top-k, top-p and min-p truncation and the tempered softmax (see candidate_filters.h).
#include "decode/candidate_filters.h"

#include "decode/row_ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

namespace fdl::detail {
namespace {

float max_logit(const std::vector<TokenLogit>& candidates) {
  float m = -std::numeric_limits<float>::infinity();
  for (const auto& c : candidates) m = std::max(m, c.logit);
  return m;
}

// keep_top_p buckets candidates by (max - logit) into kBuckets slices of kBucketNats / kBuckets
// nats. Tokens more than kBucketNats below the maximum (weight < e^-32 each) share the
// last bucket; the nucleus reaches them only for p within ~1e-8 of 1.
constexpr size_t kBuckets = 2048;
constexpr double kBucketNats = 32.0;

size_t bucket_of(float logit, float top) {
  const double d = (double(top) - double(logit)) * (kBuckets / kBucketNats);
  return d >= double(kBuckets - 1) ? kBuckets - 1 : size_t(d);
}

}  // namespace

void select_top_k(std::span<const float> row, size_t k, std::vector<TokenLogit>& out) {
  out.clear();
  if (k == 0) k = 1;
  // `out` is a heap whose front is the worst kept candidate (the one ranking last).
  size_t i = 0;
  for (; i < row.size() && out.size() < k; ++i) {
    if (std::isinf(row[i])) continue;
    out.push_back(TokenLogit{static_cast<int32_t>(i), row[i]});
    std::push_heap(out.begin(), out.end(), ranks_before);
  }
  if (out.empty()) return;  // every entry is masked
  // Once the heap is full, only a logit above the worst kept one can enter (a later id with
  // an equal logit ranks after it), and next_above skips the rest 8 at a time.
  while ((i = next_above(row, i, out.front().logit)) < row.size()) {
    std::pop_heap(out.begin(), out.end(), ranks_before);
    out.back() = TokenLogit{static_cast<int32_t>(i), row[i]};
    std::push_heap(out.begin(), out.end(), ranks_before);
    ++i;
  }
  std::sort(out.begin(), out.end(), ranks_before);
}

void select_at_least(std::span<const float> row, double threshold,
                     std::vector<TokenLogit>& out) {
  out.clear();
  for (size_t i = 0; i < row.size(); ++i) {
    const float v = row[i];
    if (double(v) >= threshold && !std::isinf(v))
      out.push_back(TokenLogit{static_cast<int32_t>(i), v});
  }
}

void keep_top_p(std::vector<TokenLogit>& candidates, double p, bool sorted,
                std::vector<float>& weights, std::vector<draw::Mass>& bucket_mass) {
  if (candidates.empty() || p >= 1.0) return;
  const float top = max_logit(candidates);
  weights.resize(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) weights[i] = candidates[i].logit;
  exp_shifted_in_place(weights, top, 1.0f);
  const draw::Mass target = draw::top_p_target(float(p), sum_mass(weights));

  if (sorted) {
    draw::Mass cumulative = 0;
    for (size_t i = 0; i < candidates.size(); ++i) {
      cumulative += draw::to_mass(weights[i]);
      if (cumulative >= target) {
        candidates.resize(i + 1);
        return;
      }
    }
    return;
  }

  // Mass per bucket, then the first bucket where the running mass reaches the target.
  bucket_mass.assign(kBuckets, 0);
  for (size_t i = 0; i < candidates.size(); ++i)
    bucket_mass[bucket_of(candidates[i].logit, top)] += draw::to_mass(weights[i]);
  draw::Mass before = 0;  // mass of all buckets above the boundary bucket
  size_t boundary = kBuckets;
  for (size_t b = 0; b < kBuckets; ++b) {
    if (before + bucket_mass[b] >= target) {
      boundary = b;
      break;
    }
    before += bucket_mass[b];
  }
  if (boundary == kBuckets) return;

  // Every candidate of a bucket above the boundary ranks before every candidate in it, so
  // those are in; the boundary bucket alone is sorted and walked for the exact cut.
  auto inside_end = std::partition(candidates.begin(), candidates.end(), [&](const TokenLogit& c) {
    return bucket_of(c.logit, top) < boundary;
  });
  auto edge_end = std::partition(inside_end, candidates.end(), [&](const TokenLogit& c) {
    return bucket_of(c.logit, top) == boundary;
  });
  std::sort(inside_end, edge_end, ranks_before);
  draw::Mass cumulative = before;
  for (auto it = inside_end; it != edge_end; ++it) {
    cumulative += draw::to_mass(draw::tempered(it->logit, top, 1.0f));
    if (cumulative >= target) {
      candidates.erase(it + 1, candidates.end());
      return;
    }
  }
  candidates.erase(edge_end, candidates.end());  // unreachable: the bucket reaches the target
}

void keep_min_p(std::vector<TokenLogit>& candidates, float min_p) {
  if (min_p <= 0.0f || candidates.empty()) return;
  const float top = max_logit(candidates);
  std::erase_if(candidates, [&](const TokenLogit& c) { return !draw::min_p_keeps(c.logit, top, min_p); });
}

draw::Mass tempered_weights(const std::vector<TokenLogit>& candidates, float temperature,
                            std::vector<float>& weights) {
  weights.resize(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) weights[i] = candidates[i].logit;
  exp_shifted_in_place(weights, max_logit(candidates), temperature);
  return sum_mass(weights);
}

}  // namespace fdl::detail
