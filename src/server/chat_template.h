// chat_template.h — the built-in chat formats (`--chat-template llama2|llama3|chatml`, and the
// fallback for a model template the Jinja interpreter cannot parse: chat_renderer.h).
//
// Three formats, recognised by their markers in a Jinja template's text:
//  - Llama 2:  "[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST] ..."
//  - Llama 3:  "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>" per message
//              (content trimmed, as the official template does)
//  - ChatML:   "<|im_start|>{role}\n{content}<|im_end|>\n" per message
// Each rendering ends with the opening of the assistant's turn (the "generation prompt").
// BOS is not part of the text: encode_prompt adds it as the vocabulary's metadata says, so
// it is never doubled. The text is encoded with parse_special = true so markers that exist
// as vocabulary tokens become those tokens; markers the vocabulary lacks stay plain text.
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace fdl {
class Tokenizer;
}

namespace fdl::server {

enum class ChatTemplate { Llama2, Llama3, ChatML };

struct ChatMessage {
  std::string role{};          ///< "system" | "user" | "assistant" | "tool"
  std::string content{};       ///< text (parts already joined; "" for an assistant turn of only tool calls)
  std::string name{};          ///< the sender's name, "" for none
  std::string tool_call_id{};  ///< role "tool": the call this result answers ("" for none)
  /// Role "assistant": the calls it made, as chat templates read them: [{"id", "type":
  /// "function", "function": {"name", "arguments"}}] with `arguments` a JSON object where the
  /// request's string parses as one (templates iterate it), else the string. Null: none.
  nlohmann::ordered_json tool_calls{};
};

/// "llama2" | "llama3" | "chatml"; nullopt otherwise.
std::optional<ChatTemplate> parse_chat_template_name(std::string_view name);
const char* chat_template_name(ChatTemplate t);

/// Picks a format from a Jinja chat template's text by its markers (ChatML's <|im_start|>,
/// Llama 3's <|start_header_id|>, Llama 2's [INST]); nullopt when none is present.
std::optional<ChatTemplate> detect_chat_template(std::string_view jinja);

/// The prompt text for `messages` (roles already validated), ending with the assistant's
/// turn opening.
std::string render_chat(ChatTemplate t, const std::vector<ChatMessage>& messages);

/// The end-of-turn marker of the format ("</s>", "<|eot_id|>", "<|im_end|>").
std::string_view end_of_turn_marker(ChatTemplate t);

/// Stop strings the engine needs for this format with this vocabulary: none when the marker
/// is a vocabulary token that ends generation (Tokenizer::is_eog; the engine stops on it),
/// else the marker text, so a model that writes it out as plain text still stops there.
std::vector<std::string> template_stop_strings(ChatTemplate t, const Tokenizer& tokenizer);

}  // namespace fdl::server
