#include "grammar/token_trie.h"

#include <algorithm>
#include <numeric>

namespace fdl::grammar {

TokenTrie::TokenTrie(const Tokenizer& tok, bool render_special) : tok_(tok) {
  const int32_t n = tok.n_vocab();
  bytes_.resize(size_t(n));
  std::vector<int32_t> order;
  for (int32_t id = 0; id < n; ++id) {
    if (tok.is_eog(id)) {
      eog_ids_.push_back(id);
      continue;
    }
    bytes_[size_t(id)] = tok.token_to_piece(id, render_special);
    if (!bytes_[size_t(id)].empty()) order.push_back(id);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes_[size_t(a)] != bytes_[size_t(b)] ? bytes_[size_t(a)] < bytes_[size_t(b)] : a < b;
  });
  // Sorted pieces give the preorder directly: a token's node path extends the path of the
  // previous token by the bytes after their common prefix.
  std::vector<uint32_t> path;  // node index per depth - 1 of the previous token's path
  std::string prev;
  for (const int32_t id : order) {
    const std::string& s = bytes_[size_t(id)];
    size_t common = 0;
    while (common < prev.size() && common < s.size() && prev[common] == s[common]) ++common;
    for (size_t d = path.size(); d > common; --d) nodes_[path[d - 1]].end = uint32_t(nodes_.size());
    path.resize(common);
    for (size_t d = common; d < s.size(); ++d) {
      path.push_back(uint32_t(nodes_.size()));
      Node node;
      node.byte = static_cast<uint8_t>(s[d]);
      node.depth = static_cast<uint16_t>(std::min<size_t>(d + 1, 65535));
      nodes_.push_back(node);
    }
    Node& last = nodes_[path.back()];
    if (last.n_tokens == 0) last.first_token = uint32_t(token_ids_.size());
    ++last.n_tokens;
    token_ids_.push_back(id);
    max_depth_ = std::max(max_depth_, s.size());
    prev = s;
  }
  for (const uint32_t i : path) nodes_[i].end = uint32_t(nodes_.size());
}

int32_t TokenTrie::longest_prefix_token(std::string_view text) const {
  int32_t best = -1;
  size_t i = 0;  // candidate node at depth d + 1 among the children of the matched path
  const size_t n = nodes_.size();
  for (size_t d = 0; d < text.size() && i < n; ++d) {
    const auto b = static_cast<uint8_t>(text[d]);
    // Siblings at this depth follow each other, each after its subtree.
    size_t limit = d == 0 ? n : nodes_[i - 1].end;
    while (i < limit && nodes_[i].byte != b) i = nodes_[i].end;
    if (i >= limit) break;
    if (nodes_[i].n_tokens > 0) best = token_ids_[nodes_[i].first_token];
    ++i;  // first child, if any, is the next node
    if (i >= nodes_[i - 1].end) break;
  }
  return best;
}

}  // namespace fdl::grammar

namespace fdl::grammar {

void TokenTrie::spell(std::string_view text, std::vector<int32_t>& out) const {
  const std::vector<int32_t> encoded = tok_.encode(text, /*add_special=*/false, /*parse_special=*/false);
  std::string joined;
  bool usable = true;
  for (const int32_t t : encoded) {
    if (t < 0 || t >= n_vocab() || bytes_[size_t(t)].empty()) {
      usable = false;
      break;
    }
    joined += bytes_[size_t(t)];
  }
  // (A SentencePiece vocabulary prefixes a space to the text it encodes: then the spelling
  // differs and the longest prefixes are used.)
  if (usable && joined == text) {
    out.insert(out.end(), encoded.begin(), encoded.end());
    return;
  }
  while (!text.empty()) {
    const int32_t t = longest_prefix_token(text);
    if (t < 0) return;
    out.push_back(t);
    text.remove_prefix(bytes_[size_t(t)].size());
  }
}

}  // namespace fdl::grammar
