// sse.h — Server-Sent Events framing for streamed responses, as OpenAI streams them:
// one `data: <json>\n\n` event per chunk and a final `data: [DONE]\n\n`.
//
// JSON text never contains a raw newline (strings escape it), so one `data:` line per event
// is always enough. A comment line (": ...\n\n") keeps idle streams probed: writing it is
// how a vanished client is noticed while a request waits for its first token (SSE clients
// ignore comments by the spec).
// Thread-safety: pure functions.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace fdl::server {

/// "data: " + compact JSON (invalid UTF-8 replaced) + "\n\n".
std::string sse_event(const nlohmann::json& payload);
/// "data: [DONE]\n\n".
std::string sse_done();
/// ": keep-alive\n\n".
std::string sse_comment();

}  // namespace fdl::server
