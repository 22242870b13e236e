// Internal: what one scheduler step runs — the plan Scheduler::schedule() makes, ModelRunner
// executes and the scheduler's update and the OutputProcessor consume (the plan → run → output
// split of docs/DESIGN.md).
//
// The model input itself (token ids, positions, KV slots, which rows want logits) is the
// EngineContext's StepBatch, filled while planning because reserving KV slots is part of the
// plan; this records which sequence owns which part of it. Logits rows come in batch order:
// every decode slot's token and draft rows, then the audit shadows' rows, then one row per
// completing prompt.
//
// Sequences are borrowed from the scheduler's queues: a plan is valid for one step. In a
// submitted (pipelined) successor step the plan holds decode slots only (one token each, no
// drafts, prompts or shadows), and a slot's sequence is null once it ended while the step ran.
// Thread-safety: none (the scheduler's thread).
#pragma once

#include <cstddef>
#include <limits>
#include <vector>

#include "decode/draft_tree.h"
#include "engine/live_sequence.h"

namespace fdl::engine {

/// A decoding sequence's part of the step: its first logits row, the KV slot of its next
/// token (its draft's nodes follow in the next slots) and its audit shadow's row (kNoRow:
/// none).
struct DecodeSlot {
  static constexpr size_t kNoRow = std::numeric_limits<size_t>::max();
  LiveSequence* s = nullptr;
  size_t row = 0;
  size_t pos = 0;
  size_t shadow_row = kNoRow;
};

/// A prompt chunk of the step: `take` tokens; `last` when the chunk completes a prompt that
/// has not sampled yet (it has one logits row).
struct PrefillSlot {
  LiveSequence* s = nullptr;
  size_t take = 0;
  bool last = false;
};

struct StepPlan {
  std::vector<DecodeSlot> decodes;
  /// Per decode slot (empty: a plain decode); clear() keeps the trees' memory, so only the
  /// first decodes.size() entries belong to this step.
  std::vector<spec::DraftTree> drafts;
  std::vector<PrefillSlot> prefills;
  size_t drafted = 0;        ///< draft tokens in the batch
  size_t decode_tokens = 0;  ///< batch tokens of the decode part (drafts and shadows included)

  /// Empties the plan for the next step (the vectors keep their memory).
  void clear() {
    decodes.clear();
    prefills.clear();
    drafted = 0;
    decode_tokens = 0;
  }
  /// Rows with logits: every decode-part token, plus one per completing prompt.
  size_t logit_rows() const {
    size_t rows = decode_tokens;
    for (const PrefillSlot& p : prefills) rows += p.last ? 1 : 0;
    return rows;
  }
  size_t prefill_tokens() const {
    size_t n = 0;
    for (const PrefillSlot& p : prefills) n += p.take;
    return n;
  }
  /// Whether `s` has tokens in this step's batch.
  bool contains(const LiveSequence* s) const {
    for (const DecodeSlot& d : decodes)
      if (d.s == s) return true;
    for (const PrefillSlot& p : prefills)
      if (p.s == s) return true;
    return false;
  }
};

}  // namespace fdl::engine
