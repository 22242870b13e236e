// Validity of one value, and disjointness of oneOf branches (see schema_check.h).
#include "grammar/schema_check.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <unordered_map>

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

bool check_number(const Json& v, const std::string& k, const Json& bound, const std::string& at) {
  if (!bound.is_number()) throw GrammarError(at, k + " must be a number");
  const int c = compare_numbers(v, bound);
  if (k == "minimum") return c >= 0;
  if (k == "maximum") return c <= 0;
  if (k == "exclusiveMinimum") return c > 0;
  return c < 0;  // exclusiveMaximum
}

const std::string kQuote = R"("\"")";

// Rule visits of a matcher per step of the work budget (a step is about a subschema's worth
// of work, these are a few tens of nanoseconds each).
constexpr size_t kVisitsPerStep = 16;

// Whether `text` is a sentence of `g`, as GrammarMatcher decides it, paying `doc`'s work
// budget for each rule visited on the way: an ambiguous pattern can take thousands of
// visits per byte (GrammarMatcher::kExpandBudget), so a long string is refused rather than
// followed for seconds. (GrammarMatcher itself does not say how much it did.)
bool matches_paid(const Grammar& g, std::string_view text, const SchemaDocument& doc, const std::string& at) {
  using Stack = GrammarMatcher::Stack;
  std::vector<Stack> stacks, next;
  size_t owed = 0;
  auto pay = [&](size_t budget_left, size_t made) {
    owed += GrammarMatcher::kExpandBudget - budget_left + made;
    if (owed >= kVisitsPerStep) doc.spend(at, long(owed / kVisitsPerStep)), owed %= kVisitsPerStep;
  };
  auto settle = [](std::vector<Stack>& v) {
    std::sort(v.begin(), v.end());
    v.erase(std::unique(v.begin(), v.end()), v.end());
    if (v.size() > GrammarMatcher::kMaxStacks) v.resize(GrammarMatcher::kMaxStacks);
  };
  size_t budget = GrammarMatcher::kExpandBudget;
  for (const uint32_t alt : g.alternatives(g.root())) GrammarMatcher::expand(g, Stack{alt}, stacks, budget);
  pay(budget, stacks.size());
  settle(stacks);
  for (const char c : text) {
    next.clear();
    budget = GrammarMatcher::kExpandBudget;
    for (const Stack& st : stacks) {
      if (st.empty() || !g.byte_sets()[g.elements()[st.back()].value].test(uint8_t(c))) continue;
      Stack t = st;
      ++t.back();
      GrammarMatcher::expand(g, std::move(t), next, budget);
    }
    pay(budget, next.size());
    if (next.empty()) return false;
    settle(next);
    stacks.swap(next);
  }
  return std::any_of(stacks.begin(), stacks.end(), [](const Stack& st) { return st.empty(); });
}

}  // namespace

struct ValueChecker::Impl {
  // What checking needs of one schema object, found the first time it is reached.
  struct Node {
    Json storage;  // the normalized copy, when the schema used older spellings
    std::vector<std::pair<const std::string*, const Json*>> keywords;  // constraints, in order
    bool sets_ready = false;
    std::vector<std::string> enum_values;  // canonical_json of each, sorted, unique
    std::vector<std::pair<std::string_view, const Json*>> properties;  // sorted by name
    std::vector<std::string_view> required;  // sorted, unique
    bool required_all_strings = true;

    // A constraint keyword's value, or null: among the constraints only (a schema may hold
    // any number of other members, which a lookup in the object would walk through).
    const Json* get(std::string_view key) const {
      for (const auto& [k, v] : keywords)
        if (*k == key) return v;
      return nullptr;
    }
  };
  explicit Impl(const SchemaDocument& d) : doc(d) {}

  Node& node(const Json& s0, const std::string& where) {
    auto [it, inserted] = nodes.try_emplace(&s0);  // made in place: `s` may point into it
    Node& n = it->second;
    if (!inserted) return n;
    const Json* s = nullptr;  // the schema as checked
    try {
      s = &normalized(s0, where, n.storage);
    } catch (...) {
      nodes.erase(it);  // refused again when reached again
      throw;
    }
    for (auto k = s->begin(); k != s->end(); ++k)
      if (is_constraint_keyword(k.key())) n.keywords.emplace_back(&k.key(), &k.value());
    return n;
  }

  // The enum set, the property index and the required names, made when first needed.
  static void make_sets(Node& n) {
    if (n.sets_ready) return;
    n.sets_ready = true;
    if (const Json* e = n.get("enum"); e && e->is_array()) {
      for (const Json& x : *e) n.enum_values.push_back(canonical_json(x));
      std::sort(n.enum_values.begin(), n.enum_values.end());
    }
    if (const Json* p = n.get("properties"); p && p->is_object()) {
      for (auto it = p->begin(); it != p->end(); ++it) n.properties.emplace_back(it.key(), &it.value());
      std::sort(n.properties.begin(), n.properties.end());
    }
    if (const Json* r = n.get("required")) {
      for (const Json& name : *r) {
        if (name.is_string())
          n.required.emplace_back(name.get_ref<const std::string&>());
        else
          n.required_all_strings = false;
      }
      std::sort(n.required.begin(), n.required.end());
      n.required.erase(std::unique(n.required.begin(), n.required.end()), n.required.end());
    }
  }

  // Whether string `v` passes the check named `key` in the document's string_checks(),
  // compiled by `compile` the first time.
  bool matches(const Json& v, const std::string& key, const std::function<SchemaDocument::StringCheck()>& compile,
               const std::string& at) {
    auto& checks = doc.string_checks();
    auto it = checks.find(key);
    if (it == checks.end()) it = checks.emplace(key, compile()).first;
    if (it->second.refused) throw GrammarError(at, *it->second.refused);
    return it->second.grammar && matches_paid(*it->second.grammar, dump_json(v, at), doc, at);
  }

  // `root ::= "\"" expr "\""` over `rules`, compiled, its size paid to the work budget.
  std::shared_ptr<const Grammar> compile_paid(const RuleSet& rules, const std::string& expr, const std::string& at) {
    doc.spend(at, long((rules.bytes() + expr.size()) / kPatternCharsPerStep));
    return compile_expr(rules, cat(kQuote, " ", expr, " ", kQuote));
  }

  // Whether string `v` matches `pattern` as the converter writes patterns (a subset of what
  // both regex dialects accept), decided by the grammar itself.
  bool matches_pattern(const Json& v, const std::string& pattern, const std::string& at) {
    return matches(v, "pattern:" + pattern, [&] {
      doc.spend(at, long(pattern.size() / kPatternCharsPerStep));
      SchemaDocument::StringCheck c;
      RuleSet rules;
      std::string expr;
      try {
        expr = regex_to_gbnf(pattern, 0, kUnbounded, rules, "pattern", at);
      } catch (const Unsatisfiable&) {
        return c;  // nothing matches
      } catch (const GrammarError& e) {
        c.refused = e.reason();
        return c;
      }
      c.grammar = compile_paid(rules, expr, at);
      return c;
    }, at);
  }

  bool matches_format(const Json& v, const std::string& format, const std::string& at) {
    return matches(v, "format:" + format, [&] {
      RuleSet rules;
      const std::string rule = define_json_rule(rules, "json-" + format, at);
      return SchemaDocument::StringCheck{compile_paid(rules, rule, at), std::nullopt};
    }, at);
  }

  bool check_object(const Json& v, Node& n, const std::string& where, int depth) {
    make_sets(n);
    for (auto it = v.begin(); it != v.end(); ++it) {
      const auto p = std::lower_bound(n.properties.begin(), n.properties.end(), std::string_view(it.key()),
                                      [](const auto& e, std::string_view k) { return e.first < k; });
      if (p != n.properties.end() && p->first == it.key()) {
        if (!check(it.value(), *p->second, child_pointer(child_pointer(where, "properties"), it.key()), depth + 1))
          return false;
        continue;
      }
      // Not in `properties`: additionalProperties decides, else unevaluatedProperties.
      for (const char* k : {"additionalProperties", "unevaluatedProperties"}) {
        if (const Json* add = n.get(k)) {
          if (!check(it.value(), *add, child_pointer(where, k), depth + 1)) return false;
          break;
        }
      }
    }
    if (n.get("required")) {
      if (!n.required_all_strings || n.required.size() > v.size()) return false;
      std::vector<std::string_view> keys;
      keys.reserve(v.size());
      for (auto it = v.begin(); it != v.end(); ++it) keys.emplace_back(it.key());
      std::sort(keys.begin(), keys.end());
      for (const std::string_view r : n.required)
        if (!std::binary_search(keys.begin(), keys.end(), r)) return false;
    }
    if (const Json* m = n.get("minProperties"); m && m->is_number() && compare_numbers(Json(v.size()), *m) < 0)
      return false;
    if (const Json* m = n.get("maxProperties"); m && m->is_number() && compare_numbers(Json(v.size()), *m) > 0)
      return false;
    return true;
  }

  bool check_array(const Json& v, const Node& n, const std::string& where, int depth) {
    size_t n_prefix = 0;
    if (const Json* pre = n.get("prefixItems"); pre && pre->is_array()) {
      n_prefix = pre->size();
      for (size_t i = 0; i < v.size() && i < pre->size(); ++i)
        if (!check(v[i], (*pre)[i], child_pointer(child_pointer(where, "prefixItems"), i), depth + 1)) return false;
    }
    if (const Json* items = n.get("items"))
      for (size_t i = n_prefix; i < v.size(); ++i)
        if (!check(v[i], *items, child_pointer(where, "items"), depth + 1)) return false;
    if (const Json* m = n.get("minItems"); m && m->is_number() && compare_numbers(Json(v.size()), *m) < 0)
      return false;
    if (const Json* m = n.get("maxItems"); m && m->is_number() && compare_numbers(Json(v.size()), *m) > 0)
      return false;
    if (const Json* u = n.get("uniqueItems"); u && u->is_boolean() && u->get<bool>()) {
      std::vector<std::string> items;
      items.reserve(v.size());
      for (const Json& e : v) items.push_back(canonical_json(e));
      std::sort(items.begin(), items.end());
      if (std::adjacent_find(items.begin(), items.end()) != items.end()) return false;
    }
    return true;
  }

  bool check(const Json& v, const Json& s0, const std::string& where, int depth) {
    if (depth > kMaxDepth) throw GrammarError(where, "the schema nests too deeply to check enum values against it");
    doc.spend(where);
    if (s0.is_boolean()) return s0.get<bool>();
    if (!s0.is_object()) throw GrammarError(where, "a schema must be an object or a boolean");
    Node& n = node(s0, where);
    for (const auto& [key, value] : n.keywords) {
      const std::string& k = *key;
      const Json& kv = *value;
      const std::string at = child_pointer(where, k);
      if (is_refused_keyword(k)) throw GrammarError(at, k + " is not supported");
      if (k == "$ref") {
        if (!kv.is_string()) throw GrammarError(at, "$ref must be a string");
        std::string target_where;
        const Json& target = doc.resolve(kv.get<std::string>(), at, &target_where);
        if (!check(v, target, target_where, depth + 1)) return false;
      } else if (k == "type") {
        const auto names = type_names(kv, at);
        if (std::none_of(names.begin(), names.end(), [&](const std::string& t) { return has_type(v, t); }))
          return false;
      } else if (k == "enum") {
        if (!kv.is_array()) throw GrammarError(at, "enum must be an array");
        make_sets(n);
        if (!std::binary_search(n.enum_values.begin(), n.enum_values.end(), canonical_json(v))) return false;
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
        for (size_t i = 0; i < kv.size(); ++i) valid += check(v, kv[i], child_pointer(at, i), depth + 1) ? 1 : 0;
        if (k == "anyOf" ? valid == 0 : k == "oneOf" ? valid != 1 : valid != kv.size()) return false;
      }
      // Object and array keywords are checked together below.
    }
    if (v.is_object() && !check_object(v, n, where, depth)) return false;
    if (v.is_array() && !check_array(v, n, where, depth)) return false;
    return true;
  }

  const SchemaDocument& doc;
  std::unordered_map<const Json*, Node> nodes;  // by the schema object's address
};

ValueChecker::ValueChecker(const SchemaDocument& doc) : impl_(std::make_unique<Impl>(doc)) {}
ValueChecker::~ValueChecker() = default;

bool ValueChecker::satisfies(const Json& value, const Json& schema, const std::string& where) {
  return impl_->check(value, schema, where, 0);
}

bool satisfies(const Json& value, const Json& schema, const SchemaDocument& doc, const std::string& where) {
  return ValueChecker(doc).satisfies(value, schema, where);
}

namespace {

// A schema with its top-level $refs and allOf merged in, or null when that fails.
Json flattened(const Json& s, const SchemaDocument& doc, const std::string& where) {
  if (s.is_boolean()) return s;
  try {
    return merge_schemas({&s}, doc, where);
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
          branch = merge_schemas({&siblings, &alt}, doc, where);
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

// The property names of `s` with their schemas, or (`required`) its required names. Looked up
// many times per pair of branches, where the keyword itself would be searched member by member.
std::map<std::string_view, const Json*> names_in(const Json& s, bool required) {
  std::map<std::string_view, const Json*> out;
  const auto it = s.find(required ? "required" : "properties");
  if (it == s.end()) return out;
  if (!required && it->is_object())
    for (auto m = it->begin(); m != it->end(); ++m) out.emplace(m.key(), &m.value());
  if (required && it->is_array())
    for (const Json& e : *it)
      if (e.is_string()) out.emplace(e.get_ref<const std::string&>(), &e);
  return out;
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
      ValueChecker checker(doc);
      return std::none_of(e->begin(), e->end(), [&](const Json& v) { return checker.satisfies(v, b, where); });
    } catch (const GrammarError&) {
      return false;
    }
  }
  if (written_kinds(a, doc, where, depth) != kObject) return false;
  const auto a_props = names_in(a, false), a_required = names_in(a, true);
  const auto b_props = names_in(b, false), b_required = names_in(b, true);
  doc.spend(where, long((a_props.size() + a_required.size() + b_props.size() + b_required.size()) /
                        SchemaDocument::kMembersPerStep));
  // Keys a writes: its properties and required ones; more only with additionalProperties.
  const auto a_add = a.find("additionalProperties");
  const bool a_open = a_add != a.end() && !(a_add->is_boolean() && !a_add->get<bool>());
  if (!a_open)
    for (const auto& [key, _] : b_required)
      if (!a_props.count(key) && !a_required.count(key)) return true;
  const auto b_add = b.find("additionalProperties");
  const bool b_closed = b_add != b.end() && b_add->is_boolean() && !b_add->get<bool>();
  for (const auto& [key, _] : a_required) {
    const auto in_b = b_props.find(key);
    if (b_closed && in_b == b_props.end()) return true;
    if (const auto in_a = a_props.find(key);
        in_a != a_props.end() && in_b != b_props.end() &&
        excludes_at(*in_a->second, *in_b->second, doc, where, depth + 1))
      return true;
  }
  return false;
}

}  // namespace

bool excludes(const Json& a, const Json& b, const SchemaDocument& doc, const std::string& where) {
  return excludes_at(a, b, doc, where, 0);
}

std::vector<Json> exclusive_branches(const std::vector<Json>& branches, const SchemaDocument& doc,
                                     const std::string& where) {
  const size_t n = branches.size();
  if (n < 2 || n > kMaxExclusiveBranches) return branches;
  std::vector<Json> out(n, nullptr);
  bool any = false;
  ValueChecker checker(doc);  // the branches stay as they are throughout
  for (size_t a = 0; a < n; ++a) {
    auto alone = [&](const Json& candidate) {
      for (size_t b = 0; b < n; ++b)
        if (b != a && !excludes(candidate, branches[b], doc, where)) return false;
      return true;
    };
    auto narrowed = [&](const char* key, const Json& value) -> Json {
      try {
        const Json cut = Json{{key, value}};
        Json candidate = merge_schemas({&branches[a], &cut}, doc, where);
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
            lone = b == a || !checker.satisfies(v, branches[b], where);
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
