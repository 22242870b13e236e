// Splitting special-token text out of the input before the tokenizer model runs
// (llama.cpp's tokenizer_st_partition).
//
// Special tokens are taken one at a time, longest text first (Vocab::special_tokens); each
// one cuts every still-unsplit text fragment at all its non-overlapping occurrences, left
// to right. USER_DEFINED tokens are always split out (as Hugging Face tokenizers do for
// added tokens); CONTROL and UNKNOWN tokens only when `parse_special` is set. A token with
// the rstrip (lstrip) attribute also removes the ASCII whitespace right after (before) it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace fdl::tok {

struct Fragment {
  int32_t token = -1;  ///< >= 0: a special token; -1: text [offset, offset + length)
  size_t offset = 0;
  size_t length = 0;
  bool is_text() const { return token < 0; }
};

/// Fragments covering `text` in order (minus whitespace eaten by strip attributes).
/// Cost: O(number of special tokens x text length) in the worst case, memchr-fast in practice.
std::vector<Fragment> split_special_tokens(std::string_view text, const Vocab& vocab,
                                           bool parse_special);

}  // namespace fdl::tok
