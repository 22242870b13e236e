// StepMasks: a device-sampled step's grammar masks (step_masks.h).
#include "engine/step_masks.h"

#include <algorithm>

namespace fdl::engine {

void StepMasks::clear(int32_t n_vocab) {
  words_per_row_ = TokenMasks::words_per_row(n_vocab);
  rows_.clear();
  which_.clear();
  words_.clear();
  keys_.clear();
  entry_.clear();
  states_.clear();
}

bool StepMasks::add(int32_t row, grammar::TokenMasker& masker, const GrammarMatcher& m) {
  const std::vector<uint64_t>& bits = masker.mask(m);
  const Key key{&masker, masker.epoch(), masker.last_state()};
  // A step holds a few distinct states: a linear search beats hashing them.
  auto it = std::find(keys_.begin(), keys_.end(), key);
  if (it == keys_.end()) {
    // The masker's vocabulary may be shorter than the model's rows (padded output rows):
    // those tokens stay disallowed, as TokenMasker::apply leaves them.
    const size_t n = std::min(bits.size(), words_per_row_);
    bool any = false;
    for (size_t w = 0; w < n && !any; ++w) any = bits[w] != 0;
    if (!any) return false;
    words_.insert(words_.end(), bits.begin(), bits.begin() + std::ptrdiff_t(n));
    words_.resize(words_.size() + (words_per_row_ - n), 0);
    keys_.push_back(key);
    it = keys_.end() - 1;
  }
  if (entry_.size() <= size_t(row)) entry_.resize(size_t(row) + 1, -1);
  entry_[size_t(row)] = int32_t(rows_.size());
  rows_.push_back(row);
  which_.push_back(int32_t(it - keys_.begin()));
  states_.push_back(RowState{key.epoch, key.state});
  return true;
}

const StepMasks::RowState* StepMasks::state_of(size_t row) const {
  if (row >= entry_.size() || entry_[row] < 0) return nullptr;
  return &states_[size_t(entry_[row])];
}

}  // namespace fdl::engine
