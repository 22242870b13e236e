// GBNF text → Grammar (flashdllm/grammar.h; syntax in docs/GRAMMARS.md): a recursive-descent
// parser into rules of byte-set and rule-reference items, then one flat element array.
#include <algorithm>
#include <cstdio>
#include <string>
#include <unordered_map>

#include "flashdllm/grammar.h"
#include "grammar/code_point_set.h"
#include "grammar/gbnf_text.h"
#include "grammar/utf8_ranges.h"
#include "tokenizer/utf8.h"

namespace fdl {
namespace {

using grammar::decode_utf8;
using grammar::kMaxCodePoint;
using grammar::utf8;

constexpr size_t kMaxSourceBytes = size_t(1) << 20;
constexpr size_t kMaxRules = 65536;
constexpr size_t kMaxRepetitionItems = 10000;
// Bounds on the compiled grammar as a whole: nesting of groups (the parser recurses), and
// elements after repetitions are expanded (what the grammar occupies in memory).
constexpr int kMaxNesting = 256;
constexpr size_t kMaxElements = size_t(1) << 20;

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

}  // namespace

class GrammarBuilder {
 public:
  explicit GrammarBuilder(std::string_view src) : src_(src) {}

  std::shared_ptr<const Grammar> build(std::string_view root) {
    if (src_.size() > kMaxSourceBytes)
      throw GrammarError("", "grammar text of " + std::to_string(src_.size()) + " bytes is over the 1 MiB limit");
    parse_rules();
    const auto it = ids_.find(std::string(root));
    if (it == ids_.end() || !rules_[it->second].defined)
      throw GrammarError("", "the grammar has no rule '" + std::string(root) + "' to start from");
    for (const Rule& r : rules_)
      if (!r.defined) fail(r.first_use, "rule '" + r.name + "' is used but never defined");
    check_left_recursion();
    return flatten(it->second);
  }

 private:
  struct Item {
    bool rule = false;
    uint32_t value = 0;  // byte-set index or rule index
  };
  using Seq = std::vector<Item>;
  struct Rule {
    std::string name;
    std::vector<Seq> alts;
    bool defined = false;
    size_t first_use = 0;  // source offset, for "never defined"
    size_t defined_at = 0;
  };

  [[noreturn]] void fail(size_t offset, const std::string& reason) const {
    size_t line = 1, col = 1;
    for (size_t i = begin_; i < offset && i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        ++line;
        col = 1;
      } else if ((uint8_t(src_[i]) & 0xC0) != 0x80) {  // columns count characters, not UTF-8 bytes
        ++col;
      }
    }
    throw GrammarError("line " + std::to_string(line) + ", column " + std::to_string(col), reason);
  }

  bool eof() const { return pos_ >= src_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < src_.size() ? src_[pos_ + ahead] : '\0'; }

  void skip_space() {
    while (!eof()) {
      const char c = peek();
      if (c == '#') {
        while (!eof() && peek() != '\n') ++pos_;
      } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!eof() && is_name_char(peek())) ++pos_;
    if (pos_ == start) fail(start, "expected a rule name");
    return std::string(src_.substr(start, pos_ - start));
  }

  // Whether a rule definition `name ::=` starts here (ends the previous rule's body).
  bool at_definition() const {
    size_t p = pos_;
    while (p < src_.size() && is_name_char(src_[p])) ++p;
    if (p == pos_) return false;
    while (p < src_.size() && (src_[p] == ' ' || src_[p] == '\t' || src_[p] == '\n' || src_[p] == '\r')) ++p;
    return src_.substr(p, 3) == "::=";
  }

  uint32_t rule_id(const std::string& name, size_t offset) {
    const auto [it, inserted] = ids_.try_emplace(name, uint32_t(rules_.size()));
    if (inserted) {
      if (rules_.size() >= kMaxRules) fail(offset, "more than 65536 rules");
      rules_.push_back(Rule{name, {}, false, offset, 0});
    }
    return it->second;
  }

  uint32_t helper_rule(const std::string& base, std::vector<Seq> alts) {
    if (rules_.size() >= kMaxRules) fail(pos_, "more than 65536 rules (after expanding repetitions)");
    const uint32_t id = uint32_t(rules_.size());
    rules_.push_back(Rule{base + "-" + std::to_string(id), std::move(alts), true, pos_, pos_});
    return id;
  }

  uint32_t byte_set(const std::bitset<256>& set) {
    const auto [it, inserted] = set_ids_.try_emplace(set, uint32_t(sets_.size()));
    if (inserted) sets_.push_back(set);
    return it->second;
  }

  Item single_byte(uint8_t b) {
    std::bitset<256> s;
    s.set(b);
    return Item{false, byte_set(s)};
  }

  void parse_rules() {
    // A byte order mark (editors on Windows write one) is not part of the grammar.
    if (src_.substr(0, 3) == "\xEF\xBB\xBF") pos_ = begin_ = 3;
    skip_space();
    if (eof()) fail(0, "the grammar is empty");
    while (!eof()) {
      const size_t start = pos_;
      const std::string name = parse_name();
      skip_space();
      if (src_.substr(pos_, 3) != "::=") fail(pos_, "expected '::=' after rule name '" + name + "'");
      pos_ += 3;
      const uint32_t id = rule_id(name, start);
      if (rules_[id].defined) fail(start, "rule '" + name + "' is defined twice");
      rules_[id].defined = true;
      rules_[id].defined_at = start;
      current_ = name;
      std::vector<Seq> alts = parse_alternatives(false);
      rules_[id].alts = std::move(alts);
      skip_space();
    }
  }

  std::vector<Seq> parse_alternatives(bool nested) {
    std::vector<Seq> alts;
    for (;;) {
      alts.push_back(parse_sequence(nested));
      skip_space();
      if (peek() == '|') {
        ++pos_;
        continue;
      }
      return alts;
    }
  }

  Seq parse_sequence(bool nested) {
    Seq seq;
    for (;;) {
      skip_space();
      if (eof() || peek() == '|' || peek() == ')') break;
      if (at_definition()) {
        if (nested) fail(pos_, "missing ')' before the next rule");
        break;
      }
      const size_t start = pos_;
      Seq unit = parse_primary();
      // A quantifier applies to the whole primary (a literal of several bytes included).
      skip_space_inline();
      const char q = peek();
      if (q == '*' || q == '+' || q == '?' || q == '{') {
        apply_quantifier(start, std::move(unit), seq);
      } else {
        seq.insert(seq.end(), unit.begin(), unit.end());
      }
    }
    return seq;
  }

  // Quantifiers must follow their primary directly (spaces allowed, not comments).
  void skip_space_inline() {
    while (!eof() && (peek() == ' ' || peek() == '\t')) ++pos_;
  }

  Seq parse_primary() {
    const char c = peek();
    if (c == '"') return parse_literal();
    if (c == '[') return {parse_class()};
    if (c == '.') {
      ++pos_;
      return {any_char()};
    }
    if (c == '(') {
      ++pos_;
      if (++nesting_ > kMaxNesting) fail(pos_ - 1, "groups nested more than 256 deep");
      std::vector<Seq> alts = parse_alternatives(true);
      --nesting_;
      skip_space();
      if (peek() != ')') fail(pos_, "expected ')'");
      ++pos_;
      if (alts.size() == 1) return std::move(alts[0]);
      return {Item{true, helper_rule(current_, std::move(alts))}};
    }
    if (is_name_char(c)) {
      const size_t start = pos_;
      const std::string name = parse_name();
      return {Item{true, rule_id(name, start)}};
    }
    fail(pos_, "unexpected character " + shown_char(pos_));
  }

  // The character at `offset` for an error message: a whole UTF-8 character as a GBNF literal
  // (control characters escaped), else the byte in hex (an ill-formed sequence).
  std::string shown_char(size_t offset) const {
    if (offset >= src_.size()) return "(the end of the text)";
    const tok::Utf8Step step = tok::utf8_step(src_, offset);
    if (step.well_formed) return grammar::gbnf_quote(src_.substr(offset, step.length));
    char hex[16];
    std::snprintf(hex, sizeof hex, "byte 0x%02X", unsigned(uint8_t(src_[offset])));
    return hex;
  }

  void apply_quantifier(size_t start, Seq unit, Seq& out) {
    const char q = peek();
    ++pos_;
    size_t min = 0, max = 0;
    bool unbounded = false;
    if (q == '*') {
      unbounded = true;
    } else if (q == '+') {
      min = 1;
      unbounded = true;
    } else if (q == '?') {
      max = 1;
    } else {
      min = parse_count();
      skip_space_inline();
      if (peek() == ',') {
        ++pos_;
        skip_space_inline();
        if (peek() == '}') {
          unbounded = true;
        } else {
          max = parse_count();
        }
      } else {
        max = min;
      }
      skip_space_inline();
      if (peek() != '}') fail(pos_, "expected '}' to close the repetition");
      ++pos_;
      if (!unbounded && max < min) fail(start, "repetition {m,n} with n < m");
    }
    const size_t copies = min + (unbounded ? 1 : max - min);
    if (copies * std::max<size_t>(unit.size(), 1) > kMaxRepetitionItems)
      fail(start, "repetition expands to more than 10000 elements");
    expanded_ += copies * std::max<size_t>(unit.size(), 1);
    if (expanded_ > kMaxElements) fail(start, "the grammar expands to more than 2^20 elements (its repetitions together)");
    if (unit.empty()) return;  // repeating nothing matches nothing
    const Item one = unit.size() == 1 ? unit[0] : Item{true, helper_rule(current_, {unit})};
    for (size_t i = 0; i < min; ++i) out.push_back(one);
    if (unbounded) {
      // star ::= one star | (empty): right recursion, so the stack does not grow per repeat.
      const uint32_t star = helper_rule(current_, {});
      rules_[star].alts = {Seq{one, Item{true, star}}, Seq{}};
      out.push_back(Item{true, star});
    } else if (max > min) {
      // opt_k ::= one opt_{k+1} | (empty), the innermost first.
      uint32_t next = helper_rule(current_, {Seq{one}, Seq{}});
      for (size_t k = max - min - 1; k > 0; --k) next = helper_rule(current_, {Seq{one, Item{true, next}}, Seq{}});
      out.push_back(Item{true, next});
    }
  }

  size_t parse_count() {
    const size_t start = pos_;
    size_t n = 0;
    while (!eof() && peek() >= '0' && peek() <= '9') {
      n = n * 10 + size_t(peek() - '0');
      if (n > kMaxRepetitionItems) fail(start, "repetition count above 10000");
      ++pos_;
    }
    if (pos_ == start) fail(start, "expected a number in the repetition");
    return n;
  }

  // One character of a literal or class, escapes decoded, as a code point.
  uint32_t parse_char() {
    const size_t start = pos_;
    const auto c = static_cast<unsigned char>(peek());
    if (c == '\\') {
      ++pos_;
      const char e = peek();
      ++pos_;
      switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '0': return 0;
        case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/': case '.':
          return uint32_t(uint8_t(e));
        case 'x': return parse_hex(2, start);
        case 'u': return parse_hex(4, start);
        case 'U': return parse_hex(8, start);
        default: fail(start, "unknown escape: \\ followed by " + shown_char(start + 1));
      }
    }
    // UTF-8 text: one well-formed code point (the grammar must not accept text that is not UTF-8).
    uint32_t cp = 0;
    if (!decode_utf8(src_, pos_, cp)) fail(start, "invalid UTF-8 in the grammar");
    return cp;
  }

  uint32_t parse_hex(int digits, size_t start) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char h = peek();
      int d = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
      if (d < 0) fail(start, "expected " + std::to_string(digits) + " hex digits in the escape");
      v = v * 16 + uint32_t(d);
      ++pos_;
    }
    if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) fail(start, "escape is not a Unicode scalar value");
    return v;
  }

  void append_utf8(uint32_t cp, Seq& out) {
    for (const char b : utf8(cp)) out.push_back(single_byte(uint8_t(b)));
  }

  Seq parse_literal() {
    const size_t start = pos_;
    ++pos_;  // opening quote
    Seq seq;
    for (;;) {
      if (eof() || peek() == '\n') fail(start, "unterminated string literal");
      if (peek() == '"') {
        ++pos_;
        return seq;
      }
      append_utf8(parse_char(), seq);
    }
  }

  Item parse_class() {
    const size_t start = pos_;
    ++pos_;  // '['
    bool negated = false;
    if (peek() == '^') {
      negated = true;
      ++pos_;
    }
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    for (;;) {
      if (eof() || peek() == '\n') fail(start, "unterminated character class");
      if (peek() == ']') {
        ++pos_;
        break;
      }
      const uint32_t lo = parse_char();
      uint32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && pos_ + 1 < src_.size()) {
        ++pos_;
        hi = parse_char();
        if (hi < lo) fail(start, "character range with its end before its start");
      }
      ranges.emplace_back(lo, hi);
    }
    if (ranges.empty() && !negated) fail(start, "empty character class");
    std::sort(ranges.begin(), ranges.end());
    std::vector<std::pair<uint32_t, uint32_t>> merged;
    for (const auto& r : ranges) {
      if (!merged.empty() && r.first <= merged.back().second + 1)
        merged.back().second = std::max(merged.back().second, r.second);
      else
        merged.push_back(r);
    }
    if (negated) {
      std::vector<std::pair<uint32_t, uint32_t>> complement;
      uint32_t next = 0;
      for (const auto& r : merged) {
        if (r.first > next) complement.emplace_back(next, r.first - 1);
        next = r.second + 1;
      }
      if (next <= kMaxCodePoint) complement.emplace_back(next, kMaxCodePoint);
      merged = std::move(complement);
      if (merged.empty()) fail(start, "the negated class excludes every character");
    }
    return class_item(merged);
  }

  Item any_char() { return class_item({{0, kMaxCodePoint}}); }

  // A class as one byte set when it is ASCII only, else a helper rule whose alternatives are
  // the ASCII set and the byte sequences of the multi-byte characters. Equal classes share it.
  Item class_item(const std::vector<std::pair<uint32_t, uint32_t>>& ranges) {
    std::string key;
    for (const auto& r : ranges) key += std::to_string(r.first) + "-" + std::to_string(r.second) + ",";
    if (const auto it = class_ids_.find(key); it != class_ids_.end()) return it->second;
    std::bitset<256> ascii;
    std::vector<grammar::ByteRangeSeq> seqs;
    for (const auto& [lo, hi] : ranges) {
      for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x7F); ++c) ascii.set(c);
      if (hi >= 0x80) grammar::utf8_sequences(std::max<uint32_t>(lo, 0x80), hi, seqs);
    }
    Item item;
    if (seqs.empty()) {
      item = Item{false, byte_set(ascii)};
    } else {
      std::vector<Seq> alts;
      if (ascii.any()) alts.push_back({Item{false, byte_set(ascii)}});
      for (const auto& s : seqs) {
        Seq seq;
        for (const auto& br : s) {
          std::bitset<256> set;
          for (unsigned b = br.lo; b <= br.hi; ++b) set.set(b);
          seq.push_back(Item{false, byte_set(set)});
        }
        alts.push_back(std::move(seq));
      }
      item = Item{true, helper_rule(current_.empty() ? "char" : current_ + "-char", std::move(alts))};
    }
    class_ids_.emplace(key, item);
    return item;
  }

  // A rule that can reach itself before consuming a byte would expand forever.
  void check_left_recursion() const {
    const size_t n = rules_.size();
    std::vector<char> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const Seq& alt : rules_[r].alts) {
          bool all = true;
          for (const Item& it : alt) all = all && it.rule && nullable[it.value];
          if (all) {
            nullable[r] = 1;
            changed = true;
            break;
          }
        }
      }
    }
    // Edges r -> s where s is referenced at a position that only nullable items precede.
    std::vector<std::vector<uint32_t>> first(n);
    for (size_t r = 0; r < n; ++r)
      for (const Seq& alt : rules_[r].alts)
        for (const Item& it : alt) {
          if (!it.rule) break;
          first[r].push_back(it.value);
          if (!nullable[it.value]) break;
        }
    // Depth-first search without recursion (a chain of rules may be tens of thousands long).
    std::vector<uint8_t> state(n, 0);  // 0 new, 1 on the search path, 2 done
    std::vector<std::pair<uint32_t, size_t>> path;  // rule, next edge to follow
    for (uint32_t start = 0; start < n; ++start) {
      if (state[start] != 0) continue;
      state[start] = 1;
      path.emplace_back(start, 0);
      while (!path.empty()) {
        auto& [r, edge] = path.back();
        if (edge == first[r].size()) {
          state[r] = 2;
          path.pop_back();
          continue;
        }
        const uint32_t s = first[r][edge++];
        if (state[s] == 1) {
          const Rule& rule = rules_[s];
          fail(rule.defined_at, "rule '" + rule.name +
                                    "' is left-recursive (it can reach itself without matching a character; "
                                    "a repetition of something that can be empty does this too)");
        }
        if (state[s] == 0) {
          state[s] = 1;
          path.emplace_back(s, 0);
        }
      }
    }
  }

  std::shared_ptr<const Grammar> flatten(uint32_t root) {
    std::shared_ptr<Grammar> g(new Grammar());
    g->rule_alternatives_.resize(rules_.size());
    for (size_t r = 0; r < rules_.size(); ++r) {
      g->rule_names_.push_back(rules_[r].name);
      for (const Seq& alt : rules_[r].alts) {
        g->rule_alternatives_[r].push_back(uint32_t(g->elements_.size()));
        for (const Item& it : alt)
          g->elements_.push_back({it.rule ? Grammar::Element::Kind::Rule : Grammar::Element::Kind::Bytes, it.value});
        g->elements_.push_back({Grammar::Element::Kind::End, 0});
      }
    }
    g->byte_sets_ = std::move(sets_);
    g->root_ = root;
    g->source_ = std::string(src_);
    return g;
  }

  std::string_view src_;
  size_t pos_ = 0;
  size_t begin_ = 0;  // where the grammar starts (after a byte order mark)
  std::string current_;  // the rule being parsed (helper rules are named after it)
  int nesting_ = 0;       // groups open around the parse position
  size_t expanded_ = 0;   // elements the repetitions have added
  std::vector<Rule> rules_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::vector<std::bitset<256>> sets_;
  std::unordered_map<std::bitset<256>, uint32_t> set_ids_;
  std::unordered_map<std::string, Item> class_ids_;
};

std::shared_ptr<const Grammar> Grammar::compile(std::string_view gbnf, std::string_view root) {
  std::shared_ptr<const Grammar> g = GrammarBuilder(gbnf).build(root);
  // Refused here, where the caller can report it, rather than on first use: a grammar whose
  // start cannot even be expanded within the budget (chains of rules that match only empty
  // text, each used twice, multiply their paths).
  size_t budget = GrammarMatcher::kExpandBudget;
  std::vector<GrammarMatcher::Stack> stacks;
  for (const uint32_t alt : g->alternatives(g->root())) {
    GrammarMatcher::expand(*g, GrammarMatcher::Stack{alt}, stacks, budget);
    if (budget == 0)
      throw GrammarError("", "the grammar is too ambiguous: expanding its start rule takes more than 65536 steps");
  }
  return g;
}

}  // namespace fdl
