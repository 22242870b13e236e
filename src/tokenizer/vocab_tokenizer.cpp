#include "tokenizer/vocab_tokenizer.h"

namespace fdl::tok {

VocabTokenizer::VocabTokenizer(Vocab vocab) : vocab_(std::move(vocab)) {}

void VocabTokenizer::check_id(int32_t id) const {
  if (!vocab_.valid_id(id))
    throw TokenizerError("token id " + std::to_string(id) + " is out of range [0, " +
                         std::to_string(vocab_.size()) + ")");
}

std::string VocabTokenizer::token_to_piece(int32_t id, bool render_special) const {
  check_id(id);
  // Like llama.cpp (and SentencePiece's decoder), CONTROL and UNKNOWN tokens are rendered
  // only on request.
  const TokenType type = vocab_.types[id];
  if (!render_special && (type == TokenType::Control || type == TokenType::Unknown)) return {};
  return std::string(pieces_[static_cast<size_t>(id)]);
}

const std::string& VocabTokenizer::token_text(int32_t id) const {
  check_id(id);
  return vocab_.texts[id];
}

TokenType VocabTokenizer::token_type(int32_t id) const {
  check_id(id);
  return vocab_.types[id];
}

}  // namespace fdl::tok
