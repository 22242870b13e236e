// Token-tree layout of a StepBatch (see token_tree.h and flashdllm/model.h).
#include "model/token_tree.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace fdl {

void TokenTreeLayout::resolve(const StepBatch& b) {
  const size_t n = b.tokens.size();
  slot_.resize(n);
  root_.resize(n);
  base_.resize(n);
  offset_.resize(n);
  list_len_.resize(n);
  mask_.resize(n);
  window_ = 0;
  lists_ptr_.assign(n, nullptr);
  lists_.clear();
  any_list_ = false;
  const bool tree = !b.tree_parent.empty();
  if (tree && b.tree_parent.size() != n)
    throw std::invalid_argument("forward: tree_parent has " + std::to_string(b.tree_parent.size()) +
                                " entries for " + std::to_string(n) + " tokens (must be 0 or n_tokens)");
  const auto bad = [](size_t i, const std::string& what) {
    throw std::invalid_argument("forward: tree token " + std::to_string(i) + " " + what);
  };
  for (size_t i = 0; i < n; ++i) {
    const int32_t p = tree ? b.tree_parent[i] : -1;
    offset_[i] = -1;
    list_len_[i] = 0;
    mask_[i] = 0;
    if (p == -1) {
      slot_[i] = b.positions[i];
      root_[i] = int32_t(i);
      continue;
    }
    if (p < -1 || size_t(p) >= i)
      bad(i, "has parent " + std::to_string(p) + " (must be -1 or an earlier batch index)");
    const size_t q = size_t(p);
    if (b.seqs[q] != b.seqs[i])
      bad(i, "is in sequence " + std::to_string(b.seqs[i]) + " but its parent " + std::to_string(q) +
                 " in sequence " + std::to_string(b.seqs[q]));
    if (int64_t(b.positions[i]) != int64_t(b.positions[q]) + 1)
      bad(i, "has position " + std::to_string(b.positions[i]) + ", not its parent's + 1 (" +
                 std::to_string(b.positions[q]) + ")");
    // Consecutive slots need consecutive batch tokens: i - 1 is the parent or in its tree.
    if (root_[i - 1] != root_[q])
      bad(i, "does not follow its tree (token " + std::to_string(i - 1) + " is outside it)");
    const size_t r = size_t(root_[q]);
    root_[i] = int32_t(r);
    slot_[i] = b.positions[r] + int32_t(i - r);
    base_[i] = b.positions[r] + 1;
    // Bit i - r - 1 is this token's slot; a parent that is the root contributes none.
    const int32_t k = int32_t(i - r) - 1;
    window_ = std::max(window_, k + 1);
    if (k < kMaskWindow) mask_[i] = (q == r ? 0 : mask_[q]) | (uint64_t(1) << k);
    // The list is the parent's (when it has one) plus this token's slot; a path whose every
    // node sits at its own position needs none.
    if (offset_[q] < 0 && slot_[i] == b.positions[i]) continue;
    offset_[i] = int32_t(lists_.size());
    if (offset_[q] >= 0) {
      for (int32_t j = 0; j < list_len_[q]; ++j) {
        const int32_t s = lists_[size_t(offset_[q] + j)];  // a copy: push_back may reallocate
        lists_.push_back(s);
      }
    } else {
      for (int32_t s = b.positions[r] + 1; s < b.positions[q] + 1; ++s) lists_.push_back(s);  // q's path: slot order
    }
    lists_.push_back(slot_[i]);
    list_len_[i] = int32_t(lists_.size()) - offset_[i];
    any_list_ = true;
  }
  if (any_list_)
    for (size_t i = 0; i < n; ++i)
      if (offset_[i] >= 0) lists_ptr_[i] = lists_.data() + offset_[i];
}

}  // namespace fdl
