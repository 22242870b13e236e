// Internal: what the JSON-schema converter needs to know about schemas as JSON — local $ref
// resolution, the keyword vocabulary (which keywords constrain, which are refused), older
// draft spellings rewritten to 2020-12, JSON pointers for error messages, and JSON value
// equality as validators define it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace fdl {
class Grammar;
}

namespace fdl::grammar {

/// Schemas keep their key order (the order of `properties` is the order of the output).
using Json = nlohmann::ordered_json;

/// The schema a $ref is resolved against (the one given to SchemaConverter::add), and the
/// work spent converting it: anyOf branches reached through $refs can multiply the work at
/// every level, so each step of the walks (subschemas written, values checked, branches
/// compared) spends from a budget, and a schema that needs more is refused.
class SchemaDocument {
 public:
  /// About 2 µs each at most (a property written into an object, a value checked), so that a
  /// schema is converted, or refused, in well under a second.
  static constexpr long kWorkSteps = 200000;

  explicit SchemaDocument(const Json& root) : root_(root) {}
  const Json& root() const { return root_; }
  /// The subschema `ref` names ("#", "#/$defs/x", any "#/json/pointer"), and its pointer
  /// ("" for the root, "/$defs/x"). Throws GrammarError(where) for other or missing targets.
  /// Each distinct `ref` is walked once: a walk looks members up one by one, and a schema may
  /// hold many $refs into one large object.
  const Json& resolve(const std::string& ref, const std::string& where, std::string* pointer = nullptr) const;
  /// `n` steps of work; GrammarError(where) once the budget is spent (and at every step after).
  void spend(const std::string& where, long n = 1) const;
  /// The steps for reaching subschema `s`: one, and one more per kMembersPerStep members of
  /// an object (its members are looked through several times, and a schema may carry any
  /// number of unknown keywords).
  void spend_on(const Json& s, const std::string& where) const;
  static constexpr long kMembersPerStep = 8;

  /// A grammar that decides which strings a `pattern` or `format` allows (null when none), or
  /// the reason it is refused: compiled once per document, as checks of enum values ask again.
  struct StringCheck {
    std::shared_ptr<const Grammar> grammar;
    std::optional<std::string> refused;
  };
  /// The checks compiled so far, by "pattern:" or "format:" and the pattern or format.
  std::map<std::string, StringCheck>& string_checks() const { return string_checks_; }

 private:
  struct Target {
    const Json* node;
    std::string pointer;
  };
  const Json& root_;
  mutable long steps_left_ = kWorkSteps;
  mutable std::map<std::string, Target> resolved_;  // by $ref text
  mutable std::map<std::string, StringCheck> string_checks_;
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
/// The size of `v` for the work budget: its values, members and array elements, and for long
/// strings (keys included) one more per kBytesPerNode bytes. Linear in that size.
size_t json_size(const Json& v);
constexpr size_t kBytesPerNode = 64;
/// Nodes copied (or walked) per step of the work budget, where whole subschemas are copied.
constexpr size_t kNodesPerStep = 4;
/// Characters of a pattern (or of GBNF) translated or compiled per step of the work budget
/// (a few tenths of a microsecond each).
constexpr size_t kPatternCharsPerStep = 2;

/// `s` itself when it has none of those spellings (no copy: a copy costs the whole subtree,
/// and walks reach a subschema once per level above it), else normalized(s) kept in `storage`.
const Json& normalized(const Json& s, const std::string& where, Json& storage);

/// Appends member `key` to `object` without looking for it first, so that n members cost n
/// (ordered_json's own insertion compares the key with every member). `key` must be new.
void append_member(Json& object, std::string key, Json value);

/// Whether `s` (an object schema) has any constraint keyword besides those named in `skip`.
bool has_constraints(const Json& s, std::initializer_list<std::string_view> skip);

/// `value` as compact JSON text; GrammarError(where) when a string in it is not UTF-8.
std::string dump_json(const Json& value, const std::string& where);

/// JSON value equality as JSON Schema defines it: numbers by value (1 == 1.0), true != 1,
/// objects regardless of key order. Linear in the values' size, but for sorting members by key.
bool json_equal(const Json& a, const Json& b);
/// A text that two values share exactly when json_equal(a, b) (members sorted by key, numbers
/// by value, every part length- or tag-delimited): sets of values are sets of these, sorted,
/// so that n values cost n log n comparisons rather than n^2 (and hashes an adversary could
/// collide are never relied on).
std::string canonical_json(const Json& value);
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
