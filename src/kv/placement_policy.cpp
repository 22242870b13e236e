// Placement by expected cost; the formula is in placement_policy.h and docs/KV_TIERS.md.
#include "kv/placement_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace fdl::kv {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

bool finite_nonneg(double v) { return std::isfinite(v) && v >= 0; }

void validate(const PlacementInputs& in, const BlockCandidate& c) {
  auto tier_ok = [](const TierCost& t) {
    return finite_nonneg(t.write_bytes_per_s) && finite_nonneg(t.read_bytes_per_s) &&
           finite_nonneg(t.read_latency_s);
  };
  if (!tier_ok(in.host) || !tier_ok(in.disk) || !finite_nonneg(in.recompute_tok_per_s) ||
      !finite_nonneg(in.tier0_pressure) || in.tier0_pressure > 1 || in.block_bytes == 0 ||
      in.block_size <= 0)
    throw std::invalid_argument("decide_placement: bad PlacementInputs (need finite values "
                                ">= 0, pressure in [0, 1], block_bytes > 0, block_size > 0)");
  if (!finite_nonneg(c.reuse_probability) || c.reuse_probability > 1)
    throw std::invalid_argument("decide_placement: reuse_probability must be in [0, 1]");
}

// C_t = B / W_t + p * (B / Rd_t + L_t); infinite when the tier cannot take the block.
double demote_cost(const TierCost& t, double bytes, double p) {
  if (!t.available || t.write_bytes_per_s <= 0 || t.read_bytes_per_s <= 0) return kInf;
  return bytes / t.write_bytes_per_s + p * (bytes / t.read_bytes_per_s + t.read_latency_s);
}

// C_drop = p * n / recompute_tok_per_s (0 when the block will not be reused).
double drop_cost(double recompute_tok_per_s, double n_tokens, double p) {
  if (p == 0) return 0;
  if (recompute_tok_per_s <= 0) return kInf;
  return p * n_tokens / recompute_tok_per_s;
}

}  // namespace

const char* to_string(Placement p) {
  switch (p) {
    case Placement::Keep: return "keep";
    case Placement::DemoteHost: return "host";
    case Placement::DemoteDisk: return "disk";
    case Placement::Drop: return "drop";
  }
  return "?";
}

double PlacementDecision::savings() const {
  double c = cost_keep;
  switch (choice) {
    case Placement::Keep: return 0;
    case Placement::DemoteHost: c = cost_host; break;
    case Placement::DemoteDisk: c = cost_disk; break;
    case Placement::Drop: c = cost_drop; break;
  }
  return std::isfinite(cost_keep - c) ? std::max(0.0, cost_keep - c) : 0.0;
}

PlacementDecision decide_placement(const PlacementInputs& in, const BlockCandidate& c) {
  validate(in, c);
  PlacementDecision d;
  const double bytes = double(in.block_bytes);
  const double p = c.reuse_probability;
  d.cost_host = demote_cost(in.host, bytes, p);
  d.cost_disk = demote_cost(in.disk, bytes, p);
  d.cost_drop = drop_cost(in.recompute_tok_per_s, double(c.n_tokens), p);
  // Opportunity cost: the cheapest fallback of a full, certainly reused block.
  const double displaced = std::min({demote_cost(in.host, bytes, 1.0),
                                     demote_cost(in.disk, bytes, 1.0),
                                     drop_cost(in.recompute_tok_per_s, in.block_size, 1.0)});
  d.cost_keep = in.tier0_pressure == 0 ? 0.0 : in.tier0_pressure * displaced;
  if (c.hot_tail) return d;  // choice stays Keep: the running sequence writes into it next
  // Strictly cheaper wins, so ties resolve to the earlier option in Keep, Host, Disk, Drop.
  double best = d.cost_keep;
  auto consider = [&](Placement p_, double cost) {
    if (cost < best) {
      best = cost;
      d.choice = p_;
    }
  };
  consider(Placement::DemoteHost, d.cost_host);
  consider(Placement::DemoteDisk, d.cost_disk);
  consider(Placement::Drop, d.cost_drop);
  return d;
}

std::vector<RankedCandidate> rank_evictions(const PlacementInputs& in,
                                            std::span<const BlockCandidate> candidates) {
  std::vector<RankedCandidate> out;
  for (const BlockCandidate& c : candidates) {
    const PlacementDecision d = decide_placement(in, c);
    if (d.choice != Placement::Keep) out.push_back({c, d});
  }
  std::stable_sort(out.begin(), out.end(), [](const RankedCandidate& a, const RankedCandidate& b) {
    const double sa = a.decision.savings(), sb = b.decision.savings();
    if (sa != sb) return sa > sb;
    return a.candidate.last_access_step < b.candidate.last_access_step;  // LRU first
  });
  return out;
}

float decay_reuse_score(float score, uint64_t steps_since_last_access, double half_life_steps) {
  if (!(half_life_steps > 0) || !std::isfinite(score) || score <= 0) return 0.f;
  return float(double(score) * std::exp2(-double(steps_since_last_access) / half_life_steps));
}

double reuse_probability(float score) {
  if (!std::isfinite(score) || score <= 0) return 0.0;
  return 1.0 - std::exp(-double(score));
}

BlockCandidate candidate_from_meta(BlockId id, const BlockMeta& m, bool hot_tail) {
  return {id, m.n_filled, reuse_probability(m.predicted_reuse), m.last_access_step, hot_tail};
}

}  // namespace fdl::kv
