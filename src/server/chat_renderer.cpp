// Chat messages to prompt ids through a Jinja or built-in template (chat_renderer.h).
#include "server/chat_renderer.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <utility>

#include "flashdllm/generator.h"
#include "flashdllm/tokenizer.h"
#include "server/openai_error.h"
#include "tokenizer/utf8.h"

namespace fdl::server {
namespace {

std::string token_text_or_empty(const Tokenizer& tok, int32_t id) { return id >= 0 ? tok.token_text(id) : std::string(); }

// Messages whose contents spell control tokens ("<|im_start|>" typed by a user), with each
// such text replaced by a placeholder: a private-use character (U+E000 + its index in
// `texts`) the template carries through like any other character. After rendering, the
// placeholders are tokenized as the plain text they stand for. Replacing before rendering,
// not searching the rendered text afterwards, cannot confuse a user's copy with the
// template's own marker, and survives templates that trim, split or move contents.
struct Shielded {
  std::vector<ChatMessage> messages;
  std::vector<std::string> texts;  // placeholder i stands for texts[i]
};

constexpr uint32_t kFirstPlaceholder = 0xe000, kPlaceholders = 0x1900;  // U+E000..U+F8FF

std::string placeholder(size_t i) {
  std::string out;
  tok::append_utf8(out, kFirstPlaceholder + uint32_t(i));  // 3 bytes: U+E000..U+F8FF
  return out;
}

Shielded shield(const Tokenizer& tok, const std::vector<ChatMessage>& messages) {
  Shielded out{messages, {}};
  for (ChatMessage& m : out.messages) {
    for (const int32_t id : tok.encode(m.content, false, true)) {
      const TokenType type = tok.token_type(id);
      if (type != TokenType::Control && type != TokenType::Unknown) continue;
      const std::string& text = tok.token_text(id);
      if (text.empty() || std::find(out.texts.begin(), out.texts.end(), text) != out.texts.end()) continue;
      if (out.texts.size() == kPlaceholders) break;
      out.texts.push_back(text);
    }
  }
  if (out.texts.empty()) return out;
  // Longest first, so a marker that contains another is replaced whole.
  std::vector<size_t> order(out.texts.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return out.texts[x].size() > out.texts[y].size(); });
  for (ChatMessage& m : out.messages)
    for (const size_t i : order) {
      const std::string& t = out.texts[i];
      for (size_t at = m.content.find(t); at != std::string::npos; at = m.content.find(t, at + 3))
        m.content.replace(at, t.size(), placeholder(i));
    }
  return out;
}

// The placeholder index at text[at] (a 3-byte UTF-8 character below kPlaceholders entries), or -1.
int placeholder_at(const std::string& text, size_t at, size_t n) {
  if (at + 3 > text.size()) return -1;
  const auto b0 = static_cast<unsigned char>(text[at]), b1 = static_cast<unsigned char>(text[at + 1]),
             b2 = static_cast<unsigned char>(text[at + 2]);
  if ((b0 & 0xf0) != 0xe0 || (b1 & 0xc0) != 0x80 || (b2 & 0xc0) != 0x80) return -1;
  const uint32_t cp = (uint32_t(b0 & 0x0f) << 12) | (uint32_t(b1 & 0x3f) << 6) | uint32_t(b2 & 0x3f);
  return cp >= kFirstPlaceholder && cp - kFirstPlaceholder < n ? int(cp - kFirstPlaceholder) : -1;
}

}  // namespace

ChatRenderer ChatRenderer::from_jinja(std::string_view source, std::string origin) {
  ChatRenderer r;
  r.jinja_ = std::make_shared<const jinja::Template>(source);
  r.tool_format_ = detect_tool_call_format(*r.jinja_);
  r.origin_ = std::move(origin);
  return r;
}

ChatRenderer ChatRenderer::from_builtin(ChatTemplate t) {
  ChatRenderer r;
  r.builtin_ = t;
  return r;
}

std::string ChatRenderer::render(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                                 const nlohmann::ordered_json& tools) const {
  if (builtin_) {
    bool tool_turns = !tools.is_null();
    for (const ChatMessage& m : messages) tool_turns = tool_turns || m.role == "tool" || !m.tool_calls.is_null();
    if (tool_turns)
      throw jinja::TemplateError(std::string("the built-in ") + chat_template_name(*builtin_) +
                                 " format has no syntax for tools or tool turns: serve the model's Jinja template");
    return render_chat(*builtin_, messages);
  }
  jinja::Array list;
  for (const ChatMessage& m : messages) {
    jinja::Object msg;
    msg.set(jinja::Value("role"), jinja::Value(m.role));
    msg.set(jinja::Value("content"), jinja::Value(m.content));
    if (!m.name.empty()) msg.set(jinja::Value("name"), jinja::Value(m.name));
    if (!m.tool_call_id.empty()) msg.set(jinja::Value("tool_call_id"), jinja::Value(m.tool_call_id));
    if (!m.tool_calls.is_null())
      msg.set(jinja::Value("tool_calls"), jinja::Value::from_json(m.tool_calls));
    list.emplace_back(std::move(msg));
  }
  jinja::Object ctx;
  ctx.set(jinja::Value("messages"), jinja::Value(std::move(list)));
  ctx.set(jinja::Value("tools"),
          tools.is_null() ? jinja::Value::none() : jinja::Value::from_json(tools));
  ctx.set(jinja::Value("documents"), jinja::Value::none());
  ctx.set(jinja::Value("add_generation_prompt"), jinja::Value(true));
  ctx.set(jinja::Value("bos_token"), jinja::Value(token_text_or_empty(tok, tok.bos_id())));
  ctx.set(jinja::Value("eos_token"), jinja::Value(token_text_or_empty(tok, tok.eos_id())));
  return jinja_->render(ctx);
}

std::vector<int32_t> ChatRenderer::encode(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                                          const nlohmann::ordered_json& tools) const {
  if (builtin_) return encode_prompt(tok, render(tok, messages, tools), /*parse_special=*/true);
  const Shielded shielded = shield(tok, messages);
  const std::string text = render(tok, shielded.messages, tools);
  std::vector<int32_t> ids;
  auto add = [&](std::string_view part, bool parse_special) {
    const std::vector<int32_t> p = tok.encode(part, false, parse_special);
    ids.insert(ids.end(), p.begin(), p.end());
  };
  size_t start = 0;
  for (size_t at = 0; at < text.size(); ++at) {
    const int i = shielded.texts.empty() ? -1 : placeholder_at(text, at, shielded.texts.size());
    if (i < 0) continue;
    add(std::string_view(text).substr(start, at - start), true);
    add(shielded.texts[size_t(i)], false);
    start = at + 3;
    at += 2;
  }
  add(std::string_view(text).substr(start), true);
  if (ids.empty()) {
    if (tok.bos_id() < 0) throw jinja::TemplateError("the chat template rendered nothing for these messages");
    ids.push_back(tok.bos_id());
  }
  return ids;
}

std::vector<std::string> ChatRenderer::stop_strings(const Tokenizer& tok) const {
  return builtin_ ? template_stop_strings(*builtin_, tok) : std::vector<std::string>{};
}

std::string ChatRenderer::describe() const {
  if (builtin_) return std::string(chat_template_name(*builtin_));
  std::string out = "jinja (" + origin_ + ")";
  if (tool_format_.syntax != ToolCallSyntax::None)
    out += ", tool calls: " + std::string(tool_call_syntax_name(tool_format_.syntax));
  return out;
}

const ChatRenderer& chat_template_or_400(const std::optional<ChatRenderer>& chat) {
  if (!chat)
    throw ApiError(400,
                   "this model has no chat template (its GGUF or tokenizer_config.json has none): start the server "
                   "with --chat-template FILE (a Jinja template) or llama2|llama3|chatml, or use /v1/completions",
                   "messages", "invalid_request_error", "chat_template_missing");
  return *chat;
}

namespace {
template <class Fn>
auto refusals_as_400(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const jinja::TemplateError& e) {  // the template refused these messages (raise_exception)
    throw ApiError(400, std::string("the model's chat template refused the messages: ") + e.what(), "messages",
                   "invalid_request_error", "chat_template_error");
  }
}
}  // namespace

std::vector<int32_t> encode_chat_or_400(const ChatRenderer& chat, const Tokenizer& tok,
                                        const std::vector<ChatMessage>& messages, const nlohmann::ordered_json& tools) {
  return refusals_as_400([&] { return chat.encode(tok, messages, tools); });
}

std::string render_chat_or_400(const ChatRenderer& chat, const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                               const nlohmann::ordered_json& tools) {
  return refusals_as_400([&] { return chat.render(tok, messages, tools); });
}

}  // namespace fdl::server
