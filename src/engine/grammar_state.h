// Internal: a grammar-constrained sequence's state (GenerationRequest::grammar) and the token
// maskers the scheduler shares between sequences with the same grammar.
//
// Sampling: a row's logits are copied, the tokens the grammar does not allow set to -inf
// (TokenMasker::apply), and the sequence's sampler draws from that, so every sampler
// setting keeps its meaning over the allowed tokens; the drawn token then advances the
// matcher. On a model that samples on its device the mask goes up with the step instead
// (StepMasks) and the drawn id comes back (take). Drafts: a drafter's tokens are kept up to the first one the grammar refuses, then
// the tokens that spell the bytes the grammar forces are appended (TokenMasker::
// forced_tokens); all are verified like any draft, so the output is the one plain
// constrained sampling gives.
// Thread-safety: none (the scheduler's thread).
#pragma once

#include <cstdint>
#include <limits>
#include <list>
#include <memory>
#include <span>
#include <vector>

#include "flashdllm/grammar.h"
#include "flashdllm/tokenizer.h"
#include "engine/step_masks.h"
#include "grammar/token_masker.h"

namespace fdl::engine {

/// One TokenMasker per grammar in use (its caches serve every sequence with that grammar),
/// over one vocabulary trie per special-token rendering. Keeps the most recently used
/// maskers of grammars no sequence holds any more, up to kKeepUnused.
class GrammarMaskers {
 public:
  explicit GrammarMaskers(const Tokenizer& tok) : tok_(tok) {}
  /// The masker for `g` with tokens spelled as `render_special` says.
  std::shared_ptr<grammar::TokenMasker> get(const std::shared_ptr<const Grammar>& g, bool render_special);

 private:
  static constexpr size_t kKeepUnused = 16;
  struct Entry {
    std::shared_ptr<const Grammar> grammar;
    bool render_special = false;
    std::shared_ptr<grammar::TokenMasker> masker;
  };
  const Tokenizer& tok_;
  std::shared_ptr<const grammar::TokenTrie> tries_[2];
  std::list<Entry> entries_;  ///< most recently used first
};

struct GrammarState {
  GrammarMatcher matcher;
  std::shared_ptr<grammar::TokenMasker> masker;
  std::vector<float> row;  ///< scratch: the masked logits

  /// The token this row gives under the grammar: the sampler's draw from the masked logits
  /// (`draw`), which then advances the matcher. Returns -1 when no token of the vocabulary
  /// can continue the grammar. Throws GrammarError when the mask costs more than its bound.
  /// A drawn token the matcher refuses although the mask allowed it (a parse the masks kept
  /// past one of the matcher's bounds) is masked too and the draw repeated: the matcher has
  /// the last word, so no token outside the grammar is ever emitted.
  template <typename Draw>
  int32_t sample(std::span<const float> logits, Draw draw) {
    row.resize(logits.size());
    size_t allowed = masker->apply(matcher, logits, row);
    while (allowed > 0) {
      const int32_t tok = draw(std::span<const float>(row));
      if (masker->accept(matcher, tok)) {
        masker->record_choice(tok);
        return tok;
      }
      row[size_t(tok)] = -std::numeric_limits<float>::infinity();
      --allowed;
    }
    return -1;
  }
  /// The token the model drew on its device from a row masked by this grammar (StepMasks;
  /// `at`: the state that row was masked with): advances the matcher, records the choice and
  /// returns it; -1, the matcher unchanged, when the matcher refuses it, so no token outside
  /// the grammar is ever emitted.
  int32_t take(int32_t token, const StepMasks::RowState* at) {
    if (token < 0 || !masker->accept(matcher, token)) return -1;
    if (at != nullptr) masker->record_choice_at(at->epoch, at->state, token);
    return token;
  }
  /// Keeps the prefix of `draft` the grammar allows after the current state, then appends
  /// up to forced_window forced tokens, to at most `max_tokens` in all. Returns how many of
  /// the given tokens were kept (the rest of the result is forced).
  size_t constrain_draft(std::vector<int32_t>& draft, size_t max_tokens);
  /// After a verification: `drafted` forced tokens, of which `accepted` were taken. The window
  /// doubles when all were taken and halves otherwise: a model that spells the forced text
  /// its own way (a random-weight one, say) gets one forced token per step, so verifying
  /// drafts it rejects costs little.
  void observe_forced(size_t drafted, size_t accepted);

  /// Host time this sequence's grammar work took (masks, draws, drafts), against its
  /// allowance: a grammar whose masks are so costly (an exponentially ambiguous one, say)
  /// that it would hold up every other sequence on the engine thread fails instead.
  double host_ms = 0;
  bool over_budget(size_t tokens) const { return host_ms > kBaseMs + kMsPerToken * double(tokens); }
  static constexpr double kBaseMs = 2000;     ///< cold masks of a new schema on a large vocabulary
  static constexpr double kMsPerToken = 5;    ///< ~100x a cached mask on a 128k vocabulary

  static constexpr size_t kMaxForcedWindow = 16;
  size_t forced_window = 4;  ///< forced tokens drafted per step at most
};

}  // namespace fdl::engine
