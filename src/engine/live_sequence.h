// Internal: the state of one admitted request while it is being generated.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

#include "decode/lookahead_pool.h"
#include "decode/stop_matcher.h"
#include "decode/window_controller.h"
#include "flashdllm/generator.h"

namespace fdl::engine {

using Clock = std::chrono::steady_clock;

inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

/// The plain-decoding shadow copy of an audited sequence (see shadow_audit.h).
struct ShadowCopy {
  explicit ShadowCopy(const Sampler& s) : sampler(s) {}
  SeqId seq = -1;
  Sampler sampler;          ///< a copy of the audited sequence's sampler at the fork
  int32_t last_token = -1;  ///< to feed next
  size_t base = 0;          ///< sampled-token index of the first id in `ids`
  std::vector<int32_t> ids; ///< tokens the shadow sampled, in order
  struct Pending { size_t begin, end; uint64_t fingerprint; };
  std::deque<Pending> pending;  ///< speculative steps awaiting comparison
};

struct LiveSequence {
  LiveSequence(size_t index, const GenerationRequest& req, GenerationResult& res,
               int32_t n_vocab, const Tokenizer& tokenizer)
      : request_index(index), request(req), result(res), sampler(req.sampling, n_vocab),
        detokenizer(tokenizer, /*render_special=*/false, /*continues_text=*/true),
        stop(req.stop), context(req.prompt_ids) {}

  size_t request_index;
  const GenerationRequest& request;
  GenerationResult& result;
  SeqId seq = -1;            ///< KV sequence; -1 once its blocks are freed
  size_t n_prefilled = 0;    ///< prompt tokens already in the KV cache
  int32_t last_token = -1;   ///< sampled but not yet fed to the model
  bool finished = false;
  Sampler sampler;
  /// Generated text continues the prompt, so its first piece keeps its leading space.
  StreamingDetokenizer detokenizer;
  StopMatcher stop;
  Clock::time_point prefill_start{};
  Clock::time_point first_token_at{};
  Clock::time_point last_token_at{};

  // Speculation
  std::vector<int32_t> context;  ///< prompt + kept generated ids (drafters read it)
  size_t n_sampled = 0;          ///< tokens sampled, a stopping end-of-generation included
  int spec_window = 0;           ///< max draft tokens per step for this request (0 = plain)
  spec::LookaheadPool lookahead;
  size_t lookahead_fed = 1;      ///< context[..lookahead_fed) is in the pool's history
  spec::WindowController window;
  std::optional<ShadowCopy> shadow;
};

}  // namespace fdl::engine
