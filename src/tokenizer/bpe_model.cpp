#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <climits>

#include "tokenizer/byte_unicode.h"

namespace fdl::tok {
namespace {

struct Symbol {
  size_t offset;
  size_t length;  // 0 once merged into its left neighbour
  int prev;
  int next;
  int32_t id;     // vocab id of the symbol's bytes, -1 if none
};

// Kept small (20 bytes): the heap of candidates is the hot data structure for long chunks.
struct Candidate {
  int32_t rank;
  int32_t merged_id;
  int32_t left;
  int32_t right;
  uint32_t right_length;  // with left.next == right, enough to know the pair is unchanged
};

struct LowerPriority {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

/// Unambiguous key for a pair of byte strings: the left length (4 bytes), then both strings.
void text_pair_key(std::string_view left, std::string_view right, std::string& key) {
  key.clear();
  const uint32_t n = static_cast<uint32_t>(left.size());
  key.append(reinterpret_cast<const char*>(&n), sizeof n);
  key.append(left);
  key.append(right);
}

}  // namespace

BpeModel::BpeModel(const Vocab& vocab, const std::vector<std::string_view>& merges, bool ignore_merges)
    : vocab_(vocab), ignore_merges_(ignore_merges), id_rules_(merges.size()) {
  StringArena raw;
  raw.reserve(vocab.texts.size(), vocab.texts.size() * 8);
  has_raw_.assign(vocab.texts.size(), 0);
  for (int32_t id = 0; id < vocab.size(); ++id) {
    const auto bytes = mapped_to_bytes(vocab.texts[id]);
    has_raw_[id] = bytes.has_value();
    raw.push_back(bytes ? std::string_view(*bytes) : std::string_view());
  }
  bytes_ = StringTable(std::move(raw), has_raw_);
  for (int b = 0; b < 256; ++b) {
    const char c = static_cast<char>(b);
    byte_id_[b] = bytes_.find(std::string_view(&c, 1));
  }

  std::string key, joined;
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const std::string_view m = merges[rank];
    const size_t space = m.find(' ', 1);
    if (space == std::string_view::npos) continue;  // malformed rule: can never apply
    const auto left = mapped_to_bytes(m.substr(0, space));
    const auto right = mapped_to_bytes(m.substr(space + 1));
    if (!left || !right || left->empty() || right->empty()) continue;  // can never match a symbol
    const int32_t l = bytes_.find(*left);
    const int32_t r = bytes_.find(*right);
    const int32_t r32 = static_cast<int32_t>(rank);
    if (l >= 0 && r >= 0) {
      joined.assign(*left).append(*right);
      id_rules_.add(l, r, {r32, bytes_.find(joined)});
    } else {
      text_pair_key(*left, *right, key);
      text_rules_.try_emplace(key, r32);
    }
  }
}

MergeTable::Rule BpeModel::rule(std::string_view left, int32_t left_id, std::string_view right,
                                int32_t right_id) const {
  if (left_id >= 0 && right_id >= 0) return id_rules_.find(left_id, right_id);
  if (text_rules_.empty()) return {};
  std::string key;
  text_pair_key(left, right, key);
  const auto it = text_rules_.find(key);
  if (it == text_rules_.end()) return {};
  std::string joined(left);
  joined.append(right);
  return {it->second, bytes_.find(joined)};
}

void BpeModel::encode_chunk(std::string_view chunk, std::vector<int32_t>& out) const {
  if (chunk.empty()) return;
  if (chunk.size() > static_cast<size_t>(INT32_MAX))
    throw TokenizerError("a pre-tokenized chunk of " + std::to_string(chunk.size()) +
                         " bytes is too long for BPE (limit 2^31 - 1)");
  if (ignore_merges_) {
    if (const int32_t id = bytes_.find(chunk); id >= 0) {
      out.push_back(id);
      return;
    }
  }

  std::vector<Symbol> symbols;
  symbols.reserve(chunk.size());
  for (size_t i = 0; i < chunk.size(); ++i) {
    const int index = static_cast<int>(i);
    symbols.push_back({i, 1, index - 1, i + 1 == chunk.size() ? -1 : index + 1,
                       byte_id_[static_cast<uint8_t>(chunk[i])]});
  }
  const auto text_of = [&](const Symbol& s) { return chunk.substr(s.offset, s.length); };

  std::vector<Candidate> heap;
  heap.reserve(symbols.size());
  const auto candidate = [&](int left, int right) -> bool {
    if (left < 0 || right < 0) return false;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[right];
    const MergeTable::Rule rl = rule(text_of(l), l.id, text_of(r), r.id);
    if (rl.rank < 0) return false;
    heap.push_back({rl.rank, rl.merged_id, left, right, static_cast<uint32_t>(r.length)});
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
    // Symbols only grow or vanish. A live left symbol still followed by `right` cannot have
    // grown (it would have absorbed `right`), so the pair is current iff `right` kept its
    // length.
    if (left.length == 0 || right.length == 0 || left.next != c.right || right.length != c.right_length)
      continue;
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.left;
    left.id = c.merged_id;
    try_pair(left.prev, c.left);
    try_pair(c.left, left.next);
  }

  for (int i = 0; i != -1; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    // Not a vocab entry: llama.cpp looks up each byte of the mapped spelling on its own.
    const std::string mapped = bytes_to_mapped(text_of(s));
    for (char ch : mapped)
      if (const int32_t id = vocab_.find(std::string_view(&ch, 1)); id >= 0) out.push_back(id);
  }
}

}  // namespace fdl::tok
