// The grammar of a reply that is tool calls (tool_call_grammar.h).
#include "server/tool_call_grammar.h"

#include <stdexcept>
#include <utility>
#include <vector>

#include "grammar/gbnf_text.h"
#include "grammar/json_schema.h"
#include "server/openai_error.h"
#include "server/ordered_json_parser.h"

namespace fdl::server {
namespace {

using grammar::gbnf_quote;

struct Function {
  size_t index = 0;  // in the request's tools
  std::string name;
  const nlohmann::ordered_json* parameters = nullptr;  // null: none
};

std::vector<Function> functions_of(const nlohmann::ordered_json& tools, const std::optional<std::string>& only) {
  std::vector<Function> out;
  for (size_t i = 0; i < tools.size(); ++i) {
    const nlohmann::ordered_json& fn = tools[i].at("function");
    Function f{i, fn.at("name").get<std::string>(), nullptr};
    if (const auto p = fn.find("parameters"); p != fn.end() && !p->is_null()) f.parameters = &*p;
    if (!only || f.name == *only) out.push_back(std::move(f));
  }
  if (out.empty())
    throw std::invalid_argument(only ? "tool_call_gbnf: no function named '" + *only + "' among the tools"
                                     : std::string("tool_call_gbnf: no tools"));
  return out;
}

// One call of function `name` whose arguments match the expression `args`.
std::string call_body(const ToolCallFormat& f, const std::string& name, const std::string& args) {
  const std::string json_name = nlohmann::json(name).dump();  // as tojson writes it
  switch (f.syntax) {
    case ToolCallSyntax::Hermes:
      return gbnf_quote(std::string(kHermesOpen) + "\n{\"name\": " + json_name + ", \"arguments\": ") + " " + args +
             " " + gbnf_quote("}\n" + std::string(kHermesClose));
    case ToolCallSyntax::Llama3Json:
      return gbnf_quote("{\"name\": " + json_name + ", \"parameters\": ") + " " + args + " " + gbnf_quote("}");
    case ToolCallSyntax::MistralJsonArray:
      return gbnf_quote("{\"name\": " + json_name + ", \"arguments\": ") + " " + args +
             (f.nine_char_ids ? " tool-call-id?" : "") + " " + gbnf_quote("}");
    case ToolCallSyntax::MistralNameArgs:
      return gbnf_quote(std::string(kMistralCalls) + name) + (f.call_id_marker ? " tool-call-id?" : "") + " " +
             gbnf_quote(std::string(kMistralArgs)) + " " + args;
    case ToolCallSyntax::None:
      break;
  }
  throw std::invalid_argument("tool_call_gbnf: the chat template has no tool-call syntax");
}

// The id a Mistral template writes after a call: its JSON "id" member or its [CALL_ID] marker.
std::string id_rule(const ToolCallFormat& f) {
  const std::string id = f.nine_char_ids ? "[a-zA-Z0-9]{9}" : "[a-zA-Z0-9]{1,64}";
  if (f.syntax == ToolCallSyntax::MistralJsonArray && f.nine_char_ids)
    return "tool-call-id ::= " + gbnf_quote(", \"id\": \"") + " " + id + " " + gbnf_quote("\"") + "\n";
  if (f.syntax == ToolCallSyntax::MistralNameArgs && f.call_id_marker)
    return "tool-call-id ::= " + gbnf_quote(std::string(kMistralCallId)) + " " + id + "\n";
  return "";
}

std::string root_body(const ToolCallFormat& f, bool several) {
  switch (f.syntax) {
    case ToolCallSyntax::Hermes:
      return several ? "tool-call (" + gbnf_quote("\n") + " tool-call)*" : "tool-call";
    case ToolCallSyntax::Llama3Json:
      return gbnf_quote(std::string(kPythonTag)) + "? tool-call";
    case ToolCallSyntax::MistralJsonArray:
      return gbnf_quote(std::string(kMistralCalls) + "[") + " tool-call" +
             (several ? " (" + gbnf_quote(", ") + " tool-call)*" : "") + " " + gbnf_quote("]");
    case ToolCallSyntax::MistralNameArgs:
      return several ? "tool-call+" : "tool-call";
    case ToolCallSyntax::None:
      break;
  }
  throw std::invalid_argument("tool_call_gbnf: the chat template has no tool-call syntax");
}

}  // namespace

std::string tool_call_gbnf(ToolCallFormat format, const nlohmann::json& tools, std::optional<std::string> only,
                           bool parallel) {
  return tool_call_gbnf(format, parse_ordered_json(tools.dump()), std::move(only), parallel);
}

std::string tool_call_gbnf(ToolCallFormat format, const nlohmann::ordered_json& tools, std::optional<std::string> only,
                           bool parallel) {
  const std::vector<Function> functions = functions_of(tools, only);
  grammar::SchemaConverter converter;
  std::string rules, choice;
  for (size_t k = 0; k < functions.size(); ++k) {
    const Function& f = functions[k];
    std::string args = gbnf_quote("{}");
    if (f.parameters != nullptr) {
      // Arguments are an object even where the schema leaves the type open ({}, a bare
      // anyOf): any other value would make the model write a call no parser reads as one.
      nlohmann::ordered_json params = *f.parameters;
      if (params.is_object() && (!params.contains("type") || params["type"].is_null())) params["type"] = "object";
      try {
        args = converter.add(params, "tool-args-" + std::to_string(k));
      } catch (const GrammarError& e) {
        throw GrammarError("tools[" + std::to_string(f.index) + "].function.parameters" + e.where(),
                           "function '" + f.name + "': " + e.reason());
      }
    }
    const std::string rule = "tool-call-" + std::to_string(k);
    rules += rule + " ::= " + call_body(format, f.name, args) + "\n";
    choice += (k == 0 ? "" : " | ") + rule;
  }
  std::string text = converter.gbnf(root_body(format, !only && parallel));
  if (!text.empty() && text.back() != '\n') text += '\n';
  return text + "tool-call ::= " + choice + "\n" + rules + id_rule(format);
}

std::shared_ptr<const Grammar> compile_tool_call_grammar(ToolCallFormat format, const nlohmann::ordered_json& tools,
                                                         std::optional<std::string> only, bool parallel,
                                                         grammar::GrammarCache* cache) {
  std::string text;
  try {
    text = tool_call_gbnf(format, tools, only, parallel);
  } catch (const GrammarError& e) {
    throw ApiError(400, std::string("the tool's parameters cannot be enforced: ") + e.what(), "tools");
  }
  try {
    return cache != nullptr ? cache->get(text) : Grammar::compile(text);
  } catch (const GrammarError& e) {
    // Name the function: the first whose grammar alone does not compile either.
    std::string culprit;
    for (const Function& f : functions_of(tools, only)) {
      try {
        Grammar::compile(tool_call_gbnf(format, tools, f.name));
      } catch (const GrammarError&) {
        culprit = f.name;
        break;
      }
    }
    throw ApiError(400,
                   "the parameters of " + (culprit.empty() ? std::string("the tools") : "function '" + culprit + "'") +
                       " cannot be enforced as a grammar: " + e.what(),
                   "tools");
  }
}

}  // namespace fdl::server
