// Internal: the vocabulary as a byte trie, for computing which tokens a grammar allows.
//
// Each token's bytes are what it adds to generated text (Tokenizer::token_to_piece without
// special rendering, or with it when `render_special`: then control tokens such as
// "<|python_tag|>" match their text). Tokens with no bytes are left out, except the
// end-of-generation tokens, kept in eog_ids().
// Layout: nodes in depth-first preorder, each with its byte, depth and the index just past
// its subtree, so a walk that rejects a node skips its subtree in O(1).
// Keeps a reference to the tokenizer (which must outlive it) to spell forced text.
// Thread-safety: immutable after construction.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "flashdllm/tokenizer.h"

namespace fdl::grammar {

class TokenTrie {
 public:
  struct Node {
    uint8_t byte = 0;
    uint16_t depth = 0;      ///< 1 for the first byte of a token
    uint32_t end = 0;        ///< index just past this node's subtree
    uint32_t first_token = 0, n_tokens = 0;  ///< tokens whose bytes end here: token_ids()[first, first + n)
  };

  TokenTrie(const Tokenizer& tok, bool render_special);

  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& token_ids() const { return token_ids_; }
  const std::vector<int32_t>& eog_ids() const { return eog_ids_; }
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  int32_t n_vocab() const { return int32_t(bytes_.size()); }
  size_t max_depth() const { return max_depth_; }
  /// The longest token whose bytes are a prefix of `text`, or -1 (none starts it).
  int32_t longest_prefix_token(std::string_view text) const;
  /// Tokens whose bytes concatenate to `text`: the tokenizer's own encoding of it where that
  /// spells it exactly with tokens of this trie (what a model saw in training, so the likeliest
  /// spelling), else the longest-prefix tokens as far as they go.
  void spell(std::string_view text, std::vector<int32_t>& out) const;

 private:
  const Tokenizer& tok_;
  std::vector<Node> nodes_;
  std::vector<int32_t> token_ids_;
  std::vector<int32_t> eog_ids_;
  std::vector<std::string> bytes_;
  size_t max_depth_ = 0;
};

}  // namespace fdl::grammar
