// Internal: the conjunction of JSON schemas (allOf, and a $ref or anyOf branch with sibling
// keywords) rewritten as one schema that the converter can write as a grammar.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "grammar/schema_document.h"

namespace fdl::grammar {

/// One schema valid for exactly the values valid under every one of `parts`. $refs at the
/// top of a part are resolved and nested allOf flattened; then keyword by keyword: `type`
/// and enum/const intersect; lower bounds take the largest, upper bounds the smallest;
/// `required` unites; property schemas, `items` and prefixItems positions combine as allOf
/// (a property that some part's additionalProperties: false excludes becomes `false`);
/// additionalProperties combine likewise; at most one part may have anyOf/oneOf; any other
/// keyword must be equal wherever it appears. Throws Unsatisfiable when the parts exclude
/// each other visibly (no common type, no common enum value, a false part), GrammarError
/// for what cannot be combined (two different patterns, ...) or a $ref/allOf cycle.
/// `parts` are read in place (they must outlive the call); only the result is a new schema.
Json merge_schemas(std::initializer_list<const Json*> parts, const SchemaDocument& doc, const std::string& where);

/// The `type` keyword's names ("integer" included), checked; GrammarError for others.
std::vector<std::string> type_names(const Json& type, const std::string& where);

}  // namespace fdl::grammar
