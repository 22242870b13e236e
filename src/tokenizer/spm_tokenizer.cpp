#include "tokenizer/spm_tokenizer.h"

#include "tokenizer/space_mark.h"
#include "tokenizer/special_split.h"

namespace fdl::tok {

std::string unescape_spaces(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (text.substr(i, kSpaceMark.size()) == kSpaceMark) {
      out += ' ';
      i += kSpaceMark.size();
    } else {
      out += text[i++];
    }
  }
  return out;
}

namespace {

std::string escape_spaces(std::string_view text, bool add_prefix) {
  std::string out;
  out.reserve(text.size() + 8);
  if (add_prefix) out += kSpaceMark;
  for (char c : text) {
    if (c == ' ') out += kSpaceMark;
    else out += c;
  }
  return out;
}

/// Value of a `<0xNN>` byte token, or -1 when the text is not of that form.
int byte_token_value(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int v = 0;
  for (char c : text.substr(3, 2)) {
    v <<= 4;
    if (c >= '0' && c <= '9') v |= c - '0';
    else if (c >= 'A' && c <= 'F') v |= c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') v |= c - 'a' + 10;
    else return -1;
  }
  return v;
}

std::string spm_piece(const Vocab& v, int32_t id) {
  const std::string& text = v.texts[id];
  switch (v.types[id]) {
    case TokenType::Control:
    case TokenType::Unknown:
    case TokenType::UserDefined:
      return text;
    case TokenType::Normal:
      return unescape_spaces(text);
    case TokenType::Byte: {
      const int b = byte_token_value(text);
      return b < 0 ? std::string() : std::string(1, static_cast<char>(b));
    }
    case TokenType::Undefined:
    case TokenType::Unused:
      break;
  }
  return {};
}

}  // namespace

SpmTokenizer::SpmTokenizer(Vocab vocab) : VocabTokenizer(std::move(vocab)), model_(vocab_) {
  StringArena pieces;
  pieces.reserve(vocab_.texts.size(), vocab_.texts.size() * 8);
  for (int32_t id = 0; id < vocab_.size(); ++id) pieces.push_back(spm_piece(vocab_, id));
  set_pieces(std::move(pieces));
}

std::vector<int32_t> SpmTokenizer::encode(std::string_view text, bool add_special,
                                          bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 2 + 4);
  if (add_special && vocab_.add_bos) out.push_back(vocab_.bos);
  bool after_special = true;  // the first fragment counts as following one
  for (const Fragment& f : split_special_tokens(text, vocab_, parse_special)) {
    if (!f.is_text()) {
      out.push_back(f.token);
      after_special = true;
      continue;
    }
    const std::string escaped =
        escape_spaces(text.substr(f.offset, f.length), vocab_.add_space_prefix && after_special);
    model_.encode(escaped, out);
    after_special = false;
  }
  if (add_special && vocab_.add_eos) out.push_back(vocab_.eos);
  return out;
}

}  // namespace fdl::tok
