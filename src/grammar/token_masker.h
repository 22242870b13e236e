// Internal: which tokens of a vocabulary a grammar allows next — the token mask applied to
// the logits before sampling — and the tokens a grammar forces (drafts for free).
//
// How: the matcher's stacks are interned as one "stack set"; the set's mask is computed once
// by walking the vocabulary trie (token_trie.h) and cached. The walk steps stack sets byte by
// byte through a transition table that is filled lazily and kept across walks, so the
// grammar's automaton over stack sets (a DFA built on demand) is shared by every mask and
// every sequence with this grammar: inside a JSON string, say, all but the first walk of a
// state are table lookups. A token is allowed when the walk reaches its node; the
// end-of-generation tokens when the set may end. The caches are bounded (frames, sets, cached
// masks) and start over past a bound; one mask computation is bounded in work and memory and
// throws GrammarError past that (the request fails, the engine goes on). Stacks past the
// matcher's depth and count bounds are dropped as the matcher drops them.
// Cost: a mask miss is O(trie nodes visited), a hit O(1) plus the copy; apply() is one pass
// over the logits.
// Thread-safety: none (one per scheduler thread); the trie and grammar are shared read-only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "flashdllm/grammar.h"
#include "grammar/token_trie.h"

namespace fdl::grammar {

class TokenMasker {
 public:
  TokenMasker(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenTrie> trie);

  /// Bit t of the result (word t / 64, bit t % 64) is set when token t may follow the state.
  /// The reference stays valid until the next call.
  const std::vector<uint64_t>& mask(const GrammarMatcher& m);
  /// `out` = `logits` with the tokens the state does not allow at -inf (entries past the
  /// vocabulary too); the two must not overlap and have one size. Returns the number of
  /// tokens allowed (0: the grammar cannot continue with this vocabulary). Cost: one
  /// vectorized copy or fill of the row plus one scattered write per allowed or per
  /// disallowed token, whichever is fewer.
  size_t apply(const GrammarMatcher& m, std::span<const float> logits, std::span<float> out);
  /// Whether `token` may follow the state (its bytes accepted, or an end-of-generation
  /// token where the grammar may end).
  bool allows(const GrammarMatcher& m, int32_t token);
  /// Advances `m` by `token`'s bytes; false (m unchanged) when the grammar refuses them.
  /// End-of-generation tokens leave m as it is and return can_end().
  bool accept(GrammarMatcher& m, int32_t token) const;
  /// Appends to `out` up to `max_tokens` tokens that spell the bytes the grammar forces next
  /// (the longest run where exactly one byte is possible and the text may not end), spelled as
  /// TokenTrie::spell does (the tokenizer's encoding where it fits); when the grammar may only
  /// end, one end-of-generation token. Tokens of this run are certain only as bytes: the
  /// model may spell them with other tokens, so they are drafts to verify.
  /// Where a sequence with this grammar was at the same state before, the token the model
  /// chose there is drafted instead (record_choice), when it fits the forced text: sequences
  /// that share a schema mostly spell its fixed text the same way, however the tokenizer
  /// would.
  void forced_tokens(const GrammarMatcher& m, size_t max_tokens, std::vector<int32_t>& out);
  /// Notes that the model chose `token` at the state of the last mask()/apply() call.
  void record_choice(int32_t token);
  /// The state of the last mask()/apply() call, and the epoch it belongs to: the caches start
  /// over past their bounds (a new epoch), after which a state number may name another state.
  /// Sampling on a device (a step's masks computed before its forward) records its choices
  /// with record_choice_at, which ignores a state of an earlier epoch.
  uint32_t last_state() const { return last_set_; }
  uint64_t epoch() const { return epoch_; }
  void record_choice_at(uint64_t epoch, uint32_t state, int32_t token);

  const TokenTrie& trie() const { return *trie_; }
  size_t cached_masks() const { return masks_.size(); }

 private:
  static constexpr uint32_t kEmptyStack = UINT32_MAX;  ///< the complete parse (an empty stack)
  static constexpr uint32_t kUnknown = UINT32_MAX;     ///< transition not computed yet
  static constexpr uint32_t kDead = UINT32_MAX - 1;    ///< no stack takes the byte

  struct Frame {
    uint32_t pos;
    uint32_t parent;  // frame below, or kEmptyStack
    uint32_t depth;   // frames in the stack, this one included
  };

  uint32_t intern_frame(uint32_t pos, uint32_t parent);
  /// Frames reached from `f` by expanding rule references and completed alternatives.
  void expand(uint32_t f, std::vector<uint32_t>& out);
  uint32_t intern_set(std::vector<uint32_t>& frames);  ///< sorts and dedups `frames`
  uint32_t set_of(const GrammarMatcher& m);
  /// The set after `byte` from `set` (kDead when no stack takes it). Inline: a mask's walk
  /// asks this once per trie node, and after a grammar's first masks nearly every answer is
  /// already in the table.
  uint32_t step(uint32_t set, uint8_t byte) {
    const uint32_t t = transitions_[size_t(set) * 256 + byte];
    return t != kUnknown ? t : step_uncached(set, byte);
  }
  uint32_t step_uncached(uint32_t set, uint8_t byte);  ///< computes and stores the entry
  void compute_mask(uint32_t set, std::vector<uint64_t>& bits);
  void reset_if_large();

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const TokenTrie> trie_;
  std::vector<Frame> frames_;
  std::unordered_map<uint64_t, uint32_t> frame_ids_;
  std::vector<std::vector<uint32_t>> sets_;
  std::unordered_map<std::string, uint32_t> set_ids_;
  std::vector<uint32_t> transitions_;  ///< sets_.size() * 256
  std::unordered_map<uint32_t, std::vector<uint64_t>> masks_;
  uint32_t last_set_ = kDead;                        ///< the state of the last mask()
  uint64_t epoch_ = 0;                               ///< resets of the caches so far
  std::unordered_map<uint32_t, int32_t> chosen_;     ///< state -> the token last chosen there
  size_t work_left_ = 0;  ///< rule visits the mask being computed may still make
  // scratch
  std::vector<uint32_t> work_, next_, walk_sets_;
};

}  // namespace fdl::grammar
