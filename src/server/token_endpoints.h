// token_endpoints.h — llama.cpp server's tokenizer endpoints over the model's vocabulary and
// chat template, for clients that count tokens or check prompts before sending them:
//   POST /tokenize       {"content": str, "add_special": bool = false, "parse_special": bool =
//                        true, "with_pieces": bool = false} -> {"tokens": [id, ...]}, or with
//                        pieces {"tokens": [{"id": id, "piece": str, or the bytes as a list of
//                        ints where the piece is not whole UTF-8}, ...]}
//   POST /detokenize     {"tokens": [id, ...]} -> {"content": str} (incomplete UTF-8 as U+FFFD)
//   POST /apply-template {"messages": [...]} (as /v1/chat/completions takes them) ->
//                        {"prompt": str}: the text the chat template renders for them
// Each throws ApiError 400 naming the field for a bad request (ids outside the vocabulary,
// wrong types), and for /apply-template what chat requests get (no template, a refusal).
// They take the tokenizer and options rather than the server, so they run without an engine.
// Thread-safety: pure on the shared, immutable tokenizer and template.
#pragma once

#include <nlohmann/json.hpp>

#include "server/http_server.h"

namespace fdl {
class Tokenizer;
}

namespace fdl::server {

nlohmann::json handle_tokenize(const Tokenizer& tok, const nlohmann::json& body);
nlohmann::json handle_detokenize(const Tokenizer& tok, const nlohmann::json& body);
/// `ordered`: the same body parsed keeping key order (as chat completions take it), or null.
nlohmann::json handle_apply_template(const Tokenizer& tok, const ServerOptions& options, const nlohmann::json& body,
                                     const nlohmann::ordered_json* ordered = nullptr);

}  // namespace fdl::server
