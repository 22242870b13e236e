// Internal: the state of one admitted request while it is being generated.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "decode/stop_matcher.h"
#include "flashdllm/generator.h"

namespace fdl::engine {

using Clock = std::chrono::steady_clock;

inline double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct LiveSequence {
  LiveSequence(size_t index, const GenerationRequest& req, GenerationResult& res,
               int32_t n_vocab, const Tokenizer& tokenizer)
      : request_index(index), request(req), result(res), sampler(req.sampling, n_vocab),
        detokenizer(tokenizer, /*render_special=*/false, /*continues_text=*/true),
        stop(req.stop) {}

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
};

}  // namespace fdl::engine
