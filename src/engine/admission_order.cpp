// Admission order (see admission_order.h).
#include "engine/admission_order.h"

#include <algorithm>
#include <numeric>
#include <tuple>

#include "engine/prompt_simhash.h"

namespace fdl::engine {

std::vector<size_t> admission_order(std::span<const AdmissionCandidate> waiting,
                                    const SchedulerOptions& options,
                                    std::span<const uint64_t> running_simhashes) {
  std::vector<size_t> order(waiting.size());
  std::iota(order.begin(), order.end(), size_t(0));
  if (!options.length_buckets) {
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return waiting[a].arrival < waiting[b].arrival;
    });
    return order;
  }
  auto similar = [&](const AdmissionCandidate& c) {
    for (uint64_t h : running_simhashes)
      if (simhash_distance(c.simhash, h) <= kSimilarDistance) return true;
    return false;
  };
  // Sort keys, smaller first: (not starved, starved ? arrival : 0, class, -cached, !similar,
  // arrival). Computed once per candidate: the similarity scan is the costly part.
  using Key = std::tuple<bool, uint64_t, int, int64_t, bool, uint64_t>;
  std::vector<Key> keys(waiting.size());
  for (size_t i = 0; i < waiting.size(); ++i) {
    const auto& c = waiting[i];
    const bool starved = c.waited_steps >= options.max_wait_steps;
    keys[i] = starved ? Key{false, c.arrival, 0, 0, false, 0}
                      : Key{true, 0, int(c.length_class), -int64_t(c.cached_tokens), !similar(c),
                            c.arrival};
  }
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return keys[a] < keys[b]; });
  return order;
}

}  // namespace fdl::engine
