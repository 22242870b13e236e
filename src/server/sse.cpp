#include "server/sse.h"

#include "server/openai_error.h"

namespace fdl::server {

std::string sse_event(const nlohmann::json& payload) { return "data: " + dump_json(payload) + "\n\n"; }

std::string sse_done() { return "data: [DONE]\n\n"; }

std::string sse_comment() { return ": keep-alive\n\n"; }

}  // namespace fdl::server
