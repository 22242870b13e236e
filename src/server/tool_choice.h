// tool_choice.h — internal: a chat request's `tool_choice`, and what it means for generating
// and reading the reply.
//
// `tool_choice`: "auto" (the default: the model may call tools or answer), "none" (the reply
// is not read for calls; the template still gets the tools, as vLLM gives them, since some
// templates need them), "required" (the reply is one or more calls) or
// {"type": "function", "function": {"name": N}} (the reply is one call of N). "required" and a
// named function are enforced by a grammar (tool_call_grammar.h), which needs a template whose
// tool-call syntax is known (tool_call_format.h). `parallel_tool_calls` false: at most one
// call, by the grammar under "required" and, under "auto", by ending the reply where a second
// call begins (tool_call_parser.h).
// Errors: ApiError 400, param "parallel_tool_calls" (not a boolean), "tool_choice" (a bad value, a function not among `tools`, a
// choice that needs tools without tools, or one the template's syntax cannot enforce) or
// "tools" (parameters that cannot become a grammar).
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "flashdllm/grammar.h"
#include "grammar/grammar_cache.h"
#include "server/tool_call_format.h"

namespace fdl::server {

struct ToolChoice {
  enum class Mode { Auto, None, Required, Function };
  Mode mode = Mode::Auto;
  std::string function;  ///< Mode::Function: the function's name
  bool parallel = true;  ///< `parallel_tool_calls`: several calls in one reply allowed
};

/// `tool_choice` and `parallel_tool_calls` of `body`, checked against `tools` (the request's
/// validated tools array, or null / absent for none). Absent or null: Auto, parallel.
ToolChoice parse_tool_choice(const nlohmann::json& body, const nlohmann::json* tools);

/// How one request's reply is constrained and read for its tools.
struct ToolCallPlan {
  ToolCallFormat format;                   ///< syntax None: the reply is not read for calls
  std::vector<std::string> names;          ///< the request's functions
  std::shared_ptr<const Grammar> grammar;  ///< required / named: the calls the reply must be
  size_t max_calls = SIZE_MAX;             ///< calls kept from the reply (1: not parallel)
};

/// The plan for `choice` over `tools` (the tools the template gets; null when none) with a
/// template that writes calls as `format`. Without tools, or with "none", nothing is read.
/// With a template of no known syntax, "auto" leaves the reply as text and "required" or a
/// named function is a 400. Grammars are compiled through `cache` where given.
ToolCallPlan plan_tool_calls(const ToolChoice& choice, const nlohmann::ordered_json& tools, const ToolCallFormat& format,
                             grammar::GrammarCache* cache = nullptr);

}  // namespace fdl::server
