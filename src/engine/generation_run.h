// Internal: one generate() call — admission, chunked prefill, batched decode steps, and the
// per-token bookkeeping (sampling, end conditions, streaming text, timings).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine_context.h"
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
  /// One forward over every live sequence's last token, then one token each.
  void decode_step();
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
  Clock::time_point start_;
};

}  // namespace fdl::engine
