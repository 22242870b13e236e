// Internal: one generate() call — admission, chunked prefill, batched decode steps, and the
// per-token bookkeeping (sampling, end conditions, streaming text, timings).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine_context.h"
#include "decode/draft_policy.h"
#include "engine/live_sequence.h"

namespace fdl::engine {

class GenerationRun {
 public:
  /// `requests` must already be validated.
  GenerationRun(EngineContext& ctx, const std::vector<GenerationRequest>& requests,
                const TextCallback& on_text);
  /// Frees the KV blocks of any sequence still live (e.g. when a forward threw).
  ~GenerationRun();
  GenerationRun(const GenerationRun&) = delete;
  GenerationRun& operator=(const GenerationRun&) = delete;

  std::vector<GenerationResult> run();

 private:
  /// Moves waiting requests into `live_` while there is room; returns the new ones.
  std::vector<LiveSequence*> admit();
  /// Fills the KV cache with the prompts of `fresh` and samples each one's first token.
  void prefill(const std::vector<LiveSequence*>& fresh);
  /// One forward over every live sequence: its last token plus, when it speculates, its
  /// draft; then acceptance, rollback and one or more tokens each (decode_step.cpp).
  void decode_step();
  /// Draft and window for `s` this step (empty = plain decode).
  void plan_draft(LiveSequence& s, size_t n_live, bool speculate, std::vector<int32_t>& draft);
  /// Accepts a prefix of `draft` from the rows starting at `row0`, emits the tokens, rolls
  /// the KV cache back past the accepted ones; returns the tokens emitted.
  size_t verify(LiveSequence& s, const std::vector<int32_t>& draft, size_t row0, size_t pos0);
  /// Shadow audit (shadow_audit.cpp): start a shadow for an audited sequence after its
  /// prefill; add its plain token to the batch; after the forward, sample it and compare.
  void start_shadow(LiveSequence& s);
  void add_shadow_token(LiveSequence& s);
  void advance_shadow(LiveSequence& s, size_t row);
  void end_shadow(LiveSequence& s);
  /// Model::forward on the batch; checks that it produced `logit_rows` rows.
  void forward(size_t logit_rows);
  std::span<const float> logits_row(size_t row) const;

  void on_token(LiveSequence& s, int32_t token);
  void finish(LiveSequence& s, const char* reason);
  void emit(LiveSequence& s, std::string_view piece);
  std::string detokenize(LiveSequence& s, int32_t token);
  void drop_finished();

  EngineContext& ctx_;
  const std::vector<GenerationRequest>& requests_;
  const TextCallback& on_text_;
  std::vector<GenerationResult> results_;
  std::vector<std::unique_ptr<LiveSequence>> live_;
  size_t next_request_ = 0;
  // decode-step scratch, reused
  std::vector<std::vector<int32_t>> drafts_;
  std::vector<size_t> first_row_, first_pos_, shadow_row_;
  std::vector<int32_t> outputs_, inputs_;
  spec::Draft draft_;
  std::vector<int32_t> emitted_;
  Clock::time_point start_;
  spec::DraftPolicy policy_;
};

}  // namespace fdl::engine
