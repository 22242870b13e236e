#include "tokenizer/bpe_tokenizer.h"

#include "tokenizer/byte_unicode.h"
#include "tokenizer/special_split.h"
#include "tokenizer/utf8.h"

namespace fdl::tok {
namespace {

/// Mapped spelling -> bytes, one character at a time; a character outside the byte map is
/// kept visible as "[UNK_BYTE_0x<its UTF-8 in hex><the whole entry>]" (llama.cpp's
/// llama_decode_text) so a broken vocab entry shows up instead of vanishing.
std::string decode_mapped(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (uint32_t cpt : decode_utf8_lenient(text)) {
    const int b = mapped_codepoint_to_byte(cpt);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
      continue;
    }
    std::string utf8;
    append_utf8(utf8, cpt);
    static constexpr char kHex[] = "0123456789abcdef";
    out += "[UNK_BYTE_0x";
    for (char c : utf8) {
      out += kHex[static_cast<uint8_t>(c) >> 4];
      out += kHex[static_cast<uint8_t>(c) & 15];
    }
    out += text;
    out += ']';
  }
  return out;
}

std::string bpe_piece(const Vocab& v, const BpeModel& model, int32_t id) {
  switch (v.types[id]) {
    case TokenType::Control:
    case TokenType::Unknown:
    case TokenType::UserDefined:
      return v.texts[id];
    case TokenType::Normal:
      return model.has_raw_bytes(id) ? std::string(model.raw_bytes(id)) : decode_mapped(v.texts[id]);
    default:
      return {};
  }
}

}  // namespace

BpeTokenizer::BpeTokenizer(Vocab vocab, const std::vector<std::string_view>& merges,
                           const PreTokenizerConfig& pre)
    : VocabTokenizer(std::move(vocab)), pre_(pre.kind), model_(vocab_, merges, pre.ignore_merges) {
  StringArena pieces;
  pieces.reserve(vocab_.texts.size(), vocab_.texts.size() * 8);
  for (int32_t id = 0; id < vocab_.size(); ++id) pieces.push_back(bpe_piece(vocab_, model_, id));
  set_pieces(std::move(pieces));
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_special,
                                          bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_special && vocab_.add_bos) out.push_back(vocab_.bos);
  std::vector<std::string> chunks;
  for (const Fragment& f : split_special_tokens(text, vocab_, parse_special)) {
    if (!f.is_text()) {
      out.push_back(f.token);
      continue;
    }
    chunks.clear();
    pre_.split(text.substr(f.offset, f.length), chunks);
    for (const std::string& c : chunks) model_.encode_chunk(c, out);
  }
  if (add_special && vocab_.add_eos) out.push_back(vocab_.eos);
  return out;
}

}  // namespace fdl::tok
