// CodePointSet and its GBNF forms (see code_point_set.h).
#include "grammar/code_point_set.h"

#include <algorithm>
#include <cstdio>

#include "grammar/gbnf_text.h"
#include "tokenizer/utf8.h"

namespace fdl::grammar {
namespace {

constexpr uint32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;

std::string hex_escape(uint32_t c) {
  char buf[16];
  if (c < 0x80)
    std::snprintf(buf, sizeof buf, "\\x%02X", unsigned(c));
  else if (c <= 0xFFFF)
    std::snprintf(buf, sizeof buf, "\\u%04X", unsigned(c));
  else
    std::snprintf(buf, sizeof buf, "\\U%08X", unsigned(c));
  return buf;
}

// One member of a class: printable ASCII as itself unless the class syntax gives it a meaning.
std::string class_char(uint32_t c) {
  if (c >= 0x20 && c < 0x7F && c != ']' && c != '[' && c != '\\' && c != '^' && c != '-' && c != '"')
    return std::string(1, char(c));
  return hex_escape(c);
}

// The JSON escape of a control character (or of `"`, `\`) as a GBNF literal.
std::string json_escape_literal(uint32_t c) {
  switch (c) {
    case '"': return gbnf_quote("\\\"");
    case '\\': return gbnf_quote("\\\\");
    case '\b': return gbnf_quote("\\b");
    case '\t': return gbnf_quote("\\t");
    case '\n': return gbnf_quote("\\n");
    case '\f': return gbnf_quote("\\f");
    case '\r': return gbnf_quote("\\r");
    default: {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(c));
      return gbnf_quote(buf);
    }
  }
}

}  // namespace

CodePointSet CodePointSet::range(uint32_t lo, uint32_t hi) {
  CodePointSet s;
  s.add(lo, hi);
  return s;
}

void CodePointSet::add(uint32_t lo, uint32_t hi) {
  hi = std::min(hi, kMaxCodePoint);
  if (lo > hi) return;
  // Surrogates are not characters: split a range that spans them.
  if (lo <= kSurrogateHi && hi >= kSurrogateLo) {
    if (lo < kSurrogateLo) add(lo, kSurrogateLo - 1);
    if (hi > kSurrogateHi) add(kSurrogateHi + 1, hi);
    return;
  }
  ranges_.emplace_back(lo, hi);
  std::sort(ranges_.begin(), ranges_.end());
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (const auto& r : ranges_) {
    if (!merged.empty() && merged.back().second + 1 >= r.first)
      merged.back().second = std::max(merged.back().second, r.second);
    else
      merged.push_back(r);
  }
  ranges_ = std::move(merged);
}

void CodePointSet::add(const CodePointSet& other) {
  for (const auto& r : other.ranges_) add(r.first, r.second);
}

CodePointSet CodePointSet::complement() const {
  CodePointSet out;
  uint32_t next = 0;
  for (const auto& r : ranges_) {
    if (r.first > next) out.add(next, r.first - 1);
    next = r.second + 1;
  }
  if (next <= kMaxCodePoint) out.add(next, kMaxCodePoint);
  return out;
}

CodePointSet CodePointSet::minus(const CodePointSet& other) const { return intersect(other.complement()); }

CodePointSet CodePointSet::intersect(const CodePointSet& other) const {
  CodePointSet out;
  for (const auto& a : ranges_)
    for (const auto& b : other.ranges_) {
      const uint32_t lo = std::max(a.first, b.first), hi = std::min(a.second, b.second);
      if (lo <= hi) out.add(lo, hi);
    }
  return out;
}

bool CodePointSet::contains(uint32_t c) const {
  for (const auto& r : ranges_)
    if (c >= r.first && c <= r.second) return true;
  return false;
}

std::string gbnf_class(const CodePointSet& set) {
  std::string out = "[";
  for (const auto& [lo, hi] : set.ranges()) {
    out += class_char(lo);
    if (hi > lo) {
      if (hi > lo + 1) out += '-';
      out += class_char(hi);
    }
  }
  return out + "]";
}

std::string json_chars_gbnf(const CodePointSet& set) {
  const CodePointSet controls = CodePointSet::range(0, 0x1F);
  CodePointSet specials = controls;
  specials.add('"', '"');
  specials.add('\\', '\\');
  std::vector<std::string> alts;
  const CodePointSet raw = set.minus(specials);
  if (!raw.empty()) alts.push_back(raw.is_single() ? gbnf_quote(utf8(raw.ranges()[0].first)) : gbnf_class(raw));
  if (set.contains('"')) alts.push_back(json_escape_literal('"'));
  if (set.contains('\\')) alts.push_back(json_escape_literal('\\'));
  const CodePointSet ctl = set.intersect(controls);
  if (!ctl.ranges().empty() && ctl.ranges()[0] == std::make_pair(0u, 0x1Fu)) {
    // Every control character: the short escapes and \u0000-\u001f.
    alts.push_back(gbnf_quote("\\") + " ([btnfr] | \"u00\" [01] [0-9a-fA-F])");
  } else {
    // Some: the short escapes, and \u00XX for a few others (leaving out the rest of a large
    // set keeps the grammar short; writing fewer characters is always allowed).
    const CodePointSet short_escaped = [] {
      CodePointSet s;
      for (const uint32_t c : {'\b', '\t', '\n', '\f', '\r'}) s.add(c, c);
      return s;
    }();
    const CodePointSet other = ctl.minus(short_escaped);
    size_t n_other = 0;
    for (const auto& [lo, hi] : other.ranges()) n_other += hi - lo + 1;
    for (const auto& [lo, hi] : ctl.ranges())
      for (uint32_t c = lo; c <= hi; ++c)
        if (short_escaped.contains(c) || n_other <= 4) alts.push_back(json_escape_literal(c));
  }
  std::string out;
  for (const auto& a : alts) out += (out.empty() ? "" : " | ") + a;
  return alts.size() > 1 ? "(" + out + ")" : out;
}

std::string utf8(uint32_t c) {
  std::string s;
  tok::append_utf8(s, c);
  return s;
}

bool decode_utf8(std::string_view text, size_t& pos, uint32_t& c) {
  if (pos >= text.size()) return false;
  const tok::Utf8Step step = tok::utf8_step(text, pos);
  if (!step.well_formed) return false;
  // Well-formed (shortest form, a scalar value): the lead byte's payload, then 6 bits a byte.
  const auto b0 = static_cast<unsigned char>(text[pos]);
  static constexpr unsigned kLeadMask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  c = b0 & kLeadMask[step.length];
  for (size_t i = 1; i < step.length; ++i) c = (c << 6) | (static_cast<unsigned char>(text[pos + i]) & 0x3Fu);
  pos += step.length;
  return true;
}

}  // namespace fdl::grammar
