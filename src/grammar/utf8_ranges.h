// Internal: code-point ranges as sequences of byte ranges, so that a character class over
// code points can be matched on UTF-8 bytes (flashdllm/grammar.h works on bytes).
#pragma once

#include <cstdint>
#include <vector>

namespace fdl::grammar {

struct ByteRange {
  uint8_t lo = 0, hi = 0;
};

/// A sequence of byte ranges: the UTF-8 encodings of a block of code points whose bytes
/// vary independently (e.g. [E1-EC][80-BF][80-BF]).
using ByteRangeSeq = std::vector<ByteRange>;

/// Appends to `out` byte-range sequences that together match exactly the UTF-8 encodings of
/// the code points in [lo, hi] (surrogates D800-DFFF excluded; hi clamped to 10FFFF).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>& out);

}  // namespace fdl::grammar
