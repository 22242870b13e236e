// response_format.h — internal: the grammar a request's output must follow, from the
// OpenAI `response_format` and llama.cpp's `grammar` and `json_schema` fields.
//
// Accepted (both endpoints):
//  - response_format {"type": "text"} (no constraint), {"type": "json_object"} (any JSON
//    object; llama.cpp's {"type": "json_object", "schema": {...}} is a schema too),
//    {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}
//    (the schema is enforced whatever `strict` says);
//  - grammar: GBNF text (docs/GRAMMARS.md), start rule `root`;
//  - json_schema: a JSON schema object (llama.cpp's extension).
// At most one of them. JSON schemas become GBNF (grammar/json_schema.h); the GBNF is compiled
// through `cache`, so equal constraints share one Grammar and its token-mask caches.
// Errors: ApiError 400 with `param` the field and a message that names the position (the
// line and column in GBNF, the JSON pointer in a schema).
// Thread-safety: the cache is thread-safe; otherwise pure.
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "flashdllm/grammar.h"
#include "grammar/grammar_cache.h"

namespace fdl::server {

/// Null when the request sets no constraint. `ordered`: the same body parsed keeping key
/// order, where schemas are read from (their properties then come out in the schema's
/// order, as OpenAI's structured outputs do); null: from `body` (keys sorted).
std::shared_ptr<const Grammar> parse_output_grammar(const nlohmann::json& body, const nlohmann::ordered_json* ordered,
                                                    grammar::GrammarCache& cache);

}  // namespace fdl::server
