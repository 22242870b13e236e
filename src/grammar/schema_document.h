// Internal: what the JSON-schema converter needs to know about schemas as JSON — local $ref
// resolution, the keyword vocabulary (which keywords constrain, which are refused), older
// draft spellings rewritten to 2020-12, JSON pointers for error messages, and JSON value
// equality as validators define it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace fdl::grammar {

/// Schemas keep their key order (the order of `properties` is the order of the output).
using Json = nlohmann::ordered_json;

/// The schema a $ref is resolved against (the one given to SchemaConverter::add), and the
/// work spent converting it: anyOf branches reached through $refs can multiply the work at
/// every level, so each step of the walks (subschemas written, values checked, branches
/// compared) spends from a budget, and a schema that needs more is refused.
class SchemaDocument {
 public:
  static constexpr long kWorkSteps = 500000;

  explicit SchemaDocument(const Json& root) : root_(root) {}
  const Json& root() const { return root_; }
  /// The subschema `ref` names ("#", "#/$defs/x", any "#/json/pointer"), and its pointer
  /// ("" for the root, "/$defs/x"). Throws GrammarError(where) for other or missing targets.
  const Json& resolve(const std::string& ref, const std::string& where, std::string* pointer = nullptr) const;
  /// One step of work; GrammarError(where) once the budget is spent (and at every step after).
  void spend(const std::string& where) const;

 private:
  const Json& root_;
  mutable long steps_left_ = kWorkSteps;
};

/// Throws GrammarError when a subschema below the root has an `$id` and a
/// `$ref` inside it: such a $ref resolves against that subschema, not the document.
void refuse_nested_ids(const Json& root);

/// `where` + "/" + token, the token escaped as JSON pointers require (~0, ~1).
std::string child_pointer(const std::string& where, std::string_view token);
std::string child_pointer(const std::string& where, size_t index);

/// Keywords that only annotate (title, description, $defs, ...) or that this converter does
/// not know (validators ignore unknown keywords too): neither constrain nor are refused.
bool is_constraint_keyword(std::string_view key);
/// Constraint keywords this converter refuses (not, if/then/else, patternProperties, ...).
bool is_refused_keyword(std::string_view key);

/// Whether the converter writes a grammar for this `format` (date, time, date-time, uuid,
/// email, ipv4); other formats are annotations to it.
bool is_enforced_format(std::string_view format);

/// A copy of object schema `s` with draft 4-7 spellings rewritten to 2020-12: boolean
/// exclusiveMinimum/exclusiveMaximum, `items` as an array (+ additionalItems) → prefixItems.
Json normalized(const Json& s, const std::string& where);

/// Whether `s` (an object schema) has any constraint keyword besides those named in `skip`.
bool has_constraints(const Json& s, std::initializer_list<std::string_view> skip);

/// `value` as compact JSON text; GrammarError(where) when a string in it is not UTF-8.
std::string dump_json(const Json& value, const std::string& where);

/// JSON value equality as JSON Schema defines it: numbers by value (1 == 1.0), true != 1,
/// objects regardless of key order.
bool json_equal(const Json& a, const Json& b);
/// -1, 0 or 1 as a < b, a == b, a > b, exactly (integers beyond 2^53 and fractions included).
int compare_numbers(const Json& a, const Json& b);

/// The JSON types a value has or a schema allows, as bits; integers are numbers here.
enum Kind : uint8_t {
  kNull = 1,
  kBoolean = 2,
  kObject = 4,
  kArray = 8,
  kString = 16,
  kNumber = 32,
  kAllKinds = 63,
};
uint8_t kind_of(const Json& value);
/// Bits of a `type` keyword's value (a string or an array of strings); 0 for unknown names.
uint8_t kinds_of_type(const Json& type);
/// Without `type`: the types whose keywords `s` has ("object" for properties, ...), none when
/// it has no type-specific keyword. The converter writes only these types (a subset of what
/// such a schema allows, so sound).
std::vector<std::string> implied_types(const Json& s);
/// Whether `value` is an integer as JSON Schema defines it (1.0 is one).
bool is_integer_value(const Json& value);

}  // namespace fdl::grammar
