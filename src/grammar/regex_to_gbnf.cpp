// ECMAScript pattern → GBNF for JSON-string content (see regex_to_gbnf.h): a recursive-
// descent parser into a small tree (character sets, sequences, alternatives, repetitions),
// then the tree written as GBNF.
#include "grammar/regex_to_gbnf.h"

#include <algorithm>
#include <vector>

#include "grammar/code_point_set.h"
#include "grammar/gbnf_text.h"
#include "grammar/unsatisfiable.h"

namespace fdl::grammar {
namespace {

constexpr size_t kMaxPatternChars = 10000;
constexpr int kMaxDepth = 100;
constexpr uint64_t kMaxCount = 100000;  // largest {m,n} count accepted
constexpr uint32_t kBmpMax = 0xFFFF;

uint64_t add_sat(uint64_t a, uint64_t b) { return a > kUnbounded - b ? kUnbounded : a + b; }
uint64_t mul_sat(uint64_t a, uint64_t b) {
  if (a == 0 || b == 0) return 0;
  return a > kUnbounded / b ? kUnbounded : a * b;
}

struct Node {
  enum class Kind { Chars, Seq, Alt, Repeat };
  Kind kind = Kind::Seq;
  CodePointSet set;         // Chars
  std::vector<Node> kids;   // Seq, Alt; Repeat: the one repeated
  uint64_t min = 0, max = 0;  // Repeat
  size_t pos = 0;           // offset in the pattern
  bool slack = false;       // Repeat: the any-character run standing for a missing anchor

  static Node chars(CodePointSet s, size_t pos) {
    Node n;
    n.kind = Kind::Chars;
    n.set = std::move(s);
    n.pos = pos;
    return n;
  }
};

bool nullable(const Node& n) {
  switch (n.kind) {
    case Node::Kind::Chars: return false;
    case Node::Kind::Seq: return std::all_of(n.kids.begin(), n.kids.end(), nullable);
    case Node::Kind::Alt: return std::any_of(n.kids.begin(), n.kids.end(), nullable);
    case Node::Kind::Repeat: return n.min == 0 || nullable(n.kids[0]);
  }
  return false;
}

// Shortest and longest match, in characters (kUnbounded: no longest).
std::pair<uint64_t, uint64_t> lengths(const Node& n) {
  switch (n.kind) {
    case Node::Kind::Chars: return {1, 1};
    case Node::Kind::Seq: {
      uint64_t lo = 0, hi = 0;
      for (const Node& k : n.kids) {
        const auto [a, b] = lengths(k);
        lo = add_sat(lo, a);
        hi = add_sat(hi, b);
      }
      return {lo, hi};
    }
    case Node::Kind::Alt: {
      uint64_t lo = kUnbounded, hi = 0;
      for (const Node& k : n.kids) {
        const auto [a, b] = lengths(k);
        lo = std::min(lo, a);
        hi = std::max(hi, b);
      }
      return {lo, hi};
    }
    case Node::Kind::Repeat: {
      const auto [a, b] = lengths(n.kids[0]);
      return {mul_sat(a, n.min), n.max == kUnbounded && b > 0 ? kUnbounded : mul_sat(b, n.max)};
    }
  }
  return {0, 0};
}

// The character classes both dialects agree on: `narrow` is in both dialects' meaning of the
// escape (used in positive classes), `wide` holds both meanings (negated classes complement it).
struct ClassEscape {
  CodePointSet narrow, wide;
};

CodePointSet ascii_digits() { return CodePointSet::range('0', '9'); }
CodePointSet ascii_word() {
  CodePointSet s = ascii_digits();
  s.add('a', 'z');
  s.add('A', 'Z');
  s.add('_', '_');
  return s;
}
CodePointSet ascii_space() {
  CodePointSet s = CodePointSet::range('\t', '\r');  // \t \n \v \f \r
  s.add(' ', ' ');
  return s;
}
// Every character that ECMAScript's \s or Python's str \s matches.
CodePointSet any_space() {
  CodePointSet s = ascii_space();
  s.add(0x1C, 0x1F);
  for (const uint32_t c : {0x85u, 0xA0u, 0x1680u, 0x2028u, 0x2029u, 0x202Fu, 0x205Fu, 0x3000u, 0xFEFFu}) s.add(c, c);
  s.add(0x2000, 0x200A);
  return s;
}

ClassEscape class_escape(char e) {
  // Python's \d and \w also take non-ASCII digits and letters; the first non-ASCII decimal
  // digit is U+0660, so below it \D is exactly "not 0-9".
  const CodePointSet non_ascii_digits = CodePointSet::range(0x660, kMaxCodePoint);
  const CodePointSet non_ascii = CodePointSet::range(0x80, kMaxCodePoint);
  switch (e) {
    case 'd': {
      CodePointSet wide = ascii_digits();
      wide.add(non_ascii_digits);
      return {ascii_digits(), wide};
    }
    case 'w': {
      CodePointSet wide = ascii_word();
      wide.add(non_ascii);
      return {ascii_word(), wide};
    }
    case 's': return {ascii_space(), any_space()};
    default: {  // D W S: the complements, narrow and wide swapped
      const ClassEscape pos = class_escape(char(e - 'A' + 'a'));
      return {pos.wide.complement(), pos.narrow.complement()};
    }
  }
}

class Parser {
 public:
  Parser(std::string_view pattern, const std::string& where) : where_(where) {
    const std::string text(pattern);
    for (size_t i = 0; i < text.size();) {
      uint32_t c = 0;
      if (!decode_utf8(text, i, c)) throw GrammarError(where_, "the pattern is not valid UTF-8");
      cps_.push_back(c);
    }
    if (cps_.size() > kMaxPatternChars) throw GrammarError(where_, "the pattern is longer than 10000 characters");
  }

  // The top-level alternatives, each with whether it is anchored at its start and end.
  struct Top {
    Node seq;
    bool start = false, end = false;
  };
  std::vector<Top> parse() {
    std::vector<Top> tops;
    for (;;) {
      Top t;
      if (peek() == '^') {
        t.start = true;
        ++pos_;
      }
      t.seq = sequence(0);
      if (peek() == '$') {
        t.end = true;
        ++pos_;
      }
      tops.push_back(std::move(t));
      if (eof()) return tops;
      if (peek() == '|') {
        ++pos_;
        continue;
      }
      fail(peek() == ')' ? "unmatched ')'" : "an anchor (^ or $) is supported only at the start or end of the pattern");
    }
  }

 private:
  [[noreturn]] void fail(const std::string& reason) const { fail_at(pos_, reason); }
  [[noreturn]] void fail_at(size_t pos, const std::string& reason) const {
    throw GrammarError(where_, reason + " (pattern offset " + std::to_string(pos) + ")");
  }
  bool eof() const { return pos_ >= cps_.size(); }
  uint32_t peek(size_t ahead = 0) const { return pos_ + ahead < cps_.size() ? cps_[pos_ + ahead] : 0xFFFFFFFF; }

  Node alternatives(int depth) {
    Node alt;
    alt.kind = Node::Kind::Alt;
    alt.pos = pos_;
    for (;;) {
      alt.kids.push_back(sequence(depth));
      if (peek() != '|') break;
      ++pos_;
    }
    return alt.kids.size() == 1 ? std::move(alt.kids[0]) : alt;
  }

  // Terms up to '|', ')', a final '$' or the end.
  Node sequence(int depth) {
    Node seq;
    seq.kind = Node::Kind::Seq;
    seq.pos = pos_;
    for (;;) {
      if (eof() || peek() == '|' || peek() == ')') break;
      if (peek() == '$' && depth == 0 && (pos_ + 1 == cps_.size() || peek(1) == '|')) break;
      if (peek() == '^' || peek() == '$')
        fail("an anchor (^ or $) is supported only at the start or end of the pattern");
      const size_t start = pos_;
      Node atom = this->atom(depth);
      quantify(std::move(atom), start, seq.kids);
    }
    return seq;
  }

  void quantify(Node atom, size_t start, std::vector<Node>& out) {
    uint64_t min = 0, max = 0;
    const uint32_t q = peek();
    if (q == '*') {
      max = kUnbounded;
    } else if (q == '+') {
      min = 1, max = kUnbounded;
    } else if (q == '?') {
      max = 1;
    } else if (q == '{' && counted(min, max)) {
      // pos_ is on the '}', which the step below passes
    } else {
      out.push_back(std::move(atom));
      return;
    }
    ++pos_;
    if (peek() == '?') ++pos_;  // lazy: the same strings match
    if (peek() == '*' || peek() == '+' || peek() == '?' || (peek() == '{' && lookahead_counted()))
      fail("a quantifier after a quantifier is not supported");
    if (max == kUnbounded && nullable(atom))
      fail_at(start, "* or + over a subpattern that can match the empty string is not supported");
    Node rep;
    rep.kind = Node::Kind::Repeat;
    rep.min = min;
    rep.max = max;
    rep.pos = start;
    rep.kids.push_back(std::move(atom));
    out.push_back(std::move(rep));
  }

  bool lookahead_counted() {
    const size_t save = pos_;
    uint64_t a = 0, b = 0;
    const bool ok = counted(a, b);
    pos_ = save;
    return ok;
  }

  // {m}, {m,} or {m,n} at pos_: true with pos_ on the '}'; false (pos_ unchanged) when the
  // text is not a quantifier, in which case '{' is a literal in both dialects.
  bool counted(uint64_t& min, uint64_t& max) {
    const size_t save = pos_;
    ++pos_;
    auto number = [&](uint64_t& v) {
      const size_t from = pos_;
      v = 0;
      while (peek() >= '0' && peek() <= '9') {
        v = std::min<uint64_t>(v * 10 + (peek() - '0'), kMaxCount + 1);
        ++pos_;
      }
      return pos_ > from;
    };
    if (!number(min)) {
      if (peek() == ',') fail_at(save, "{,n} means different things in ECMAScript and Python; write {0,n}");
      pos_ = save;
      return false;
    }
    max = min;
    if (peek() == ',') {
      ++pos_;
      if (!number(max)) max = kUnbounded;
    }
    if (peek() != '}') {
      pos_ = save;
      return false;
    }
    if ((max != kUnbounded && max > kMaxCount) || min > kMaxCount) fail_at(save, "a repetition count above 100000");
    if (max < min) fail_at(save, "a repetition {m,n} with n < m");
    return true;
  }

  Node atom(int depth) {
    if (depth > kMaxDepth) fail("groups nested more than 100 deep");
    const size_t start = pos_;
    const uint32_t c = peek();
    if (c == '*' || c == '+' || c == '?') fail("a quantifier with nothing to repeat");
    if (c == '{' && lookahead_counted()) fail("a quantifier with nothing to repeat");
    if (c == '(') return group(depth);
    if (c == '[') return char_class();
    if (c == '.') {
      ++pos_;
      CodePointSet s = CodePointSet::range(0, kBmpMax);
      for (const uint32_t t : {uint32_t('\n'), uint32_t('\r'), 0x2028u, 0x2029u}) s = s.minus(CodePointSet::single(t));
      return Node::chars(s, start);
    }
    if (c == '\\') {
      ++pos_;
      return escape_atom(start);
    }
    ++pos_;
    return Node::chars(CodePointSet::single(c), start);
  }

  Node group(int depth) {
    const size_t start = pos_;
    ++pos_;  // '('
    if (peek() == '?') {
      const uint32_t k = peek(1);
      if (k == ':') {
        pos_ += 2;
      } else if (k == '=' || k == '!' || (k == '<' && (peek(2) == '=' || peek(2) == '!'))) {
        fail_at(start, "lookaround assertions are not supported");
      } else if (k == '<' || (k == 'P' && peek(2) == '<')) {
        pos_ += k == '<' ? 2 : 3;
        while (!eof() && peek() != '>') ++pos_;
        if (eof()) fail_at(start, "unterminated group name");
        ++pos_;
      } else {
        fail_at(start, "this group syntax (inline flags, ...) is not supported");
      }
    }
    Node inner = alternatives(depth + 1);
    if (peek() != ')') fail_at(start, "unterminated group");
    ++pos_;
    return inner;
  }

  uint32_t hex(int digits, size_t start) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const uint32_t h = peek();
      const int d = (h >= '0' && h <= '9') ? int(h - '0') : (h >= 'a' && h <= 'f') ? int(h - 'a' + 10)
                   : (h >= 'A' && h <= 'F') ? int(h - 'A' + 10) : -1;
      if (d < 0) fail_at(start, "expected " + std::to_string(digits) + " hex digits after the escape");
      v = v * 16 + uint32_t(d);
      ++pos_;
    }
    if (v >= 0xD800 && v <= 0xDFFF) fail_at(start, "a surrogate escape is not supported (the dialects differ)");
    return v;
  }

  // After a backslash, outside or inside a class: one character, or a class escape (set).
  // Returns true and sets `esc` for \d \D \w \W \s \S.
  bool escape(size_t start, bool in_class, uint32_t& ch, ClassEscape& esc) {
    if (eof()) fail_at(start, "the pattern ends with a backslash");
    const uint32_t e = peek();
    ++pos_;
    switch (e) {
      case 'd': case 'D': case 'w': case 'W': case 's': case 'S':
        esc = class_escape(char(e));
        return true;
      case 't': ch = '\t'; return false;
      case 'n': ch = '\n'; return false;
      case 'r': ch = '\r'; return false;
      case 'f': ch = '\f'; return false;
      case 'v': ch = '\v'; return false;
      case 'x': ch = hex(2, start); return false;
      case 'u': ch = hex(4, start); return false;
      case '0':
        if (peek() >= '0' && peek() <= '9') fail_at(start, "octal escapes are not supported");
        ch = 0;
        return false;
      case 'b':
        if (in_class) {
          ch = '\b';
          return false;
        }
        fail_at(start, "word boundaries (\\b, \\B) are not supported");
      default:
        break;
    }
    if (e >= '1' && e <= '9') fail_at(start, "backreferences are not supported");
    if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z'))
      fail_at(start, std::string("the escape \\") + char(e) + " is not supported");
    ch = e;  // escaped punctuation or a non-ASCII character: itself
    return false;
  }

  Node escape_atom(size_t start) {
    uint32_t ch = 0;
    ClassEscape esc;
    if (escape(start, false, ch, esc)) return Node::chars(esc.narrow.intersect(CodePointSet::range(0, kBmpMax)), start);
    return Node::chars(CodePointSet::single(ch), start);
  }

  Node char_class() {
    const size_t start = pos_;
    ++pos_;  // '['
    const bool negated = peek() == '^';
    if (negated) ++pos_;
    if (peek() == ']') fail_at(start, "[] and [^] mean different things in ECMAScript and Python");
    CodePointSet members;  // wide meanings when negated, narrow otherwise
    // The previous item, when it was one character (it may start a range).
    bool have_prev = false;
    uint32_t prev = 0;
    for (;;) {
      if (eof()) fail_at(start, "unterminated character class");
      if (peek() == ']') {
        ++pos_;
        break;
      }
      const size_t item = pos_;
      uint32_t ch = 0;
      bool is_set = false;
      ClassEscape esc;
      if (peek() == '\\') {
        ++pos_;
        is_set = escape(item, true, ch, esc);
      } else {
        ch = peek();
        ++pos_;
      }
      if (!is_set && ch > kBmpMax) fail_at(item, "a character above U+FFFF in a class is not supported");
      const bool raw_dash = cps_[item] == '-';
      if (raw_dash && have_prev && peek() != ']') {
        // A range prev-next.
        const size_t to = pos_;
        uint32_t hi = 0;
        ClassEscape hi_esc;
        bool hi_set = false;
        if (peek() == '\\') {
          ++pos_;
          hi_set = escape(to, true, hi, hi_esc);
        } else {
          hi = peek();
          ++pos_;
        }
        if (hi_set) fail_at(to, "a range ending in a class escape is not supported");
        if (hi > kBmpMax) fail_at(to, "a character above U+FFFF in a class is not supported");
        if (hi < prev) fail_at(item, "a character range with its end before its start");
        members.add(prev, hi);
        have_prev = false;
        continue;
      }
      if (is_set) {
        if (peek() == '-' && peek(1) != ']') fail_at(item, "a range starting at a class escape is not supported");
        members.add(negated ? esc.wide : esc.narrow);
        have_prev = false;
      } else {
        members.add(ch, ch);
        have_prev = true;
        prev = ch;
      }
    }
    const CodePointSet bmp = CodePointSet::range(0, kBmpMax);
    return Node::chars(negated ? bmp.minus(members) : members.intersect(bmp), start);
  }

  std::string where_;
  std::vector<uint32_t> cps_;
  size_t pos_ = 0;
};

// JSON text for one character outside quotes-and-backslashes and controls: itself.
bool is_raw(uint32_t c) { return c >= 0x20 && c != '"' && c != '\\'; }

class Writer {
 public:
  Writer(RuleSet& rules, std::string_view hint, const std::string& where) : rules_(rules), hint_(hint), where_(where) {}

  std::string write(const Node& n) {
    switch (n.kind) {
      case Node::Kind::Chars: {
        if (n.set.empty()) throw Unsatisfiable(where_, "a character class that matches nothing");
        const std::string e = json_chars_gbnf(n.set);
        // Long classes (negations, \S, .) get a rule, so repetitions can name them.
        return e.size() > 48 ? rules_.add(std::string(hint_) + "-char", e, where_) : e;
      }
      case Node::Kind::Seq: return sequence(n.kids);
      case Node::Kind::Alt: {
        std::string out;
        bool empty_alt = false;
        for (const Node& k : n.kids) {
          const std::string s = write(k);
          if (s.empty()) {
            empty_alt = true;
            continue;
          }
          out += (out.empty() ? "" : " | ") + s;
        }
        if (out.empty()) return "";
        return "(" + out + ")" + (empty_alt ? "?" : "");
      }
      case Node::Kind::Repeat:
        return repeat(rules_, as_primary(write(n.kids[0])), n.min, n.max, std::string(hint_) + "-rep", where_);
    }
    return "";
  }

  std::string sequence(const std::vector<Node>& kids) {
    std::string out, literal;
    auto emit = [&](const std::string& s) {
      if (!s.empty()) out += (out.empty() ? "" : " ") + s;
    };
    for (const Node& k : kids) {
      // Runs of single raw characters become one literal.
      if (k.kind == Node::Kind::Chars && k.set.is_single() && is_raw(k.set.ranges()[0].first)) {
        literal += utf8(k.set.ranges()[0].first);
        continue;
      }
      if (!literal.empty()) emit(gbnf_quote(literal)), literal.clear();
      emit(write(k));
    }
    if (!literal.empty()) emit(gbnf_quote(literal));
    return out;
  }

 private:
  RuleSet& rules_;
  std::string_view hint_;
  const std::string& where_;
};

// The items of a top-level alternative, with any-character repetitions for a missing anchor.
std::vector<Node> top_items(const Parser::Top& t) {
  const Node any_run = [] {
    Node r;
    r.kind = Node::Kind::Repeat;
    r.max = kUnbounded;
    r.slack = true;
    r.kids.push_back(Node::chars(CodePointSet::all(), 0));
    return r;
  }();
  std::vector<Node> items;
  if (!t.start) items.push_back(any_run);
  if (!t.start && !t.end && t.seq.kids.empty()) return items;  // matches every string
  for (const Node& k : t.seq.kids) {
    // A group that is a plain sequence joins the outer one (its items may carry the slack).
    if (k.kind == Node::Kind::Seq)
      items.insert(items.end(), k.kids.begin(), k.kids.end());
    else
      items.push_back(k);
  }
  if (!t.end) items.push_back(any_run);
  return items;
}

// Fits a sequence's length into [lo, hi]: true when it already fits or when one repetition
// of single characters can take the slack (the other such repetitions are held at their
// minimum). False when no string of the sequence fits; throws when this cannot be decided.
bool fit_length(std::vector<Node>& items, uint64_t lo, uint64_t hi, const std::string& where) {
  Node seq;
  seq.kind = Node::Kind::Seq;
  seq.kids = items;
  const auto [min_len, max_len] = lengths(seq);
  if (min_len >= lo && max_len <= hi) return true;
  if (min_len > hi) return false;
  // Lengths of everything but the flexible item, with flexible repetitions at their minimum.
  uint64_t fixed = 0;
  std::vector<size_t> flexible;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto [a, b] = lengths(items[i]);
    if (a == b) {
      fixed = add_sat(fixed, a);
    } else if (items[i].kind == Node::Kind::Repeat && items[i].kids[0].kind == Node::Kind::Chars) {
      flexible.push_back(i);
      fixed = add_sat(fixed, items[i].min);
    } else {
      throw GrammarError(where, "pattern combined with minLength/maxLength is supported only when one repetition of "
                                "single characters can take up the length (pattern offset " +
                                    std::to_string(items[i].pos) + ")");
    }
  }
  if (flexible.empty()) return fixed >= lo && fixed <= hi;
  // Prefer the pattern's own repetitions to the any-character runs of missing anchors.
  std::stable_partition(flexible.begin(), flexible.end(), [&](size_t i) { return !items[i].slack; });
  for (const size_t f : flexible) {
    Node& rep = items[f];
    const uint64_t others = fixed - rep.min;  // <= hi, since the shortest match is
    const uint64_t want_lo = lo > others ? lo - others : 0;
    const uint64_t want_hi = hi == kUnbounded ? kUnbounded : hi - others;
    const uint64_t c_lo = std::max(rep.min, want_lo), c_hi = std::min(rep.max, want_hi);
    if (c_lo > c_hi) continue;
    for (const size_t g : flexible)
      if (g != f) items[g].max = items[g].min;
    rep.min = c_lo;
    rep.max = c_hi;
    return true;
  }
  return false;
}

}  // namespace

std::string regex_to_gbnf(std::string_view pattern, uint64_t min_length, uint64_t max_length, RuleSet& rules,
                          std::string_view hint, const std::string& where) {
  Parser parser(pattern, where);
  const std::vector<Parser::Top> tops = parser.parse();
  Writer writer(rules, hint, where);
  std::vector<std::string> alts;
  bool empty_alt = false;
  for (const Parser::Top& t : tops) {
    std::vector<Node> items = top_items(t);
    if (!fit_length(items, min_length, max_length, where)) continue;
    const std::string s = writer.sequence(items);
    if (s.empty()) {
      empty_alt = true;
    } else if (std::find(alts.begin(), alts.end(), s) == alts.end()) {
      alts.push_back(s);
    }
  }
  if (alts.empty() && !empty_alt)
    throw Unsatisfiable(where, "no string matches the pattern within minLength/maxLength");
  std::string out;
  for (const auto& a : alts) out += (out.empty() ? "" : " | ") + a;
  if (alts.size() > 1 || (empty_alt && !alts.empty())) out = "(" + out + ")" + (empty_alt ? "?" : "");
  return out;
}

}  // namespace fdl::grammar
