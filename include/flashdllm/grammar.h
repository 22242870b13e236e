// flashdllm/grammar.h — formal grammars that constrain generation: GBNF text (the grammar
// format of llama.cpp's `--grammar`, described in docs/GRAMMARS.md) compiled to a byte-level
// pushdown automaton, and a matcher that follows it one byte at a time.
//
// Model: a grammar is a set of rules `name ::= alternatives`; `root` (or the rule named at
// compile time) is the start. Terminals are string literals, character classes and `.`;
// they are matched on the UTF-8 *bytes* of the text (a class over code points becomes the
// byte sequences of its UTF-8 encodings), so a token that ends inside a multi-byte
// character is checked exactly, with no partial-character state. Quantifiers `* + ? {m,n}`
// become right-recursive helper rules. Left recursion (a rule that can reach itself without
// consuming a byte) is refused at compile time, since a pushdown automaton that follows it
// never terminates.
//
// State: a matcher holds the set of parse stacks consistent with the bytes accepted so far
// (one per live parse; a stack is the positions still to match, innermost rule last). A byte
// is accepted when at least one stack accepts it; the text may end when some stack is empty.
//
// Errors: compilation throws GrammarError with the line and column in the source (1-based)
// and a one-line reason; so does a grammar whose start alone takes more than kExpandBudget
// rule visits to expand (exponentially ambiguous empty rules). A matcher never throws for text: accept_bytes() returns false and
// leaves the state as it was.
// Thread-safety: a compiled Grammar is immutable and may be shared between threads and
// requests; a GrammarMatcher is one sequence's state (not thread-safe; a copy costs its
// stacks: usually a few short vectors, at most kMaxStacks of kMaxStackDepth).
#pragma once

#include <bitset>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace fdl {

/// A grammar (or a JSON schema converted to one) that cannot be compiled.
class GrammarError : public std::invalid_argument {
 public:
  /// `where`: "line L, column C" for GBNF text, a JSON pointer for schemas.
  GrammarError(const std::string& where, const std::string& reason)
      : std::invalid_argument(where.empty() ? reason : where + ": " + reason), where_(where), reason_(reason) {}
  const std::string& where() const { return where_; }
  const std::string& reason() const { return reason_; }

 private:
  std::string where_, reason_;
};

/// A compiled grammar: immutable, shared by the matchers of every request that uses it.
class Grammar {
 public:
  /// One element of an alternative: a set of bytes to match, a reference to a rule, or the
  /// end of the alternative.
  struct Element {
    enum class Kind : uint8_t { Bytes, Rule, End };
    Kind kind = Kind::End;
    uint32_t value = 0;  ///< Bytes: index into byte_sets(); Rule: rule index
  };

  /// Compiles GBNF text; `root`: the start rule. Throws GrammarError.
  /// Limits (GrammarError beyond them): 1 MiB of text, 65,536 rules, groups nested 256
  /// deep, a repetition expanding to 10,000 elements and all of them to 2^20.
  static std::shared_ptr<const Grammar> compile(std::string_view gbnf, std::string_view root = "root");

  /// The flat element array: every alternative of every rule, each closed by an End.
  const std::vector<Element>& elements() const { return elements_; }
  /// Start positions (into elements()) of rule r's alternatives.
  const std::vector<uint32_t>& alternatives(uint32_t rule) const { return rule_alternatives_[rule]; }
  const std::vector<std::bitset<256>>& byte_sets() const { return byte_sets_; }
  uint32_t root() const { return root_; }
  size_t n_rules() const { return rule_alternatives_.size(); }
  /// Rule names, for messages (helper rules are named after the rule they came from).
  const std::string& rule_name(uint32_t rule) const { return rule_names_[rule]; }
  /// The source text the grammar was compiled from (after conversion, for JSON schemas).
  const std::string& source() const { return source_; }

 private:
  friend class GrammarBuilder;
  Grammar() = default;
  std::vector<Element> elements_;
  std::vector<std::vector<uint32_t>> rule_alternatives_;
  std::vector<std::bitset<256>> byte_sets_;
  std::vector<std::string> rule_names_;
  uint32_t root_ = 0;
  std::string source_;
};

/// One sequence's position in a grammar: the set of parse stacks after the bytes accepted.
class GrammarMatcher {
 public:
  /// A stack: element positions still to match, the innermost (next) last. Empty = done.
  using Stack = std::vector<uint32_t>;

  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);

  /// Accepts one byte: true and the state advanced when some stack takes it, else false and
  /// the state unchanged.
  bool accept_byte(uint8_t byte);
  /// Accepts all of `bytes` or none of them (the state is unchanged on false).
  bool accept_bytes(std::string_view bytes);
  /// Whether the bytes so far form a complete sentence of the grammar.
  bool can_end() const;
  /// Bytes some stack accepts next.
  std::bitset<256> next_bytes() const;
  /// The stacks, each already expanded so that its last position is a Bytes element (or the
  /// stack is empty), sorted and without duplicates.
  const std::vector<Stack>& stacks() const { return stacks_; }
  const Grammar& grammar() const { return *grammar_; }
  const std::shared_ptr<const Grammar>& grammar_ptr() const { return grammar_; }

  /// `stack` expanded: while its top is a rule reference or an alternative's end, it is
  /// replaced by what it stands for; every resulting stack (one per path through the
  /// rules' alternatives) is appended to `out`. Each rule visited takes one unit of
  /// `budget`; when it runs out the remaining paths are dropped and false is returned (the
  /// text they would allow is refused, never accepted wrongly). Paths deeper than
  /// kMaxStackDepth are dropped too.
  static bool expand(const Grammar& g, Stack stack, std::vector<Stack>& out, size_t& budget);

  static constexpr size_t kMaxStackDepth = 4096;   ///< nested rules one parse may hold
  static constexpr size_t kMaxStacks = 16384;      ///< parses followed at once
  static constexpr size_t kExpandBudget = 1 << 16; ///< rule visits per accepted byte

 private:
  std::shared_ptr<const Grammar> grammar_;
  std::vector<Stack> stacks_;
  std::vector<Stack> scratch_;
};

}  // namespace fdl
