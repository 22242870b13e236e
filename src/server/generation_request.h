// generation_request.h — internal: a POST /v1/completions or /v1/chat/completions body turned
// into what the engine is given (prompt ids, generation parameters, grammar, the chat
// template's stops, how the reply is read for tool calls), before anything is submitted.
//
// Kept apart from the handler so that the whole of a request's validation runs on a tokenizer,
// the server's options and a grammar cache alone, with no engine or model (fuzz/request_fuzz).
// Errors: ApiError 4xx for anything the client got wrong.
// Thread-safety: pure on the shared, immutable tokenizer and options; the cache is thread-safe.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "grammar/grammar_cache.h"
#include "server/generation_params.h"
#include "server/http_server.h"
#include "server/tool_choice.h"

namespace fdl {
class Tokenizer;
}

namespace fdl::server {

/// What preparing a request reads besides its body.
struct RequestEnv {
  const Tokenizer& tok;
  const ServerOptions& options;     ///< chat template and sampling defaults
  grammar::GrammarCache& grammars;  ///< compiled output grammars, shared by equal requests
  int n_ctx;                        ///< the context a prompt must leave room in
};

struct PreparedRequest {
  Endpoint endpoint;
  GenerationParams params;
  std::vector<int32_t> prompt_ids;
  std::vector<std::string> extra_stops;  ///< the chat template's end marker, if text
  std::string cache_scope;               ///< prefix-cache scope (ApiKeys::cache_scope), set by the caller
  std::string echo;                      ///< completions with `echo`: the prompt's text, sent first
  ToolCallPlan tools;                    ///< chat: how replies are read for tool calls
};

/// `ordered`: the same body parsed keeping key order (chat tools and tool calls reach the
/// template as the client wrote them; schemas keep their property order), or null.
PreparedRequest prepare_generation(const RequestEnv& env, const nlohmann::json& body, Endpoint endpoint,
                                   const nlohmann::ordered_json* ordered = nullptr);

}  // namespace fdl::server
