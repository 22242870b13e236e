// chat_request.h — POST /v1/chat/completions body → a validated request.
//
// `messages`: a non-empty array of objects with `role` "system" | "developer" (treated as
// system, OpenAI's newer name) | "user" | "assistant" and `content` either a string or an
// array of {"type":"text","text":...} parts (joined without separator, as OpenAI does for
// text parts). Refused with 400: other roles (tool/function calling is not supported), other
// part types (images, audio), a null content, `name` of the wrong type. `logprobs`: bool;
// `top_logprobs` 0..20 needs logprobs = true. `tools`, `functions`, `tool_choice`,
// `function_call` and a `response_format` other than {"type":"text"} are refused as
// unsupported.
// Thread-safety: pure functions.
#pragma once

#include <vector>

#include <nlohmann/json.hpp>

#include "server/chat_template.h"
#include "server/generation_params.h"

namespace fdl::server {

inline constexpr int kMaxChatTopLogprobs = 20;

struct ChatRequest {
  GenerationParams params;
  std::vector<ChatMessage> messages;
};

/// Throws ApiError 400 naming the field (e.g. "messages[1].content").
ChatRequest parse_chat_request(const nlohmann::json& body, const SamplingParams& defaults = {});

}  // namespace fdl::server
