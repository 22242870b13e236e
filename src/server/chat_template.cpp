#include "server/chat_template.h"

#include "flashdllm/tokenizer.h"

namespace fdl::server {
namespace {

std::string_view trim(std::string_view s) {
  const auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; };
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// Llama 2 has no system turn: system text goes into a <<SYS>> block at the head of the next
// user turn. Several system messages before one user turn are joined by a blank line.
std::string render_llama2(const std::vector<ChatMessage>& messages) {
  std::string out;
  std::string pending_system;
  bool after_assistant = false;
  for (const ChatMessage& m : messages) {
    if (m.role == "system") {
      if (!pending_system.empty()) pending_system += "\n\n";
      pending_system += m.content;
    } else if (m.role == "user") {
      if (after_assistant) out += "<s>";  // each later exchange opens with BOS
      out += "[INST] ";
      if (!pending_system.empty()) {
        out += "<<SYS>>\n" + pending_system + "\n<</SYS>>\n\n";
        pending_system.clear();
      }
      out += m.content + " [/INST]";
      after_assistant = false;
    } else {  // assistant
      out += " " + m.content + " </s>";
      after_assistant = true;
    }
  }
  // A system message with no user turn after it still reaches the model.
  if (!pending_system.empty()) {
    if (after_assistant) out += "<s>";
    out += "[INST] <<SYS>>\n" + pending_system + "\n<</SYS>>\n\n [/INST]";
  }
  return out;
}

std::string render_llama3(const std::vector<ChatMessage>& messages) {
  std::string out;
  for (const ChatMessage& m : messages) {
    out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n";
    out += trim(m.content);
    out += "<|eot_id|>";
  }
  out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

std::string render_chatml(const std::vector<ChatMessage>& messages) {
  std::string out;
  for (const ChatMessage& m : messages) {
    out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  out += "<|im_start|>assistant\n";
  return out;
}

}  // namespace

std::optional<ChatTemplate> parse_chat_template_name(std::string_view name) {
  if (name == "llama2") return ChatTemplate::Llama2;
  if (name == "llama3") return ChatTemplate::Llama3;
  if (name == "chatml") return ChatTemplate::ChatML;
  return std::nullopt;
}

const char* chat_template_name(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::Llama2: return "llama2";
    case ChatTemplate::Llama3: return "llama3";
    case ChatTemplate::ChatML: return "chatml";
  }
  return "?";
}

std::optional<ChatTemplate> detect_chat_template(std::string_view jinja) {
  // Most specific markers first: a Llama 3 or ChatML template may mention "[INST]" in a
  // comment or a branch, never the other way round.
  if (jinja.find("<|im_start|>") != std::string_view::npos) return ChatTemplate::ChatML;
  if (jinja.find("<|start_header_id|>") != std::string_view::npos) return ChatTemplate::Llama3;
  if (jinja.find("[INST]") != std::string_view::npos) return ChatTemplate::Llama2;
  return std::nullopt;
}

std::string render_chat(ChatTemplate t, const std::vector<ChatMessage>& messages) {
  switch (t) {
    case ChatTemplate::Llama2: return render_llama2(messages);
    case ChatTemplate::Llama3: return render_llama3(messages);
    case ChatTemplate::ChatML: return render_chatml(messages);
  }
  return {};
}

std::string_view end_of_turn_marker(ChatTemplate t) {
  switch (t) {
    case ChatTemplate::Llama2: return "</s>";
    case ChatTemplate::Llama3: return "<|eot_id|>";
    case ChatTemplate::ChatML: return "<|im_end|>";
  }
  return {};
}

std::vector<std::string> template_stop_strings(ChatTemplate t, const Tokenizer& tokenizer) {
  const std::string_view marker = end_of_turn_marker(t);
  const int32_t id = tokenizer.token_id(marker);
  if (id >= 0 && tokenizer.is_eog(id)) return {};
  return {std::string(marker)};
}

}  // namespace fdl::server
