// $ref resolution, keyword vocabulary, normalization and JSON equality (see schema_document.h).
#include "grammar/schema_document.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "flashdllm/grammar.h"
#include "grammar/gbnf_rules.h"
#include "grammar/numeric_range.h"

namespace fdl::grammar {
namespace {

constexpr std::array<std::string_view, 42> kConstraintKeywords = {
    "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems",
    "additionalItems", "minItems", "maxItems", "uniqueItems", "contains", "minContains", "maxContains",
    "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum", "multipleOf", "anyOf", "oneOf", "allOf", "not", "if", "then", "else", "$ref",
    "$dynamicRef", "$recursiveRef", "patternProperties", "propertyNames", "dependentRequired",
    "dependentSchemas", "dependencies", "minProperties", "maxProperties", "unevaluatedProperties",
};
// (unevaluatedItems is refused below, so it is a constraint as well.)

constexpr std::array<std::string_view, 15> kRefusedKeywords = {
    "not", "if", "then", "else", "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas",
    "dependencies", "contains", "minContains", "maxContains", "unevaluatedItems", "$dynamicRef",
    "$recursiveRef",
};

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// One pointer token: percent-decoded (a URI fragment), then ~1 → / and ~0 → ~.
bool decode_token(std::string_view raw, std::string& out) {
  std::string pct;
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '%') {
      if (i + 2 >= raw.size()) return false;
      const int hi = hex_value(raw[i + 1]), lo = hex_value(raw[i + 2]);
      if (hi < 0 || lo < 0) return false;
      pct += char(hi * 16 + lo);
      i += 2;
    } else {
      pct += raw[i];
    }
  }
  out.clear();
  for (size_t i = 0; i < pct.size(); ++i) {
    if (pct[i] == '~') {
      if (i + 1 >= pct.size() || (pct[i + 1] != '0' && pct[i + 1] != '1')) return false;
      out += pct[i + 1] == '0' ? '~' : '/';
      ++i;
    } else {
      out += pct[i];
    }
  }
  return true;
}

}  // namespace

const Json& SchemaDocument::resolve(const std::string& ref, const std::string& where, std::string* pointer) const {
  if (const auto hit = resolved_.find(ref); hit != resolved_.end()) {
    if (pointer) *pointer = hit->second.pointer;
    return *hit->second.node;
  }
  if (ref.empty() || ref[0] != '#')
    throw GrammarError(where,
                       "$ref '" + ref + "' is not local; only references into the schema itself (#...) are supported");
  const std::string_view frag = std::string_view(ref).substr(1);
  if (!frag.empty() && frag[0] != '/')
    throw GrammarError(where, "$ref '" + ref + "' names an anchor; only JSON pointers (#/...) are supported");
  const Json* node = &root_;
  std::string path;
  size_t i = 1;
  while (i <= frag.size() && !frag.empty()) {
    const size_t next = std::min(frag.find('/', i), frag.size());
    std::string token;
    if (!decode_token(frag.substr(i, next - i), token))
      throw GrammarError(where, "$ref '" + ref + "' is not a valid JSON pointer");
    if (const auto member = node->is_object() ? node->find(token) : node->end(); member != node->end()) {
      node = &*member;
    } else if (node->is_array() && !token.empty() &&
               std::all_of(token.begin(), token.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
               token.size() < 10 && std::stoul(token) < node->size()) {
      node = &(*node)[std::stoul(token)];
    } else {
      throw GrammarError(where, "$ref '" + ref + "' does not resolve");
    }
    path = child_pointer(path, token);
    i = next + 1;
  }
  if (pointer) *pointer = path;
  resolved_.emplace(ref, Target{node, path});
  return *node;
}

namespace {

// Subschemas nested deeper than this are refused: the walk must see every $ref below an
// $id, and a $ref it skipped would be resolved against the root instead of the $id's base.
constexpr int kMaxIdWalkDepth = 256;

// Walks the subschemas of `s` (at `where`); `id_at` is the pointer of the innermost $id
// below the root seen so far, "" for none.
void walk_ids(const Json& s, const std::string& where, const std::string& id_at, int depth) {
  if (!s.is_object()) return;
  if (depth > kMaxIdWalkDepth)
    throw GrammarError(where, "the schema nests more than " + std::to_string(kMaxIdWalkDepth) + " levels deep");
  std::string inner = id_at;
  if (const auto it = s.find("$id"); !where.empty() && it != s.end() && it->is_string())
    inner = child_pointer(where, "$id");
  if (!inner.empty() && s.contains("$ref"))
    throw GrammarError(inner, "an $id below the root with a $ref inside it is not supported");
  for (auto it = s.begin(); it != s.end(); ++it) {
    const std::string& k = it.key();
    const Json& v = it.value();
    const std::string at = child_pointer(where, k);
    if (k == "properties" || k == "patternProperties" || k == "$defs" || k == "definitions" ||
        k == "dependentSchemas") {
      if (v.is_object())
        for (auto sub = v.begin(); sub != v.end(); ++sub)
          walk_ids(sub.value(), child_pointer(at, sub.key()), inner, depth + 1);
    } else if (k == "anyOf" || k == "oneOf" || k == "allOf" || k == "prefixItems" || (k == "items" && v.is_array())) {
      if (v.is_array())
        for (size_t i = 0; i < v.size(); ++i) walk_ids(v[i], child_pointer(at, i), inner, depth + 1);
    } else if (is_constraint_keyword(k) && v.is_object()) {
      walk_ids(v, at, inner, depth + 1);  // items, additionalProperties, not, if, ...
    }
  }
}

}  // namespace

void refuse_nested_ids(const Json& root) { walk_ids(root, "", "", 0); }

void SchemaDocument::spend(const std::string& where, long n) const {
  steps_left_ = n > steps_left_ ? -1 : steps_left_ - n;
  if (steps_left_ < 0)
    throw GrammarError(where, "the schema is too complex to convert (over " + std::to_string(kWorkSteps) + " steps)");
}

size_t json_size(const Json& v) {
  size_t n = 1;
  if (v.is_string()) n += v.get_ref<const std::string&>().size() / kBytesPerNode;
  if (v.is_object())
    for (auto it = v.begin(); it != v.end(); ++it) n += it.key().size() / kBytesPerNode + json_size(it.value());
  if (v.is_array())
    for (const Json& e : v) n += json_size(e);
  return n;
}

void SchemaDocument::spend_on(const Json& s, const std::string& where) const {
  spend(where, 1 + (s.is_object() ? long(s.size()) / kMembersPerStep : 0));
}

std::string child_pointer(const std::string& where, std::string_view token) {
  std::string out = where + "/";
  for (const char c : token) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out += c;
  }
  return out;
}

std::string child_pointer(const std::string& where, size_t index) { return where + "/" + std::to_string(index); }

bool is_constraint_keyword(std::string_view key) {
  return key == "unevaluatedItems" ||
         std::find(kConstraintKeywords.begin(), kConstraintKeywords.end(), key) != kConstraintKeywords.end();
}

bool is_refused_keyword(std::string_view key) {
  return std::find(kRefusedKeywords.begin(), kRefusedKeywords.end(), key) != kRefusedKeywords.end();
}

bool is_enforced_format(std::string_view f) {
  return f == "date" || f == "time" || f == "date-time" || f == "uuid" || f == "email" || f == "ipv4";
}

Json normalized(const Json& s, const std::string& where) {
  Json out = s;
  // Draft 4: exclusiveMinimum: true turns `minimum` exclusive.
  for (const auto& [excl, bound] : {std::pair<const char*, const char*>{"exclusiveMinimum", "minimum"},
                                    std::pair<const char*, const char*>{"exclusiveMaximum", "maximum"}}) {
    const auto it = out.find(excl);
    if (it == out.end() || !it->is_boolean()) continue;
    const bool on = it->get<bool>();
    out.erase(excl);
    if (on && out.contains(bound)) {
      out[excl] = out[bound];
      out.erase(bound);
    }
  }
  // Drafts up to 7: `items` as an array is 2020-12's prefixItems, additionalItems its items.
  if (const auto it = out.find("items"); it != out.end() && it->is_array()) {
    if (out.contains("prefixItems"))
      throw GrammarError(child_pointer(where, "items"), "items is an array beside prefixItems");
    out["prefixItems"] = *it;
    if (const auto add = out.find("additionalItems"); add != out.end()) {
      out["items"] = *add;
      out.erase("additionalItems");
    } else {
      out.erase("items");
    }
  }
  // Without an `items` array, additionalItems has no effect.
  out.erase("additionalItems");
  return out;
}

const Json& normalized(const Json& s, const std::string& where, Json& storage) {
  const auto excl_min = s.find("exclusiveMinimum"), excl_max = s.find("exclusiveMaximum"), items = s.find("items");
  const bool old_spelling = (excl_min != s.end() && excl_min->is_boolean()) ||
                            (excl_max != s.end() && excl_max->is_boolean()) ||
                            (items != s.end() && items->is_array()) || s.contains("additionalItems");
  if (!old_spelling) return s;
  storage = normalized(s, where);
  return storage;
}

void append_member(Json& object, std::string key, Json value) {
  auto& members = object.get_ref<Json::object_t&>();
  members.Json::object_t::Container::emplace_back(std::move(key), std::move(value));
}

bool has_constraints(const Json& s, std::initializer_list<std::string_view> skip) {
  for (auto it = s.begin(); it != s.end(); ++it) {
    if (!is_constraint_keyword(it.key())) continue;
    if (std::find(skip.begin(), skip.end(), std::string_view(it.key())) != skip.end()) continue;
    return true;
  }
  return false;
}

std::string dump_json(const Json& value, const std::string& where) {
  try {
    return value.dump();
  } catch (const nlohmann::json::exception&) {
    throw GrammarError(where, "a string in the schema is not valid UTF-8");
  }
}

int compare_numbers(const Json& a, const Json& b) {
  auto sign = [](auto x, auto y) { return x < y ? -1 : (x > y ? 1 : 0); };
  auto as_int = [](const Json& v) -> Int128 {
    return v.is_number_unsigned() ? Int128(v.get<uint64_t>()) : Int128(v.get<int64_t>());
  };
  const bool fa = a.is_number_float(), fb = b.is_number_float();
  if (fa && fb) return sign(a.get<double>(), b.get<double>());
  if (!fa && !fb) return sign(as_int(a), as_int(b));
  // One integer i, one double d: compare i with floor(d), then d's fraction decides.
  const Int128 i = as_int(fa ? b : a);
  const double d = (fa ? a : b).get<double>();
  int r;  // sign of (i - d)
  if (d >= 1e30) {
    r = -1;
  } else if (d <= -1e30) {
    r = 1;
  } else {
    const double fl = std::floor(d);
    const Int128 f = Int128(fl);
    r = i < f ? -1 : (i > f ? 1 : (d > fl ? -1 : 0));
  }
  return fa ? -r : r;
}

namespace {

void append_canonical(const Json& v, std::string& out) {
  switch (v.type()) {
    case Json::value_t::null:
      out += 'n';
      return;
    case Json::value_t::boolean:
      out += v.get<bool>() ? 't' : 'f';
      return;
    case Json::value_t::string: {
      const auto& text = v.get_ref<const std::string&>();
      out += cat("s", std::to_string(text.size()), ":", text);
      return;
    }
    case Json::value_t::array:
      out += '[';
      for (const Json& e : v) append_canonical(e, out);
      out += ']';
      return;
    case Json::value_t::object: {
      std::vector<std::pair<const std::string*, const Json*>> members;
      members.reserve(v.size());
      for (auto it = v.begin(); it != v.end(); ++it) members.emplace_back(&it.key(), &it.value());
      std::sort(members.begin(), members.end(), [](const auto& x, const auto& y) { return *x.first < *y.first; });
      out += '{';
      for (const auto& [key, value] : members) {
        out += cat("s", std::to_string(key->size()), ":", *key);
        append_canonical(*value, out);
      }
      out += '}';
      return;
    }
    default:
      break;
  }
  if (!v.is_number()) {
    out += cat("?", v.dump(), ";");  // binary or discarded: never from parsed JSON
    return;
  }
  // Integers and integral doubles below 10^30 by their exact digits (1 and 1.0 are equal);
  // other doubles equal only themselves, and the shortest text that reads back as a double
  // names it uniquely. Non-finite doubles (only from code) get texts no number has.
  out += '#';
  if (v.is_number_unsigned()) {
    out += std::to_string(v.get<uint64_t>());
  } else if (v.is_number_integer()) {
    out += std::to_string(v.get<int64_t>());
  } else if (const double d = v.get<double>(); std::isnan(d)) {
    out += "nan";
  } else if (std::isinf(d)) {
    out += d > 0 ? "inf" : "-inf";
  } else if (std::floor(d) == d && std::fabs(d) < 1e30) {
    out += to_string_128(Int128(d));
  } else {
    out += v.dump();
  }
  out += ';';
}

}  // namespace

std::string canonical_json(const Json& value) {
  std::string out;
  append_canonical(value, out);
  return out;
}

bool json_equal(const Json& a, const Json& b) {
  if (a.is_number() && b.is_number()) return compare_numbers(a, b) == 0;
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!json_equal(a[i], b[i])) return false;
    return true;
  }
  // Objects: looking each key up in the other would be quadratic (members are a list).
  if (a.is_object()) return a.size() == b.size() && canonical_json(a) == canonical_json(b);
  return a == b;
}

uint8_t kind_of(const Json& v) {
  if (v.is_null()) return kNull;
  if (v.is_boolean()) return kBoolean;
  if (v.is_object()) return kObject;
  if (v.is_array()) return kArray;
  if (v.is_string()) return kString;
  return kNumber;
}

uint8_t kinds_of_type(const Json& type) {
  auto one = [](const Json& t) -> uint8_t {
    if (!t.is_string()) return 0;
    const auto& s = t.get_ref<const std::string&>();
    if (s == "null") return kNull;
    if (s == "boolean") return kBoolean;
    if (s == "object") return kObject;
    if (s == "array") return kArray;
    if (s == "string") return kString;
    if (s == "number" || s == "integer") return kNumber;
    return 0;
  };
  if (!type.is_array()) return one(type);
  uint8_t k = 0;
  for (const Json& t : type) k |= one(t);
  return k;
}

std::vector<std::string> implied_types(const Json& s) {
  auto any = [&](std::initializer_list<const char*> keys) {
    return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return s.contains(k); });
  };
  std::vector<std::string> out;
  if (any({"properties", "required", "additionalProperties", "minProperties", "maxProperties",
           "unevaluatedProperties"}))
    out.push_back("object");
  if (any({"items", "prefixItems", "minItems", "maxItems", "uniqueItems"})) out.push_back("array");
  // (Unknown formats, such as OpenAPI's int32, imply nothing.)
  const auto format = s.find("format");
  if (any({"minLength", "maxLength", "pattern"}) ||
      (format != s.end() && format->is_string() && is_enforced_format(format->get<std::string>())))
    out.push_back("string");
  if (any({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})) out.push_back("number");
  return out;
}

bool is_integer_value(const Json& v) {
  if (v.is_number_integer()) return true;  // signed and unsigned
  if (!v.is_number_float()) return false;
  const double d = v.get<double>();
  return std::isfinite(d) && std::floor(d) == d;
}

}  // namespace fdl::grammar
