// The tokenizer endpoints (token_endpoints.h).
#include "server/token_endpoints.h"

#include "flashdllm/tokenizer.h"
#include "server/chat_renderer.h"
#include "server/chat_request.h"
#include "server/json_fields.h"
#include "server/openai_error.h"
#include "tokenizer/utf8.h"

namespace fdl::server {

using nlohmann::json;

json handle_tokenize(const Tokenizer& tok, const json& body) {
  const std::optional<std::string> content = read_string(body, "content");
  if (!content) throw invalid_param("content", "'content' is required: the text to tokenize");
  const bool add_special = read_bool(body, "add_special").value_or(false);
  const bool parse_special = read_bool(body, "parse_special").value_or(true);
  const bool with_pieces = read_bool(body, "with_pieces").value_or(false);
  const std::vector<int32_t> ids = tok.encode(*content, add_special, parse_special);
  if (!with_pieces) return {{"tokens", ids}};
  json list = json::array();
  for (const int32_t id : ids) {
    const std::string piece = tok.token_to_piece(id, /*render_special=*/true);
    if (tok::is_well_formed_utf8(piece)) {
      list.push_back({{"id", id}, {"piece", piece}});
    } else {  // a byte token or part of a character: its bytes, as llama.cpp's server gives them
      json bytes = json::array();
      for (const unsigned char c : piece) bytes.push_back(int(c));
      list.push_back({{"id", id}, {"piece", std::move(bytes)}});
    }
  }
  return {{"tokens", std::move(list)}};
}

json handle_detokenize(const Tokenizer& tok, const json& body) {
  const json* tokens = find_field(body, "tokens");
  if (tokens == nullptr || !tokens->is_array())
    throw invalid_param("tokens", "'tokens' must be a list of token ids");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < tokens->size(); ++i) {
    const json& t = (*tokens)[i];
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.n_vocab())
      throw invalid_param("tokens", "tokens[" + std::to_string(i) + "] is not a token id in [0, " +
                                        std::to_string(tok.n_vocab()) + ")");
    ids.push_back(t.get<int32_t>());
  }
  return {{"content", tok::to_well_formed_utf8(tok.decode(ids))}};
}

json handle_apply_template(const Tokenizer& tok, const ServerOptions& options, const json& body,
                           const nlohmann::ordered_json* ordered) {
  const ChatRequest r = parse_chat_request(body, options.sampling_defaults, ordered);
  const ChatRenderer& chat = chat_template_or_400(options.chat);
  return {{"prompt", render_chat_or_400(chat, tok, r.messages, r.tools)}};
}

}  // namespace fdl::server
