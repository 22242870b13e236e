// tool_call_grammar.h — internal: the grammar that makes a reply a tool call, for
// `tool_choice` "required" or a named function: exactly the text the chat template writes for
// a call (tool_call_format.h), with arguments that follow the function's `parameters` JSON
// schema (grammar/json_schema.h).
//
// Shapes, per syntax (NAME the function, ARGS its arguments; spacing as the templates write):
//  - Hermes:            <tool_call>\n{"name": "NAME", "arguments": ARGS}\n</tool_call>
//                       (required: one or more, separated by "\n", unless not parallel)
//  - Llama3Json:        <|python_tag|>? {"name": "NAME", "parameters": ARGS}
//                       (always one call: the Llama 3 templates refuse a turn of several)
//  - MistralJsonArray:  [TOOL_CALLS][{"name": "NAME", "arguments": ARGS}, ...] where each
//                       call may end with , "id": "ID" (9 alphanumerics) when the template
//                       writes ids (required: one or more, separated by ", ")
//  - MistralNameArgs:   [TOOL_CALLS]NAME[ARGS]ARGS, with an optional [CALL_ID]ID before
//                       [ARGS] where the template writes one (required: one or more)
// A function without `parameters` takes exactly {} (OpenAI: no parameters).
// Special tokens such as <|python_tag|> and [TOOL_CALLS] are written as their text: the
// grammar is matched on the text of the tokens, and the engine keeps special tokens' text when
// skip_special_tokens is false.
//
// Errors: GrammarError from tool_call_gbnf when a function's schema cannot be converted
// (`where` names tools[i].function.parameters); compile_tool_call_grammar turns any failure
// into ApiError 400 (param "tools") naming the function.
// Thread-safety: pure functions.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "flashdllm/grammar.h"
#include "grammar/grammar_cache.h"
#include "server/tool_call_format.h"

namespace fdl::server {

/// GBNF (root rule `root`) for the tool-call text of `format` over `tools` (the request's
/// array of {"type": "function", "function": {"name", "parameters"?}}): `only` set, exactly
/// one call of that function; else one or more calls of any of them (exactly one when not
/// `parallel`: OpenAI's parallel_tool_calls false). Arguments' properties
/// come in the order of each schema's `properties` (alphabetical for nlohmann::json, whose
/// keys are sorted). Throws GrammarError, and std::invalid_argument for syntax None or an
/// `only` that is not among the tools.
std::string tool_call_gbnf(ToolCallFormat format, const nlohmann::ordered_json& tools, std::optional<std::string> only,
                           bool parallel = true);
std::string tool_call_gbnf(ToolCallFormat format, const nlohmann::json& tools, std::optional<std::string> only,
                           bool parallel = true);

/// tool_call_gbnf compiled, through `cache` where given (requests with the same tools share
/// one Grammar and its token-mask caches). Throws ApiError 400 (param "tools") naming the
/// function whose parameters cannot be enforced.
std::shared_ptr<const Grammar> compile_tool_call_grammar(ToolCallFormat format, const nlohmann::ordered_json& tools,
                                                         std::optional<std::string> only, bool parallel = true,
                                                         grammar::GrammarCache* cache = nullptr);

}  // namespace fdl::server
