// Internal: a set of named GBNF rules built from code (the JSON-schema converter and its
// regex translator). It hands out unique rule names, shares one rule between equal bodies,
// caps the text at what the GBNF compiler accepts, and can roll back to a mark, so that a
// subschema found unsatisfiable halfway through leaves no rules behind.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace fdl::grammar {

/// Rules in the order they were added. Names are [a-zA-Z0-9-]+; names starting with "json-"
/// and the name "root" are kept for the fixed rules (define_fixed, gbnf's root).
/// Not thread-safe.
class RuleSet {
 public:
  /// The GBNF compiler's limit on text (flashdllm/grammar.h), minus room for the root rule.
  static constexpr size_t kMaxBytes = (size_t(1) << 20) - 4096;
  /// Rules in all, the root rule gbnf() adds included: the converter's own cap, well below the
  /// compiler's 65,536, which also counts a rule for each group and repetition in them.
  static constexpr size_t kMaxRules = 20000;

  /// Adds `name ::= body` under a fresh name made from `hint`, or returns the name of the
  /// rule that already has this body. Throws GrammarError(where, ...) past the size caps.
  std::string add(std::string_view hint, const std::string& body, const std::string& where);
  /// A fresh name for a rule whose body is not known yet (a recursive reference); give it
  /// its body with define() before text() is called.
  std::string reserve(std::string_view hint, const std::string& where);
  void define(const std::string& name, const std::string& body, const std::string& where);
  /// Defines `name` (a fixed "json-..." name) unless it is defined already.
  void define_fixed(const std::string& name, const std::string& body, const std::string& where);
  bool has(const std::string& name) const { return index_.count(name) != 0; }

  /// A point to roll back to: rollback(mark) removes every rule added or reserved since.
  size_t mark() const { return rules_.size(); }
  void rollback(size_t mark);

  /// Every rule, one `name ::= body` line each, in the order added.
  std::string text() const;
  size_t bytes() const { return bytes_; }

  /// `hint` made into a rule name: runs of other characters become '-', at most 48 long.
  static std::string sanitize(std::string_view hint);

 private:
  struct Rule {
    std::string name, body;
    bool defined = false;
    bool shared = false;  // listed in by_body_
  };
  std::string fresh_name(std::string_view hint);
  void check_caps(size_t extra, const std::string& where) const;

  std::vector<Rule> rules_;
  std::unordered_map<std::string, size_t> index_;       // name -> position in rules_
  std::unordered_map<std::string, std::string> by_body_;  // body -> name, for sharing
  std::unordered_map<std::string, uint32_t> next_suffix_;  // per base name
  size_t bytes_ = 0;
};

/// `parts` joined by appending (this also keeps GCC 12 from warning falsely, -Wrestrict, about
/// "literal" + temporary string at -O3).
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::string out;
  (out.append(std::string_view(parts)), ...);
  return out;
}

/// Marks "no upper bound" for repeat().
constexpr uint64_t kUnbounded = std::numeric_limits<uint64_t>::max();

/// Whether `expr` is one GBNF primary (a rule name, one literal, one class, `.` or one
/// parenthesized group), to which a quantifier applies as a whole.
bool is_primary(std::string_view expr);
/// `expr`, parenthesized unless it is one primary already.
std::string as_primary(std::string_view expr);

/// GBNF for `expr` repeated min..max times (max may be kUnbounded). Counts the compiler would
/// refuse (above 100 here, to keep expansions small) become nested helper rules: x{0,n} is
/// (x{100}){0,q-1} x{0,100+r} for n = 100q + r, recursively, so the text grows with log n.
/// Returns "" for {0,0}.
std::string repeat(RuleSet& rules, std::string_view expr, uint64_t min, uint64_t max, std::string_view hint,
                   const std::string& where);

}  // namespace fdl::grammar
