// JSON Schema → GBNF (see json_schema.h): a walk over the schema that writes one rule per
// subschema, with the fixed "json-..." rules for unconstrained values.
#include "grammar/json_schema.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "flashdllm/grammar.h"
#include "grammar/code_point_set.h"
#include "grammar/gbnf_rules.h"
#include "grammar/gbnf_text.h"
#include "grammar/json_rules.h"
#include "grammar/numeric_range.h"
#include "grammar/regex_to_gbnf.h"
#include "grammar/schema_check.h"
#include "grammar/schema_document.h"
#include "grammar/schema_merge.h"
#include "grammar/unsatisfiable.h"

namespace fdl::grammar {
namespace {

constexpr int kMaxDepth = 64;
// prefixItems a tuple may list (one rule per optional tail).
constexpr size_t kMaxPrefixItems = 256;
// An enum is one rule with an alternative per value, and a matcher follows every alternative
// at once until the text tells them apart (GrammarMatcher::kMaxStacks = 16,384 at most).
constexpr size_t kMaxEnumValues = 10000;
// Members of one object (properties and required names together): each is a part of the
// object's rule and a name its additional keys must differ from.
constexpr size_t kMaxMembers = 4096;
// The largest minLength/minItems accepted: beyond it no generation would finish anyway.
constexpr uint64_t kMaxMinCount = 100000;
// Integer digits: 15 where a side is unbounded, up to 18 where the bounds ask for them.
const Int128 kDefaultIntLimit = pow10_128(15) - 1;
const Int128 kMaxIntLimit = pow10_128(18) - 1;
// Numbers with bounds stay below 10^15 in magnitude, with 6 fraction digits (up to 15
// when the range is too narrow for 6).
constexpr int kNumberDigits = 15;

const std::string kQuote = R"("\"")";   // one double quote
const std::string kSep = R"("," " "?)";  // a comma and one optional space
const std::string kColon = R"(":" " "?)";

std::string join(const std::vector<std::string>& parts, const std::string& sep) {
  std::string out;
  for (const auto& p : parts) {
    if (p.empty()) continue;
    if (!out.empty()) out += sep;
    out += p;
  }
  return out;
}

std::string seq(std::initializer_list<std::string> parts) { return join(parts, " "); }

bool is_rule_name(const std::string& e) {
  return !e.empty() && std::all_of(e.begin(), e.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
  });
}

// `value` as compact JSON, as a GBNF literal.
std::string json_literal(const Json& value, const std::string& where) { return gbnf_quote(dump_json(value, where)); }

// A sorted nlohmann::json value as an ordered one, member by member (parsing its text again
// would insert each member after comparing its key with all before it: quadratic).
nlohmann::ordered_json converted(const nlohmann::json& v) {
  if (v.is_array()) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const auto& e : v) out.push_back(converted(e));
    return out;
  }
  if (!v.is_object()) return nlohmann::ordered_json(v);  // scalars convert directly
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (auto it = v.begin(); it != v.end(); ++it) append_member(out, it.key(), converted(it.value()));
  return out;
}

nlohmann::ordered_json ordered(const nlohmann::json& schema) {
  try {
    (void)schema.dump();  // refuses strings that are not UTF-8
  } catch (const nlohmann::json::exception&) {
    throw GrammarError("", "a string in the schema is not valid UTF-8");
  }
  return converted(schema);
}

// A count keyword (minLength, maxItems, ...): a non-negative integer.
std::optional<uint64_t> count(const Json& s, const char* key, const std::string& where) {
  const auto it = s.find(key);
  if (it == s.end()) return std::nullopt;
  if (!it->is_number() || !is_integer_value(*it) || compare_numbers(*it, Json(0)) < 0)
    throw GrammarError(child_pointer(where, key), std::string(key) + " must be a non-negative integer");
  if (it->is_number_float() && it->get<double>() >= 1.8e19) return kUnbounded - 1;
  return it->is_number_float() ? uint64_t(it->get<double>()) : it->get<uint64_t>();
}

uint64_t min_count(const Json& s, const char* key, const std::string& where) {
  const uint64_t n = count(s, key, where).value_or(0);
  if (n > kMaxMinCount)
    throw GrammarError(child_pointer(where, key),
                       std::string(key) + " above " + std::to_string(kMaxMinCount) + " is not supported");
  return n;
}

// Exact floor(b · 10^k) for |b| <= 10^16, k <= 15.
Int128 scaled_floor(double b, int k) {
  if (b == 0) return 0;
  int e = 0;
  const double m = std::frexp(b, &e);  // b = m · 2^e, 0.5 <= |m| < 1
  const Int128 p = Int128(int64_t(std::ldexp(m, 53))) * pow10_128(k);
  e -= 53;  // b = p / 10^k · 2^e, exactly
  if (e >= 0) return p << e;
  if (e <= -120) return p < 0 ? -1 : 0;
  return p >> (-e);  // arithmetic shift: floors negatives too
}

// N / 10^k as JSON text, parsed to the nearest double (as Python and strtod do, but
// whatever the C locale).
double parsed(Int128 n, int k) {
  const bool neg = n < 0;
  std::string digits = to_string_128(neg ? -n : n);
  if (digits.size() <= size_t(k)) digits.insert(0, size_t(k) + 1 - digits.size(), '0');
  const std::string text = k > 0 ? cat(neg ? "-" : "", std::string_view(digits).substr(0, digits.size() - size_t(k)),
                                       ".", std::string_view(digits).substr(digits.size() - size_t(k)))
                                 : cat(neg ? "-" : "", digits);
  double value = 0;
  std::from_chars(text.data(), text.data() + text.size(), value);
  return value;
}

// The largest N >= from whose text N / 10^k a validator reads as <= hi (N = from reads so):
// doubling steps, then bisection, as reading is monotonic.
Int128 last_read_below(Int128 from, int k, double hi) {
  Int128 good = from, step = 1;
  while (parsed(good + step, k) <= hi) good += step, step *= 2;
  for (Int128 bad = good + step; bad - good > 1;) {
    const Int128 mid = good + (bad - good) / 2;
    (parsed(mid, k) <= hi ? good : bad) = mid;
  }
  return good;
}

// The smallest N whose text N / 10^k a validator reads as >= lo, and the largest read as
// <= hi. They pass the exact bound only by rounding (the text reads as the bound itself),
// and never at an integer value, which Python compares exactly: those are exact doubles.
Int128 scaled_min(double lo, int k) { return -last_read_below(scaled_floor(-lo, k), k, -lo); }
Int128 scaled_max(double hi, int k) { return last_read_below(scaled_floor(hi, k), k, hi); }

// A bound as a double, clamped to +-10^16 (past the supported range, so a clamped bound
// only narrows the range the caller caps anyway, or is refused as beyond it).
double bound_value(const Json& v) {
  const double cap = 1e16;
  if (v.is_number_float()) return std::clamp(v.get<double>(), -cap, cap);
  const Int128 i = v.is_number_unsigned() ? Int128(v.get<uint64_t>()) : Int128(v.get<int64_t>());
  return double(std::clamp(i, -Int128(cap), Int128(cap)));
}

// A double known to be an integer, clamped to ±10^30, as an integer.
Int128 to_int(double d) { return Int128(std::clamp(d, -1e30, 1e30)); }

class Visitor {
 public:
  // `base`: the name hint of the schema, which every rule name of this schema starts with.
  Visitor(RuleSet& rules, const Json& root, std::string base) : rules_(rules), doc_(root), base_(std::move(base)) {}

  // GBNF for the JSON texts valid under `s`: a rule name.
  std::string visit(const Json& s0, const std::string& where, const std::string& hint) {
    if (depth_ >= kMaxDepth) throw GrammarError(where, "the schema nests more than 64 levels deep");
    doc_.spend_on(s0, where);
    ++depth_;
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth_};
    if (s0.is_boolean()) {
      if (s0.get<bool>()) return fixed("json-value", where);
      throw Unsatisfiable(where, "the schema false allows nothing");
    }
    if (!s0.is_object()) throw GrammarError(where, "a schema must be an object or a boolean");
    Json storage;
    const Json& s = normalized(s0, where, storage);
    if (&s == &storage) doc_.spend(where, long(json_size(storage) / kNodesPerStep));  // a copy of the subtree
    for (auto it = s.begin(); it != s.end(); ++it)
      if (is_refused_keyword(it.key()))
        throw GrammarError(child_pointer(where, it.key()), it.key() + " is not supported");
    if (const auto ref = s.find("$ref"); ref != s.end()) {
      if (!has_constraints(s, {"$ref"})) return ref_rule(*ref, where);
      return visit(merge_schemas({&s}, doc_, where), where, hint);  // $ref with sibling keywords: both apply
    }
    if (s.contains("allOf")) return visit(merge_schemas({&s}, doc_, where), where, hint);
    if (s.contains("anyOf") || s.contains("oneOf")) return alternatives(s, where, hint);
    if (s.contains("enum") || s.contains("const")) return enumeration(s, where, hint);
    return typed(s, where, hint);
  }

  void rollback(size_t mark) {
    rules_.rollback(mark);
    for (auto it = refs_.begin(); it != refs_.end();) it = it->second.mark >= mark ? refs_.erase(it) : std::next(it);
    for (auto it = patterns_.begin(); it != patterns_.end();)
      it = it->second.mark >= mark ? patterns_.erase(it) : std::next(it);
  }

 private:
  std::string fixed(const std::string& name, const std::string& where) { return define_json_rule(rules_, name, where); }

  // A rule for `body`, or the body itself when it is one rule name already.
  std::string rule(const std::string& hint, const std::string& body, const std::string& where) {
    return is_rule_name(body) ? body : rules_.add(hint, body, where);
  }

  std::string ref_rule(const Json& ref, const std::string& where) {
    const std::string at = child_pointer(where, "$ref");
    if (!ref.is_string()) throw GrammarError(at, "$ref must be a string");
    std::string target_where;
    const Json& target = doc_.resolve(ref.get<std::string>(), at, &target_where);
    if (const auto it = refs_.find(target_where); it != refs_.end()) {
      // Reaching a schema again before any '{' or '[' would be left recursion.
      if (!it->second.done && it->second.containers == containers_)
        throw GrammarError(at, "$ref cycle with no object or array in between (the schema would nest without bound)");
      return it->second.name;
    }
    const std::string hint =
        cat(base_, "-", target_where.empty() ? "root" : target_where.substr(target_where.rfind('/') + 1));
    const size_t mark = rules_.mark();
    const std::string name = rules_.reserve(hint, where);
    refs_[target_where] = RefRule{name, mark, false, containers_};
    const std::string body = visit(target, target_where, hint);
    rules_.define(name, body, where);
    refs_[target_where].done = true;
    return name;
  }

  std::string alternatives(const Json& s, const std::string& where, const std::string& hint) {
    if (s.contains("anyOf") && s.contains("oneOf"))
      throw GrammarError(child_pointer(where, "oneOf"), "anyOf and oneOf in one schema are not supported");
    const std::string key = s.contains("oneOf") ? "oneOf" : "anyOf";
    const std::string at = child_pointer(where, key);
    const Json& list = s[key];
    if (!list.is_array() || list.empty()) throw GrammarError(at, key + " must be a non-empty array");
    Json siblings = s;
    siblings.erase(key);
    // Keywords beside anyOf apply to every branch: S and (A or B) = (S and A) or (S and B).
    const bool distribute = has_constraints(siblings, {});
    std::optional<Unsatisfiable> merge_error, visit_error;  // the first of each, for the message
    // A branch with the siblings merged in, or null when that is visibly unsatisfiable.
    auto merged = [&](size_t i) -> Json {
      try {
        return merge_schemas({&siblings, &list[i]}, doc_, child_pointer(at, i));
      } catch (const Unsatisfiable& e) {
        if (!merge_error) merge_error = e;
        return nullptr;
      }
    };
    std::vector<std::string> exprs;
    std::set<std::string> seen;
    auto write = [&](const Json& branch, size_t i) {
      const size_t mark = rules_.mark();
      try {
        std::string e = visit(branch, child_pointer(at, i), hint + "-" + std::to_string(i));
        if (seen.insert(e).second) exprs.push_back(std::move(e));
      } catch (const Unsatisfiable& e) {
        rollback(mark);
        if (!visit_error) visit_error = e;
      }
    };
    if (key == "oneOf" && list.size() >= 2 && list.size() <= kMaxExclusiveBranches) {
      // The branches are compared with each other before any is written.
      std::vector<Json> branches;  // those not visibly unsatisfiable
      std::vector<size_t> index;   // their positions in the list
      for (size_t i = 0; i < list.size(); ++i) {
        Json b = distribute ? merged(i) : list[i];
        if (!distribute || !b.is_null()) branches.push_back(std::move(b)), index.push_back(i);
      }
      branches = exclusive_branches(branches, doc_, at);
      for (size_t k = 0; k < branches.size(); ++k)
        if (!branches[k].is_null()) write(branches[k], index[k]);  // null: a oneOf branch left out
    } else {
      // One branch at a time: merged copies of every branch at once could each be as large as
      // the siblings.
      for (size_t i = 0; i < list.size(); ++i) {
        if (!distribute) {
          write(list[i], i);
        } else if (const Json b = merged(i); !b.is_null()) {
          write(b, i);
        }
      }
    }
    const std::optional<Unsatisfiable>& first_error = merge_error ? merge_error : visit_error;
    if (exprs.empty() && !first_error) throw Unsatisfiable(at, "no oneOf branch excludes the others");
    if (exprs.empty()) throw Unsatisfiable(at, "no branch can be satisfied (" + std::string(first_error->what()) + ")");
    return exprs.size() == 1 ? exprs[0] : rules_.add(hint, join(exprs, " | "), where);
  }

  std::string enumeration(const Json& s, const std::string& where, const std::string& hint) {
    std::vector<const Json*> values;
    if (const auto e = s.find("enum"); e != s.end()) {
      const std::string at = child_pointer(where, "enum");
      if (!e->is_array()) throw GrammarError(at, "enum must be an array");
      if (e->size() > kMaxEnumValues)
        throw GrammarError(at, "enum with more than " + std::to_string(kMaxEnumValues) + " values is not supported");
      for (const Json& v : *e) values.push_back(&v);
    }
    if (const auto c = s.find("const"); c != s.end()) {
      if (s.contains("enum")) {
        const std::string want = canonical_json(*c);
        std::erase_if(values, [&](const Json* v) { return canonical_json(*v) != want; });
      } else {
        values = {&*c};
      }
    }
    Json rest = s;
    rest.erase("enum");
    rest.erase("const");
    std::vector<const Json*> kept;
    std::set<std::string> seen;  // canonical_json of the values met
    ValueChecker checker(doc_);
    for (const Json* v : values) {
      if (!seen.insert(canonical_json(*v)).second) continue;
      if (checker.satisfies(*v, rest, where)) kept.push_back(v);
    }
    const std::string at = child_pointer(where, s.contains("enum") ? "enum" : "const");
    if (kept.empty()) throw Unsatisfiable(at, "no enum/const value satisfies the other keywords");
    std::vector<std::string> literals;
    for (const Json* v : kept) literals.push_back(json_literal(*v, at));
    return rule(hint, join(literals, " | "), where);
  }

  std::string typed(const Json& s, const std::string& where, const std::string& hint) {
    std::vector<std::string> types;
    if (const auto t = s.find("type"); t != s.end()) {
      types = type_names(*t, child_pointer(where, "type"));
      if (std::find(types.begin(), types.end(), "number") != types.end()) std::erase(types, std::string("integer"));
      if (types.empty()) throw Unsatisfiable(child_pointer(where, "type"), "an empty type list allows nothing");
    } else {
      types = implied_types(s);
      if (types.empty()) return fixed("json-value", where);
    }
    std::vector<std::string> alts;
    std::optional<Unsatisfiable> first_error;
    for (const std::string& t : types) {
      const size_t mark = rules_.mark();
      try {
        alts.push_back(type_body(t, s, where, hint));
      } catch (const Unsatisfiable& e) {
        rollback(mark);
        if (!first_error) first_error = e;
      }
    }
    if (alts.empty()) throw *first_error;
    return rule(hint, join(alts, " | "), where);
  }

  std::string type_body(const std::string& t, const Json& s, const std::string& where, const std::string& hint) {
    if (t == "null") return R"("null")";
    if (t == "boolean") return R"(("true" | "false"))";
    if (t == "string") return string_body(s, where, hint);
    if (t == "integer") return integer_body(s, where);
    if (t == "number") return number_body(s, where);
    if (t == "array") return array_body(s, where, hint);
    return object_body(s, where, hint);
  }

  std::string string_body(const Json& s, const std::string& where, const std::string& hint) {
    const uint64_t min_len = min_count(s, "minLength", where);
    const uint64_t max_len = count(s, "maxLength", where).value_or(kUnbounded);
    if (max_len < min_len) throw Unsatisfiable(child_pointer(where, "maxLength"), "maxLength is below minLength");
    const auto pattern = s.find("pattern");
    if (pattern != s.end() && !pattern->is_string())
      throw GrammarError(child_pointer(where, "pattern"), "pattern must be a string");
    if (const auto f = s.find("format"); f != s.end() && f->is_string() && is_enforced_format(f->get<std::string>())) {
      const std::string format = f->get<std::string>();
      const std::string at = child_pointer(where, "format");
      if (pattern != s.end()) throw GrammarError(at, "format together with pattern is not supported");
      const auto [lo, hi] = format_lengths(format);
      if (lo < min_len || hi > max_len)
        throw GrammarError(at, "format " + format + " together with minLength/maxLength is not supported");
      return seq({kQuote, fixed("json-" + format, where), kQuote});
    }
    std::string content;
    if (pattern != s.end())
      content = pattern_gbnf(pattern->get_ref<const std::string&>(), min_len, max_len, hint,
                             child_pointer(where, "pattern"));
    else
      content = repeat(rules_, fixed("json-char", where), min_len, max_len, hint + "-chars", where);
    return seq({kQuote, content, kQuote});
  }

  // A pattern's GBNF, translated once per pattern and length bounds: a translation costs the
  // pattern's length (paid to the work budget), and schemas repeat patterns, as anyOf branches
  // that each take the pattern beside them do.
  std::string pattern_gbnf(const std::string& pattern, uint64_t min_len, uint64_t max_len, const std::string& hint,
                           const std::string& at) {
    auto key = std::make_tuple(pattern, min_len, max_len);
    if (const auto it = patterns_.find(key); it != patterns_.end()) return it->second.expr;
    doc_.spend(at, long(pattern.size() / kPatternCharsPerStep));
    const size_t mark = rules_.mark();
    std::string expr = regex_to_gbnf(pattern, min_len, max_len, rules_, hint + "-pattern", at);
    bounded(patterns_).emplace(std::move(key), Translation{expr, mark});
    return expr;
  }

  static void check_multiple_of(const Json& s, const std::string& where) {
    if (const auto m = s.find("multipleOf"); m != s.end())
      if (!m->is_number() || compare_numbers(*m, Json(1)) != 0)
        throw GrammarError(child_pointer(where, "multipleOf"), "multipleOf other than 1 is not supported");
  }

  // The pointer of the first of `keys` that `s` has (for messages about bounds).
  static std::string first_of(const Json& s, std::initializer_list<const char*> keys, const std::string& where) {
    for (const char* k : keys)
      if (s.contains(k)) return child_pointer(where, k);
    return where;
  }

  static const Json* number_keyword(const Json& s, const char* key, const std::string& where) {
    const auto it = s.find(key);
    if (it == s.end()) return nullptr;
    if (!it->is_number()) throw GrammarError(child_pointer(where, key), std::string(key) + " must be a number");
    return &*it;
  }

  std::string integer_body(const Json& s, const std::string& where) {
    check_multiple_of(s, where);
    std::optional<Int128> lo, hi;
    auto raise = [&](Int128 v) { lo = lo ? std::max(*lo, v) : v; };
    auto lower = [&](Int128 v) { hi = hi ? std::min(*hi, v) : v; };
    auto as_int = [](const Json& v) {
      return v.is_number_unsigned() ? Int128(v.get<uint64_t>()) : Int128(v.get<int64_t>());
    };
    if (const Json* v = number_keyword(s, "minimum", where))
      raise(v->is_number_float() ? to_int(std::ceil(v->get<double>())) : as_int(*v));
    if (const Json* v = number_keyword(s, "exclusiveMinimum", where))
      raise(v->is_number_float() ? to_int(std::floor(v->get<double>())) + 1 : as_int(*v) + 1);
    if (const Json* v = number_keyword(s, "maximum", where))
      lower(v->is_number_float() ? to_int(std::floor(v->get<double>())) : as_int(*v));
    if (const Json* v = number_keyword(s, "exclusiveMaximum", where))
      lower(v->is_number_float() ? to_int(std::ceil(v->get<double>())) - 1 : as_int(*v) - 1);
    if (!lo && !hi) return fixed("json-integer", where);
    // An open side stops at 15 digits, or 18 when the other bound is already past 15.
    if (!lo) lo = *hi < -kDefaultIntLimit ? -kMaxIntLimit : -kDefaultIntLimit;
    if (!hi) hi = *lo > kDefaultIntLimit ? kMaxIntLimit : kDefaultIntLimit;
    if (*lo > kMaxIntLimit)
      throw GrammarError(first_of(s, {"minimum", "exclusiveMinimum"}, where),
                         "integer bounds beyond 18 digits are not supported");
    if (*hi < -kMaxIntLimit)
      throw GrammarError(first_of(s, {"maximum", "exclusiveMaximum"}, where),
                         "integer bounds beyond 18 digits are not supported");
    lo = std::max(*lo, -kMaxIntLimit);
    hi = std::min(*hi, kMaxIntLimit);
    if (*lo > *hi)
      throw Unsatisfiable(first_of(s, {"maximum", "exclusiveMaximum"}, where),
                          "no integer lies within minimum/maximum");
    auto [it, fresh] = bounded(integer_ranges_).try_emplace({*lo, *hi});
    if (fresh) it->second = cat("(", decimal_range_gbnf(*lo, *hi, 0), ")");
    return it->second;
  }

  std::string number_body(const Json& s, const std::string& where) {
    if (s.contains("multipleOf")) return integer_body(s, where);  // multipleOf 1 (others refused)
    // Inclusive bounds as validators compare them: an exclusive bound b becomes the next
    // double past it (a text read as that double, or beyond, is past b).
    std::optional<double> lo, hi;
    auto raise = [&](double v) { lo = lo ? std::max(*lo, v) : v; };
    auto lower = [&](double v) { hi = hi ? std::min(*hi, v) : v; };
    if (const Json* v = number_keyword(s, "minimum", where)) raise(bound_value(*v));
    if (const Json* v = number_keyword(s, "exclusiveMinimum", where)) raise(std::nextafter(bound_value(*v), HUGE_VAL));
    if (const Json* v = number_keyword(s, "maximum", where)) lower(bound_value(*v));
    if (const Json* v = number_keyword(s, "exclusiveMaximum", where)) lower(std::nextafter(bound_value(*v), -HUGE_VAL));
    if (!lo && !hi) return fixed("json-number", where);
    const std::string upper_at = first_of(s, {"maximum", "exclusiveMaximum"}, where);
    if (lo && hi && *lo > *hi) throw Unsatisfiable(upper_at, "no number lies within minimum/maximum");
    auto bits = [](std::optional<double> d) { return d ? std::optional(std::bit_cast<uint64_t>(*d)) : std::nullopt; };
    const auto key = std::make_pair(bits(lo), bits(hi));
    if (const auto it = number_ranges_.find(key); it != number_ranges_.end()) {
      if (it->second) return *it->second;
      throw Unsatisfiable(upper_at, "no number with at most 15 fraction digits lies within minimum/maximum");
    }
    for (const int k : {6, 9, 12, 15}) {
      const Int128 cap = pow10_128(kNumberDigits + k) - 1;  // |x| < 10^15
      const Int128 a = lo ? scaled_min(*lo, k) : -cap, b = hi ? scaled_max(*hi, k) : cap;
      // Numbers are written below 10^15 in magnitude: a bound beyond that on its own side
      // only narrows what the validator allows, but one that leaves nothing below it is refused.
      if (a > cap || b < -cap)
        throw GrammarError(a > cap ? first_of(s, {"minimum", "exclusiveMinimum"}, where) : upper_at,
                           "a lower bound at or above 10^15 (or an upper bound at or below -10^15) is not supported");
      if (std::max(a, -cap) <= std::min(b, cap)) {
        std::string body = cat("(", decimal_range_gbnf(std::max(a, -cap), std::min(b, cap), k), ")");
        return *(bounded(number_ranges_)[key] = std::move(body));
      }
    }
    bounded(number_ranges_)[key] = std::nullopt;
    throw Unsatisfiable(upper_at, "no number with at most 15 fraction digits lies within minimum/maximum");
  }

  struct Containers {
    int& n;
    explicit Containers(int& c) : n(c) { ++n; }
    ~Containers() { --n; }
  };

  std::string array_body(const Json& s, const std::string& where, const std::string& hint) {
    uint64_t min_items = min_count(s, "minItems", where);
    uint64_t max_items = count(s, "maxItems", where).value_or(kUnbounded);
    if (max_items < min_items) throw Unsatisfiable(child_pointer(where, "maxItems"), "maxItems is below minItems");
    if (const auto u = s.find("uniqueItems"); u != s.end() && u->is_boolean() && u->get<bool>() && max_items > 1)
      throw GrammarError(child_pointer(where, "uniqueItems"), "uniqueItems is not supported");
    const Containers inside(containers_);
    std::vector<std::string> prefix;
    const Json prefix_schemas = s.value("prefixItems", Json::array());
    if (!prefix_schemas.is_array())
      throw GrammarError(child_pointer(where, "prefixItems"), "prefixItems must be an array");
    if (prefix_schemas.size() > kMaxPrefixItems)
      throw GrammarError(child_pointer(where, "prefixItems"), "more than 256 prefixItems are not supported");
    // Elements past an unsatisfiable one cannot exist: the array ends before it.
    auto unsatisfiable_at = [&](uint64_t i, const Unsatisfiable& e) {
      if (i < min_items) throw e;
      max_items = std::min(max_items, i);
    };
    for (size_t i = 0; i < prefix_schemas.size() && i < max_items; ++i) {
      const size_t mark = rules_.mark();
      try {
        prefix.push_back(visit(prefix_schemas[i], child_pointer(child_pointer(where, "prefixItems"), i),
                               hint + "-item-" + std::to_string(i)));
      } catch (const Unsatisfiable& e) {
        rollback(mark);
        unsatisfiable_at(i, e);
      }
    }
    std::string item;
    if (max_items > prefix.size()) {
      const size_t mark = rules_.mark();
      try {
        item = s.contains("items") ? visit(s["items"], child_pointer(where, "items"), hint + "-item")
                                   : fixed("json-value", where);
      } catch (const Unsatisfiable& e) {
        rollback(mark);
        unsatisfiable_at(prefix.size(), e);
      }
    }
    return seq({R"("[")", elements(0, prefix, item, min_items, max_items, hint, where), R"("]")"});
  }

  // Elements i.. of an array, each after the first led by a comma.
  std::string elements(uint64_t i, const std::vector<std::string>& prefix, const std::string& item, uint64_t min_items,
                       uint64_t max_items, const std::string& hint, const std::string& where) {
    if (i >= max_items) return "";
    const std::string lead = i > 0 ? kSep : "";
    if (i < prefix.size()) {
      const std::string e = seq({lead, prefix[i], elements(i + 1, prefix, item, min_items, max_items, hint, where)});
      // An optional tail is a rule of its own, not a group: nested groups would nest as deep
      // as the tuple is long, past what the compiler parses.
      return i < min_items ? e : rule(hint + "-from-" + std::to_string(i), e, where) + "?";
    }
    // The rest are all `item`: a repetition.
    const uint64_t lo = min_items > i ? min_items - i : 0;
    const uint64_t hi = max_items == kUnbounded ? kUnbounded : max_items - i;
    const std::string more = "(" + kSep + " " + item + ")";
    if (i > 0) return repeat(rules_, more, lo, hi, hint + "-items", where);
    const std::string first = seq({item, repeat(rules_, more, lo > 0 ? lo - 1 : 0, hi == kUnbounded ? hi : hi - 1,
                                                 hint + "-items", where)});
    return lo > 0 ? first : "(" + first + ")?";
  }

  struct Member {
    std::string text;  // "key" : value
    bool required = false;
  };

  std::string object_body(const Json& s, const std::string& where, const std::string& hint) {
    const auto props_it = s.find("properties");
    const Json no_props = Json::object();
    const Json& props = props_it != s.end() ? *props_it : no_props;
    if (!props.is_object()) throw GrammarError(child_pointer(where, "properties"), "properties must be an object");
    const auto required_it = s.find("required");
    const Json no_required = Json::array();
    const Json& required = required_it != s.end() ? *required_it : no_required;
    if (!required.is_array() ||
        !std::all_of(required.begin(), required.end(), [](const Json& r) { return r.is_string(); }))
      throw GrammarError(child_pointer(where, "required"), "required must be an array of strings");
    // Every member's name once, properties first (sets: lookups in the lists are linear).
    std::vector<std::string> names;
    std::set<std::string_view> listed, required_names;
    for (auto it = props.begin(); it != props.end(); ++it)
      if (listed.insert(it.key()).second) names.push_back(it.key());
    for (const Json& r : required) {
      const std::string& name = r.get_ref<const std::string&>();
      if (required_names.insert(name).second && !listed.count(name)) names.push_back(name);
    }
    if (names.size() > kMaxMembers)
      throw GrammarError(child_pointer(where, listed.size() > kMaxMembers ? "properties" : "required"),
                         "objects with more than " + std::to_string(kMaxMembers) +
                             " properties and required names together are not supported");
    // additionalProperties absent counts as false here (as in OpenAI's strict mode): only
    // the listed properties are written, which the schema allows either way.
    const auto add = s.find("additionalProperties");
    const bool open = add != s.end() && !(add->is_boolean() && !add->get<bool>());
    const Containers inside(containers_);
    std::vector<Member> members;
    for (auto it = props.begin(); it != props.end(); ++it) {
      const std::string& key = it.key();
      const bool req = required_names.count(key) != 0;
      const size_t mark = rules_.mark();
      try {
        const std::string value =
            visit(it.value(), child_pointer(child_pointer(where, "properties"), key), hint + "-" + key);
        members.push_back({seq({json_literal(Json(key), where), kColon, value}), req});
      } catch (const Unsatisfiable&) {
        rollback(mark);
        if (req) throw;  // an optional property nothing satisfies is left out
      }
    }
    for (size_t i = listed.size(); i < names.size(); ++i) {
      const std::string& key = names[i];
      // Required but not listed: its value follows additionalProperties (any value when absent,
      // unless unevaluatedProperties says otherwise).
      const Json* value_schema = add != s.end()                        ? &*add
                                 : s.contains("unevaluatedProperties") ? &s["unevaluatedProperties"]
                                                                       : nullptr;
      const Json any = true;
      const std::string value =
          visit(value_schema ? *value_schema : any, child_pointer(where, "required"), hint + "-" + key);
      members.push_back({seq({json_literal(Json(key), where), kColon, value}), true});
    }
    std::string extra;  // one additional member, when allowed
    if (open) {
      const size_t mark = rules_.mark();
      try {
        const std::string value = visit(*add, child_pointer(where, "additionalProperties"), hint + "-additional");
        extra = seq({key_not_in(names, where, hint), kColon, value});
      } catch (const Unsatisfiable&) {
        rollback(mark);
      }
    }
    check_property_counts(s, members, !extra.empty(), where);
    return seq({R"("{")", members_gbnf(members, extra, hint, where), R"("}")"});
  }

  static void check_property_counts(const Json& s, const std::vector<Member>& members, bool open,
                                    const std::string& where) {
    const uint64_t n_required =
        uint64_t(std::count_if(members.begin(), members.end(), [](const Member& m) { return m.required; }));
    if (const auto m = count(s, "minProperties", where); m && *m > n_required)
      throw GrammarError(child_pointer(where, "minProperties"),
                         "minProperties is supported only when the required properties already meet it");
    if (const auto m = count(s, "maxProperties", where); m && (open || *m < members.size()))
      throw GrammarError(child_pointer(where, "maxProperties"),
                         "maxProperties is supported only when all listed properties fit and no others are allowed");
  }

  // The members in order, optional ones omittable, commas only between members, then any
  // number of additional members (`extra`).
  std::string members_gbnf(const std::vector<Member>& members, const std::string& extra, const std::string& hint,
                           const std::string& where) {
    const size_t n = members.size();
    // The possible first members: each up to and including the first required one.
    size_t firsts = 0;
    while (firsts < n && !members[firsts].required) ++firsts;
    const bool all_optional = firsts == n;
    firsts = std::min(firsts + 1, n);
    // piece[i]: member i after an earlier one (omittable when optional); piece[n]: the extras.
    std::vector<std::string> piece(n + 1);
    for (size_t i = 0; i < n; ++i) {
      const std::string m = seq({kSep, members[i].text});
      piece[i] = members[i].required ? m : "(" + m + ")?";
    }
    piece[n] = extra.empty() ? "" : "(" + kSep + " " + extra + ")*";
    // tail[i]: members i.. after at least one member was written. Several first-member
    // choices share their tails: each is a rule naming the next. Otherwise the (at most two)
    // tails needed are written out once each; a tail per member would be quadratic.
    std::vector<std::string> tail(n + 1);
    tail[n] = piece[n];
    if (firsts > 2) {
      for (size_t i = n; i-- > 1;) tail[i] = rules_.add(hint + "-rest", seq({piece[i], tail[i + 1]}), where);
    } else {
      for (size_t i = 1; i <= firsts && i < n; ++i) {
        std::string t;
        for (size_t k = i; k <= n; ++k)
          if (!piece[k].empty()) {
            if (!t.empty()) t += ' ';
            t += piece[k];
          }
        tail[i] = std::move(t);
      }
    }
    std::vector<std::string> alts;
    for (size_t j = 0; j < firsts; ++j) alts.push_back(seq({members[j].text, tail[j + 1]}));
    if (all_optional && !extra.empty()) alts.push_back(seq({extra, tail[n]}));
    const std::string body = join(alts, " | ");
    if (body.empty()) return "";
    if (all_optional) return "(" + body + ")?";
    return alts.size() > 1 ? "(" + body + ")" : body;
  }

  // A key (quotes included) that is none of `names`: raw characters only (no escapes, so the
  // text is the key), through a trie of the names that steps aside at the first difference.
  std::string key_not_in(const std::vector<std::string>& names, const std::string& where, const std::string& hint) {
    if (names.empty()) return fixed("json-string", where);
    CodePointSet raw = CodePointSet::all().minus(CodePointSet::range(0, 0x1F));
    raw = raw.minus(CodePointSet::single('"')).minus(CodePointSet::single('\\'));
    struct Node {
      std::map<uint32_t, size_t> next;
      bool terminal = false;
    };
    std::vector<Node> trie(1);
    for (const std::string& name : names) {
      size_t node = 0, pos = 0;
      bool spellable = true;
      std::vector<uint32_t> cps;
      while (pos < name.size()) {
        uint32_t c = 0;
        if (!decode_utf8(name, pos, c) || !raw.contains(c)) {
          spellable = false;  // a raw key can never equal it
          break;
        }
        cps.push_back(c);
      }
      if (!spellable) continue;
      for (const uint32_t c : cps) {
        auto [it, inserted] = trie[node].next.try_emplace(c, trie.size());
        if (inserted) trie.emplace_back();
        node = it->second;
      }
      trie[node].terminal = true;
    }
    doc_.spend(where, long(trie.size()));  // a rule per node, written again for each object visited
    const std::string any_char = rules_.add(hint + "-key-char", gbnf_class(raw), where);
    std::vector<std::string> rule_of(trie.size());
    // Children have higher indices than their parent: fill from the end.
    for (size_t v = trie.size(); v-- > 0;) {
      std::vector<std::string> alts;
      CodePointSet others = raw;
      for (const auto& [c, child] : trie[v].next) {
        alts.push_back(seq({gbnf_quote(utf8(c)), rule_of[child]}));
        others = others.minus(CodePointSet::single(c));
      }
      if (!others.empty()) alts.push_back(seq({gbnf_class(others), any_char + "*"}));
      std::string body = join(alts, " | ");
      if (!trie[v].terminal) body = "(" + body + ")?";
      rule_of[v] = rules_.add(hint + "-key", body, where);
    }
    return seq({kQuote, rule_of[0], kQuote});
  }

  struct RefRule {
    std::string name;
    size_t mark = 0;  // the RuleSet mark before its rule was reserved
    bool done = false;
    int containers = 0;  // objects/arrays entered when its expansion began
  };

  struct Translation {
    std::string expr;
    size_t mark = 0;  // the RuleSet mark before its rules were added
  };
  // Digit blocks of numeric ranges (no rules, so never rolled back), by their bounds: a range
  // takes microseconds (a number's bounds are found by reading decimal texts back), and one
  // property schema merged into every anyOf branch asks for the same ranges again and again.
  // These memos (and patterns_) are cleared when they hold kMaxKept entries: what was rolled
  // back out of the grammar would otherwise keep them growing.
  static constexpr size_t kMaxKept = 4096;
  template <class Map>
  static Map& bounded(Map& m) {
    if (m.size() >= kMaxKept) m.clear();
    return m;
  }

  RuleSet& rules_;
  SchemaDocument doc_;
  std::string base_;
  std::map<std::string, RefRule> refs_;  // by target pointer
  std::map<std::tuple<std::string, uint64_t, uint64_t>, Translation> patterns_;  // by pattern and lengths
  std::map<std::pair<Int128, Int128>, std::string> integer_ranges_;
  std::map<std::pair<std::optional<uint64_t>, std::optional<uint64_t>>, std::optional<std::string>>
      number_ranges_;  // by the bounds' bits; nullopt: no number fits
  int depth_ = 0;
  int containers_ = 0;
};

}  // namespace

struct SchemaConverter::Impl {
  RuleSet rules;
};

SchemaConverter::SchemaConverter() : impl_(std::make_unique<Impl>()) {}
SchemaConverter::~SchemaConverter() = default;

std::string SchemaConverter::add(const nlohmann::ordered_json& schema, std::string_view name) {
  RuleSet& rules = impl_->rules;
  const size_t mark = rules.mark();
  try {
    refuse_nested_ids(schema);
    Visitor visitor(rules, schema, std::string(name));
    const std::string expr = visitor.visit(schema, "", std::string(name));
    return is_rule_name(expr) ? expr : rules.add(name, expr, "");
  } catch (...) {
    rules.rollback(mark);
    throw;
  }
}

std::string SchemaConverter::add(const nlohmann::json& schema, std::string_view name) {
  return add(ordered(schema), name);
}

std::string SchemaConverter::gbnf(std::string_view root_body) const {
  return "root ::= " + std::string(root_body) + "\n" + impl_->rules.text();
}

std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema) {
  SchemaConverter c;
  const std::string root = c.add(schema);
  return c.gbnf(root);
}

std::string json_schema_to_gbnf(const nlohmann::json& schema) {
  return json_schema_to_gbnf(ordered(schema));
}

std::string json_object_gbnf() {
  SchemaConverter c;
  return c.gbnf(c.add(nlohmann::ordered_json{{"type", "object"}, {"additionalProperties", true}}, "object"));
}

}  // namespace fdl::grammar
