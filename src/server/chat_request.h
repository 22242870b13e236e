// chat_request.h — POST /v1/chat/completions body → a validated request.
//
// `messages`: a non-empty array of objects with `role` "system" | "developer" (treated as
// system, OpenAI's newer name) | "user" | "assistant" | "tool" and `content` either a string or
// an array of {"type":"text","text":...} parts (joined without separator, as OpenAI does for
// text parts); an assistant turn may carry `tool_calls` (then a null content is allowed), a
// tool turn `tool_call_id`. `tools`: an array of {"type": "function", "function": {"name",
// ...}} given to the chat template (whatever `tool_choice` is); `tool_choice` and
// `parallel_tool_calls` as tool_choice.h reads them (the grammar of "required" or a named
// function is made later, once the template's tool-call syntax is known). Refused with 400: other roles, other part types
// (images, audio), a null content otherwise, fields of the wrong type, tool names that are
// not is_valid_tool_name (tool_call_format.h) or repeat another's, a `tool_choice` that names
// no function of `tools`, and the legacy `functions` / `function_call`.
// `response_format` is read by response_format.h. `logprobs`: bool; `top_logprobs` 0..20
// needs logprobs = true.
// Thread-safety: pure functions.
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "server/chat_template.h"
#include "server/generation_params.h"
#include "server/tool_choice.h"

namespace fdl::server {

inline constexpr int kMaxChatTopLogprobs = 20;

struct ChatRequest {
  GenerationParams params;
  std::vector<ChatMessage> messages;
  nlohmann::ordered_json tools;  ///< the tools for the template, in the client's key order; null for none
  ToolChoice tool_choice;        ///< validated against `tools`
};

/// Throws ApiError 400 naming the field (e.g. "messages[1].content"). `ordered`, the same body
/// parsed keeping key order, is where tools and tool calls are taken from (templates print
/// them as the client wrote them); without it they come from `body` (keys sorted).
ChatRequest parse_chat_request(const nlohmann::json& body, const SamplingParams& defaults = {},
                               const nlohmann::ordered_json* ordered = nullptr);

}  // namespace fdl::server
