// token_tree.h — internal: resolves StepBatch::tree_parent (flashdllm/model.h) into what the
// forward needs per token: the KV slot it writes and, for a tree token whose path leaves slot
// order, the slot list its attention reads (cpu::PagedAttentionArgs::tree_slots), and, for
// backends that mask instead (the CUDA model, where the reduction order is free anyway), each
// tree token's ancestor bitmask over its tree's slots.
//
// Why a slot list and not a mask: the CPU attention's reductions are fixed by a token's own
// (virtual) positions — softmax lanes by position mod 8, the V sum in position order. A tree
// node that reads context 0..root, then its ancestors, then itself, runs exactly the
// arithmetic of a plain step at the end of its path; masking other branches with -inf in
// slot order would shift the later positions' lanes and change the last bits.
#pragma once

#include <cstdint>
#include <vector>

#include "flashdllm/model.h"

namespace fdl {

class TokenTreeLayout {
 public:
  /// Checks `b.tree_parent` against the rules of model.h and fills the per-token tables.
  /// Throws std::invalid_argument naming the token for a malformed tree (nothing written).
  /// Reuses its buffers: allocates nothing once grown to the largest batch seen.
  void resolve(const StepBatch& b);
  /// KV slot token t writes (its position unless it is a tree token).
  int32_t slot(size_t t) const { return slot_[t]; }
  /// Per token: the slot list of its virtual positions [base(t), position], or nullptr when
  /// the token reads slots 0..position in order (ordinary tokens, and tree tokens whose
  /// ancestors all sit at their own positions: the first branch).
  const int32_t* const* tree_slots() const { return any_list_ ? lists_ptr_.data() : nullptr; }
  const int32_t* tree_base() const { return base_.data(); }
  /// Whether any token has a parent (tree_parent may be non-empty yet hold no tree).
  bool has_tree() const { return window_ > 0; }
  /// The most tree nodes below one root in the batch (i - r for a tree token i of root r);
  /// 0 without trees. A tree of window w occupies slots positions[r] .. positions[r] + w.
  int32_t window() const { return window_; }
  /// Tree token t's ancestor bitmask relative to its root: bit k set when slot
  /// tree_base()[t] + k (k = 0 is the slot right after the root's) is an ancestor of t below
  /// the root, or t itself. 0 for ordinary tokens. Exact for nodes within the first
  /// kMaskWindow of their tree; a caller that uses masks must refuse batches whose window()
  /// exceeds it (the bits of later nodes are left 0).
  static constexpr int32_t kMaskWindow = 64;
  uint64_t ancestor_mask(size_t t) const { return mask_[t]; }

 private:
  std::vector<int32_t> slot_, root_, base_, offset_, list_len_;
  std::vector<int32_t> lists_;  ///< concatenated slot lists
  std::vector<const int32_t*> lists_ptr_;
  std::vector<uint64_t> mask_;
  int32_t window_ = 0;
  bool any_list_ = false;
};

}  // namespace fdl
