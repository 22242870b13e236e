// response_json.h — the JSON objects the server sends: whole responses, streaming chunks,
// usage, and logprobs in both OpenAI shapes (legacy completions and chat).
//
// Shapes (OpenAI API, 2024-2025):
//  - completion: {"id":"cmpl-..","object":"text_completion","created":s,"model":..,
//    "choices":[{"index","text","logprobs","finish_reason"}],"usage":{..}}; a streamed chunk
//    is the same object with one choice carrying a text piece and finish_reason null until
//    its last chunk.
//  - chat: {"object":"chat.completion", choices:[{"index","message":{"role":"assistant",
//    "content"},"logprobs","finish_reason"}]}; chunks are "chat.completion.chunk" with a
//    "delta" ({"role":"assistant","content":""} first, then {"content": piece}, then {}).
//    A reply read for tool calls adds "tool_calls": [{"id","type":"function","function":
//    {"name","arguments"}}] to the message (`arguments` a string of JSON; `content` null when
//    the reply is only calls); streamed, a call is a delta {"tool_calls":[{"index","id",
//    "type":"function","function":{"name","arguments":""}}]} then deltas
//    {"tool_calls":[{"index","function":{"arguments": fragment}}]}.
//  - usage: {"prompt_tokens","completion_tokens","total_tokens",
//    "prompt_tokens_details":{"cached_tokens"}}; the usage chunk has "choices":[].
// Log-probabilities that are -inf (tokens the sampling distribution excludes) are sent as
// -9999.0, OpenAI's convention, since JSON has no infinity.
// Thread-safety: pure functions (the tokenizer is immutable).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "flashdllm/engine.h"
#include "server/tool_call_parser.h"

namespace fdl::server {

/// What every response/chunk of one HTTP request repeats.
struct ResponseMeta {
  std::string id;        ///< "cmpl-…" or "chatcmpl-…"
  int64_t created = 0;   ///< Unix seconds
  std::string model;     ///< the served model name
};

/// One choice once finished (non-streaming responses).
struct ChoiceResult {
  std::string text;  ///< the reply; for one read for tool calls, its content outside the calls
  std::vector<SampledToken> tokens;
  std::string finish_reason;  ///< "stop" | "length" | "tool_calls"
  std::vector<ToolCall> tool_calls{};  ///< chat: the calls read from the reply
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
};

/// "cmpl-" / "chatcmpl-" followed by 24 random hex digits.
std::string new_response_id(const char* prefix);

nlohmann::json usage_json(const Usage& u);

/// Legacy completions logprobs for `tokens`: tokens, token_logprobs, top_logprobs (one
/// {token: logprob} object per position) and text_offset (byte offsets into the choice's
/// text, starting at `text_offset`).
nlohmann::json completion_logprobs(const Tokenizer& tok, const std::vector<SampledToken>& tokens,
                                   size_t text_offset = 0);
/// Chat logprobs: {"content":[{"token","logprob","bytes","top_logprobs":[...]}],"refusal":null}.
nlohmann::json chat_logprobs(const Tokenizer& tok, const std::vector<SampledToken>& tokens);

/// `with_logprobs`: include logprobs built from each choice's tokens, else null.
nlohmann::json completion_response(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                                   const Usage& usage, const Tokenizer& tok, bool with_logprobs);
nlohmann::json chat_response(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                             const Usage& usage, const Tokenizer& tok, bool with_logprobs);

/// One streamed completions chunk. `logprobs` may be null; `finish_reason` "" → null.
/// `include_usage`: add "usage": null as OpenAI does on every chunk before the usage chunk.
nlohmann::json completion_chunk(const ResponseMeta& meta, size_t index, const std::string& text,
                                nlohmann::json logprobs, const std::string& finish_reason,
                                bool include_usage);
/// OpenAI's message.tool_calls for `calls`.
nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls);
/// The streamed chat delta for one parser event: {"content"} for content and for a failed
/// call's text, else a tool_calls delta.
nlohmann::json tool_call_delta(const ToolCallEvent& event);

/// One streamed chat chunk with `delta` as given.
nlohmann::json chat_chunk(const ResponseMeta& meta, size_t index, nlohmann::json delta,
                          nlohmann::json logprobs, const std::string& finish_reason,
                          bool include_usage);
/// The final usage chunk ("choices": []), object "text_completion" or "chat.completion.chunk".
nlohmann::json usage_chunk(const ResponseMeta& meta, const char* object, const Usage& usage);

}  // namespace fdl::server
