// token_tree.h — internal: resolves StepBatch::tree_parent (flashdllm/model.h) into what the
// forward needs per token: the KV slot it writes and, for a tree token whose path leaves slot
// order, the slot list its attention reads (cpu::PagedAttentionArgs::tree_slots).
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

 private:
  std::vector<int32_t> slot_, root_, base_, offset_, list_len_;
  std::vector<int32_t> lists_;  ///< concatenated slot lists
  std::vector<const int32_t*> lists_ptr_;
  bool any_list_ = false;
};

}  // namespace fdl
