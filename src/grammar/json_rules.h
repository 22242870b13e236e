// Internal: the fixed GBNF rules for unconstrained JSON (any value, string, number, ...) and
// for the string formats the schema converter enforces, and matching one JSON text against
// a grammar built from them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "grammar/gbnf_rules.h"

namespace fdl {
class Grammar;
}

namespace fdl::grammar {

/// Defines the fixed rule `name` ("json-value", "json-string", "json-char", "json-number",
/// "json-integer", "json-object", "json-array", or "json-" + an enforced format) and the
/// rules it refers to, unless defined already; returns `name`.
///   json-value   any JSON value, compact but for one optional space after ':' and ','
///   json-char    one string character: raw (not `"`, `\`, U+0000-U+001F) or an escape;
///                \uD800-\uDFFF escapes are left out (a pair is one character to a validator)
///   json-integer at most 15 digits; json-number adds up to 15 fraction and 2 exponent digits
///   json-date    valid calendar dates of years 0001-9999 (29 February left out)
///   json-time    hh:mm:ss, up to 6 fraction digits, then Z or an offset (RFC 3339)
///   json-date-time, json-uuid (lower-case hex), json-email, json-ipv4 (no leading zeros)
std::string define_json_rule(RuleSet& rules, const std::string& name, const std::string& where);

/// Shortest and longest text of an enforced format (is_enforced_format).
std::pair<uint64_t, uint64_t> format_lengths(std::string_view format);

/// `root ::= <expr>` over `rules`, compiled (once, to match many texts).
std::shared_ptr<const Grammar> compile_expr(const RuleSet& rules, const std::string& expr);

}  // namespace fdl::grammar
