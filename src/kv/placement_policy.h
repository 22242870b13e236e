// placement_policy.h — where a KV block should live, decided by expected cost in seconds.
//
// For a candidate block with n tokens, B bytes and reuse probability p (from its predicted
// reuse score), using the measured StorageProfile:
//
//   recompute time    R(n)     = n / recompute_tok_per_s
//   demote to tier t  C_t      = B / W_t  +  p * (B / Rd_t + L_t)
//                                (write now; if reused, read back + one block's latency)
//   drop              C_drop   = p * R(n)
//   keep in tier 0    C_keep   = pressure * min_f C_f(full block, p = 1)
//                                (the space is denied to another block that is certainly
//                                 reused; it pays its cheapest fallback f among the
//                                 available tiers and recompute. pressure in [0, 1] says how
//                                 much tier 0 is wanted: 0 = free space, 1 = full and asked for)
//
// The cheapest wins; ties keep the order Keep, Host, Disk, Drop (the cheapest to undo first).
// Among blocks with equal savings (C_keep - C_choice) eviction goes in LRU order (oldest
// last_access_step first). The hot tail block of every running sequence is always Keep.
// Unavailable tiers (disabled, breaker open, full) have infinite cost. Units: seconds,
// bytes, bytes per second, tokens per second. docs/KV_TIERS.md derives the rule.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "flashdllm/kv_cache.h"

namespace fdl::kv {

struct TierCost {
  bool available = false;
  double write_bytes_per_s = 0;  ///< demotion bandwidth into the tier
  double read_bytes_per_s = 0;   ///< promotion bandwidth back to tier 0
  double read_latency_s = 0;     ///< fixed latency of one block read back
};

struct PlacementInputs {
  TierCost host;
  TierCost disk;
  double recompute_tok_per_s = 0;  ///< 0 = unknown: dropping a reused block costs infinity
  double tier0_pressure = 1.0;     ///< [0, 1]
  size_t block_bytes = 0;
  int block_size = 16;             ///< tokens in a full block
};

enum class Placement : uint8_t { Keep, DemoteHost, DemoteDisk, Drop };
const char* to_string(Placement p);

struct BlockCandidate {
  BlockId block = -1;
  uint32_t n_tokens = 0;         ///< tokens stored (BlockMeta::n_filled)
  double reuse_probability = 0;  ///< [0, 1]; see reuse_probability()
  uint64_t last_access_step = 0;
  bool hot_tail = false;         ///< tail block of a running sequence: never moved
};

struct PlacementDecision {
  Placement choice = Placement::Keep;
  double cost_keep = 0, cost_host = 0, cost_disk = 0, cost_drop = 0;  ///< seconds
  double savings() const;  ///< cost_keep - cost of the choice (>= 0)
};

/// Throws std::invalid_argument for non-finite or negative inputs, pressure outside [0, 1],
/// block_bytes == 0 or block_size <= 0.
PlacementDecision decide_placement(const PlacementInputs& in, const BlockCandidate& c);

struct RankedCandidate {
  BlockCandidate candidate;
  PlacementDecision decision;
};
/// Candidates whose best placement is not Keep, best savings first, LRU among equal savings.
std::vector<RankedCandidate> rank_evictions(const PlacementInputs& in,
                                            std::span<const BlockCandidate> candidates);

/// Decayed access frequency: the score halves every `half_life_steps` engine steps without
/// access, and each access adds 1. Stored in BlockMeta::predicted_reuse.
float decay_reuse_score(float score, uint64_t steps_since_last_access, double half_life_steps);
/// p = 1 - exp(-score): 0 for a never-used block, ~0.63 after one recent access, -> 1.
double reuse_probability(float score);
/// A candidate from a block's metadata and whether it is a running sequence's tail.
BlockCandidate candidate_from_meta(BlockId id, const BlockMeta& m, bool hot_tail);

}  // namespace fdl::kv
