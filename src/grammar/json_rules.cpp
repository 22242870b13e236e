// The fixed rules (see json_rules.h).
#include "grammar/json_rules.h"

#include "flashdllm/grammar.h"

namespace fdl::grammar {
namespace {

struct FixedRule {
  const char* name;
  const char* body;
};
constexpr FixedRule kFixedRules[] = {
    {"json-value", R"(json-object | json-array | json-string | json-number | "true" | "false" | "null")"},
    {"json-object", R"("{" (json-member ("," " "? json-member)*)? "}")"},
    {"json-member", R"(json-string ":" " "? json-value)"},
    {"json-array", R"("[" (json-value ("," " "? json-value)*)? "]")"},
    {"json-string", R"("\"" json-char* "\"")"},
    // Escapes \uD800-\uDFFF are left out: a pair of them is one character to a validator.
    {"json-char",
     R"([^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" ([0-9a-cA-CefEF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2})))"},
    {"json-integer", R"("-"? ("0" | [1-9] [0-9]{0,14}))"},
    {"json-number", R"(json-integer ("." [0-9]{1,15})? ([eE] [-+]? [0-9]{1,2})?)"},
    // Valid calendar dates (29 February left out: leap years are not worth a grammar).
    {"json-date",
     R"(([1-9] [0-9]{3} | "0" [1-9] [0-9]{2} | "00" [1-9] [0-9] | "000" [1-9]) "-" )"
     R"((("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]) | )"
     R"(("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30") | "02-" ("0" [1-9] | "1" [0-9] | "2" [0-8])))"},
    {"json-time",
     R"(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? )"
     R"(("Z" | [-+] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9]))"},
    {"json-date-time", R"(json-date "T" json-time)"},
    {"json-uuid", R"([0-9a-f]{8} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{4} "-" [0-9a-f]{12})"},
    {"json-email", R"([a-zA-Z0-9._%+-]{1,64} "@" ([a-zA-Z0-9-]{1,63} "."){1,4} [a-zA-Z]{2,24})"},
    {"json-ipv4", R"(json-octet "." json-octet "." json-octet "." json-octet)"},
    {"json-octet", R"("25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9]? [0-9])"},
};

// Rules a fixed rule refers to, defined along with it.
std::vector<std::string> fixed_closure(const std::string& name) {
  if (name == "json-value" || name == "json-object" || name == "json-array" || name == "json-member")
    return {"json-value", "json-object", "json-member", "json-array", "json-string", "json-char", "json-number",
            "json-integer"};
  if (name == "json-string") return {"json-string", "json-char"};
  if (name == "json-number") return {"json-number", "json-integer"};
  if (name == "json-date-time") return {"json-date-time", "json-date", "json-time"};
  if (name == "json-ipv4") return {"json-ipv4", "json-octet"};
  return {name};
}

}  // namespace

std::pair<uint64_t, uint64_t> format_lengths(std::string_view f) {
  if (f == "date") return {10, 10};
  if (f == "time") return {9, 21};
  if (f == "date-time") return {20, 32};
  if (f == "uuid") return {36, 36};
  if (f == "email") return {6, 64 + 1 + 4 * 64 + 24};
  return {7, 15};  // ipv4
}

std::string define_json_rule(RuleSet& rules, const std::string& name, const std::string& where) {
  // A fixed rule is defined together with the rules it refers to (and rolled back with them).
  if (rules.has(name)) return name;
  for (const std::string& n : fixed_closure(name))
    for (const FixedRule& r : kFixedRules)
      if (n == r.name) rules.define_fixed(r.name, r.body, where);
  return name;
}

std::shared_ptr<const Grammar> compile_expr(const RuleSet& rules, const std::string& expr) {
  return Grammar::compile(cat("root ::= ", expr, "\n", rules.text()));
}

}  // namespace fdl::grammar
