// generation_handler.h — internal: POST /v1/completions and /v1/chat/completions, from the
// parsed body to the response (whole JSON, or an SSE stream fed by the engine).
//
// Errors: throws ApiError for client errors found before anything is submitted (bad fields,
// prompt too long, no chat template) and for 503 while draining; the caller turns it into
// the error response. After submission, failures are reported in the response itself.
// Threading: runs on the HTTP connection thread; a whole response blocks it until every choice
// is done, a stream's content provider (also on that thread) drains the RequestStream.
#pragma once

#include <httplib.h>

#include <nlohmann/json.hpp>

#include <string>

#include "server/generation_params.h"
#include "server/server_context.h"

namespace fdl::server {

/// `cache_scope` keys the request's prefix-cache sharing (ApiKeys::cache_scope: the key the
/// request authenticated with): requests share KV blocks only with requests of the same scope.
/// `ordered`: the same body parsed keeping key order (chat tools and tool calls reach the
/// template as the client wrote them), or null.
void handle_generation(ServerContext& ctx, const nlohmann::json& body, Endpoint endpoint,
                       const std::string& cache_scope, httplib::Response& res,
                       const nlohmann::ordered_json* ordered = nullptr);


}  // namespace fdl::server
