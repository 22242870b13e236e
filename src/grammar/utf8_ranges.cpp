#include "grammar/utf8_ranges.h"

#include <algorithm>
#include <string>

#include "tokenizer/utf8.h"

namespace fdl::grammar {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

int encoded_length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }


// [lo, hi] share one encoded length. Byte i of the encodings can vary independently of the
// others only when, for every trailing group of 6-bit continuation bytes, the range either
// covers the group completely or stays inside one value of the bytes before it; otherwise
// the range is cut where a group wraps and each part is handled the same way.
void same_length(uint32_t lo, uint32_t hi, int len, std::vector<ByteRangeSeq>& out) {
  for (int trailing = 1; trailing < len; ++trailing) {
    const uint32_t low_bits = (1u << (6 * trailing)) - 1;
    if ((lo & ~low_bits) == (hi & ~low_bits)) continue;  // same leading bytes: nothing to cut here
    if ((lo & low_bits) != 0) {                          // lo starts inside a group
      same_length(lo, lo | low_bits, len, out);
      same_length((lo | low_bits) + 1, hi, len, out);
      return;
    }
    if ((hi & low_bits) != low_bits) {                   // hi ends inside a group
      same_length(lo, (hi & ~low_bits) - 1, len, out);
      same_length(hi & ~low_bits, hi, len, out);
      return;
    }
  }
  std::string a, b;  // both len bytes: lo and hi share one encoded length
  tok::append_utf8(a, lo);
  tok::append_utf8(b, hi);
  ByteRangeSeq seq(static_cast<size_t>(len));
  for (size_t i = 0; i < seq.size(); ++i) seq[i] = {uint8_t(a[i]), uint8_t(b[i])};
  out.push_back(std::move(seq));
}

}  // namespace

void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>& out) {
  hi = std::min(hi, kMaxCodePoint);
  if (lo > hi) return;
  // Surrogates have no UTF-8 encoding.
  if (lo <= 0xDFFF && hi >= 0xD800) {
    if (lo < 0xD800) utf8_sequences(lo, 0xD7FF, out);
    if (hi > 0xDFFF) utf8_sequences(0xE000, hi, out);
    return;
  }
  // Split at the encoded-length boundaries.
  for (const uint32_t edge : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= edge && hi > edge) {
      utf8_sequences(lo, edge, out);
      utf8_sequences(edge + 1, hi, out);
      return;
    }
  }
  same_length(lo, hi, encoded_length(lo), out);
}

}  // namespace fdl::grammar
