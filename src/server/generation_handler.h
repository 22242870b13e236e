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

#include "server/generation_params.h"
#include "server/server_context.h"

namespace fdl::server {

void handle_generation(ServerContext& ctx, const nlohmann::json& body, Endpoint endpoint,
                       httplib::Response& res);

}  // namespace fdl::server
