// Internal: the grammar masks of a step whose ids the model samples on its device
// (Model::forward_sample's TokenMasks) — per logits row of a grammar-constrained sequence, the
// mask of the grammar state that row draws from. A state's mask is copied once per step however
// many rows share it (a batch of JSON requests is mostly in a few states: inside a string,
// after a key), so what goes up is a few 16 KB masks on a 128k vocabulary and an index per row,
// instead of every row's n_vocab logits coming down to be masked and sampled on the host.
// Thread-safety: none (the scheduler's thread).
#pragma once

#include <cstdint>
#include <vector>

#include "flashdllm/grammar.h"
#include "flashdllm/sampling.h"
#include "grammar/token_masker.h"

namespace fdl::engine {

class StepMasks {
 public:
  /// Where a row's mask came from: the masker's state and epoch (TokenMasker::last_state),
  /// for recording the model's choice there (TokenMasker::record_choice_at).
  struct RowState {
    uint64_t epoch = 0;
    uint32_t state = 0;
  };

  /// Starts a step's masks over a vocabulary of `n_vocab` logits per row.
  void clear(int32_t n_vocab);
  /// Adds logits row `row`, masked by `masker`'s mask of `m`'s state. Returns false, adding
  /// nothing, when the state allows no token of the vocabulary (the host path reports that
  /// request's error). Throws GrammarError when the mask costs more than its bound.
  bool add(int32_t row, grammar::TokenMasker& masker, const GrammarMatcher& m);
  /// The masks as Model::forward_sample takes them (valid until the next clear or add).
  TokenMasks view() const { return TokenMasks{rows_, which_, words_}; }
  bool empty() const { return rows_.empty(); }
  /// The state row `row` was masked with; nullptr for a row without a mask.
  const RowState* state_of(size_t row) const;

 private:
  struct Key {
    const grammar::TokenMasker* masker;
    uint64_t epoch;
    uint32_t state;
    bool operator==(const Key&) const = default;
  };
  size_t words_per_row_ = 0;
  std::vector<int32_t> rows_, which_;
  std::vector<uint64_t> words_;  // the distinct masks, back to back
  std::vector<Key> keys_;        // per distinct mask
  std::vector<int32_t> entry_;   // per logits row: its index in rows_, or -1
  std::vector<RowState> states_; // per index of rows_
};

}  // namespace fdl::engine
