// Validity of one value, and disjointness of oneOf branches (see schema_check.h).
#include "grammar/schema_check.h"

#include <algorithm>

#include "flashdllm/grammar.h"
#include "grammar/code_point_set.h"
#include "grammar/json_rules.h"
#include "grammar/regex_to_gbnf.h"
#include "grammar/schema_merge.h"
#include "grammar/unsatisfiable.h"

namespace fdl::grammar {
namespace {

constexpr int kMaxDepth = 64;

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (const char c : s)
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  return n;
}

bool has_type(const Json& v, const std::string& t) {
  if (t == "null") return v.is_null();
  if (t == "boolean") return v.is_boolean();
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  return v.is_number() && is_integer_value(v);  // integer
}

bool check(const Json& v, const Json& s0, const SchemaDocument& doc, const std::string& where, int depth);

const std::string kQuote = R"("\"")";

// Whether string `v` matches `pattern` as the converter writes patterns (a subset of what
// both regex dialects accept), decided by the grammar itself.
bool matches_pattern(const Json& v, const std::string& pattern, const std::string& where) {
  RuleSet rules;
  std::string expr;
  try {
    expr = regex_to_gbnf(pattern, 0, kUnbounded, rules, "pattern", where);
  } catch (const Unsatisfiable&) {
    return false;
  }
  return gbnf_matches(rules, cat(kQuote, " ", expr, " ", kQuote), dump_json(v, where));
}

bool matches_format(const Json& v, const std::string& format, const std::string& where) {
  RuleSet rules;
  const std::string rule = define_json_rule(rules, "json-" + format, where);
  return gbnf_matches(rules, cat(kQuote, " ", rule, " ", kQuote), dump_json(v, where));
}

bool check_object(const Json& v, const Json& s, const SchemaDocument& doc, const std::string& where, int depth) {
  const auto props = s.find("properties");
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (props != s.end() && props->is_object() && props->contains(it.key())) {
      if (!check(it.value(), (*props)[it.key()], doc, child_pointer(child_pointer(where, "properties"), it.key()),
                 depth + 1))
        return false;
      continue;
    }
    // Not in `properties`: additionalProperties decides, else unevaluatedProperties.
    for (const char* k : {"additionalProperties", "unevaluatedProperties"}) {
      if (const auto add = s.find(k); add != s.end()) {
        if (!check(it.value(), *add, doc, child_pointer(where, k), depth + 1)) return false;
        break;
      }
    }
  }
  if (const auto req = s.find("required"); req != s.end())
    for (const Json& r : *req)
      if (!r.is_string() || !v.contains(r.get<std::string>())) return false;
  if (const auto m = s.find("minProperties"); m != s.end() && m->is_number() && compare_numbers(Json(v.size()), *m) < 0)
    return false;
  if (const auto m = s.find("maxProperties"); m != s.end() && m->is_number() && compare_numbers(Json(v.size()), *m) > 0)
    return false;
  return true;
}

bool check_array(const Json& v, const Json& s, const SchemaDocument& doc, const std::string& where, int depth) {
  size_t n_prefix = 0;
  if (const auto pre = s.find("prefixItems"); pre != s.end() && pre->is_array()) {
    n_prefix = pre->size();
    for (size_t i = 0; i < v.size() && i < pre->size(); ++i)
      if (!check(v[i], (*pre)[i], doc, child_pointer(child_pointer(where, "prefixItems"), i), depth + 1)) return false;
  }
  if (const auto items = s.find("items"); items != s.end())
    for (size_t i = n_prefix; i < v.size(); ++i)
      if (!check(v[i], *items, doc, child_pointer(where, "items"), depth + 1)) return false;
  if (const auto m = s.find("minItems"); m != s.end() && m->is_number() && compare_numbers(Json(v.size()), *m) < 0)
    return false;
  if (const auto m = s.find("maxItems"); m != s.end() && m->is_number() && compare_numbers(Json(v.size()), *m) > 0)
    return false;
  if (const auto u = s.find("uniqueItems"); u != s.end() && u->is_boolean() && u->get<bool>())
    for (size_t i = 0; i < v.size(); ++i)
      for (size_t j = i + 1; j < v.size(); ++j)
        if (json_equal(v[i], v[j])) return false;
  return true;
}

bool check_number(const Json& v, const std::string& k, const Json& bound, const std::string& at) {
  if (!bound.is_number()) throw GrammarError(at, k + " must be a number");
  const int c = compare_numbers(v, bound);
  if (k == "minimum") return c >= 0;
  if (k == "maximum") return c <= 0;
  if (k == "exclusiveMinimum") return c > 0;
  return c < 0;  // exclusiveMaximum
}

bool check(const Json& v, const Json& s0, const SchemaDocument& doc, const std::string& where, int depth) {
  if (depth > kMaxDepth) throw GrammarError(where, "the schema nests too deeply to check enum values against it");
  doc.spend(where);
  if (s0.is_boolean()) return s0.get<bool>();
  if (!s0.is_object()) throw GrammarError(where, "a schema must be an object or a boolean");
  const Json s = normalized(s0, where);
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    const Json& kv = it.value();
    const std::string at = child_pointer(where, k);
    if (is_refused_keyword(k)) throw GrammarError(at, k + " is not supported");
    if (!is_constraint_keyword(k)) continue;
    if (k == "$ref") {
      if (!kv.is_string()) throw GrammarError(at, "$ref must be a string");
      std::string target_where;
      const Json& target = doc.resolve(kv.get<std::string>(), at, &target_where);
      if (!check(v, target, doc, target_where, depth + 1)) return false;
    } else if (k == "type") {
      const auto names = type_names(kv, at);
      if (std::none_of(names.begin(), names.end(), [&](const std::string& t) { return has_type(v, t); })) return false;
    } else if (k == "enum") {
      if (!kv.is_array()) throw GrammarError(at, "enum must be an array");
      if (std::none_of(kv.begin(), kv.end(), [&](const Json& x) { return json_equal(v, x); })) return false;
    } else if (k == "const") {
      if (!json_equal(v, kv)) return false;
    } else if (k == "minLength" || k == "maxLength") {
      if (!kv.is_number()) throw GrammarError(at, k + " must be a number");
      if (v.is_string()) {
        const int c = compare_numbers(Json(code_points(v.get<std::string>())), kv);
        if (k == "minLength" ? c < 0 : c > 0) return false;
      }
    } else if (k == "pattern") {
      if (!kv.is_string()) throw GrammarError(at, "pattern must be a string");
      if (v.is_string() && !matches_pattern(v, kv.get<std::string>(), at)) return false;
    } else if (k == "format") {
      if (v.is_string() && kv.is_string() && is_enforced_format(kv.get<std::string>()) &&
          !matches_format(v, kv.get<std::string>(), at))
        return false;
    } else if (k == "minimum" || k == "maximum" || k == "exclusiveMinimum" || k == "exclusiveMaximum") {
      if (v.is_number() && !check_number(v, k, kv, at)) return false;
    } else if (k == "multipleOf") {
      if (!kv.is_number() || compare_numbers(kv, Json(1)) != 0)
        throw GrammarError(at, "multipleOf other than 1 is not supported");
      if (v.is_number() && !is_integer_value(v)) return false;
    } else if (k == "anyOf" || k == "oneOf" || k == "allOf") {
      if (!kv.is_array() || kv.empty()) throw GrammarError(at, k + " must be a non-empty array");
      size_t valid = 0;
      for (size_t i = 0; i < kv.size(); ++i) valid += check(v, kv[i], doc, child_pointer(at, i), depth + 1) ? 1 : 0;
      if (k == "anyOf" ? valid == 0 : k == "oneOf" ? valid != 1 : valid != kv.size()) return false;
    } else if (v.is_object() && (k == "properties" || k == "required" || k == "additionalProperties" ||
                                 k == "minProperties" || k == "maxProperties" || k == "unevaluatedProperties")) {
      // Checked together once.
    } else if (v.is_array() && (k == "items" || k == "prefixItems" || k == "minItems" || k == "maxItems" ||
                                k == "uniqueItems")) {
      // Checked together once.
    }
  }
  if (v.is_object() && !check_object(v, s, doc, where, depth)) return false;
  if (v.is_array() && !check_array(v, s, doc, where, depth)) return false;
  return true;
}

// A schema with its top-level $refs and allOf merged in, or null when that fails.
Json flattened(const Json& s, const SchemaDocument& doc, const std::string& where) {
  if (s.is_boolean()) return s;
  try {
    return merge_schemas({s}, doc, where);
  } catch (const GrammarError&) {
    return nullptr;
  }
}

// Types of what the converter writes for `s` (a flattened schema).
uint8_t written_kinds(const Json& s, const SchemaDocument& doc, const std::string& where, int depth) {
  if (!s.is_object() || depth > kMaxDepth) return kAllKinds;
  doc.spend(where);
  if (const auto e = s.find("enum"); e != s.end() && e->is_array()) {
    uint8_t k = 0;
    for (const Json& v : *e) k |= kind_of(v);
    return k;
  }
  if (const auto t = s.find("type"); t != s.end()) return kinds_of_type(*t);
  for (const char* key : {"anyOf", "oneOf"})
    if (const auto alts = s.find(key); alts != s.end() && alts->is_array()) {
      // Each branch is written with the keywords beside anyOf merged in.
      Json siblings = s;
      siblings.erase(key);
      uint8_t k = 0;
      for (const Json& alt : *alts) {
        Json branch = alt;
        try {
          branch = merge_schemas({siblings, alt}, doc, where);
        } catch (const GrammarError&) {
          return kAllKinds;  // unsure
        }
        k |= written_kinds(branch, doc, where, depth + 1);
      }
      return k;
    }
  const std::vector<std::string> implied = implied_types(s);
  if (implied.empty()) return kAllKinds;
  uint8_t k = 0;
  for (const std::string& t : implied) k |= kinds_of_type(Json(t));
  return k;
}

// Types of every value valid under `s` (a flattened schema), or more.
uint8_t valid_kinds(const Json& s, const SchemaDocument& doc, const std::string& where, int depth) {
  if (s.is_boolean()) return s.get<bool>() ? kAllKinds : 0;
  if (!s.is_object() || depth > kMaxDepth) return kAllKinds;
  doc.spend(where);
  uint8_t k = kAllKinds;
  if (const auto t = s.find("type"); t != s.end()) k &= kinds_of_type(*t);
  if (const auto e = s.find("enum"); e != s.end() && e->is_array()) {
    uint8_t values = 0;
    for (const Json& v : *e) values |= kind_of(v);
    k &= values;
  }
  for (const char* key : {"anyOf", "oneOf"})
    if (const auto alts = s.find(key); alts != s.end() && alts->is_array()) {
      uint8_t any = 0;
      for (const Json& alt : *alts) any |= valid_kinds(flattened(alt, doc, where), doc, where, depth + 1);
      k &= any;
    }
  return k;
}

bool contains_key(const Json& s, const char* keyword, const std::string& key) {
  const auto it = s.find(keyword);
  if (it == s.end()) return false;
  if (it->is_object()) return it->contains(key);
  if (it->is_array()) return std::find(it->begin(), it->end(), Json(key)) != it->end();
  return false;
}

bool excludes_at(const Json& a0, const Json& b0, const SchemaDocument& doc, const std::string& where, int depth) {
  if (depth > kMaxDepth) return false;
  doc.spend(where);
  const Json a = flattened(a0, doc, where), b = flattened(b0, doc, where);
  if (a.is_null() || b.is_null()) return false;
  if ((written_kinds(a, doc, where, depth) & valid_kinds(b, doc, where, depth)) == 0) return true;
  if (!a.is_object() || !b.is_object()) return false;
  if (const auto e = a.find("enum"); e != a.end() && e->is_array()) {
    try {
      return std::none_of(e->begin(), e->end(), [&](const Json& v) { return satisfies(v, b, doc, where); });
    } catch (const GrammarError&) {
      return false;
    }
  }
  if (written_kinds(a, doc, where, depth) != kObject) return false;
  // Keys a writes: its properties and required ones; more only with additionalProperties.
  const auto a_add = a.find("additionalProperties");
  const bool a_open = a_add != a.end() && !(a_add->is_boolean() && !a_add->get<bool>());
  const Json a_required = a.value("required", Json::array());
  if (const auto req = b.find("required"); req != b.end() && req->is_array() && !a_open)
    for (const Json& r : *req)
      if (r.is_string() && !contains_key(a, "properties", r.get<std::string>()) &&
          !contains_key(a, "required", r.get<std::string>()))
        return true;
  const auto b_add = b.find("additionalProperties");
  const bool b_closed = b_add != b.end() && b_add->is_boolean() && !b_add->get<bool>();
  for (const Json& r : a_required) {
    if (!r.is_string()) continue;
    const std::string& key = r.get_ref<const std::string&>();
    if (b_closed && !contains_key(b, "properties", key)) return true;
    if (contains_key(a, "properties", key) && contains_key(b, "properties", key) &&
        excludes_at(a["properties"][key], b["properties"][key], doc, where, depth + 1))
      return true;
  }
  return false;
}

}  // namespace

bool satisfies(const Json& value, const Json& schema, const SchemaDocument& doc, const std::string& where) {
  return check(value, schema, doc, where, 0);
}

bool excludes(const Json& a, const Json& b, const SchemaDocument& doc, const std::string& where) {
  return excludes_at(a, b, doc, where, 0);
}

std::vector<Json> exclusive_branches(const std::vector<Json>& branches, const SchemaDocument& doc,
                                     const std::string& where) {
  constexpr size_t kMaxChecked = 64;  // the checks are quadratic in the branches
  const size_t n = branches.size();
  if (n < 2 || n > kMaxChecked) return branches;
  std::vector<Json> out(n, nullptr);
  bool any = false;
  for (size_t a = 0; a < n; ++a) {
    auto alone = [&](const Json& candidate) {
      for (size_t b = 0; b < n; ++b)
        if (b != a && !excludes(candidate, branches[b], doc, where)) return false;
      return true;
    };
    auto narrowed = [&](const char* key, const Json& value) -> Json {
      try {
        Json candidate = merge_schemas({branches[a], Json{{key, value}}}, doc, where);
        return alone(candidate) ? candidate : Json(nullptr);
      } catch (const GrammarError&) {
        return nullptr;
      }
    };
    Json keep = alone(branches[a]) ? branches[a] : Json(nullptr);
    // The types no other branch allows.
    uint8_t others = 0;
    for (size_t b = 0; b < n; ++b)
      if (b != a) others |= valid_kinds(flattened(branches[b], doc, where), doc, where, 0);
    const uint8_t mine = written_kinds(flattened(branches[a], doc, where), doc, where, 0) & uint8_t(~others);
    if (keep.is_null() && mine != 0) {
      Json types = Json::array();
      for (const auto& [bit, name] : {std::pair<Kind, const char*>{kNull, "null"},
                                      {kBoolean, "boolean"},
                                      {kObject, "object"},
                                      {kArray, "array"},
                                      {kString, "string"},
                                      {kNumber, "number"}})
        if (mine & bit) types.push_back(name);
      keep = narrowed("type", types);
    }
    // The enum values no other branch accepts.
    const Json flat = flattened(branches[a], doc, where);
    if (keep.is_null() && flat.is_object() && flat.contains("enum") && flat["enum"].is_array()) {
      Json values = Json::array();
      for (const Json& v : flat["enum"]) {
        bool lone = true;
        for (size_t b = 0; b < n && lone; ++b) {
          try {
            lone = b == a || !satisfies(v, branches[b], doc, where);
          } catch (const GrammarError&) {
            lone = false;
          }
        }
        if (lone) values.push_back(v);
      }
      if (!values.empty()) keep = narrowed("enum", values);
    }
    if (!keep.is_null()) out[a] = std::move(keep), any = true;
  }
  return any ? out : branches;
}

}  // namespace fdl::grammar
