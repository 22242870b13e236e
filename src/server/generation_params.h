// generation_params.h — the request fields /v1/completions and /v1/chat/completions share
// (sampling, length, stop, n, streaming, logprobs), parsed and validated into what the Engine
// takes, and the expansion of one HTTP request into its n engine requests.
//
// Accepted values (docs/SERVER.md has the table and the reasons):
//  - max_tokens (chat: max_completion_tokens wins over max_tokens): integer >= 1; absent or
//    null = the endpoint default (completions 16 as in OpenAI; chat: until end-of-generation
//    or the context is full). Values past the context end with finish_reason "length".
//  - temperature [0, 2] (OpenAI's range; 0 = greedy), default 1; top_p [0, 1] (0 = keep only
//    the most likely token), default 1; top_k >= 0 (0 = off; values >= the vocabulary keep
//    everything); min_p [0, 1]; presence/frequency_penalty [-2, 2]; repetition_penalty
//    (0, 10] (llama.cpp extension); repeat_last_n -1..2^31-1 (extension).
//  - seed: any JSON integer (negative ones wrap to 64 bits); absent = a random seed per
//    request; choice i of n uses seed + i.
//  - stop: a string or an array of at most 4 non-empty strings (OpenAI's limit).
//  - n: 1..16; logprobs: see the endpoint parsers; stream: bool; stream_options only with
//    stream = true ({"include_usage": bool}); user: string, ignored.
//  - logit_bias: an object of token ids (as strings) to biases in [-100, 100], at most 1024
//    (OpenAI's); ids beyond the vocabulary are refused when the request is submitted.
// Unknown fields are ignored (as llama.cpp's server does), so clients written for newer API
// versions keep working; a known field of the wrong type or out of range is a 400.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "flashdllm/generator.h"

namespace fdl::server {

enum class Endpoint { Completions, Chat };

inline constexpr int kMaxChoices = 16;    ///< upper bound of `n`
inline constexpr size_t kMaxStops = 4;    ///< OpenAI's limit on `stop` entries
inline constexpr int32_t kCompletionsDefaultMaxTokens = 16;

struct GenerationParams {
  std::string model;               ///< as sent ("" when absent); informational only
  int32_t max_new_tokens = -1;     ///< engine semantics: -1 = until end or context full
  SamplingParams sampling;         ///< seed filled only when seed_given
  bool seed_given = false;
  std::vector<std::string> stop;   ///< the client's stop strings
  int n = 1;
  bool stream = false;
  bool include_usage = false;      ///< stream_options.include_usage
  int32_t logprobs = -1;           ///< -1 = none, else this many alternatives per token
  bool ignore_eos = false;         ///< extension: keep going past end-of-generation
  /// The grammar every choice's output follows (response_format, `grammar`, a required or
  /// named tool), or null.
  std::shared_ptr<const Grammar> grammar{};
  /// false: special tokens keep their text in the output (tool-call markers are parsed out).
  bool skip_special_tokens = true;
};

/// Parses the shared fields of `body` (a JSON object) for `endpoint`; the endpoint's own
/// fields (prompt/messages, logprobs, echo, ...) are left to the endpoint parser. Sampling
/// fields the request leaves out (temperature, top_p, top_k, min_p, repetition_penalty) take
/// `defaults`' values: OpenAI's (SamplingParams{}), or the model's recommended ones where it
/// has them (ServerOptions::sampling_defaults). Throws ApiError 400 naming the field.
GenerationParams parse_generation_params(const nlohmann::json& body, Endpoint endpoint,
                                         const SamplingParams& defaults = {});

/// The n engine requests for one HTTP request: identical except the seed (seed + i; when no
/// seed was given, `random_seed` + i). `extra_stops` (a chat template's end marker) are added
/// after the client's stop strings.
std::vector<GenerationRequest> make_engine_requests(const GenerationParams& params,
                                                    const std::vector<int32_t>& prompt_ids,
                                                    const std::vector<std::string>& extra_stops,
                                                    uint64_t random_seed);

/// Throws ApiError 400 (code "context_length_exceeded", param `param`) when a prompt of
/// `prompt_tokens` leaves no room for one new token in a context of `n_ctx` tokens.
void check_prompt_fits(size_t prompt_tokens, int n_ctx, const std::string& param);

}  // namespace fdl::server
