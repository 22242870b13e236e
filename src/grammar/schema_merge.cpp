// Conjunction of schemas (see schema_merge.h).
#include "grammar/schema_merge.h"

#include <algorithm>
#include <array>
#include <deque>
#include <functional>
#include <map>
#include <set>

#include "grammar/unsatisfiable.h"

namespace fdl::grammar {
namespace {

constexpr int kMaxParts = 256;  // schemas flattened into one merge (a cycle runs out of these)

// A part of a merge and where it came from, for messages. Parts point into the schemas
// merged or the document (a copy of each would cost its whole subtree, per merge), or into
// the normalized copies the merge keeps; its own $ref and allOf were followed by flatten.
struct Part {
  const Json* schema;
  std::string where;
};

void flatten(const Json& s, const SchemaDocument& doc, const std::string& where, std::vector<Part>& out,
             std::deque<Json>& copies, int& budget) {
  if (--budget < 0) throw GrammarError(where, "allOf/$ref nesting is too deep or cyclic");
  doc.spend_on(s, where);
  if (s.is_boolean()) {
    if (s.get<bool>()) return;
    throw Unsatisfiable(where, "allOf includes the schema false");
  }
  if (!s.is_object()) throw GrammarError(where, "a schema must be an object or a boolean");
  Json copy;
  const Json* n = &normalized(s, where, copy);
  if (n == &copy) {
    doc.spend(where, long(json_size(copy) / kNodesPerStep));
    n = &copies.emplace_back(std::move(copy));
  }
  if (const auto ref = n->find("$ref"); ref != n->end()) {
    if (!ref->is_string()) throw GrammarError(child_pointer(where, "$ref"), "$ref must be a string");
    std::string target_where;
    const Json& target = doc.resolve(ref->get<std::string>(), child_pointer(where, "$ref"), &target_where);
    flatten(target, doc, target_where, out, copies, budget);
  }
  if (const auto all = n->find("allOf"); all != n->end()) {
    if (!all->is_array() || all->empty())
      throw GrammarError(child_pointer(where, "allOf"), "allOf must be a non-empty array");
    for (size_t i = 0; i < all->size(); ++i)
      flatten((*all)[i], doc, child_pointer(child_pointer(where, "allOf"), i), out, copies, budget);
  }
  out.push_back({n, where});
}

// allOf of `schemas`, `true` ones left out.
Json conjunction(const std::vector<Json>& schemas) {
  std::vector<Json> kept;
  for (const Json& s : schemas)
    if (!(s.is_boolean() && s.get<bool>()) && !(s.is_object() && s.empty())) kept.push_back(s);
  if (kept.empty()) return true;
  if (kept.size() == 1) return kept[0];
  return Json{{"allOf", kept}};
}

bool is_lower_bound(const std::string& k) {
  return k == "minimum" || k == "exclusiveMinimum" || k == "minLength" || k == "minItems" || k == "minProperties";
}
bool is_upper_bound(const std::string& k) {
  return k == "maximum" || k == "exclusiveMaximum" || k == "maxLength" || k == "maxItems" || k == "maxProperties";
}

std::vector<std::string> intersect_types(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  auto has = [](const std::vector<std::string>& v, const char* t) {
    return std::find(v.begin(), v.end(), t) != v.end();
  };
  std::vector<std::string> out;
  for (const std::string& t : a) {
    if (has(b, t.c_str()) || (t == "integer" && has(b, "number")))
      out.push_back(t);
    else if (t == "number" && has(b, "integer"))
      out.push_back("integer");
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// An object schema's properties by name (a lookup in the object itself is a linear scan).
using PropertyIndex = std::map<std::string_view, const Json*>;

PropertyIndex index_properties(const Json& schema) {
  PropertyIndex index;
  if (const auto props = schema.find("properties"); props != schema.end() && props->is_object())
    for (auto it = props->begin(); it != props->end(); ++it) index.emplace(it.key(), &it.value());
  return index;
}

void merge_objects(const std::vector<Part>& parts, Json& result) {
  std::vector<const Json*> objs;
  for (const Part& part : parts)
    if (part.schema->contains("properties") || part.schema->contains("additionalProperties"))
      objs.push_back(part.schema);
  if (objs.empty()) return;
  // Every property name in the order it first appears, with the schema it has there; the
  // parts' properties by name, to find the others (none needed when there is one part).
  std::vector<std::pair<std::string_view, const Json*>> keys;
  std::set<std::string_view> seen;
  std::vector<PropertyIndex> indexes;
  for (const Json* p : objs) {
    if (objs.size() > 1) indexes.push_back(index_properties(*p));
    if (const auto props = p->find("properties"); props != p->end() && props->is_object())
      for (auto it = props->begin(); it != props->end(); ++it)
        if (objs.size() == 1 || seen.insert(it.key()).second) keys.emplace_back(it.key(), &it.value());
  }
  Json props = Json::object();
  for (const auto& [key, first] : keys) {
    std::vector<Json> constraints;
    bool excluded = false;
    if (objs.size() == 1) constraints.push_back(*first);
    for (size_t i = 0; i < indexes.size(); ++i) {
      if (const auto own = indexes[i].find(key); own != indexes[i].end()) {
        constraints.push_back(*own->second);
      } else if (const auto add = objs[i]->find("additionalProperties"); add != objs[i]->end()) {
        if (add->is_boolean() && !add->get<bool>())
          excluded = true;
        else
          constraints.push_back(*add);
      }
    }
    append_member(props, std::string(key), excluded ? Json(false) : conjunction(constraints));
  }
  if (!keys.empty()) result["properties"] = std::move(props);
  std::vector<Json> adds;
  bool any_add = false, closed = false;
  for (const Json* p : objs)
    if (const auto add = p->find("additionalProperties"); add != p->end()) {
      any_add = true;
      if (add->is_boolean() && !add->get<bool>()) closed = true;
      adds.push_back(*add);
    }
  if (closed)
    result["additionalProperties"] = false;
  else if (any_add)
    result["additionalProperties"] = conjunction(adds);
}

void merge_arrays(const std::vector<Part>& all, Json& result) {
  std::vector<std::reference_wrapper<const Json>> parts;
  for (const Part& p : all) parts.emplace_back(*p.schema);
  size_t n = 0;
  bool any = false;
  for (const Json& p : parts) {
    if (const auto pre = p.find("prefixItems"); pre != p.end() && pre->is_array())
      n = std::max(n, pre->size()), any = true;
    if (p.contains("items")) any = true;
  }
  if (!any) return;
  if (n > 0) {
    Json prefix = Json::array();
    for (size_t i = 0; i < n; ++i) {
      std::vector<Json> at;
      for (const Json& p : parts) {
        const auto pre = p.find("prefixItems");
        if (pre != p.end() && pre->is_array() && i < pre->size())
          at.push_back((*pre)[i]);
        else if (const auto items = p.find("items"); items != p.end())
          at.push_back(*items);
      }
      prefix.push_back(conjunction(at));
    }
    result["prefixItems"] = prefix;
  }
  std::vector<Json> items;
  for (const Json& p : parts)
    if (const auto it = p.find("items"); it != p.end()) items.push_back(*it);
  if (!items.empty()) result["items"] = conjunction(items);
}

}  // namespace

std::vector<std::string> type_names(const Json& type, const std::string& where) {
  static const std::array<std::string_view, 7> kTypes = {"null",   "boolean", "object", "array",
                                                         "string", "number",  "integer"};
  std::vector<std::string> out;
  auto one = [&](const Json& t) {
    if (!t.is_string() || std::find(kTypes.begin(), kTypes.end(), t.get<std::string>()) == kTypes.end())
      throw GrammarError(where, "unknown type " + t.dump());
    out.push_back(t.get<std::string>());
  };
  if (type.is_array()) {
    for (const Json& t : type) one(t);
  } else {
    one(type);
  }
  return out;
}

Json merge_schemas(std::initializer_list<const Json*> in, const SchemaDocument& doc, const std::string& where) {
  std::vector<Part> parts;
  std::deque<Json> copies;  // normalized copies of parts that needed them
  int budget = kMaxParts;
  for (const Json* s : in) flatten(*s, doc, where, parts, copies, budget);
  Json result = Json::object();
  bool have_types = false, have_values = false;
  std::vector<std::string> types;
  std::vector<Json> values;
  std::set<std::string> required;  // canonical_json of result's `required`
  for (const Part& part : parts) {
    for (auto it = part.schema->begin(); it != part.schema->end(); ++it) {
      const std::string& k = it.key();
      const Json& v = it.value();
      const std::string at = child_pointer(part.where, k);
      if (!is_constraint_keyword(k) || k == "properties" || k == "additionalProperties" || k == "items" ||
          k == "prefixItems" || k == "$ref" || k == "allOf")
        continue;  // annotations; object and array keywords are combined below; flatten followed the rest
      if (k == "type") {
        const std::vector<std::string> t = type_names(v, at);
        types = have_types ? intersect_types(types, t) : t;
        have_types = true;
        if (types.empty()) throw Unsatisfiable(at, "allOf: no type satisfies every branch");
      } else if (k == "enum" || k == "const") {
        if (k == "enum" && !v.is_array()) throw GrammarError(at, "enum must be an array");
        const Json single = k == "const" ? Json::array({v}) : Json();
        const Json& list = k == "const" ? single : v;
        if (!have_values) {
          values.assign(list.begin(), list.end());
        } else {
          // The values of `list` also in `values`, through a sorted set (pairwise is quadratic).
          std::vector<std::string> before;
          for (const Json& x : values) before.push_back(canonical_json(x));
          std::sort(before.begin(), before.end());
          std::vector<Json> kept;
          for (const Json& x : list)
            if (std::binary_search(before.begin(), before.end(), canonical_json(x))) kept.push_back(x);
          values = std::move(kept);
        }
        have_values = true;
        if (values.empty()) throw Unsatisfiable(at, "allOf: no enum/const value satisfies every branch");
      } else if (is_lower_bound(k) || is_upper_bound(k)) {
        if (!v.is_number()) throw GrammarError(at, k + " must be a number");
        const auto old = result.find(k);
        if (old == result.end() || (compare_numbers(v, *old) > 0) == is_lower_bound(k)) result[k] = v;
      } else if (k == "required") {
        if (!v.is_array()) throw GrammarError(at, "required must be an array");
        Json& req = result["required"];
        if (req.is_null()) req = Json::array();
        for (const Json& r : v)
          if (required.insert(canonical_json(r)).second) req.push_back(r);
      } else if (k == "uniqueItems") {
        if (v.is_boolean() && v.get<bool>()) result[k] = true;
      } else if (k == "anyOf" || k == "oneOf") {
        if (result.contains("anyOf") || result.contains("oneOf"))
          throw GrammarError(at, "combining several anyOf/oneOf in one allOf is not supported");
        result[k] = v;
      } else if (const auto old = result.find(k); old == result.end()) {
        result[k] = v;
      } else if (!json_equal(*old, v)) {
        throw GrammarError(at, "allOf combines different values of " + k + ", which is not supported");
      }
    }
  }
  if (have_types) result["type"] = types.size() == 1 ? Json(types[0]) : Json(types);
  if (have_values) result["enum"] = std::move(values);
  merge_objects(parts, result);
  merge_arrays(parts, result);
  // The result copies its parts' constraints whole (enum lists, property schemas): merging
  // large schemas again and again is paid for by their size.
  doc.spend(where, long(json_size(result) / kNodesPerStep));
  return result;
}

}  // namespace fdl::grammar
