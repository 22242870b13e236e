// JSON Schema → GBNF: a grammar whose sentences are JSON texts valid under the schema
// (response_format json_schema, tool-call arguments). docs/GRAMMARS.md, "JSON schemas", lists
// the keywords, how each is enforced and what is refused.
//
// Soundness first: every text the grammar accepts is valid under the schema (JSON Schema
// 2020-12 as Python's jsonschema or an ECMAScript validator decides; older drafts' spellings
// are read too). Where a keyword cannot be enforced exactly the grammar keeps to a subset
// (numbers with at most 15 integer digits, a bounded fraction, ...); where no sound subset
// is known the schema is refused. One exception, documented: a oneOf none of whose branches
// can be narrowed to values the other branches provably reject is written as anyOf, so a
// value valid under two branches may come out.
//
// Output shape: compact JSON — no whitespace except one optional space after each ':' and
// ','; object properties in the order of `properties` (only those listed, unless
// additionalProperties allows more, which then follow them); no surrounding whitespace.
//
// Errors: GrammarError(where, reason) with `where` the JSON pointer of the offending
// subschema or keyword ("/properties/age/minimum"), for invalid or unsupported schemas, for
// schemas nothing satisfies, and past the caps (1 MiB of GBNF and 20,000 rules, nesting 64
// deep, 10,000 enum values, 4,096 members per object, a budget of work steps against schemas
// whose anyOf/$ref structure multiplies the work). Within them a schema of up to 1 MiB is
// converted or refused in well under a second and a few tens of MB.
//
// Thread-safety: a SchemaConverter is one build (not thread-safe); the free functions are
// safe to call from any thread.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace fdl::grammar {

/// Builds one GBNF grammar from one or more JSON schemas; rules with equal bodies are shared.
class SchemaConverter {
 public:
  SchemaConverter();
  ~SchemaConverter();
  SchemaConverter(const SchemaConverter&) = delete;
  SchemaConverter& operator=(const SchemaConverter&) = delete;

  /// Adds the rules for `schema`; returns the name of the rule that matches exactly the JSON
  /// texts the grammar allows for it. `name`: a hint for the rule names (sanitized to
  /// [a-zA-Z0-9-]). `$ref`s resolve against `schema` itself as the document root ("#",
  /// "#/$defs/x", "#/definitions/x", any "#/json/pointer"). Throws GrammarError; the rules
  /// added so far stay valid after a throw.
  std::string add(const nlohmann::ordered_json& schema, std::string_view name = "root-value");
  /// The same for a schema whose object keys are sorted (nlohmann::json): properties then
  /// come out in alphabetical order.
  std::string add(const nlohmann::json& schema, std::string_view name = "root-value");

  /// Every rule added so far plus `root ::= <root_body>` (root_body is GBNF, e.g. a rule name).
  std::string gbnf(std::string_view root_body) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The whole grammar for one schema: root matches the schema's instances (no surrounding
/// whitespace). Throws GrammarError.
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);
std::string json_schema_to_gbnf(const nlohmann::json& schema);

/// Grammar for `response_format: json_object`: any JSON object.
std::string json_object_gbnf();

}  // namespace fdl::grammar
