// completion_request.h — POST /v1/completions body → a validated request.
//
// `prompt` forms accepted: a string; an array of token ids; an array holding exactly one
// string or one array of ids. Refused with 400: empty prompts ("", [], [""], [[]]), arrays of
// several prompts (batching: send one request per prompt, or use n), ids outside the
// vocabulary, any other type. `logprobs`: integer 0..5 (OpenAI's limit) = the sampled token's
// logprob plus that many alternatives; `echo: true` repeats the prompt's text before each
// choice's completion (refused with `logprobs`: no prompt logprobs are computed); a non-empty `suffix` and `best_of` other
// than 1 are refused as unsupported (never silently ignored: they change the output).
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/generation_params.h"

namespace fdl::server {

inline constexpr int kMaxCompletionLogprobs = 5;

struct CompletionRequest {
  GenerationParams params;
  std::optional<std::string> prompt_text;  ///< set when the prompt is text
  std::vector<int32_t> prompt_ids;         ///< set when the prompt is token ids
  bool echo = false;                       ///< repeat the prompt before the completion
};

/// Throws ApiError 400 naming the field. `n_vocab` bounds token-id prompts.
CompletionRequest parse_completion_request(const nlohmann::json& body, int32_t n_vocab,
                                           const SamplingParams& defaults = {});

}  // namespace fdl::server
