// A chat template's tool-call syntax, found by rendering a probe call (tool_call_format.h).
#include "server/tool_call_format.h"

#include <algorithm>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>

#include "jinja/template.h"

namespace fdl::server {
namespace {

// Names unlikely to appear in a template's own text, so that finding them in the rendering
// can only mean the probe call.
constexpr std::string_view kProbeName = "probe_function";
constexpr std::string_view kLongProbeId = "call_Pr0beIdentifier0123456";
constexpr std::string_view kShortProbeId = "Pr0beId09";

nlohmann::ordered_json probe_variables(std::string_view id) {
  using J = nlohmann::ordered_json;
  const J call = {{"id", id},
                  {"type", "function"},
                  {"function", {{"name", kProbeName}, {"arguments", {{"probe_argument", 1}}}}}};
  const J parameters = {{"type", "object"},
                        {"properties", {{"probe_argument", {{"type", "integer"}, {"description", "a number"}}}}},
                        {"required", J::array({"probe_argument"})}};
  // As ChatRenderer gives them: every message has a string content.
  const J messages = J::array({{{"role", "user"}, {"content", "Call the probe."}},
                               {{"role", "assistant"}, {"content", ""}, {"tool_calls", J::array({call})}},
                               {{"role", "tool"}, {"content", "1"}, {"tool_call_id", id}}});
  const J tools = J::array({{{"type", "function"},
                             {"function", {{"name", kProbeName}, {"description", "A probe."}, {"parameters", parameters}}}}});
  return {{"messages", messages},
          {"tools", tools},
          {"add_generation_prompt", true},
          {"bos_token", ""},
          {"eos_token", ""}};
}

std::optional<std::string> render_probe(const jinja::Template& tmpl, std::string_view id) {
  try {
    return tmpl.render(jinja::chat_context(probe_variables(id)));
  } catch (const std::exception&) {  // the template refuses the probe (its ids, its roles): no answer
    return std::nullopt;
  }
}

bool contains(std::string_view text, const std::string& what) { return text.find(what) != std::string_view::npos; }

}  // namespace

ToolCallFormat classify_probe_rendering(std::string_view rendered, bool nine_char_ids) {
  const std::string name(kProbeName), quoted = "\"" + name + "\"";
  ToolCallFormat f;
  f.nine_char_ids = nine_char_ids;
  if (contains(rendered, std::string(kMistralCalls) + name + std::string(kMistralCallId))) {
    f.syntax = ToolCallSyntax::MistralNameArgs;
    f.call_id_marker = true;
  } else if (contains(rendered, std::string(kMistralCalls) + name + std::string(kMistralArgs))) {
    f.syntax = ToolCallSyntax::MistralNameArgs;
  } else if (contains(rendered, std::string(kMistralCalls) + "[{\"name\": " + quoted + ", \"arguments\": ")) {
    f.syntax = ToolCallSyntax::MistralJsonArray;
  } else if (contains(rendered, std::string(kHermesOpen) + "\n{\"name\": " + quoted + ", \"arguments\": ")) {
    f.syntax = ToolCallSyntax::Hermes;
  } else if (contains(rendered, "{\"name\": " + quoted + ", \"parameters\": ")) {
    f.syntax = ToolCallSyntax::Llama3Json;
  } else {
    return ToolCallFormat{};
  }
  return f;
}

ToolCallFormat detect_tool_call_format(const jinja::Template& tmpl) {
  if (const auto text = render_probe(tmpl, kLongProbeId)) return classify_probe_rendering(*text, false);
  if (const auto text = render_probe(tmpl, kShortProbeId)) return classify_probe_rendering(*text, true);
  return ToolCallFormat{};
}

std::string_view tool_call_syntax_name(ToolCallSyntax s) {
  switch (s) {
    case ToolCallSyntax::Hermes:
      return "hermes";
    case ToolCallSyntax::Llama3Json:
      return "llama3_json";
    case ToolCallSyntax::MistralJsonArray:
      return "mistral_json_array";
    case ToolCallSyntax::MistralNameArgs:
      return "mistral_name_args";
    case ToolCallSyntax::None:
      break;
  }
  return "none";
}

std::string new_tool_call_id(const ToolCallFormat& format) {
  static constexpr char kAlnum[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof kAlnum - 2);
  std::string id = format.nine_char_ids ? "" : "call_";
  for (int i = 0, n = format.nine_char_ids ? 9 : 24; i < n; ++i) id += kAlnum[pick(rng)];
  return id;
}

bool is_tool_name_char(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == '-' ||
         c == '.' || c == ':';
}

bool is_valid_tool_name(std::string_view name) {
  return !name.empty() && name.size() <= kMaxToolNameBytes && std::all_of(name.begin(), name.end(), is_tool_name_char);
}

}  // namespace fdl::server
