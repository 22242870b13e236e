// Internal: deciding things about schemas — whether a given JSON value is valid (to keep
// only the enum/const values the other keywords allow), and which oneOf branches can be told
// apart from the others (so that oneOf may be written as a plain choice).
#pragma once

#include <string>

#include "grammar/schema_document.h"

namespace fdl::grammar {

/// Whether `value` is valid under `schema`, as a JSON Schema 2020-12 validator decides, for
/// the keywords the converter supports (additionalProperties absent means any, as in the
/// standard). `pattern` and the enforced formats are decided by the grammars the converter
/// writes for them, so a string they reject counts as invalid even where a validator would
/// accept it (never the other way). Throws GrammarError(where) for refused keywords.
bool satisfies(const Json& value, const Json& schema, const SchemaDocument& doc, const std::string& where);

/// Whether no value the converter writes for schema `a` is valid under schema `b` (false
/// when unsure). True when the types differ, when a's enum values all fail b, or for objects
/// when b requires a property a never writes, b forbids one a always writes, or a property
/// both require has values under a that all fail b.
bool excludes(const Json& a, const Json& b, const SchemaDocument& doc, const std::string& where);

/// oneOf's branches narrowed so that no value written for one is valid under another: each
/// branch as it is when excludes() proves every other branch rejects its values, else cut to
/// the types no other branch allows, else to the enum values no other branch accepts, else
/// null (left out). When every branch would be left out, returns them unchanged: oneOf is
/// then written as anyOf, which is unsound where branches overlap.
std::vector<Json> exclusive_branches(const std::vector<Json>& branches, const SchemaDocument& doc,
                                     const std::string& where);

}  // namespace fdl::grammar
