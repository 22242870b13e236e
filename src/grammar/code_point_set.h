// Internal: sets of Unicode scalar values as sorted ranges, and how to write them in GBNF —
// as a character class, or as the text a JSON string uses for them (raw where JSON allows,
// escaped where it requires it). The regex translator and the schema converter build their
// character sets with these.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fdl::grammar {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;

/// A set of scalar values (surrogates D800-DFFF are never members).
class CodePointSet {
 public:
  CodePointSet() = default;
  static CodePointSet range(uint32_t lo, uint32_t hi);
  static CodePointSet single(uint32_t c) { return range(c, c); }
  /// Every scalar value.
  static CodePointSet all() { return range(0, kMaxCodePoint); }

  void add(uint32_t lo, uint32_t hi);
  void add(const CodePointSet& other);
  CodePointSet complement() const;
  CodePointSet minus(const CodePointSet& other) const;
  CodePointSet intersect(const CodePointSet& other) const;
  bool contains(uint32_t c) const;
  bool empty() const { return ranges_.empty(); }
  /// The one member, when there is exactly one.
  bool is_single() const { return ranges_.size() == 1 && ranges_[0].first == ranges_[0].second; }
  const std::vector<std::pair<uint32_t, uint32_t>>& ranges() const { return ranges_; }

 private:
  std::vector<std::pair<uint32_t, uint32_t>> ranges_;  // sorted, disjoint, not adjacent
};

/// `set` as a GBNF class "[...]" (escapes for ASCII specials and controls, \u / \U for the rest).
std::string gbnf_class(const CodePointSet& set);

/// GBNF for the JSON-string text of one character of `set`: a class of the characters JSON
/// allows raw (all but `"`, `\` and U+0000-U+001F), plus the escapes \" \\ and \b \t \n \f
/// \r for those members; other control characters become \u00XX when there are at most four
/// of them or the set has all of U+0000-U+001F, else they are left out (a subset is always
/// sound). Returns "" for the empty set.
std::string json_chars_gbnf(const CodePointSet& set);

/// `c` as UTF-8 (c must be a scalar value).
std::string utf8(uint32_t c);

/// Decodes the well-formed UTF-8 character at text[pos], advancing pos; false on ill-formed
/// UTF-8 (overlong forms, surrogates, values above U+10FFFF, a cut sequence) or at the end.
bool decode_utf8(std::string_view text, size_t& pos, uint32_t& c);

}  // namespace fdl::grammar
