// Internal: the cross-request n-gram cache. Every sequence's accepted output tokens feed one
// shared table "n tokens -> the token that most recently followed them" (n in
// [n_min, n_max]); a draft is built by chaining lookups, longest n first at each step, so
// correlated requests (same template, same code base) draft from each other's output.
// The table is bounded: when it reaches `max_entries` it is cleared (recent data refills it
// within a few requests; an LRU would cost more per token than it saves here).
#pragma once

#include <unordered_map>

#include "decode/drafter.h"

namespace fdl::spec {

class NgramCache final : public Drafter {
 public:
  /// 1 <= n_min <= n_max <= 8, max_entries >= 1 (std::invalid_argument otherwise).
  NgramCache(int n_min, int n_max, size_t max_entries = size_t(1) << 20);

  /// Records the grams that end just before each token context[from..] (that token being
  /// their follower). Call with the new tokens of a sequence after each step.
  void feed(std::span<const int32_t> context, size_t from);
  void propose(std::span<const int32_t> context, size_t max_tokens, Draft& out) const override;
  /// Alternate for tree verification: the draft whose first token is the follower of the
  /// longest gram that disagrees with propose()'s first token, chained on as propose()
  /// does. Empty when every gram agrees.
  void propose_alternate(std::span<const int32_t> context, size_t max_tokens, Draft& out) const;
  size_t size() const { return next_.size(); }
  void clear() { next_.clear(); }

 private:
  /// propose() from `tail` (the context's last tokens, extended in place).
  void chain(std::vector<int32_t>& tail, size_t max_tokens, Draft& out) const;
  int n_min_;
  int n_max_;
  size_t max_entries_;
  std::unordered_map<uint64_t, int32_t> next_;
};

}  // namespace fdl::spec
