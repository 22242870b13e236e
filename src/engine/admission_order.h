// Internal: the order in which the scheduler tries to admit waiting requests (the policy of
// flashdllm/engine.h; SchedulerOptions in flashdllm/options.h). With length buckets on:
//   1. requests that have waited max_wait_steps steps or more, oldest first (anti-starvation:
//      nothing below can hold a request back longer than that);
//   2. then by length class: short, medium, long;
//   3. within a class, cache-aware: the longest prefix the prefix cache can serve first (its
//      admission costs the least compute and keeps those blocks from being evicted);
//   4. then prompts similar to what is running (SimHash distance <= kSimilarDistance to any
//      running prompt) before the others, so correlated requests run together and feed each
//      other's n-gram drafts;
//   5. then arrival order.
// With buckets off the order is arrival order alone (first-come first-served, the baseline).
// Pure function; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/live_sequence.h"
#include "flashdllm/options.h"

namespace fdl::engine {

struct AdmissionCandidate {
  LengthClass length_class = LengthClass::Short;
  uint64_t arrival = 0;        ///< submission order
  int64_t waited_steps = 0;
  size_t cached_tokens = 0;    ///< prompt tokens the prefix cache would serve now
  uint64_t simhash = 0;        ///< prompt_simhash of the prompt
};

/// SimHash distance (of 64 bits) under which two prompts count as similar: unrelated
/// prompts sit near 32, prompts sharing most 3-grams well under 16.
inline constexpr int kSimilarDistance = 12;

/// Indices into `waiting`, in the order admission should try them.
std::vector<size_t> admission_order(std::span<const AdmissionCandidate> waiting,
                                    const SchedulerOptions& options,
                                    std::span<const uint64_t> running_simhashes);

}  // namespace fdl::engine
