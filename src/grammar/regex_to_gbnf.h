// Internal: a JSON Schema `pattern` (an ECMAScript regular expression) as GBNF for the text
// between the quotes of a JSON string.
//
// Semantics: the string is valid when the pattern matches somewhere in its decoded text, as
// both ECMAScript's RegExp.test and Python's re.search decide (jsonschema validators use
// either); a pattern without a leading ^ lets any characters come first, one without a
// trailing $ any characters after. Where the two regex dialects differ the grammar keeps to
// what both accept: \d \w \s are their ASCII sets, \D \W \S and negated classes leave out
// anything either dialect might count as a digit, word or space character, `.` leaves out
// \n \r U+2028 U+2029, and characters above U+FFFF (two UTF-16 units to ECMAScript) match
// only as literals outside classes. Decoded characters that JSON must escape are written
// escaped (\" \\ \n ...), others raw.
//
// Supported: literals, escapes (\d \w \s \D \W \S \t \n \r \f \v \0 \xHH \uHHHH and escaped
// punctuation), classes with ranges and negation, `.`, groups (capturing, (?:...), named),
// alternation, quantifiers * + ? {m} {m,} {m,n} (lazy forms match the same strings), ^ at the
// start and $ at the end of a top-level alternative. Refused with GrammarError naming the
// offset: lookarounds, backreferences, \b \B, \p{..}, inline flags, possessive quantifiers,
// anchors elsewhere, * or + over something that can match the empty string, and syntax the
// two dialects read differently ({,n}, [] and [^]).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "grammar/gbnf_rules.h"

namespace fdl::grammar {

/// GBNF (an expression, helper rules added to `rules`) for the JSON-string content whose
/// decoded text matches `pattern` and has between min_length and max_length characters
/// (max_length may be kUnbounded). Length bounds are applied exactly when the pattern's own
/// lengths already lie within them, or by choosing the count of one repetition over single
/// characters; other combinations throw GrammarError. `where`: the pattern's JSON pointer.
/// Throws Unsatisfiable when no string fits both the pattern and the lengths.
std::string regex_to_gbnf(std::string_view pattern, uint64_t min_length, uint64_t max_length, RuleSet& rules,
                          std::string_view hint, const std::string& where);

}  // namespace fdl::grammar
