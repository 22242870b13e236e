#include "server/chat_request.h"

#include "server/json_fields.h"
#include "server/openai_error.h"

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
  if (out.role != "system" && out.role != "user" && out.role != "assistant") {
    throw invalid_param(at + ".role", "role '" + role->get<std::string>() +
                                          "' is not supported (system, developer, user, "
                                          "assistant)");
  }
  const auto content = m.find("content");
  if (content == m.end() || content->is_null()) {
    throw invalid_param(at + ".content", "'" + at + ".content' is required");
  }
  out.content = content_text(*content, at + ".content");
  if (const auto name = m.find("name"); name != m.end() && !name->is_null() && !name->is_string()) {
    throw invalid_param(at + ".name", "'" + at + ".name' must be a string");
  }
  return out;
}

void refuse_unsupported(const nlohmann::json& body) {
  for (const char* field : {"tools", "functions", "tool_choice", "function_call"}) {
    const nlohmann::json* v = find_field(body, field);
    if (v != nullptr && !(v->is_array() && v->empty())) {
      throw invalid_param(field, std::string("'") + field +
                                     "' is not supported (no tool or function calling)");
    }
  }
  if (const nlohmann::json* rf = find_field(body, "response_format")) {
    const auto type = rf->is_object() ? rf->find("type") : rf->end();
    if (!rf->is_object() || type == rf->end() || !type->is_string() || *type != "text") {
      throw invalid_param("response_format",
                          "only 'response_format' {\"type\": \"text\"} is supported");
    }
  }
}

}  // namespace

ChatRequest parse_chat_request(const nlohmann::json& body, const SamplingParams& defaults) {
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
  refuse_unsupported(body);
  return r;
}

}  // namespace fdl::server
