// JSON Schema → GBNF (grammar/json_schema.h): each keyword's grammar accepts the valid texts
// and refuses the invalid ones, unsupported schemas fail with the pointer to the offending
// keyword, and random walks through the grammars of many schemas only ever produce JSON
// that a small validator written here accepts.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <cstdlib>
#include <deque>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <string>

#include "flashdllm/grammar.h"
#include "grammar/gbnf_rules.h"
#include "grammar/json_schema.h"
#include "test_support.h"

namespace fdl::grammar {
namespace {

using Json = nlohmann::ordered_json;

std::shared_ptr<const Grammar> compile(const std::string& schema) {
  return Grammar::compile(json_schema_to_gbnf(Json::parse(schema)));
}

bool accepts(const std::shared_ptr<const Grammar>& g, std::string_view text) {
  GrammarMatcher m(g);
  return m.accept_bytes(text) && m.can_end();
}

// "where: reason" of the GrammarError the schema raises, "" when it converts.
std::string error_of(const std::string& schema) {
  try {
    json_schema_to_gbnf(Json::parse(schema));
  } catch (const GrammarError& e) {
    return e.where() + ": " + e.reason();
  }
  return "";
}

std::string where_of(const std::string& schema) {
  try {
    json_schema_to_gbnf(Json::parse(schema));
  } catch (const GrammarError& e) {
    return e.where();
  }
  return "(no error)";
}

// ---------------------------------------------------------------------------------------
// A small validator for the keywords the tests use (JSON Schema 2020-12 semantics).

size_t code_points(const std::string& s) {
  size_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::wstring widen(const std::string& s) {
  std::wstring out;
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    const int len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    uint32_t c = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    for (int k = 1; k < len; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + size_t(k)]) & 0x3F);
    out += wchar_t(c);
    i += size_t(len);
  }
  return out;
}

bool number_equal(const Json& a, const Json& b) {
  if (a.is_number_float() || b.is_number_float()) return a.get<double>() == b.get<double>();
  return a == b;
}

bool value_equal(const Json& a, const Json& b) {
  if (a.is_number() && b.is_number()) return number_equal(a, b);
  if (a.type() != b.type()) return false;
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (auto it = a.begin(); it != a.end(); ++it)
      if (!b.contains(it.key()) || !value_equal(it.value(), b[it.key()])) return false;
    return true;
  }
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i)
      if (!value_equal(a[i], b[i])) return false;
    return true;
  }
  return a == b;
}

const Json& resolve(const Json& root, const std::string& ref) {
  return root.at(Json::json_pointer(ref.substr(1)));
}

bool valid(const Json& v, const Json& s, const Json& root);

bool valid_format(const std::string& text, const std::string& format) {
  static const std::map<std::string, std::regex> kFormats = {
      {"date", std::regex(R"(\d{4}-\d{2}-\d{2})")},
      {"time", std::regex(R"(\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2}))")},
      {"date-time", std::regex(R"(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2}))")},
      {"uuid", std::regex(R"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")},
      {"email", std::regex(R"([^@]+@[^@]+\.[a-zA-Z]+)")},
      {"ipv4", std::regex(R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3})")},
  };
  const auto it = kFormats.find(format);
  return it == kFormats.end() || std::regex_match(text, it->second);
}

bool valid_number(const Json& v, const Json& s) {
  const double x = v.get<double>();
  if (s.contains("minimum") && x < s["minimum"].get<double>()) return false;
  if (s.contains("maximum") && x > s["maximum"].get<double>()) return false;
  if (s.contains("exclusiveMinimum") && x <= s["exclusiveMinimum"].get<double>()) return false;
  if (s.contains("exclusiveMaximum") && x >= s["exclusiveMaximum"].get<double>()) return false;
  return true;
}

bool valid_object(const Json& v, const Json& s, const Json& root) {
  const Json props = s.value("properties", Json::object());
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (props.contains(it.key())) {
      if (!valid(it.value(), props[it.key()], root)) return false;
    } else if (s.contains("additionalProperties") && !valid(it.value(), s["additionalProperties"], root)) {
      return false;
    }
  }
  for (const Json& r : s.value("required", Json::array()))
    if (!v.contains(r.get<std::string>())) return false;
  return true;
}

bool valid_array(const Json& v, const Json& s, const Json& root) {
  const Json prefix = s.value("prefixItems", Json::array());
  for (size_t i = 0; i < v.size(); ++i) {
    if (i < prefix.size()) {
      if (!valid(v[i], prefix[i], root)) return false;
    } else if (s.contains("items") && !valid(v[i], s["items"], root)) {
      return false;
    }
  }
  if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return false;
  if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return false;
  return true;
}

bool valid(const Json& v, const Json& s, const Json& root) {
  if (s.is_boolean()) return s.get<bool>();
  if (s.contains("$ref") && !valid(v, resolve(root, s["$ref"].get<std::string>()), root)) return false;
  if (s.contains("type")) {
    const Json types = s["type"].is_array() ? s["type"] : Json::array({s["type"]});
    bool any = false;
    for (const Json& t : types) {
      const std::string n = t.get<std::string>();
      any = any || (n == "null" && v.is_null()) || (n == "boolean" && v.is_boolean()) ||
            (n == "object" && v.is_object()) || (n == "array" && v.is_array()) || (n == "string" && v.is_string()) ||
            (n == "number" && v.is_number()) ||
            (n == "integer" && v.is_number() && std::floor(v.get<double>()) == v.get<double>());
    }
    if (!any) return false;
  }
  if (s.contains("enum")) {
    bool any = false;
    for (const Json& e : s["enum"]) any = any || value_equal(v, e);
    if (!any) return false;
  }
  if (s.contains("const") && !value_equal(v, s["const"])) return false;
  if (v.is_string()) {
    const std::string& text = v.get_ref<const std::string&>();
    if (s.contains("minLength") && code_points(text) < s["minLength"].get<size_t>()) return false;
    if (s.contains("maxLength") && code_points(text) > s["maxLength"].get<size_t>()) return false;
    if (s.contains("pattern") &&
        !std::regex_search(widen(text), std::wregex(widen(s["pattern"].get<std::string>()), std::regex::ECMAScript)))
      return false;
    if (s.contains("format") && !valid_format(text, s["format"].get<std::string>())) return false;
  }
  if (v.is_number() && !valid_number(v, s)) return false;
  if (v.is_object() && !valid_object(v, s, root)) return false;
  if (v.is_array() && !valid_array(v, s, root)) return false;
  for (const char* k : {"anyOf", "oneOf", "allOf"}) {
    if (!s.contains(k)) continue;
    size_t n = 0;
    for (const Json& alt : s[k]) n += valid(v, alt, root);
    const bool ok = std::string(k) == "anyOf" ? n > 0 : std::string(k) == "oneOf" ? n == 1 : n == s[k].size();
    if (!ok) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------
// Random walks: pick random allowed bytes, then finish by the shortest completion.

// The shortest bytes that let the matcher end (ASCII first), by breadth-first search over
// matcher states; "" with ok=false when none is found within the budget.
std::string shortest_completion(const GrammarMatcher& start, bool& ok) {
  struct Item {
    GrammarMatcher m;
    std::string path;
  };
  std::deque<Item> queue;
  std::set<std::vector<GrammarMatcher::Stack>> seen;
  queue.push_back({start, ""});
  seen.insert(start.stacks());
  for (int expanded = 0; !queue.empty() && expanded < 20000; ++expanded) {
    Item item = std::move(queue.front());
    queue.pop_front();
    if (item.m.can_end()) {
      ok = true;
      return item.path;
    }
    // No control bytes, unless nothing else is allowed here.
    auto next = item.m.next_bytes();
    std::bitset<256> printable;
    for (int b = 0x20; b < 0x100; ++b) printable.set(size_t(b));
    printable.reset(0x7F);
    if ((next & printable).any()) next &= printable;
    for (int b = 0; b < 256; ++b) {
      if (!next.test(size_t(b))) continue;
      GrammarMatcher m = item.m;
      if (!m.accept_byte(uint8_t(b))) continue;
      if (!seen.insert(m.stacks()).second) continue;
      queue.push_back({std::move(m), item.path + char(b)});
    }
  }
  ok = false;
  return "";
}

// One random sentence of the grammar: up to `random_bytes` random choices (stopping early,
// when allowed, with probability 1/8 per byte), then the shortest way to the end.
std::string random_sentence(const std::shared_ptr<const Grammar>& g, std::mt19937& rng, size_t random_bytes) {
  GrammarMatcher m(g);
  std::string out;
  for (size_t i = 0; i < random_bytes; ++i) {
    if (m.can_end() && rng() % 8 == 0) return out;
    const auto next = m.next_bytes();
    std::vector<uint8_t> choices, ascii;
    for (int b = 0; b < 256; ++b)
      if (next.test(size_t(b))) {
        choices.push_back(uint8_t(b));
        if (b >= 0x20 && b < 0x7F) ascii.push_back(uint8_t(b));
      }
    if (choices.empty()) break;
    // Mostly printable ASCII (readable failures), sometimes anything (UTF-8, controls).
    const auto& pool = !ascii.empty() && rng() % 4 != 0 ? ascii : choices;
    const uint8_t b = pool[rng() % pool.size()];
    EXPECT_TRUE(m.accept_byte(b));
    out += char(b);
  }
  bool ok = false;
  const std::string tail = shortest_completion(m, ok);
  EXPECT_TRUE(ok) << "no way to finish after: " << out;
  return out + tail;
}

// ---------------------------------------------------------------------------------------

TEST(JsonSchema, IntegerRangeIsExact) {
  const auto g = compile(R"({"type": "integer", "minimum": -15, "maximum": 123})");
  for (int n = -200; n <= 200; ++n) EXPECT_EQ(accepts(g, std::to_string(n)), n >= -15 && n <= 123) << n;
  for (const char* bad : {"-0", "007", "+5", "1.0", " 5", "5 ", "", "-", "1e1"}) EXPECT_FALSE(accepts(g, bad)) << bad;
}

TEST(JsonSchema, IntegerBoundsExclusiveOneSidedAndFractional) {
  const auto above = compile(R"({"type": "integer", "exclusiveMinimum": 7})");
  EXPECT_FALSE(accepts(above, "7"));
  EXPECT_TRUE(accepts(above, "8"));
  EXPECT_TRUE(accepts(above, "999999999999999"));     // 15 digits
  EXPECT_FALSE(accepts(above, "1000000000000000"));   // 16: past the default digit bound
  const auto below = compile(R"({"type": "integer", "maximum": -3})");
  EXPECT_TRUE(accepts(below, "-3"));
  EXPECT_FALSE(accepts(below, "-2"));
  EXPECT_FALSE(accepts(below, "0"));
  EXPECT_TRUE(accepts(below, "-999999999999999"));
  const auto fractional = compile(R"({"type": "integer", "minimum": 1.5, "exclusiveMaximum": 7.0})");
  for (int n = -3; n <= 10; ++n) EXPECT_EQ(accepts(fractional, std::to_string(n)), n >= 2 && n <= 6) << n;
  const auto big = compile(R"({"type": "integer", "minimum": -9007199254740993, "maximum": -9007199254740990})");
  for (long long n = -9007199254740995; n <= -9007199254740988; ++n)
    EXPECT_EQ(accepts(big, std::to_string(n)), n >= -9007199254740993 && n <= -9007199254740990) << n;
  const auto draft4 = compile(R"({"type": "integer", "minimum": 0, "exclusiveMinimum": true, "maximum": 3})");
  EXPECT_FALSE(accepts(draft4, "0"));
  EXPECT_TRUE(accepts(draft4, "1"));
  EXPECT_TRUE(accepts(draft4, "3"));
}

TEST(JsonSchema, IntegerRangesRandomized) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    // Bounds of mixed magnitudes, both signs.
    auto pick = [&] {
      const int digits = int(rng() % 13);
      long long v = 0;
      for (int d = 0; d < digits; ++d) v = v * 10 + int(rng() % 10);
      return rng() % 3 == 0 ? -v : v;
    };
    long long lo = pick(), hi = pick();
    if (lo > hi) std::swap(lo, hi);
    const auto g = compile(Json{{"type", "integer"}, {"minimum", lo}, {"maximum", hi}}.dump());
    std::vector<long long> probes = {lo, hi, lo - 1, hi + 1, 0, -1, 1};
    for (int i = 0; i < 30; ++i) probes.push_back(lo + (long long)(rng() % uint64_t(hi - lo + 1)));
    for (int i = 0; i < 10; ++i) probes.push_back(pick());
    for (const long long p : probes)
      EXPECT_EQ(accepts(g, std::to_string(p)), p >= lo && p <= hi) << p << " in [" << lo << ", " << hi << "]";
  }
}

TEST(JsonSchema, NumberBoundsAreRespected) {
  const auto unit = compile(R"({"type": "number", "minimum": 0.1, "maximum": 0.9})");
  for (const char* ok : {"0.1", "0.5", "0.9", "0.123456", "0.10", "0.900000"}) EXPECT_TRUE(accepts(unit, ok)) << ok;
  for (const char* bad : {"0.09", "0.91", "1", "0", "-0.5", "0.1e1", ".5", "0.9000001"})
    EXPECT_FALSE(accepts(unit, bad)) << bad;
  // Every text with two decimals from -3.00 to 4.00 against (-2.5, 3.75).
  const auto open = compile(R"({"type": "number", "exclusiveMinimum": -2.5, "exclusiveMaximum": 3.75})");
  for (int i = -300; i <= 400; ++i) {
    char text[32];
    std::snprintf(text, sizeof text, "%s%d.%02d", i < 0 ? "-" : "", std::abs(i) / 100, std::abs(i) % 100);
    const double x = std::strtod(text, nullptr);
    EXPECT_EQ(accepts(open, text), x > -2.5 && x < 3.75) << text;
  }
  EXPECT_TRUE(accepts(open, "-2"));
  EXPECT_TRUE(accepts(open, "3.749999"));
  const auto zero = compile(R"({"type": "number", "minimum": 0, "maximum": 0})");
  EXPECT_TRUE(accepts(zero, "0"));
  EXPECT_TRUE(accepts(zero, "0.0"));
  EXPECT_FALSE(accepts(zero, "-0.0"));
  EXPECT_FALSE(accepts(zero, "0.000001"));
  const auto tiny = compile(R"({"type": "number", "exclusiveMinimum": 0, "maximum": 1e-3})");
  EXPECT_TRUE(accepts(tiny, "0.001"));
  EXPECT_TRUE(accepts(tiny, "0.000001"));
  EXPECT_FALSE(accepts(tiny, "0"));
  EXPECT_FALSE(accepts(tiny, "0.0011"));
}

TEST(JsonSchema, UnboundedNumbersAreBoundedInDigits) {
  const auto g = compile(R"({"type": "number"})");
  for (const char* ok : {"0", "-0.5e-10", "12", "1.25E+3", "999999999999999", "1.123456789012345"})
    EXPECT_TRUE(accepts(g, ok)) << ok;
  for (const char* bad : {"01", ".5", "1.", "1e", "1e123", "1000000000000000", "+1", "NaN", "1.1234567890123456"})
    EXPECT_FALSE(accepts(g, bad)) << bad;
}

TEST(JsonSchema, StringsEscapesUnicodeAndLengths) {
  const auto any = compile(R"({"type": "string"})");
  EXPECT_TRUE(accepts(any, R"("a\"b\\c\n\u00e9\/\t")"));
  EXPECT_TRUE(accepts(any, "\"\xC3\xA9\xF0\x9F\x98\x80\""));
  EXPECT_FALSE(accepts(any, "\"\x01\""));            // raw control character
  EXPECT_FALSE(accepts(any, R"("\ud83d\ude00")"));   // surrogate escapes (two escapes, one character)
  EXPECT_FALSE(accepts(any, R"("\x41")"));
  EXPECT_FALSE(accepts(any, R"("abc)"));
  const auto three = compile(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_TRUE(accepts(three, R"("ab\n")"));           // an escape is one character
  EXPECT_FALSE(accepts(three, R"("abcd")"));
  EXPECT_FALSE(accepts(three, "\"\xF0\x9F\x98\x80\""));  // one character of four bytes
  EXPECT_TRUE(accepts(three, "\"\xF0\x9F\x98\x80\xF0\x9F\x98\x80\""));
  EXPECT_FALSE(accepts(three, R"("a")"));
}

TEST(JsonSchema, EnumAndConstOfAnyValues) {
  const auto g = compile(R"({"enum": ["red", 1, null, {"a": [1, 2]}, [true, false], 1.5, "x\"y"]})");
  for (const char* ok : {R"("red")", "1", "null", R"({"a":[1,2]})", "[true,false]", "1.5", R"("x\"y")"})
    EXPECT_TRUE(accepts(g, ok)) << ok;
  for (const char* bad : {R"("blue")", "2", "true", R"({"a":[1]})", "1.50"}) EXPECT_FALSE(accepts(g, bad)) << bad;
  // Values the other keywords reject are left out.
  const auto typed = compile(R"({"type": "string", "enum": ["a", 1, "bb"], "maxLength": 1})");
  EXPECT_TRUE(accepts(typed, R"("a")"));
  EXPECT_FALSE(accepts(typed, "1"));
  EXPECT_FALSE(accepts(typed, R"("bb")"));
  const auto patterned = compile(R"({"type": "string", "enum": ["AB", "cd", "E"], "pattern": "^[A-Z]{2}$"})");
  EXPECT_TRUE(accepts(patterned, R"("AB")"));
  EXPECT_FALSE(accepts(patterned, R"("cd")"));
  EXPECT_FALSE(accepts(patterned, R"("E")"));
  const auto dated = compile(R"({"enum": ["2024-01-01", "yesterday", 3], "format": "date"})");
  EXPECT_TRUE(accepts(dated, R"("2024-01-01")"));
  EXPECT_FALSE(accepts(dated, R"("yesterday")"));
  EXPECT_TRUE(accepts(dated, "3"));  // formats apply to strings only
  const auto c = compile(R"({"const": {"k": "v"}})");
  EXPECT_TRUE(accepts(c, R"({"k":"v"})"));
  EXPECT_FALSE(accepts(c, R"({"k": "v"})"));  // literals are compact
}

TEST(JsonSchema, ObjectsKeepOrderAndOmitOnlyOptionalProperties) {
  const auto g = compile(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                             "c": {"type": "boolean"}}, "required": ["a", "c"]})");
  EXPECT_TRUE(accepts(g, R"({"a":1,"c":true})"));
  EXPECT_TRUE(accepts(g, R"({"a": 1, "b": "x", "c": false})"));
  EXPECT_FALSE(accepts(g, R"({"c":true,"a":1})"));          // order of `properties`
  EXPECT_FALSE(accepts(g, R"({"a":1})"));                    // c is required
  EXPECT_FALSE(accepts(g, R"({"a":1,"a":2,"c":true})"));     // no duplicates
  EXPECT_FALSE(accepts(g, R"({"a":1,"c":true,"d":1})"));     // additionalProperties absent: none
  EXPECT_FALSE(accepts(g, R"({"a":1 ,"c":true})"));
  EXPECT_FALSE(accepts(g, R"({"a":1,  "c":true})"));         // at most one space
  EXPECT_FALSE(accepts(g, R"( {"a":1,"c":true})"));
  const auto optional = compile(R"({"properties": {"x": {"type": "null"}, "y": {"type": "null"}}})");
  for (const char* ok : {"{}", R"({"x":null})", R"({"y":null})", R"({"x":null,"y":null})"})
    EXPECT_TRUE(accepts(optional, ok)) << ok;
  EXPECT_FALSE(accepts(optional, R"({,"y":null})"));
  EXPECT_FALSE(accepts(optional, R"({"x":null,})"));
}

TEST(JsonSchema, AdditionalPropertiesNeverRepeatListedNames) {
  const auto g = compile(R"({"type": "object", "properties": {"ab": {"type": "string"}, "b": {"type": "string"}},
                             "additionalProperties": {"type": "integer"}})");
  EXPECT_TRUE(accepts(g, R"({"ab":"x","zz":1,"a":2,"abc":3,"":4})"));
  EXPECT_TRUE(accepts(g, R"({"q":1})"));
  EXPECT_FALSE(accepts(g, R"({"ab":"x","ab":1})"));
  EXPECT_FALSE(accepts(g, R"({"b":1})"));        // listed: must be a string, in its place
  EXPECT_FALSE(accepts(g, R"({"zz":"x"})"));
  const auto open = compile(R"({"type": "object", "additionalProperties": true})");
  EXPECT_TRUE(accepts(open, R"({"a":[1,{"b":null}],"c":"\u0041"})"));
  const auto object = Grammar::compile(json_object_gbnf());
  EXPECT_TRUE(accepts(object, R"({"k": [1, 2.5, "s", {}], "t": true})"));
  EXPECT_FALSE(accepts(object, "[]"));
  EXPECT_FALSE(accepts(object, R"("s")"));
}

TEST(JsonSchema, ArrayCountsAndTuples) {
  const auto g = compile(R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4})");
  for (int n = 0; n <= 6; ++n) {
    std::string text = "[";
    for (int i = 0; i < n; ++i) text += std::string(i ? "," : "").append(std::to_string(i));
    EXPECT_EQ(accepts(g, text + "]"), n >= 2 && n <= 4) << n;
  }
  EXPECT_TRUE(accepts(g, "[1, 2]"));
  EXPECT_FALSE(accepts(g, "[1,2,]"));
  const auto tuple =
      compile(R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": false})");
  for (const char* ok : {"[]", R"(["a"])", R"(["a",true])"}) EXPECT_TRUE(accepts(tuple, ok)) << ok;
  for (const char* bad : {"[true]", R"(["a",true,1])", R"(["a","b"])"}) EXPECT_FALSE(accepts(tuple, bad)) << bad;
  // The longest tuple the converter takes (each optional tail a rule, not a nested group).
  Json longest = {{"type", "array"}, {"prefixItems", Json::array()}, {"items", false}};
  for (int i = 0; i < 256; ++i) longest["prefixItems"].push_back({{"const", i}});
  const auto tuple256 = compile(longest.dump());
  std::string all = "[";
  for (int i = 0; i < 256; ++i) all += (i ? "," : "") + std::to_string(i);
  EXPECT_TRUE(accepts(tuple256, all + "]"));
  EXPECT_TRUE(accepts(tuple256, "[0,1,2]"));
  EXPECT_FALSE(accepts(tuple256, "[0,2]"));
  longest["prefixItems"].push_back({{"const", 256}});
  EXPECT_THROW(compile(longest.dump()), GrammarError);
  const auto mixed =
      compile(R"({"prefixItems": [{"const": 1}], "items": {"type": "null"}, "minItems": 2, "maxItems": 3})");
  EXPECT_FALSE(accepts(mixed, "[1]"));
  EXPECT_TRUE(accepts(mixed, "[1,null]"));
  EXPECT_TRUE(accepts(mixed, "[1,null,null]"));
  EXPECT_FALSE(accepts(mixed, "[1,null,null,null]"));
  EXPECT_FALSE(accepts(mixed, "[null,null]"));
  // Large counts go through nested helper rules.
  const auto many = compile(R"({"type": "array", "items": {"const": 0}, "minItems": 150, "maxItems": 260})");
  auto zeros = [](int n) {
    std::string t = "[";
    for (int i = 0; i < n; ++i) t += i ? ",0" : "0";
    return t + "]";
  };
  for (const int n : {149, 150, 151, 199, 200, 201, 259, 260, 261})
    EXPECT_EQ(accepts(many, zeros(n)), n >= 150 && n <= 260) << n;
}

TEST(JsonSchema, RefsAndRecursion) {
  const auto tree = compile(R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
      "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["v"]}}, "$ref": "#/$defs/node"})");
  EXPECT_TRUE(accepts(tree, R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[{"v":4,"kids":[]}]}]})"));
  EXPECT_FALSE(accepts(tree, R"({"v":1,"kids":[{"kids":[]}]})"));
  const auto list = compile(R"({"definitions": {"l": {"anyOf": [{"type": "null"},
      {"type": "object", "properties": {"h": {"type": "integer"}, "t": {"$ref": "#/definitions/l"}},
       "required": ["h", "t"]}]}},
      "$ref": "#/definitions/l"})");
  EXPECT_TRUE(accepts(list, R"({"h":1,"t":{"h":2,"t":null}})"));
  EXPECT_FALSE(accepts(list, R"({"h":1})"));
  const auto self = compile(R"({"type": "object", "properties": {"next": {"$ref": "#"}, "n": {"type": "integer"}}})");
  EXPECT_TRUE(accepts(self, R"({"next":{"next":{"n":1}}})"));
  const auto escaped = compile(R"({"$defs": {"a/b": {"const": 1}, "c~d": {"const": 2}},
                                   "prefixItems": [{"$ref": "#/$defs/a~1b"}, {"$ref": "#/$defs/c~0d"}],
                                   "items": false})");
  EXPECT_TRUE(accepts(escaped, "[1,2]"));
  EXPECT_FALSE(accepts(escaped, "[2,1]"));
}

TEST(JsonSchema, AnyOfOneOfAndTypeLists) {
  const auto nullable = compile(R"({"type": ["string", "null"], "maxLength": 2})");
  EXPECT_TRUE(accepts(nullable, "null"));
  EXPECT_TRUE(accepts(nullable, R"("ab")"));
  EXPECT_FALSE(accepts(nullable, R"("abc")"));
  const auto any = compile(R"({"anyOf": [{"type": "integer", "minimum": 10}, {"type": "string", "enum": ["a"]}]})");
  EXPECT_TRUE(accepts(any, "10"));
  EXPECT_FALSE(accepts(any, "9"));
  EXPECT_TRUE(accepts(any, R"("a")"));
  // Sibling keywords apply to every branch; the branch they contradict is dropped.
  const auto distributed = compile(R"({"type": "string", "anyOf": [{"maxLength": 1}, {"type": "null"}]})");
  EXPECT_TRUE(accepts(distributed, R"("a")"));
  EXPECT_FALSE(accepts(distributed, "null"));
  EXPECT_FALSE(accepts(distributed, R"("ab")"));
  // oneOf over a discriminator: both branches stay.
  const auto tagged = compile(R"({"oneOf": [
      {"type": "object", "properties": {"kind": {"const": "a"}, "x": {"type": "integer"}}, "required": ["kind", "x"]},
      {"type": "object", "properties": {"kind": {"const": "b"}}, "required": ["kind"]}]})");
  EXPECT_TRUE(accepts(tagged, R"({"kind":"a","x":1})"));
  EXPECT_TRUE(accepts(tagged, R"({"kind":"b"})"));
  EXPECT_FALSE(accepts(tagged, R"({"kind":"a"})"));
  // oneOf where one branch includes the other: only the branch no other accepts is kept.
  const auto nested =
      compile(R"({"oneOf": [{"type": "string"}, {"type": "string", "enum": ["x"]}, {"type": "null"}]})");
  EXPECT_TRUE(accepts(nested, "null"));
  EXPECT_FALSE(accepts(nested, R"("x")"));
  // Overlapping branches are cut to the types, or enum values, no other branch allows.
  const auto cut = compile(R"({"oneOf": [{}, {"type": "number"}]})");
  EXPECT_TRUE(accepts(cut, R"("s")"));
  EXPECT_TRUE(accepts(cut, "[1]"));
  EXPECT_FALSE(accepts(cut, "1"));
  const auto values = compile(R"({"oneOf": [{"enum": [1, "a", null]}, {"type": ["string", "null"]}]})");
  EXPECT_TRUE(accepts(values, "1"));
  EXPECT_FALSE(accepts(values, R"("a")"));
  EXPECT_FALSE(accepts(values, "null"));
  EXPECT_FALSE(accepts(values, R"("b")"));  // valid, but only the sure part is written
}

TEST(JsonSchema, AllOfMergesObjectSchemas) {
  const auto g = compile(R"({"allOf": [
      {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"]},
      {"properties": {"a": {"maximum": 5}, "b": {"type": "string"}}, "required": ["b"]}]})");
  EXPECT_TRUE(accepts(g, R"({"a":5,"b":""})"));
  EXPECT_FALSE(accepts(g, R"({"a":6,"b":""})"));
  EXPECT_FALSE(accepts(g, R"({"a":1})"));
  // additionalProperties: false in one branch excludes the other branch's extra property.
  const auto closed = compile(R"({"allOf": [{"properties": {"a": {"type": "null"}}, "additionalProperties": false},
                                            {"properties": {"b": {"type": "null"}}}]})");
  EXPECT_TRUE(accepts(closed, R"({"a":null})"));
  EXPECT_FALSE(accepts(closed, R"({"a":null,"b":null})"));
  // $ref with siblings: both apply.
  const auto ref = compile(R"({"$defs": {"s": {"type": "string"}}, "$ref": "#/$defs/s", "maxLength": 1})");
  EXPECT_TRUE(accepts(ref, R"("a")"));
  EXPECT_FALSE(accepts(ref, R"("ab")"));
}

TEST(JsonSchema, Patterns) {
  struct Case {
    const char* pattern;
    std::vector<std::string> ok, bad;
  };
  const std::vector<Case> cases = {
      {R"(^[a-z]{2,4}-\d{3}$)", {"ab-123", "abcd-000"}, {"a-123", "abcde-123", "ab-12", "AB-123", "ab-1234"}},
      {"ab+c", {"abc", "xxabbbcyy", "abbc"}, {"ac", "ab", "abx"}},
      {"^(foo|bar)?baz$", {"baz", "foobaz", "barbaz"}, {"fooba", "foobarbaz", "bazz"}},
      {"^a|b$", {"a", "axx", "b", "xxb"}, {"xa", "bx"}},
      {R"(^[^a-z]{1,3}$)", {"A", "1!Z", R"(\")", R"(\\)", R"(\t)"}, {"a", "AAAA", ""}},
      {R"(^\d\w\s$)", {"1a ", "9_\\t"}, {"a1 ", "\u0661a "}},
      {R"(^\.\*\\\/$)", {R"(.*\\/)"}, {R"(.*\/)", "x*\\\\/"}},
      {"^\\u00e9\\x41[\\u00e0-\\u00ff]$", {"\xC3\xA9" "A" "\xC3\xBF"}, {"eAa"}},
      {"^(?:ab){2}(?<n>c)?$", {"abab", "ababc"}, {"ab", "ababcc"}},
      {"^.$", {"x", "\xC3\xA9", R"(\")"}, {"\\n", "xy", "\xE2\x80\xA8"}},
      {"^a{0}b$", {"b"}, {"ab"}},
      {"^x*?y+?$", {"y", "xxyy"}, {"x"}},
  };
  for (const Case& c : cases) {
    const auto g = compile(Json{{"type", "string"}, {"pattern", c.pattern}}.dump());
    for (const std::string& ok : c.ok) EXPECT_TRUE(accepts(g, "\"" + ok + "\"")) << c.pattern << " ~ " << ok;
    for (const std::string& bad : c.bad) EXPECT_FALSE(accepts(g, "\"" + bad + "\"")) << c.pattern << " !~ " << bad;
  }
  // A long unit repeated many times stays within the compiler's expansion limit.
  const std::string unit = "abcdefghijklmnopqrstuvwxyz0123456789";
  const auto repeated = compile(Json{{"type", "string"}, {"pattern", "^(" + unit + "){250,300}$"}}.dump());
  std::string text;
  for (int i = 0; i < 300; ++i) text += unit;
  EXPECT_TRUE(accepts(repeated, "\"" + text + "\""));
  EXPECT_FALSE(accepts(repeated, "\"" + text + unit + "\""));
  // Refused constructs name their offset in the pattern.
  for (const char* bad : {"(?<=a)b", "(?!a)", "\\p{L}", "(?i)a", "a{,3}", "[]a]", "[^]", "a**", "(a*)*", "(a)\\1",
                          "a$b", "(^a)", "\\bx", "[\\d-z]", "\\uD83D\\uDE00"}) {
    const std::string e = error_of(Json{{"type", "string"}, {"pattern", bad}}.dump());
    EXPECT_NE(e.find("pattern offset"), std::string::npos) << bad << " -> " << e;
    EXPECT_EQ(e.rfind("/pattern: ", 0), 0u) << e;
  }
  // Lengths beside a pattern: one repetition takes the slack.
  const auto digits = compile(R"({"type": "string", "pattern": "^\\d+$", "maxLength": 3})");
  EXPECT_TRUE(accepts(digits, R"("123")"));
  EXPECT_FALSE(accepts(digits, R"("1234")"));
  EXPECT_FALSE(accepts(digits, R"("")"));
  const auto inside = compile(R"({"type": "string", "pattern": "xy", "minLength": 4, "maxLength": 5})");
  EXPECT_TRUE(accepts(inside, R"("abxy")"));
  EXPECT_FALSE(accepts(inside, R"("xy")"));
  EXPECT_FALSE(accepts(inside, R"("abcdxy")"));
}

TEST(JsonSchema, Formats) {
  const auto date = compile(R"({"type": "string", "format": "date"})");
  EXPECT_TRUE(accepts(date, R"("2024-12-31")"));
  EXPECT_TRUE(accepts(date, R"("2023-04-30")"));
  EXPECT_FALSE(accepts(date, R"("2023-02-30")"));
  EXPECT_FALSE(accepts(date, R"("2023-04-31")"));
  EXPECT_FALSE(accepts(date, R"("0000-01-01")"));
  const auto dt = compile(R"({"type": "string", "format": "date-time"})");
  EXPECT_TRUE(accepts(dt, R"("2024-01-02T03:04:05Z")"));
  EXPECT_TRUE(accepts(dt, R"("2024-01-02T03:04:05.123+05:30")"));
  EXPECT_FALSE(accepts(dt, R"("2024-01-02 03:04:05Z")"));
  EXPECT_FALSE(accepts(dt, R"("2024-01-02T24:00:00Z")"));
  const auto uuid = compile(R"({"type": "string", "format": "uuid"})");
  EXPECT_TRUE(accepts(uuid, R"("123e4567-e89b-12d3-a456-426614174000")"));
  EXPECT_FALSE(accepts(uuid, R"("123e4567e89b12d3a456426614174000")"));
  const auto ip = compile(R"({"type": "string", "format": "ipv4"})");
  EXPECT_TRUE(accepts(ip, R"("192.168.0.255")"));
  EXPECT_FALSE(accepts(ip, R"("192.168.0.256")"));
  EXPECT_FALSE(accepts(ip, R"("01.2.3.4")"));
  const auto email = compile(R"({"type": "string", "format": "email"})");
  EXPECT_TRUE(accepts(email, R"("a.b+c@example.co.uk")"));
  EXPECT_FALSE(accepts(email, R"("example.com")"));
  // Unknown formats are annotations.
  EXPECT_TRUE(accepts(compile(R"({"type": "string", "format": "x-color"})"), R"("anything")"));
}

TEST(JsonSchema, EmptySchemaAndTrueAllowAnyValue) {
  for (const char* schema : {"{}", "true", R"({"description": "anything"})"}) {
    const auto g = compile(schema);
    for (const char* ok : {"null", "1", R"("s")", R"({"a":[1,{"b":false}]})", "[]", "-2.5e3"})
      EXPECT_TRUE(accepts(g, ok)) << schema << " " << ok;
    EXPECT_FALSE(accepts(g, "nul"));
  }
}

TEST(JsonSchema, RefusedAndInvalidSchemasNameTheirPointer) {
  const std::vector<std::pair<const char*, const char*>> cases = {
      {R"({"type": "strin"})", "/type"},
      {R"({"properties": {"age": {"type": "integer", "minimum": "3"}}})", "/properties/age/minimum"},
      {R"({"type": "string", "minLength": 5, "maxLength": 2})", "/maxLength"},
      {R"({"type": "array", "minItems": 3, "maxItems": 1})", "/maxItems"},
      {R"({"not": {"type": "string"}})", "/not"},
      {R"({"if": {"type": "string"}, "then": {"minLength": 1}})", "/if"},
      {R"({"type": "object", "patternProperties": {"^x": {}}})", "/patternProperties"},
      {R"({"type": "object", "dependentRequired": {"a": ["b"]}})", "/dependentRequired"},
      {R"({"$ref": "#/$defs/missing"})", "/$ref"},
      {R"({"$ref": "other.json#/x"})", "/$ref"},
      {R"j({"properties": {"p": {"type": "string", "pattern": "a(?=b)"}}})j", "/properties/p/pattern"},
      {R"({"type": "string", "pattern": "(a)\\1"})", "/pattern"},
      {R"({"type": "string", "pattern": "\\bword"})", "/pattern"},
      {R"({"type": "integer", "minimum": 10, "maximum": 5})", "/maximum"},
      {R"({"type": "number", "minimum": 1e300})", "/minimum"},
      {R"({"type": "integer", "multipleOf": 3})", "/multipleOf"},
      {R"({"type": "array", "uniqueItems": true})", "/uniqueItems"},
      {R"({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}}, "$ref": "#/$defs/a"})",
       "/$defs/a/anyOf/0/$ref"},
      {R"({"items": [{"type": "string"}], "prefixItems": []})", "/items"},
      {R"({"type": "object", "properties": {"a": {}}, "required": ["a"], "minProperties": 2})", "/minProperties"},
      {R"({"allOf": [{"type": "string", "pattern": "a"}, {"pattern": "b"}]})", "/allOf/1/pattern"},
      {R"({"properties": {"x": false}, "required": ["x"]})", "/properties/x"},
      {R"({"enum": [1, 2], "type": "string"})", "/enum"},
      {"[1]", ""},
      {R"({"$defs": {"a": {"$id": "http://x/a", "$ref": "#/$defs/b"}, "b": {}}, "$ref": "#/$defs/a"})", "/$defs/a/$id"},
  };
  for (const auto& [schema, where] : cases) EXPECT_EQ(where_of(schema), where) << schema << " -> " << error_of(schema);
  EXPECT_NE(error_of(R"j({"type": "string", "pattern": "a(?=b)"})j").find("offset 1"), std::string::npos);
  EXPECT_NE(error_of(R"({"not": {}})").find("not is not supported"), std::string::npos);
}

TEST(JsonSchema, HostileSchemasHitTheCaps) {
  Json deep = Json::object();
  for (int i = 0; i < 200; ++i) deep = Json{{"type", "array"}, {"items", deep}};
  EXPECT_NE(error_of(deep.dump()).find("64 levels"), std::string::npos);
  Json big = Json{{"enum", Json::array()}};
  for (int i = 0; i < 3000; ++i) big["enum"].push_back(std::string(500, char('a' + i % 26)) + std::to_string(i));
  EXPECT_NE(error_of(big.dump()).find("1 MiB"), std::string::npos);
  // anyOf through $refs, with a keyword beside it at the top, doubles the work per level.
  Json doubling = Json{{"$ref", "#/$defs/a0"}, {"maximum", 5}, {"$defs", Json::object()}};
  for (int i = 0; i < 40; ++i) {
    const std::string name = cat("a", std::to_string(i)), next = cat("#/$defs/a", std::to_string(i + 1));
    doubling["$defs"][name] = Json{{"anyOf", {{{"$ref", next}}, {{"$ref", next}, {"minimum", i}}}}};
  }
  doubling["$defs"]["a40"] = Json{{"type", "integer"}};
  EXPECT_NE(error_of(doubling.dump()).find("too complex"), std::string::npos);
  // Huge counts stay small in text (nested helper rules).
  const std::string g = json_schema_to_gbnf(Json::parse(R"({"type": "string", "maxLength": 1000000000})"));
  EXPECT_LT(g.size(), 4000u);
  EXPECT_NO_THROW(Grammar::compile(g));
}

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

// CPU seconds json_schema_to_gbnf takes for `schema`, divided by test::kSlowBuild (so limits
// hold for sanitizer and unoptimized builds, and on a busy machine); `gbnf` gets the grammar,
// or "" when refused (and `error` the "where: reason").
double convert_timed(const Json& schema, std::string& gbnf, std::string* error = nullptr) {
  const double t0 = thread_cpu_seconds();
  gbnf.clear();
  try {
    gbnf = json_schema_to_gbnf(schema);
  } catch (const GrammarError& e) {
    if (error) *error = e.where() + ": " + e.reason();
  }
  return (thread_cpu_seconds() - t0) / test::kSlowBuild;
}

Json object_of(int n_props, int n_required_only, bool props_required) {
  Json s = Json{{"type", "object"}, {"properties", Json::object()}, {"required", Json::array()}};
  for (int i = 0; i < n_props; ++i) {
    s["properties"][cat("p", std::to_string(i))] = Json::object();
    if (props_required) s["required"].push_back(cat("p", std::to_string(i)));
  }
  for (int i = 0; i < n_required_only; ++i) s["required"].push_back(cat("k", std::to_string(i)));
  return s;
}

TEST(JsonSchema, ObjectMembersAreLinearAndCapped) {
  // Each member's grammar is written once, never again for each member before it, so the
  // text grows linearly: twice the members, about twice the text.
  std::string gbnf, half;
  for (const bool optional : {false, true}) {
    EXPECT_LT(convert_timed(object_of(4000, 0, !optional), gbnf), 1.0);
    convert_timed(object_of(2000, 0, !optional), half);
    ASSERT_FALSE(gbnf.empty());
    EXPECT_LT(gbnf.size(), 4000u * (optional ? 160 : 60)) << optional;
    EXPECT_LT(double(gbnf.size()) / double(half.size()), 2.2) << optional;
    const auto g = Grammar::compile(gbnf);
    std::string text = "{";
    for (int i = optional ? 3998 : 0; i < 4000; ++i)
      text += cat(text.size() > 1 ? "," : "", "\"p", std::to_string(i), "\":0");
    EXPECT_TRUE(accepts(g, text + "}")) << optional;
    EXPECT_EQ(accepts(g, R"({"p1":0})"), optional);
  }
  // Required names not in `properties`: any value each.
  EXPECT_LT(convert_timed(object_of(0, 4000, false), gbnf), 1.0);
  EXPECT_LT(gbnf.size(), 4000u * 100);
  std::string all = R"({"k0":[1],"k1":null)";
  for (int i = 2; i < 4000; ++i) all += cat(",\"k", std::to_string(i), "\":0");
  EXPECT_TRUE(accepts(Grammar::compile(gbnf), all + "}"));
  // Past 4,096 members (properties and required names together) the object is refused.
  std::string error;
  EXPECT_LT(convert_timed(object_of(0, 10000, false), gbnf, &error), 1.0);
  EXPECT_EQ(error.substr(0, error.find(':')), "/required") << error;
  EXPECT_NE(error.find("4096"), std::string::npos) << error;
  EXPECT_LT(convert_timed(object_of(3000, 3000, true), gbnf, &error), 1.0);
  EXPECT_EQ(error.substr(0, error.find(':')), "/required") << error;
  EXPECT_EQ(where_of(object_of(5000, 0, false).dump()), "/properties");
  EXPECT_EQ(where_of(object_of(4000, 96, true).dump()), "(no error)");  // required ones count once
  // Duplicate required names count once too.
  Json dups = object_of(0, 0, false);
  for (int i = 0; i < 20000; ++i) dups["required"].push_back("a");
  EXPECT_LT(convert_timed(dups, gbnf), 1.0);
  EXPECT_TRUE(accepts(Grammar::compile(gbnf), R"({"a":1})"));
  // Through the sorted nlohmann::json overload, which converts member by member.
  nlohmann::json sorted = nlohmann::json::object();
  for (int i = 0; i < 4000; ++i) sorted["properties"][cat("p", std::to_string(i))] = nlohmann::json::object();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_NO_THROW(json_schema_to_gbnf(sorted));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.0);
}

TEST(JsonSchema, LargeEnumsAreNearLinearAndCapped) {
  std::string gbnf, error;
  Json ints = Json{{"enum", Json::array()}};
  for (int i = 0; i < 80000; ++i) ints["enum"].push_back(i);
  EXPECT_LT(convert_timed(ints, gbnf, &error), 1.0);
  EXPECT_EQ(error.substr(0, error.find(':')), "/enum") << error;
  EXPECT_NE(error.find("10000"), std::string::npos) << error;
  // 10,000 values: deduplicated through a sorted set and checked against the other keywords
  // one by one, each against the enum of a property as a set.
  Json strings = Json{{"type", "string"}, {"pattern", "^s[0-9]+$"}, {"enum", Json::array()}};
  for (int i = 0; i < 10000; ++i) strings["enum"].push_back(cat("s", std::to_string(i % 9000)));
  EXPECT_LT(convert_timed(strings, gbnf), 1.0);
  auto g = Grammar::compile(gbnf);
  EXPECT_TRUE(accepts(g, R"("s8999")"));
  EXPECT_FALSE(accepts(g, R"("s9000")"));
  Json objects = Json{{"type", "object"},
                      {"properties", Json{{"a", Json{{"enum", Json::array()}}}}},
                      {"enum", Json::array()}};
  for (int i = 0; i < 40000; ++i) objects["properties"]["a"]["enum"].push_back(2 * i);
  for (int i = 0; i < 10000; ++i) objects["enum"].push_back(Json{{"a", i}});
  EXPECT_LT(convert_timed(objects, gbnf), 1.0);
  g = Grammar::compile(gbnf);
  EXPECT_TRUE(accepts(g, R"({"a":9998})"));
  EXPECT_FALSE(accepts(g, R"({"a":9999})"));
  // Equal values as JSON Schema counts them are written once: 1 and 1.0, objects whatever
  // their key order; the sets tell apart what differs in type alone.
  g = compile(R"({"enum": [1, 1.0, {"a": 1, "b": [2]}, {"b": [2.0], "a": 1}, "1", true, null, [], {}]})");
  for (const char* ok : {"1", R"({"a":1,"b":[2]})", R"("1")", "true", "null", "[]", "{}"})
    EXPECT_TRUE(accepts(g, ok)) << ok;
  EXPECT_FALSE(accepts(g, "1.0"));
  EXPECT_FALSE(accepts(g, R"({"b":[2.0],"a":1})"));
  g = compile(R"({"enum": [{"a": 1}, {"a": 2}, {"a": 3}], "properties": {"a": {"enum": [2.0, 3, "x"]}},
                 "uniqueItems": true, "required": ["a", "a"]})");
  EXPECT_FALSE(accepts(g, R"({"a":1})"));
  EXPECT_TRUE(accepts(g, R"({"a":2})"));
  EXPECT_TRUE(accepts(g, R"({"a":3})"));
  g = compile(R"({"enum": [[1, 1.0], [1, 2], [{"a": 1, "b": 2}, {"b": 2, "a": 1}]], "uniqueItems": true})");
  EXPECT_TRUE(accepts(g, "[1,2]"));
  EXPECT_FALSE(accepts(g, "[1,1.0]"));
  EXPECT_FALSE(accepts(g, R"([{"a":1,"b":2},{"b":2,"a":1}])"));
  // allOf intersects enums the same way.
  g = compile(R"({"allOf": [{"enum": [1, 2.0, {"x": [1]}]}, {"enum": [2, {"x": [1.0]}, 3]}]})");
  EXPECT_FALSE(accepts(g, "1"));
  EXPECT_TRUE(accepts(g, "2"));
  EXPECT_TRUE(accepts(g, R"({"x":[1.0]})"));
}

TEST(JsonSchema, RepeatedWorkIsRefusedQuickly) {
  std::string gbnf, error;
  // anyOf distributes the properties beside it into each of its branches.
  Json numbers = Json{{"type", "object"}, {"properties", Json::object()}, {"anyOf", Json::array()}};
  for (int i = 0; i < 1000; ++i)
    numbers["properties"][cat("p", std::to_string(i))] = Json{{"type", "number"}, {"minimum", i * 0.001}};
  for (int i = 0; i < 100000; ++i) numbers["anyOf"].push_back(Json::object());
  EXPECT_LT(convert_timed(numbers, gbnf, &error), 1.0);
  EXPECT_NE(error.find("too complex"), std::string::npos) << error;
  // One long string against an ambiguous pattern: the matcher's work is paid for.
  const Json ambiguous = Json{{"type", "string"}, {"pattern", "(a?){500}b"}, {"enum", {std::string(100000, 'a')}}};
  EXPECT_LT(convert_timed(ambiguous, gbnf, &error), 1.0);
  EXPECT_NE(error.find("too complex"), std::string::npos) << error;
  // Many members that are not keywords, in a schema merged again and again.
  Json junk = Json{{"$defs", Json{{"big", Json{{"type", "integer"}}}}}, {"anyOf", Json::array()}};
  for (int i = 0; i < 5000; ++i) junk["$defs"]["big"][cat("x", std::to_string(i))] = i;
  for (int i = 0; i < 10000; ++i) junk["anyOf"].push_back(Json{{"$ref", "#/$defs/big"}, {"minimum", i}});
  EXPECT_LT(convert_timed(junk, gbnf, &error), 1.0);
  EXPECT_NE(error.find("too complex"), std::string::npos) << error;
}

TEST(JsonSchema, TheRuleCapCountsEveryRuleWritten) {
  // anyOf of n constants: a rule per constant, one for the choice, and root.
  auto consts = [](int n) {
    Json s = Json{{"anyOf", Json::array()}};
    for (int i = 0; i < n; ++i) s["anyOf"].push_back(Json{{"const", i}});
    return s;
  };
  std::string gbnf, error;
  convert_timed(consts(int(RuleSet::kMaxRules) - 2), gbnf, &error);
  ASSERT_FALSE(gbnf.empty()) << error;
  EXPECT_EQ(size_t(std::count(gbnf.begin(), gbnf.end(), '\n')), RuleSet::kMaxRules);
  EXPECT_NO_THROW(Grammar::compile(gbnf));
  convert_timed(consts(int(RuleSet::kMaxRules) - 1), gbnf, &error);
  EXPECT_TRUE(gbnf.empty());
  EXPECT_NE(error.find("20000 rules"), std::string::npos) << error;
}

TEST(JsonSchema, RefDeepBelowAnIdIsRefusedAtTheNestingCap) {
  // A $ref 300 levels inside an $id, reached straight through a pointer: the converter's own
  // depth stays small, so only the $id walk can refuse it; it must not fall back to the root.
  Json inner = Json{{"$ref", "#/$defs/b"}};
  std::string target = "#/$defs/a";
  for (int i = 0; i < 300; ++i) {
    inner = Json{{"properties", Json{{"p", inner}}}};
    target += "/properties/p";
  }
  inner["$id"] = "http://x/a";
  const Json schema = Json{{"$defs", Json{{"a", inner}, {"b", Json::object()}}}, {"$ref", target}};
  std::string at_cap = "/$defs/a";
  for (int i = 0; i < 256; ++i) at_cap += "/properties/p";
  EXPECT_EQ(where_of(schema.dump()), at_cap);
  EXPECT_NE(error_of(schema.dump()).find("256 levels"), std::string::npos);
}

TEST(JsonSchema, ConverterSharesRulesAcrossSchemas) {
  SchemaConverter c;
  const std::string a =
      c.add(Json::parse(R"({"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]})"), "tool-a");
  const std::string b =
      c.add(Json::parse(R"({"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}})"), "tool-b");
  EXPECT_THROW(c.add(Json::parse(R"({"not": {}})"), "bad"), GrammarError);  // leaves the set usable
  const auto g = Grammar::compile(c.gbnf(a + " | " + b));
  EXPECT_TRUE(accepts(g, R"({"q":"x"})"));
  EXPECT_TRUE(accepts(g, R"({"n":3})"));
  EXPECT_FALSE(accepts(g, R"({"n":4})"));
  // Keys of a sorted nlohmann::json come out in alphabetical order.
  const auto sorted = Grammar::compile(json_schema_to_gbnf(nlohmann::json::parse(
      R"({"type": "object", "properties": {"z": {"const": 1}, "a": {"const": 2}}, "required": ["a", "z"]})")));
  EXPECT_TRUE(accepts(sorted, R"({"a":2,"z":1})"));
}

// The grammars of these schemas, walked at random, must only produce valid JSON.
const char* const kWalkSchemas[] = {
    R"({"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": -15, "maximum": 123}, "email": {"type": "string", "format": "email"}},
        "required": ["name", "age"]})",
    R"({"type": "number", "exclusiveMinimum": -2.5, "maximum": 3.75})",
    R"({"type": "number", "minimum": 1e-3, "exclusiveMaximum": 0.5})",
    R"({"type": "integer", "exclusiveMinimum": -1000, "exclusiveMaximum": -7})",
    R"({"type": ["string", "null"], "maxLength": 3})",
    R"({"enum": ["red", "green", 1, null, {"a": [1, 2]}, [true, false], 1.5]})",
    R"({"type": "string", "pattern": "^[a-z]{2,4}-\\d{3}$"})",
    R"({"type": "string", "pattern": "ab+c"})",
    R"({"type": "string", "pattern": "^[^a-z]{1,5}(x|y\\.)?$"})",
    R"({"type": "string", "pattern": "^\\S+@\\S+\\.\\w{2,3}$"})",
    R"({"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 4})",
    R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "boolean"}], "items": {"type": "null"},
        "maxItems": 4})",
    R"({"$defs": {"node": {"type": "object", "properties": {"value": {"type": "integer"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}, "required": ["value"]}},
        "$ref": "#/$defs/node"})",
    R"({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "boolean"}},
        "additionalProperties": {"type": "integer"}})",
    R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"]},
        {"properties": {"a": {"maximum": 5}, "b": {"type": "string", "maxLength": 4}}}]})",
    R"({"oneOf": [{"type": "string", "maxLength": 3}, {"type": "integer"},
        {"type": "object", "properties": {"kind": {"const": "x"}}, "required": ["kind"]}]})",
    R"({"type": "object", "properties": {"p": {"type": "string", "maxLength": 3}},
        "anyOf": [{"required": ["p"]}, {"properties": {"q": {"type": "boolean"}}, "required": ["q"]}]})",
    R"({"type": "array", "items": {"anyOf": [{"type": "string", "format": "date"},
        {"type": "string", "format": "date-time"}, {"type": "string", "format": "uuid"},
        {"type": "string", "format": "ipv4"}, {"type": "null"}]}, "maxItems": 3})",
    R"({"type": "object", "properties": {"x\"y": {"const": "é"},
        "t": {"type": "string", "pattern": "^\\w*$", "maxLength": 4}},
        "required": ["x\"y"]})",
    R"({"type": "object", "properties": {"n": {"type": "number"}, "i": {"type": "integer", "minimum": 100}},
        "required": ["n", "i"]})",
    R"({"type": "string", "pattern": "^(\\+|-)?[0-9]{1,3}(,[0-9]{3})*(\\.[0-9]+)?$"})",
    R"({"type": "array", "minItems": 1, "items": {"type": "object", "properties": {"k": {"enum": ["a", "b"]},
        "v": {"type": ["integer", "null"], "maximum": 50}}, "required": ["k"]}, "maxItems": 3})",
    "{}",
};

TEST(JsonSchema, RandomWalksProduceValidJson) {
  std::mt19937 rng(12345);
  size_t checked = 0;
  for (const char* text : kWalkSchemas) {
    const Json schema = Json::parse(text);
    const auto g = Grammar::compile(json_schema_to_gbnf(schema));
    for (int i = 0; i < 40; ++i) {
      const std::string out = random_sentence(g, rng, size_t(rng() % 200));
      Json value;
      try {
        value = Json::parse(out);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "not JSON: " << out << "\nschema: " << text;
        continue;
      }
      EXPECT_TRUE(valid(value, schema, schema)) << out << "\nschema: " << text;
      ++checked;
    }
  }
  EXPECT_GE(checked, 40 * std::size(kWalkSchemas));
}

}  // namespace
}  // namespace fdl::grammar
