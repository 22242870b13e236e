// Internal: deciding things about schemas — whether a given JSON value is valid (to keep
// only the enum/const values the other keywords allow), and which oneOf branches can be told
// apart from the others (so that oneOf may be written as a plain choice).
#pragma once

#include <memory>
#include <string>

#include "grammar/schema_document.h"

namespace fdl::grammar {

/// Whether `value` is valid under `schema`, as a JSON Schema 2020-12 validator decides, for
/// the keywords the converter supports (additionalProperties absent means any, as in the
/// standard). `pattern` and the enforced formats are decided by the grammars the converter
/// writes for them, so a string they reject counts as invalid even where a validator would
/// accept it (never the other way). Throws GrammarError(where) for refused keywords.
bool satisfies(const Json& value, const Json& schema, const SchemaDocument& doc, const std::string& where);

/// satisfies() for many values: what it learns of a schema object the first time (its
/// constraint keywords, its enum as a sorted set, its properties by name) is kept by the
/// object's address, so that a value costs about its own size rather than the schema's (an
/// enum of n values checked against a schema with a large enum would otherwise be quadratic);
/// the grammars of patterns and formats are kept by `doc`. The schemas it is given must stay
/// alive and unchanged while it is used (their addresses are its keys), and so must `doc`.
class ValueChecker {
 public:
  explicit ValueChecker(const SchemaDocument& doc);
  ~ValueChecker();
  ValueChecker(const ValueChecker&) = delete;
  ValueChecker& operator=(const ValueChecker&) = delete;

  bool satisfies(const Json& value, const Json& schema, const std::string& where);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Whether no value the converter writes for schema `a` is valid under schema `b` (false
/// when unsure). True when the types differ, when a's enum values all fail b, or for objects
/// when b requires a property a never writes, b forbids one a always writes, or a property
/// both require has values under a that all fail b.
bool excludes(const Json& a, const Json& b, const SchemaDocument& doc, const std::string& where);

/// The most oneOf branches exclusive_branches() compares (its checks are quadratic in them);
/// more are returned unchanged.
constexpr size_t kMaxExclusiveBranches = 64;

/// oneOf's branches narrowed so that no value written for one is valid under another: each
/// branch as it is when excludes() proves every other branch rejects its values, else cut to
/// the types no other branch allows, else to the enum values no other branch accepts, else
/// null (left out). When every branch would be left out, returns them unchanged: oneOf is
/// then written as anyOf, which is unsound where branches overlap.
std::vector<Json> exclusive_branches(const std::vector<Json>& branches, const SchemaDocument& doc,
                                     const std::string& where);

}  // namespace fdl::grammar
