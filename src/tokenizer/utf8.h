// UTF-8 helpers shared by the tokenizers and the streaming detokenizer.
//
// Two decoders on purpose:
//  - the *lenient* one reproduces how llama.cpp turns text into code points before
//    pre-tokenization (so ids match it even on malformed input);
//  - the *strict* one follows the Unicode standard (Table 3-7 "well-formed UTF-8 byte
//    sequences", and the "maximal subpart" replacement practice of section 3.9) and is what
//    text handed to users goes through.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fdl::tok {

inline constexpr uint32_t kReplacementChar = 0xFFFD;

/// Sequence length implied by a lead byte, judged by its high nibble only (0x0-0xB -> 1,
/// 0xC-0xD -> 2, 0xE -> 3, 0xF -> 4). This is how llama.cpp cuts text into initial
/// symbols for SPM and BPE merging; stray continuation bytes count as 1-byte symbols.
inline size_t utf8_len_from_lead(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

/// Lenient decode, as llama.cpp does before pre-tokenizing: a lead byte followed by the
/// right number of continuation bytes is accepted even when overlong or a surrogate; any
/// other byte becomes U+FFFD and decoding resumes at the next byte. Values above U+10FFFF
/// (4-byte forms F4 90.. to F7 ..) also become U+FFFD (llama.cpp would throw there).
std::vector<uint32_t> decode_utf8_lenient(std::string_view text);

/// Append the UTF-8 form of `cpt` (<= 0x10FFFF; surrogates are encoded like any value).
void append_utf8(std::string& out, uint32_t cpt);

/// Result of examining the bytes at one position under strict UTF-8 rules.
struct Utf8Step {
  size_t length = 0;       ///< bytes consumed: a whole character, or one maximal ill-formed subpart
  bool well_formed = false;
  bool truncated = false;  ///< ill-formed only because the input ended mid-sequence
};
/// Strictly examine the sequence starting at `pos` (< text.size()).
Utf8Step utf8_step(std::string_view text, size_t pos);

/// True if `text` is entirely well-formed UTF-8.
bool is_well_formed_utf8(std::string_view text);

/// Copy of `text` where each maximal ill-formed subpart is replaced by U+FFFD.
std::string to_well_formed_utf8(std::string_view text);

}  // namespace fdl::tok
