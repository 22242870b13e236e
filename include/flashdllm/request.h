// flashdllm/request.h — one generation request and what comes back for it: the request
// (prompt ids, sampling, limits, stop strings), its timings, the Generator's result and the
// Engine's streamed deliveries (RequestOutput) with their log-probabilities.
// Units: tokens, milliseconds (std::chrono::steady_clock).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "flashdllm/sampling.h"

namespace fdl {

using RequestId = uint64_t;

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;  ///< must not be empty (pass [BOS] for an empty prompt)
  SamplingParams sampling;
  /// Tokens to generate at most; -1 = until end-of-generation or the context is full;
  /// 0 = none (the request finishes at once with "length").
  int32_t max_new_tokens = 128;
  std::vector<std::string> stop;  ///< stop strings (non-empty)
  bool ignore_eos = false;        ///< keep going past end-of-generation tokens
  /// Speculation window of this request: -1 = GeneratorOptions::spec.window, 0 = never
  /// speculate (plain decoding), 1..64 = at most this many draft tokens per step.
  int32_t spec_window = -1;
  /// Log-probabilities of sampled tokens (Engine only, see flashdllm/engine.h): -1 = none,
  /// 0..20 = each sampled token's logprob plus this many most likely alternatives.
  int32_t logprobs = -1;
  /// Prefix-cache scope (e.g. derived from the API key): requests share KV blocks only with
  /// requests of the same scope. Empty = the default scope.
  std::string cache_scope;
};

struct GenerationTimings {
  int32_t prompt_tokens = 0;
  double prompt_ms = 0;   ///< start of this prompt's first prefill forward -> end of its last
  double ttft_ms = 0;     ///< generate() call -> first token sampled (includes waiting)
  /// Tokens sampled, the end-of-generation token that stopped the request included.
  int32_t gen_tokens = 0;
  double decode_ms = 0;   ///< first token sampled -> last token sampled
  /// Time between consecutive sampled tokens (gen_tokens - 1 entries), for ITL statistics.
  std::vector<double> token_latencies_ms;

  double prompt_tokens_per_s() const {
    return prompt_ms > 0 ? prompt_tokens * 1000.0 / prompt_ms : 0.0;
  }
  /// Decode throughput of this request: tokens after the first over decode_ms.
  double decode_tokens_per_s() const {
    return decode_ms > 0 && gen_tokens > 1 ? (gen_tokens - 1) * 1000.0 / decode_ms : 0.0;
  }
};

struct GenerationResult {
  std::vector<int32_t> prompt_ids;
  /// Generated ids. An end-of-generation token that stopped the request is not included;
  /// the token that completed a stop string is.
  std::vector<int32_t> generated_ids;
  std::string text;            ///< detokenized generated text, cut before any stop string
  std::string finish_reason;   ///< "stop" (end-of-generation or stop string) or "length"
  std::string matched_stop;    ///< the stop string that ended the request, else empty
  GenerationTimings timings;
};

/// A token's log-probability under the model's own distribution at that position: the
/// log-softmax of the logits, before penalties, temperature, top-k, top-p and min-p (vLLM's
/// default, "raw_logprobs"), so it does not depend on the sampling parameters.
struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.f;
};

struct SampledToken {
  int32_t id = 0;
  /// Only when the request asked for logprobs (GenerationRequest::logprobs >= 0), else NaN.
  float logprob = 0.f;
  std::vector<TokenLogprob> top;  ///< the `logprobs` most likely tokens, descending
};

struct RequestOutput {
  RequestId id = 0;
  /// Tokens sampled since the previous delivery, in order. An end-of-generation token that
  /// stopped the request is not included (as in GenerationResult::generated_ids).
  std::vector<SampledToken> tokens;
  std::string text;              ///< text released since the previous delivery (whole UTF-8)
  bool finished = false;
  /// When finished: "stop", "length", "abort" (abort() or engine shutdown) or "error".
  std::string finish_reason;
  std::string matched_stop;      ///< the stop string that ended it, else empty
  std::string error;             ///< message when finish_reason == "error"
  // Set on the final delivery only:
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;      ///< == total generated ids delivered
  int32_t cached_prompt_tokens = 0;   ///< prompt tokens served from the prefix cache
  double queue_ms = 0;                ///< submit() -> admitted (first scheduled)
  GenerationTimings timings;          ///< ttft_ms counts from submit()
};

using OutputSink = std::function<void(const RequestOutput&)>;

}  // namespace fdl
