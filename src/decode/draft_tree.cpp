// Draft trees (see draft_tree.h).
#include "decode/draft_tree.h"

#include <algorithm>

namespace fdl::spec {

bool DraftTree::linear() const {
  for (size_t i = 0; i < parent.size(); ++i)
    if (parent[i] != int32_t(i) - 1) return false;
  return true;
}

void DraftTree::assign_linear(std::span<const int32_t> draft) {
  tokens.assign(draft.begin(), draft.end());
  parent.resize(tokens.size());
  for (size_t i = 0; i < parent.size(); ++i) parent[i] = int32_t(i) - 1;
}

size_t DraftTree::main_depth() const {
  size_t d = 0;
  while (d < parent.size() && parent[d] == int32_t(d) - 1) ++d;
  return d;
}

namespace {
double clamp_alpha(double alpha) { return std::clamp(alpha, 0.02, 0.98); }
}  // namespace

// The value of the main chain's node at depth `budget`: the least a node may be worth. The
// window controller chose the budget k because a k-th main node (worth alpha^k) pays for its
// verification; a node worth less would not, wherever it sits (on a tiny model a verified
// token costs half a plain step).
double DraftTreeBuilder::min_value(size_t budget, double alpha) {
  alpha = clamp_alpha(alpha);
  double v = 1.0;
  for (size_t i = 0; i < budget; ++i) v *= alpha;
  return v;
}

bool DraftTreeBuilder::alternates_useful(size_t budget, double alpha, double gamma) {
  return budget >= 2 && (1.0 - clamp_alpha(alpha)) * gamma >= min_value(budget, alpha);
}

double AlternateRate::gamma() const { return std::clamp(hits_ / tried_, 0.05, 0.9); }

void DraftTreeBuilder::build(std::span<const Draft> candidates, size_t budget, double alpha, double gamma,
                             DraftTree& out) {
  out.clear();
  if (candidates.empty() || budget == 0) return;
  // Clamped so that a child is always worth strictly less than its parent.
  alpha = clamp_alpha(alpha);
  trie_.clear();
  for (size_t c = 0; c < candidates.size(); ++c) {
    int32_t at = -1;
    double value = 1.0;  // the root is always reached
    bool branched = c == 0;
    const auto& toks = candidates[c].tokens;
    for (size_t d = 0; d < toks.size() && d < budget; ++d) {
      int32_t found = -1;
      for (size_t i = 0; i < trie_.size(); ++i)
        if (trie_[i].parent == at && trie_[i].token == toks[d]) { found = int32_t(i); break; }
      if (found >= 0) {
        at = found;
        value = trie_[size_t(found)].value;
        continue;
      }
      if (!branched) {
        // Leaves the trie here: an alternate to the children `at` already has.
        int32_t siblings = 0;
        for (const Node& n : trie_) siblings += n.parent == at ? 1 : 0;
        value *= (1.0 - alpha) * gamma;
        for (int32_t k = 1; k < siblings; ++k) value *= 1.0 - gamma;
        branched = true;
      } else {
        value *= alpha;
      }
      trie_.push_back({toks[d], at, value});
      at = int32_t(trie_.size() - 1);
    }
  }
  // Keep the `budget` most valuable nodes; ties keep the earlier node (parents come first).
  order_.resize(trie_.size());
  for (size_t i = 0; i < order_.size(); ++i) order_[i] = int32_t(i);
  std::stable_sort(order_.begin(), order_.end(),
                   [&](int32_t a, int32_t b) { return trie_[size_t(a)].value > trie_[size_t(b)].value; });
  kept_.assign(trie_.size(), 0);
  const double floor = min_value(budget, alpha);  // main nodes (depth <= budget) always pass
  for (size_t i = 0; i < order_.size() && i < budget; ++i)
    if (trie_[size_t(order_[i])].value >= floor) kept_[size_t(order_[i])] = 1;
  // Depth-first, children in insertion order: the main chain first, at nodes 0..d-1.
  index_.assign(trie_.size(), -1);
  const auto visit = [&](auto&& self, int32_t node, int32_t out_parent) -> void {
    for (size_t i = 0; i < trie_.size(); ++i) {
      if (trie_[i].parent != node || !kept_[i]) continue;
      index_[i] = int32_t(out.tokens.size());
      out.tokens.push_back(trie_[i].token);
      out.parent.push_back(out_parent);
      self(self, int32_t(i), index_[i]);
    }
  };
  visit(visit, -1, -1);
}

}  // namespace fdl::spec
