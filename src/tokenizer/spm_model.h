// SentencePiece-style BPE by piece score, as llama.cpp runs it for `tokenizer.ggml.model =
// llama` (llm_tokenizer_spm_session).
//
// The text (spaces already escaped to U+2581) starts as one symbol per UTF-8 character
// (length judged from the lead byte). Repeatedly, of all adjacent symbol pairs whose
// concatenation is a vocab entry, the pair whose entry has the highest score is merged (the
// leftmost on ties). Every final symbol becomes its vocab id; a symbol that is not in the
// vocab becomes one `<0xNN>` byte token per byte (or the single-character token for that byte,
// or finally the unknown token).
// Cost: O(n log n) in the text length (a heap of candidate pairs).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace fdl::tok {

class SpmModel {
 public:
  /// `vocab` must outlive the model.
  explicit SpmModel(const Vocab& vocab);
  /// Append the ids of `text` (already space-escaped) to `out`. Throws TokenizerError if a
  /// byte has no token and the vocab has no unknown token.
  void encode(std::string_view text, std::vector<int32_t>& out) const;

 private:
  const Vocab& vocab_;
  std::array<int32_t, 256> byte_token_{};  ///< -1: no token for that byte
};

}  // namespace fdl::tok
