#include "server/chat_request.h"

#include <map>
#include <string>

#include "server/json_fields.h"
#include "server/openai_error.h"
#include "server/ordered_json_parser.h"
#include "server/tool_call_format.h"

namespace fdl::server {
namespace {

std::string content_text(const nlohmann::json& content, const std::string& where) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) {
    throw invalid_param(where, "'" + where + "' must be a string or an array of text parts, got " +
                                   json_type_name(content));
  }
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) {
    const nlohmann::json& part = content[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    if (!part.is_object()) {
      throw invalid_param(at, "'" + at + "' must be an object, got " + json_type_name(part));
    }
    const auto type = part.find("type");
    if (type == part.end() || !type->is_string()) {
      throw invalid_param(at + ".type", "'" + at + ".type' must be a string");
    }
    if (*type != "text") {
      throw invalid_param(at + ".type", "content part type '" + type->get<std::string>() +
                                            "' is not supported (only 'text')");
    }
    const auto t = part.find("text");
    if (t == part.end() || !t->is_string()) {
      throw invalid_param(at + ".text", "'" + at + ".text' must be a string");
    }
    text += t->get<std::string>();
  }
  return text;
}

// An assistant turn's tool_calls (from either JSON flavour), with each call's `arguments`
// string parsed to the object it holds where it holds one; key order kept.
template <typename J>
nlohmann::ordered_json parse_tool_calls(const J& calls, const std::string& at) {
  if (!calls.is_array()) throw invalid_param(at, "'" + at + "' must be an array, got " + std::string(calls.type_name()));
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    const std::string here = at + "[" + std::to_string(k) + "]";
    const J& c = calls[k];
    const bool named = c.is_object() && c.contains("function") && c["function"].is_object() &&
                       c["function"].contains("name") && c["function"]["name"].is_string();
    if (!named) throw invalid_param(here + ".function.name", "'" + here + ".function.name' must be a string");
    nlohmann::ordered_json call = parse_ordered_json(c.dump());
    const auto& fn = c["function"];
    if (fn.contains("arguments") && fn["arguments"].is_string()) {
      check_json_nesting(fn["arguments"].template get_ref<const std::string&>(), here + ".function.arguments",
                         "'" + here + ".function.arguments'");
      const auto parsed = parse_ordered_json(fn["arguments"].template get_ref<const std::string&>());
      if (parsed.is_object()) call["function"]["arguments"] = parsed;
    } else if (fn.contains("arguments") && !fn["arguments"].is_object()) {
      throw invalid_param(here + ".function.arguments", "'" + here + ".function.arguments' must be a JSON string");
    }
    out.push_back(std::move(call));
  }
  return out;
}

ChatMessage parse_message(const nlohmann::json& m, size_t i) {
  const std::string at = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) {
    throw invalid_param(at, "'" + at + "' must be an object, got " + json_type_name(m));
  }
  const auto role = m.find("role");
  if (role == m.end() || !role->is_string()) {
    throw invalid_param(at + ".role", "'" + at + ".role' must be a string");
  }
  ChatMessage out;
  out.role = role->get<std::string>();
  if (out.role == "developer") out.role = "system";
  if (out.role != "system" && out.role != "user" && out.role != "assistant" && out.role != "tool") {
    throw invalid_param(at + ".role", "role '" + role->get<std::string>() +
                                          "' is not supported (system, developer, user, assistant, tool)");
  }
  if (const auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
    if (out.role != "assistant") throw invalid_param(at + ".tool_calls", "only assistant turns carry 'tool_calls'");
    out.tool_calls = parse_tool_calls(*calls, at + ".tool_calls");
  }
  const auto content = m.find("content");
  if (content == m.end() || content->is_null()) {
    if (out.tool_calls.is_null()) throw invalid_param(at + ".content", "'" + at + ".content' is required");
  } else {
    out.content = content_text(*content, at + ".content");
  }
  if (const auto name = m.find("name"); name != m.end() && !name->is_null()) {
    if (!name->is_string()) throw invalid_param(at + ".name", "'" + at + ".name' must be a string");
    out.name = name->get<std::string>();
  }
  if (const auto id = m.find("tool_call_id"); id != m.end() && !id->is_null()) {
    if (!id->is_string()) throw invalid_param(at + ".tool_call_id", "'" + at + ".tool_call_id' must be a string");
    out.tool_call_id = id->get<std::string>();
  }
  return out;
}

// `tools` (for the template, in the key order of `ordered` where given; null when none) and
// `tool_choice`; the legacy function-calling fields are refused.
nlohmann::ordered_json parse_tools(const nlohmann::json& body, const nlohmann::ordered_json* ordered,
                                   ToolChoice& choice) {
  for (const char* field : {"functions", "function_call"}) {
    const nlohmann::json* v = find_field(body, field);
    if (v != nullptr && !(v->is_array() && v->empty()))
      throw invalid_param(field, std::string("'") + field + "' is not supported (use 'tools')");
  }
  const nlohmann::json* tools = find_field(body, "tools");
  if (tools != nullptr && !tools->is_array())
    throw invalid_param("tools", "'tools' must be an array, got " + json_type_name(*tools));
  std::map<std::string, size_t> seen;  // name -> index of the tool that has it
  for (size_t i = 0; tools != nullptr && i < tools->size(); ++i) {
    const nlohmann::json& t = (*tools)[i];
    const std::string tool_at = "'tools[" + std::to_string(i) + "]";
    // Chat completions take function tools only (OpenAI's rule): another kind would reach the
    // template as if it were one.
    const nlohmann::json* type = t.is_object() ? find_field(t, "type") : nullptr;
    if (type == nullptr || !type->is_string() || *type != "function")
      throw invalid_param("tools", tool_at + ".type' must be \"function\"" +
                                       (type != nullptr ? ", got " + type->dump() : std::string()));
    const nlohmann::json* fn = t.is_object() ? find_field(t, "function") : nullptr;
    const nlohmann::json* name = fn != nullptr && fn->is_object() ? find_field(*fn, "name") : nullptr;
    const std::string at = tool_at + ".function.name'";
    if (name == nullptr || !name->is_string()) throw invalid_param("tools", at + " must be a string");
    // A name the parser cannot read back would turn an enforced call into content; two tools
    // of one name would make a call ambiguous.
    const std::string& text = name->get_ref<const std::string&>();
    if (const nlohmann::json* d = find_field(*fn, "description"); d != nullptr && !d->is_null() && !d->is_string())
      throw invalid_param("tools", tool_at + ".function.description' must be a string");
    if (!is_valid_tool_name(text))
      throw invalid_param("tools", at + " must be 1 to " + std::to_string(kMaxToolNameBytes) +
                                       " characters from a-z, A-Z, 0-9, '_', '-', '.' and ':'");
    if (const auto [it, fresh] = seen.emplace(text, i); !fresh)
      throw invalid_param("tools",
                          at + " repeats the name '" + text + "' of tools[" + std::to_string(it->second) + "]");
    // Arguments are a JSON object (OpenAI's rule): a schema for anything else would make the
    // model write calls no parser reads as calls.
    if (const nlohmann::json* params = find_field(*fn, "parameters")) {
      const std::string pat = "'tools[" + std::to_string(i) + "].function.parameters'";
      if (!params->is_object()) throw invalid_param("tools", pat + " must be a JSON schema object");
      const nlohmann::json* type = find_field(*params, "type");
      if (type != nullptr && !(type->is_string() && *type == "object"))
        throw invalid_param("tools", pat + " must describe an object (\"type\": \"object\"), got " + type->dump());
    }
  }
  choice = parse_tool_choice(body, tools);
  if (tools == nullptr || tools->empty()) return nullptr;
  return ordered != nullptr && ordered->is_object() && ordered->contains("tools") ? (*ordered)["tools"]
                                                                                 : parse_ordered_json(tools->dump());
}

}  // namespace

ChatRequest parse_chat_request(const nlohmann::json& body, const SamplingParams& defaults,
                               const nlohmann::ordered_json* ordered) {
  ChatRequest r;
  r.params = parse_generation_params(body, Endpoint::Chat, defaults);
  const nlohmann::json* messages = find_field(body, "messages");
  if (messages == nullptr) throw invalid_param("messages", "'messages' is required");
  if (!messages->is_array()) {
    throw invalid_param("messages", "'messages' must be an array, got " + json_type_name(*messages));
  }
  if (messages->empty()) throw invalid_param("messages", "'messages' must not be empty");
  for (size_t i = 0; i < messages->size(); ++i) r.messages.push_back(parse_message((*messages)[i], i));

  const bool logprobs = read_bool(body, "logprobs").value_or(false);
  const auto top = read_int(body, "top_logprobs", 0, kMaxChatTopLogprobs);
  if (top && !logprobs) {
    throw invalid_param("top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
  }
  if (logprobs) r.params.logprobs = int32_t(top.value_or(0));
  r.tools = parse_tools(body, ordered, r.tool_choice);
  // Tool calls again from the ordered body: their arguments print in the client's key order.
  if (ordered != nullptr && ordered->is_object() && ordered->contains("messages") && (*ordered)["messages"].is_array())
    for (size_t i = 0; i < r.messages.size() && i < (*ordered)["messages"].size(); ++i)
      if (!r.messages[i].tool_calls.is_null())
        r.messages[i].tool_calls =
            parse_tool_calls((*ordered)["messages"][i]["tool_calls"], "messages[" + std::to_string(i) + "].tool_calls");
  return r;
}

}  // namespace fdl::server
