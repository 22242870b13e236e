#include "tokenizer/spm_model.h"

#include <algorithm>
#include <cstdio>
#include <climits>

#include "tokenizer/utf8.h"

namespace fdl::tok {
namespace {

struct Symbol {
  size_t offset;
  size_t length;  // 0 once merged into its left neighbour
  int prev;
  int next;
};

// Kept small (16 bytes): the heap of candidates is the hot data structure for long texts.
struct Candidate {
  float score;
  int32_t left;
  int32_t right;
  uint32_t length;  // bytes of the merged piece, to detect stale entries
};

struct LowerPriority {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

SpmModel::SpmModel(const Vocab& vocab) : vocab_(vocab) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const char name[] = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    int32_t id = vocab.find(std::string_view(name, sizeof name));
    const char raw = static_cast<char>(b);
    if (id < 0) id = vocab.find(std::string_view(&raw, 1));
    byte_token_[b] = id;
  }
}

void SpmModel::encode(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  if (text.size() > static_cast<size_t>(INT32_MAX))
    throw TokenizerError("a text fragment of " + std::to_string(text.size()) +
                         " bytes is too long to tokenize (limit 2^31 - 1)");
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t off = 0; off < text.size();) {
    const size_t len = std::min(utf8_len_from_lead(static_cast<uint8_t>(text[off])), text.size() - off);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({off, len, index - 1, off + len == text.size() ? -1 : index + 1});
    off += len;
  }

  std::vector<Candidate> heap;
  heap.reserve(symbols.size());
  const auto candidate = [&](int left, int right) -> bool {
    if (left < 0 || right < 0) return false;
    const size_t length = symbols[left].length + symbols[right].length;
    const int32_t id = vocab_.find(text.substr(symbols[left].offset, length));
    if (id < 0) return false;
    heap.push_back({vocab_.scores[id], left, right, static_cast<uint32_t>(length)});
    return true;
  };
  const auto try_pair = [&](int left, int right) {
    if (candidate(left, right)) std::push_heap(heap.begin(), heap.end(), LowerPriority{});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) candidate(i - 1, i);
  std::make_heap(heap.begin(), heap.end(), LowerPriority{});

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), LowerPriority{});
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = symbols[c.left];
    Symbol& right = symbols[c.right];
    // Symbols only grow or vanish, so an unchanged total length means an unchanged pair.
    if (left.length == 0 || right.length == 0 || left.length + right.length != c.length) continue;
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.left;
    try_pair(left.prev, c.left);
    try_pair(c.left, left.next);
  }

  for (int i = 0; i != -1; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    const std::string_view piece = text.substr(s.offset, s.length);
    if (const int32_t id = vocab_.find(piece); id >= 0) {
      out.push_back(id);
      continue;
    }
    for (char ch : piece) {
      const uint8_t b = static_cast<uint8_t>(ch);
      int32_t id = byte_token_[b];
      if (id < 0) id = vocab_.unk;
      if (id < 0) {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02X", b);
        throw TokenizerError(std::string("cannot encode byte ") + hex +
                             ": the vocab has no <0xNN> byte token, no single-byte token for it "
                             "and no unknown token");
      }
      out.push_back(id);
    }
  }
}

}  // namespace fdl::tok
