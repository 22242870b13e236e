// A synthesized SentencePiece-style vocab so random-weight models carry a tokenizer that
// llama.cpp and flashdllm accept (tokenizer.ggml.model = "llama").
#include <cstdio>
#include <stdexcept>
#include <unordered_set>

#include "tools/make_model_internal.h"

namespace fdl::tools {
namespace {

// llama.cpp token types (llama_token_type).
constexpr int32_t kNormal = 1, kUnknown = 2, kControl = 3, kByte = 6;
const std::string kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's space marker

}  // namespace

SyntheticVocab synthesize_spm_vocab(uint32_t n_vocab) {
  if (n_vocab < kMinSyntheticVocab)
    throw std::invalid_argument("synthesize_spm_vocab: n_vocab " + std::to_string(n_vocab) +
                                " < " + std::to_string(kMinSyntheticVocab));
  SyntheticVocab v;
  v.tokens.reserve(n_vocab);
  auto add = [&](std::string text, float score, int32_t type) {
    v.tokens.push_back(std::move(text));
    v.scores.push_back(score);
    v.token_types.push_back(type);
  };
  add("<unk>", 0.f, kUnknown);
  add("<s>", 0.f, kControl);
  add("</s>", 0.f, kControl);
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    add(buf, 0.f, kByte);
  }
  // Filler pieces, most useful first so their scores (which rank BPE merges) decrease:
  // the space marker, every printable ASCII character, then lowercase strings of growing
  // length, each bare and with the space-marker prefix. Every piece's prefixes come earlier,
  // so the SPM merge loop can reach each of them.
  float score = -1.f;
  auto add_piece = [&](std::string text) {
    if (v.tokens.size() < n_vocab) add(std::move(text), score--, kNormal);
  };
  add_piece(kSpace);
  for (char c = '!'; c <= '~'; ++c) add_piece(std::string(1, c));
  std::vector<std::string> level = {""};
  while (v.tokens.size() < n_vocab) {
    std::vector<std::string> next;
    next.reserve(level.size() * 26);
    for (const auto& prefix : level)
      for (char c = 'a'; c <= 'z'; ++c) next.push_back(prefix + c);
    for (const auto& s : next) {
      if (s.size() > 1) add_piece(s);  // single letters were added with the ASCII range
      add_piece(kSpace + s);
      if (v.tokens.size() >= n_vocab) break;
    }
    level = std::move(next);
  }
  return v;
}

}  // namespace fdl::tools
