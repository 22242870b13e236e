// chat_renderer.h — chat messages to prompt ids, with the model's own Jinja chat template
// (jinja/template.h: GGUF `tokenizer.chat_template`, a Hugging Face directory's
// tokenizer_config.json, or `--chat-template`), or one of the built-in formats of
// chat_template.h (`--chat-template llama2|llama3|chatml`).
//
// A Jinja template is rendered as Transformers' apply_chat_template renders it (messages,
// add_generation_prompt true, bos_token and eos_token the vocabulary's texts), and its text is
// tokenized as Transformers tokenizes it (no BOS/EOS added: the template writes them; text of
// special tokens becomes those tokens). One difference, on purpose: a message's content that
// contains the text of a control token (say "<|im_start|>" typed by a user) keeps it as text,
// so no one can forge a turn of the conversation.
// Thread-safety: immutable after construction; encode and render may run concurrently.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/template.h"
#include "server/chat_template.h"
#include "server/tool_call_format.h"

namespace fdl {
class Tokenizer;
}

namespace fdl::server {

class ChatRenderer {
 public:
  /// The Jinja template `source`; `origin` names where it came from in descriptions.
  /// Throws jinja::TemplateError if it does not parse.
  static ChatRenderer from_jinja(std::string_view source, std::string origin);
  static ChatRenderer from_builtin(ChatTemplate t);

  /// The prompt text for `messages` and `tools` (a JSON array, null for none). Throws
  /// jinja::TemplateError when the template refuses them (raise_exception) or fails on them,
  /// and for tools or tool turns with a built-in format (they have no syntax for them).
  std::string render(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                     const nlohmann::ordered_json& tools = nullptr) const;
  /// The prompt ids (never empty); throws as render.
  std::vector<int32_t> encode(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                              const nlohmann::ordered_json& tools = nullptr) const;
  /// Stop strings the engine needs beyond the vocabulary's end-of-generation tokens.
  std::vector<std::string> stop_strings(const Tokenizer& tok) const;
  /// "jinja (<origin>)" (with ", tool calls: <syntax>" where it has one) or the built-in
  /// format's name, for logs.
  std::string describe() const;
  /// How the template writes tool calls (detected once, at construction); syntax None for
  /// built-in formats and templates without a known tool-call syntax.
  const ToolCallFormat& tool_call_format() const { return tool_format_; }

 private:
  std::shared_ptr<const jinja::Template> jinja_;
  ToolCallFormat tool_format_;
  std::optional<ChatTemplate> builtin_;
  std::string origin_;
};

/// The server's chat template, or ApiError 400 (`chat_template_missing`) explaining how to
/// give one.
const ChatRenderer& chat_template_or_400(const std::optional<ChatRenderer>& chat);
/// ChatRenderer::encode / render, with a template's refusal (jinja::TemplateError) as
/// ApiError 400 (`chat_template_error`) carrying the template's message.
std::vector<int32_t> encode_chat_or_400(const ChatRenderer& chat, const Tokenizer& tok,
                                        const std::vector<ChatMessage>& messages, const nlohmann::ordered_json& tools);
std::string render_chat_or_400(const ChatRenderer& chat, const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                               const nlohmann::ordered_json& tools);

}  // namespace fdl::server
