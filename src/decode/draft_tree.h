// Internal: the token tree a speculating sequence verifies in one step when its drafters
// offer several candidate continuations (docs/SPECULATIVE.md, "Tree verification").
//
// Nodes are in depth-first order, first child first, so the main candidate's chain occupies
// nodes 0..d-1: its slots equal its positions and only the alternates' nodes need the
// model's tree attention (flashdllm/model.h, StepBatch::tree_parent). A linear tree (each
// node the child of the one before) is the ordinary one-draft case.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "decode/drafter.h"

namespace fdl::spec {

struct DraftTree {
  std::vector<int32_t> tokens;  ///< node tokens, parents before children
  std::vector<int32_t> parent;  ///< per node: -1 = child of the root (the next input token)
  size_t size() const { return tokens.size(); }
  bool empty() const { return tokens.empty(); }
  void clear() { tokens.clear(); parent.clear(); }
  /// Every node the child of the node before it (one linear draft, or none).
  bool linear() const;
  /// Makes the tree the chain `draft`.
  void assign_linear(std::span<const int32_t> draft);
  /// Nodes of the first-child chain from the root: the main candidate's branch.
  size_t main_depth() const;
};

/// Branch allocation by confidence. Nodes of all candidates (the first is the main one) are
/// merged into a trie and valued by the probability that verification reaches them: a main
/// node at depth i is worth alpha^i (alpha: the sequence's per-token acceptance estimate); a
/// node where an alternate leaves the trie is worth value(parent) * (1 - alpha) * gamma *
/// (1 - gamma)^(alternates already there), gamma being the chance that an alternate is right
/// when the first choice is wrong (AlternateRate: measured); each later node of it a factor
/// alpha.
/// The `budget` most valuable nodes are kept (a child is always worth less than its parent,
/// so the kept set is a tree), but none worth less than alpha^budget, the main chain's
/// node at depth `budget`: the window controller chose that budget because such a node pays
/// for its verification, so a short main draft's spare budget is not filled with long shots.
/// With one candidate, or when no alternate node is worth a main node, the result is the
/// main candidate's chain (capped at `budget`).
class DraftTreeBuilder {
 public:
  /// Whether any alternate could be kept: a first-position alternate ((1 - alpha) * gamma)
  /// is worth at least alpha^budget. Lets the caller skip collecting alternates (a visible
  /// cost per step on a tiny model) when they could not be used.
  static bool alternates_useful(size_t budget, double alpha, double gamma);
  /// alpha^budget: the least a kept node may be worth (see above).
  static double min_value(size_t budget, double alpha);
  void build(std::span<const Draft> candidates, size_t budget, double alpha, double gamma, DraftTree& out);

 private:
  struct Node {
    int32_t token;
    int32_t parent;  ///< trie index, -1 = root
    double value;
  };
  std::vector<Node> trie_;
  std::vector<int32_t> order_, kept_, index_;
};

/// gamma of DraftTreeBuilder, measured: at every verified node with several children whose
/// first child was rejected, did one of the others match? A decayed rate with a prior of 0.4
/// (worth two observations), clamped to [0.05, 0.9]. Where alternates keep failing (greedy
/// continuations of a small story model: the first candidate is the likeliest by far), gamma
/// falls and trees become rare; where they win (sampling, varied text), it stays up.
class AlternateRate {
 public:
  static constexpr double kPrior = 0.4;
  void observe(bool hit) {
    tried_ = tried_ * kDecay + 1.0;
    hits_ = hits_ * kDecay + (hit ? 1.0 : 0.0);
  }
  double gamma() const;

 private:
  static constexpr double kDecay = 0.97;  ///< ~33 observations of memory
  double tried_ = 2.0;
  double hits_ = 2.0 * kPrior;
};

}  // namespace fdl::spec
