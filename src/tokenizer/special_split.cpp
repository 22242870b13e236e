#include "tokenizer/special_split.h"

#include <bitset>
#include <memory>

namespace fdl::tok {
namespace {

/// Which bytes and byte pairs occur in a text: a special token whose first two bytes never
/// occur together cannot match, so most of a large special-token list is skipped without
/// scanning the text once per token.
class BytePairFilter {
 public:
  explicit BytePairFilter(std::string_view text) {
    for (size_t i = 0; i < text.size(); ++i) {
      const uint8_t b = static_cast<uint8_t>(text[i]);
      bytes_.set(b);
      if (i + 1 < text.size()) pairs_->set(size_t(b) << 8 | static_cast<uint8_t>(text[i + 1]));
    }
  }
  bool may_occur(std::string_view needle) const {
    const uint8_t b0 = static_cast<uint8_t>(needle[0]);
    if (needle.size() == 1) return bytes_.test(b0);
    return pairs_->test(size_t(b0) << 8 | static_cast<uint8_t>(needle[1]));
  }

 private:
  std::bitset<256> bytes_;
  std::unique_ptr<std::bitset<65536>> pairs_ = std::make_unique<std::bitset<65536>>();
};

// The C locale's isspace, as used for llama.cpp's strip attributes.
bool is_ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

/// Cut one text fragment at every occurrence of special token `id`, appending the pieces.
void cut_fragment(std::string_view text, const Fragment& frag, int32_t id, std::string_view needle,
                  bool lstrip, bool rstrip, std::vector<Fragment>& out) {
  size_t begin = frag.offset;
  size_t end = frag.offset + frag.length;
  const std::string_view window = text.substr(0, end);
  while (begin < end) {
    const size_t match = window.find(needle, begin);
    if (match == std::string_view::npos) break;
    size_t left_len = match - begin;
    if (lstrip)
      while (left_len > 0 && is_ascii_space(text[begin + left_len - 1])) --left_len;
    if (left_len > 0) out.push_back({-1, begin, left_len});
    out.push_back({id, match, needle.size()});
    begin = match + needle.size();
    if (rstrip)
      while (begin < end && is_ascii_space(text[begin])) ++begin;
  }
  if (begin < end) out.push_back({-1, begin, end - begin});
}

}  // namespace

std::vector<Fragment> split_special_tokens(std::string_view text, const Vocab& vocab,
                                           bool parse_special) {
  std::vector<Fragment> frags;
  if (text.empty()) return frags;
  frags.push_back({-1, 0, text.size()});
  if (vocab.special_tokens.empty()) return frags;
  const BytePairFilter filter(text);
  std::vector<Fragment> next;
  for (int32_t id : vocab.special_tokens) {
    const TokenType type = vocab.types[id];
    if (!parse_special && (type == TokenType::Control || type == TokenType::Unknown)) continue;
    const std::string& needle = vocab.texts[id];
    if (needle.empty()) continue;  // an empty text would match everywhere
    if (needle.size() > text.size() || !filter.may_occur(needle)) continue;
    next.clear();
    bool changed = false;
    for (const Fragment& f : frags) {
      if (!f.is_text() || f.length < needle.size()) {
        next.push_back(f);
        continue;
      }
      const size_t before = next.size();
      cut_fragment(text, f, id, needle, vocab.lstrip[id] != 0, vocab.rstrip[id] != 0, next);
      changed |= !(next.size() == before + 1 && next.back().offset == f.offset &&
                   next.back().length == f.length && next.back().is_text());
    }
    if (changed) frags.swap(next);
  }
  return frags;
}

}  // namespace fdl::tok
