// Chat messages to prompt ids through a Jinja or built-in template (chat_renderer.h).
#include "server/chat_renderer.h"

#include <stdexcept>
#include <utility>

#include "flashdllm/generator.h"
#include "flashdllm/tokenizer.h"
#include "server/openai_error.h"

namespace fdl::server {
namespace {

std::string token_text_or_empty(const Tokenizer& tok, int32_t id) { return id >= 0 ? tok.token_text(id) : std::string(); }

// [begin, end) byte spans of `text` holding a message's content that the tokenizer would turn
// (partly) into special tokens: those spans are tokenized as plain text. Contents are found in
// message order, as written or trimmed (templates often trim them).
std::vector<std::pair<size_t, size_t>> protected_spans(const Tokenizer& tok, const std::string& text,
                                                       const std::vector<ChatMessage>& messages) {
  std::vector<std::pair<size_t, size_t>> spans;
  size_t from = 0;
  for (const ChatMessage& m : messages) {
    if (m.content.empty() || tok.encode(m.content, false, true) == tok.encode(m.content, false, false)) continue;
    std::string needle = m.content;
    size_t at = text.find(needle, from);
    if (at == std::string::npos) {
      const size_t a = needle.find_first_not_of(" \t\n\r"), b = needle.find_last_not_of(" \t\n\r");
      needle = a == std::string::npos ? std::string() : needle.substr(a, b - a + 1);
      at = needle.empty() ? std::string::npos : text.find(needle, from);
    }
    if (at == std::string::npos) continue;
    spans.emplace_back(at, at + needle.size());
    from = at + needle.size();
  }
  return spans;
}

}  // namespace

ChatRenderer ChatRenderer::from_jinja(std::string_view source, std::string origin) {
  ChatRenderer r;
  r.jinja_ = std::make_shared<const jinja::Template>(source);
  r.origin_ = std::move(origin);
  return r;
}

ChatRenderer ChatRenderer::from_builtin(ChatTemplate t) {
  ChatRenderer r;
  r.builtin_ = t;
  return r;
}

std::string ChatRenderer::render(const Tokenizer& tok, const std::vector<ChatMessage>& messages) const {
  if (builtin_) return render_chat(*builtin_, messages);
  jinja::Array list;
  for (const ChatMessage& m : messages) {
    jinja::Object msg;
    msg.set(jinja::Value("role"), jinja::Value(m.role));
    msg.set(jinja::Value("content"), jinja::Value(m.content));
    list.emplace_back(std::move(msg));
  }
  jinja::Object ctx;
  ctx.set(jinja::Value("messages"), jinja::Value(std::move(list)));
  ctx.set(jinja::Value("tools"), jinja::Value::none());
  ctx.set(jinja::Value("documents"), jinja::Value::none());
  ctx.set(jinja::Value("add_generation_prompt"), jinja::Value(true));
  ctx.set(jinja::Value("bos_token"), jinja::Value(token_text_or_empty(tok, tok.bos_id())));
  ctx.set(jinja::Value("eos_token"), jinja::Value(token_text_or_empty(tok, tok.eos_id())));
  return jinja_->render(ctx);
}

std::vector<int32_t> ChatRenderer::encode(const Tokenizer& tok, const std::vector<ChatMessage>& messages) const {
  const std::string text = render(tok, messages);
  if (builtin_) return encode_prompt(tok, text, /*parse_special=*/true);
  std::vector<int32_t> ids;
  size_t at = 0;
  auto add = [&](size_t end, bool parse_special) {
    if (end <= at) return;
    const std::vector<int32_t> part = tok.encode(std::string_view(text).substr(at, end - at), false, parse_special);
    ids.insert(ids.end(), part.begin(), part.end());
    at = end;
  };
  for (const auto& [begin, end] : protected_spans(tok, text, messages)) {
    add(begin, true);
    add(end, false);
  }
  add(text.size(), true);
  if (ids.empty()) {
    if (tok.bos_id() < 0) throw std::invalid_argument("the chat template rendered nothing, and the vocabulary has no BOS token");
    ids.push_back(tok.bos_id());
  }
  return ids;
}

std::vector<std::string> ChatRenderer::stop_strings(const Tokenizer& tok) const {
  return builtin_ ? template_stop_strings(*builtin_, tok) : std::vector<std::string>{};
}

std::string ChatRenderer::describe() const {
  return builtin_ ? std::string(chat_template_name(*builtin_)) : "jinja (" + origin_ + ")";
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
                                        const std::vector<ChatMessage>& messages) {
  return refusals_as_400([&] { return chat.encode(tok, messages); });
}

std::string render_chat_or_400(const ChatRenderer& chat, const Tokenizer& tok, const std::vector<ChatMessage>& messages) {
  return refusals_as_400([&] { return chat.render(tok, messages); });
}

}  // namespace fdl::server
