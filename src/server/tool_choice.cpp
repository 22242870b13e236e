// `tool_choice` parsed, and turned into a plan for the reply (tool_choice.h).
#include "server/tool_choice.h"

#include <optional>

#include "server/json_fields.h"
#include "server/openai_error.h"
#include "server/tool_call_grammar.h"

namespace fdl::server {
namespace {

const char* kChoiceShapes =
    "\"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}";

std::string mode_text(const ToolChoice& c) {
  return c.mode == ToolChoice::Mode::Required ? "\"required\"" : "the function '" + c.function + "'";
}

}  // namespace

ToolChoice parse_tool_choice(const nlohmann::json& body, const nlohmann::json* tools) {
  ToolChoice out;
  out.parallel = read_bool(body, "parallel_tool_calls").value_or(true);
  const nlohmann::json* choice = find_field(body, "tool_choice");
  if (choice == nullptr) return out;
  if (choice->is_string()) {
    const std::string s = choice->get<std::string>();
    if (s == "none") {
      out.mode = ToolChoice::Mode::None;
    } else if (s == "required") {
      out.mode = ToolChoice::Mode::Required;
    } else if (s != "auto") {
      throw invalid_param("tool_choice", "'tool_choice' must be " + std::string(kChoiceShapes) + ", got \"" + s + "\"");
    }
  } else {
    const nlohmann::json* type = choice->is_object() ? find_field(*choice, "type") : nullptr;
    const nlohmann::json* fn = choice->is_object() ? find_field(*choice, "function") : nullptr;
    const nlohmann::json* name = fn != nullptr && fn->is_object() ? find_field(*fn, "name") : nullptr;
    if (type == nullptr || *type != "function" || name == nullptr || !name->is_string())
      throw invalid_param("tool_choice", "'tool_choice' must be " + std::string(kChoiceShapes));
    out.mode = ToolChoice::Mode::Function;
    out.function = name->get<std::string>();
  }
  if (out.mode != ToolChoice::Mode::Required && out.mode != ToolChoice::Mode::Function) return out;
  if (tools == nullptr || !tools->is_array() || tools->empty())
    throw invalid_param("tool_choice", "'tool_choice' " + mode_text(out) + " needs 'tools'");
  if (out.mode == ToolChoice::Mode::Function) {
    for (const nlohmann::json& t : *tools)
      if (t.at("function").at("name") == out.function) return out;
    throw invalid_param("tool_choice", "'tool_choice' names the function '" + out.function + "', which is not in 'tools'");
  }
  return out;
}

ToolCallPlan plan_tool_calls(const ToolChoice& choice, const nlohmann::ordered_json& tools, const ToolCallFormat& format,
                             grammar::GrammarCache* cache) {
  ToolCallPlan plan;
  if (tools.is_null() || choice.mode == ToolChoice::Mode::None) return plan;
  const bool enforced = choice.mode == ToolChoice::Mode::Required || choice.mode == ToolChoice::Mode::Function;
  if (format.syntax == ToolCallSyntax::None) {
    if (enforced)
      throw invalid_param("tool_choice", "'tool_choice' " + mode_text(choice) +
                                             " cannot be enforced: the model's chat template writes tool calls in no "
                                             "syntax the server knows (Hermes, Llama 3, Mistral); use \"auto\"");
    return plan;  // the template gets the tools; the reply stays text
  }
  plan.format = format;
  for (const auto& t : tools) plan.names.push_back(t.at("function").at("name").get<std::string>());
  if (!choice.parallel) plan.max_calls = 1;
  if (enforced) {
    plan.grammar = compile_tool_call_grammar(
        format, tools, choice.mode == ToolChoice::Mode::Function ? std::optional(choice.function) : std::nullopt,
        choice.parallel, cache);
  }
  return plan;
}

}  // namespace fdl::server
