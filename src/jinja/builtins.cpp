// Filters, tests and methods of the Jinja interpreter (builtins.h), with Jinja2's and Python's
// behaviour for the arguments chat templates pass.
#include "jinja/builtins.h"

#include "jinja/work_meter.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace fdl::jinja {
namespace {

[[noreturn]] void fail(const std::string& what) { throw TemplateError(what); }

// ---------------------------------------------------------------- UTF-8 code points

std::vector<std::string> code_points(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

// The widest padding a filter may make (center, zfill, indent, batch).
constexpr int64_t kMaxWidth = 1 << 20;

// Python's str.splitlines() for \n, \r\n and \r.
std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\n' && s[i] != '\r') continue;
    out.push_back(s.substr(start, i - start));
    if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < s.size()) out.push_back(s.substr(start));
  return out;
}

bool is_py_space(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string strip_chars(const std::string& s, const Value* chars, bool left, bool right) {
  auto strip_this = [&](unsigned char c) {
    if (chars == nullptr || chars->is_none()) return is_py_space(c);
    return chars->str().find(char(c)) != std::string::npos;
  };
  size_t a = 0, b = s.size();
  if (left)
    while (a < b && strip_this(static_cast<unsigned char>(s[a]))) ++a;
  if (right)
    while (b > a && strip_this(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

std::string upper(std::string s) {
  for (char& c : s) c = char(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string title(const std::string& s) {
  std::string out = s;
  bool prev_letter = false;
  for (char& c : out) {
    const bool letter = std::isalpha(static_cast<unsigned char>(c)) != 0;
    c = char(letter ? (prev_letter ? std::tolower(static_cast<unsigned char>(c)) : std::toupper(static_cast<unsigned char>(c))) : c);
    prev_letter = letter;
  }
  return out;
}
std::string capitalize(const std::string& s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = char(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

std::vector<std::string> split(const std::string& s, const Value* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep == nullptr || sep->is_none()) {  // runs of whitespace, no empty parts
    size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && is_py_space(static_cast<unsigned char>(s[i]))) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        size_t end = s.size();
        while (end > i && is_py_space(static_cast<unsigned char>(s[end - 1]))) --end;
        out.push_back(s.substr(i, end - i));
        break;
      }
      size_t j = i;
      while (j < s.size() && !is_py_space(static_cast<unsigned char>(s[j]))) ++j;
      out.push_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  const std::string& d = sep->str();
  if (d.empty()) fail("empty separator");
  size_t start = 0;
  for (;;) {
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) break;
    const size_t at = WorkMeter::find_text(s, d, start);
    if (at == std::string::npos) break;
    out.push_back(s.substr(start, at - start));
    start = at + d.size();
  }
  out.push_back(s.substr(start));
  return out;
}

std::vector<std::string> rsplit(const std::string& s, const Value* sep, int64_t maxsplit) {
  if (sep == nullptr || sep->is_none() || maxsplit < 0) return split(s, sep, maxsplit);
  const std::string& d = sep->str();
  std::vector<std::string> out;
  size_t end = s.size();
  while (int64_t(out.size()) < maxsplit) {
    const size_t at = end >= d.size() ? s.rfind(d, end - d.size()) : std::string::npos;
    if (at == std::string::npos) break;
    out.insert(out.begin(), s.substr(at + d.size(), end - at - d.size()));
    end = at;
  }
  out.insert(out.begin(), s.substr(0, end));
  return out;
}

std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) return s;  // Python inserts `to` between characters; no template does that
  std::string out;
  size_t pos = 0;
  int64_t n = 0;
  for (;;) {
    if (count >= 0 && n == count) break;
    const size_t at = WorkMeter::find_text(s, from, pos);
    if (at == std::string::npos) break;
    WorkMeter::append_text(out, std::string_view(s).substr(pos, at - pos));
    WorkMeter::append_text(out, to);
    pos = at + from.size();
    ++n;
  }
  WorkMeter::append_text(out, std::string_view(s).substr(pos));
  return out;
}

Value strings(const std::vector<std::string>& parts) {
  Array a;
  for (const auto& p : parts) a.emplace_back(p);
  return Value(std::move(a));
}

const std::string& need_string(const Value& v, const char* what) {
  if (!v.is_string()) fail(std::string(what) + " expects a string, got " + v.type_name());
  return v.str();
}

int64_t int_arg(const Args& a, size_t i, const char* name, int64_t def) {
  const Value* v = a.get(i, name);
  if (v == nullptr || v->is_none()) return def;
  if (v->kind() != Value::Kind::Int && v->kind() != Value::Kind::Bool) fail(std::string(name) + " must be an integer");
  return v->as_int();
}
bool bool_arg(const Args& a, size_t i, const char* name, bool def) {
  const Value* v = a.get(i, name);
  return v == nullptr ? def : v->truthy();
}

// str.format: {} {0} {name} fields (format specs beyond the field name are ignored).
std::string py_format(const std::string& f, const Args& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] == '{' && i + 1 < f.size() && f[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (f[i] == '}' && i + 1 < f.size() && f[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (f[i] == '{') {
      const size_t close = f.find('}', i);
      if (close == std::string::npos) fail("Single '{' encountered in format string");
      std::string field = f.substr(i + 1, close - i - 1);
      field = field.substr(0, field.find_first_of(":!"));
      const Value* v = nullptr;
      if (field.empty()) v = auto_index < a.pos.size() ? &a.pos[auto_index++] : nullptr;
      else if (std::isdigit(static_cast<unsigned char>(field[0]))) v = a.get(size_t(std::atoi(field.c_str())), "");
      else v = a.get(size_t(-1), field);
      if (v == nullptr) fail("format: no argument for field '{" + field + "}'");
      WorkMeter::append_text(out, v->to_string());
      i = close;
    } else {
      out += f[i];
    }
  }
  return out;
}

bool is_mutator(const Value& obj, const std::string& n) {
  static const char* kList[] = {"append", "extend", "insert", "pop", "remove", "sort", "reverse", "clear"};
  static const char* kDict[] = {"update", "pop", "popitem", "setdefault", "clear"};
  if (obj.is_list()) return std::find(std::begin(kList), std::end(kList), n) != std::end(kList);
  if (obj.kind() == Value::Kind::Object) return std::find(std::begin(kDict), std::end(kDict), n) != std::end(kDict);
  return false;
}

Array items_of(const Value& v) {
  Array out;
  for (const auto& [k, x] : v.object().items) out.push_back(Value::tuple(Array{k, x}));
  return out;
}

// Sort key comparisons, case-insensitive for strings unless asked.
bool sort_less(const Value& a, const Value& b, bool case_sensitive) {
  if (!case_sensitive && a.is_string() && b.is_string()) return lower(a.str()) < lower(b.str());
  return a.less(b);
}

Value number_of(const Value& v, bool as_float, const Value& def) {
  if (v.kind() == Value::Kind::Int || v.kind() == Value::Kind::Bool)
    return as_float ? Value(v.as_double()) : Value(v.as_int());
  if (v.kind() == Value::Kind::Float) return as_float ? v : Value(int64_t(std::trunc(v.as_double())));
  if (v.is_string()) {
    const std::string s = strip_chars(v.str(), nullptr, true, true);
    char* end = nullptr;
    if (as_float) {
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size()) return Value(d);
    } else {
      const long long i = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && end == s.c_str() + s.size()) return Value(int64_t(i));
    }
  }
  return def;
}

}  // namespace


namespace {

// A call's first positional argument, undefined when there is none. A reference to an element
// or to a static, never to a temporary: need_string() returns a reference into its argument.
const Value& first_arg(const Args& a) {
  static const Value undefined;
  return a.pos.empty() ? undefined : a.pos[0];
}

// What a filter, method or loop over `v` may walk: its bytes or its elements, charged to the
// rendering's meter before the walk.
void charge_size(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::String: WorkMeter::charge(int64_t(v.str().size())); return;
    case Value::Kind::Array: WorkMeter::charge_elements(int64_t(v.array().size())); return;
    case Value::Kind::Object:
    case Value::Kind::Namespace: WorkMeter::charge_elements(int64_t(v.object().items.size())); return;
    default: return;
  }
}
}  // namespace

size_t python_len(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined: return 0;
    case Value::Kind::String: return code_points(v.str()).size();
    case Value::Kind::Array:
      if (v.is_lazy()) fail("object of type '" + v.type_name() + "' has no len()");
      return v.array().size();
    case Value::Kind::Object:
    case Value::Kind::Namespace: return v.object().items.size();
    default: fail("object of type '" + v.type_name() + "' has no len()");
  }
}

Array iterate(const Value& v) {
  charge_size(v);
  switch (v.kind()) {
    case Value::Kind::Undefined: return {};
    case Value::Kind::Array: return v.array();
    case Value::Kind::String: {
      Array out;
      for (auto& c : code_points(v.str())) out.emplace_back(c);
      return out;
    }
    case Value::Kind::Object: {
      Array out;
      for (const auto& kv : v.object().items) out.push_back(kv.first);
      return out;
    }
    default: fail("'" + v.type_name() + "' object is not iterable");
  }
}

// "'<type> object' has no attribute '<name>'", built piecewise: a `"'" + std::string`
// expression trips a GCC 12 -Wrestrict false positive.
std::string no_attribute(const Value& obj, const std::string& name) {
  std::string m(1, '\'');
  m += obj.type_name();
  m += " object' has no attribute '";
  m += name;
  m += '\'';
  return m;
}

Value lookup_path(const Value& obj, const std::string& path) {
  Value cur = obj;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (cur.is_mapping()) {
      const Value* v = cur.object().find(Value(part));
      cur = v ? *v : Value::undefined(no_attribute(cur, part));
    } else if (cur.is_list() && !part.empty() && std::isdigit(static_cast<unsigned char>(part[0]))) {
      const size_t i = size_t(std::atoll(part.c_str()));
      cur = i < cur.array().size() ? cur.array()[i] : Value::undefined("list index out of range");
    } else {
      return Value::undefined(no_attribute(cur, part));
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return cur;
}

bool apply_test(const std::string& n, const Value& v, const Args& a) {
  using K = Value::Kind;
  auto arg = [&](size_t i) -> const Value& {
    if (i >= a.pos.size()) fail("test '" + n + "' needs an argument");
    return a.pos[i];
  };
  if (n == "defined") return !v.is_undefined();
  if (n == "undefined") return v.is_undefined();
  if (n == "none") return v.is_none();
  if (n == "boolean") return v.kind() == K::Bool;
  if (n == "true") return v.kind() == K::Bool && v.as_bool();
  if (n == "false") return v.kind() == K::Bool && !v.as_bool();
  if (n == "integer") return v.kind() == K::Int;
  if (n == "float") return v.kind() == K::Float;
  if (n == "number") return v.is_number();
  if (n == "string") return v.is_string();
  if (n == "mapping") return v.kind() == K::Object;
  if (n == "iterable") return v.is_string() || v.kind() == K::Array || v.kind() == K::Object || v.is_undefined();
  if (n == "sequence") return v.is_string() || v.is_list() || v.kind() == K::Object;
  if (n == "callable") return v.kind() == K::Function;
  if (n == "sameas") return v.identity() ? v.identity() == arg(0).identity() : v.equals(arg(0)) && v.kind() == arg(0).kind();
  if (n == "escaped") return false;
  if (n == "in") {
    const Value& c = arg(0);
    if (c.is_string()) return v.is_string() && WorkMeter::find_text(c.str(), v.str()) != std::string::npos;
    if (c.kind() == K::Object) return c.object().find(v) != nullptr;
    for (const Value& e : iterate(c))
      if (e.equals(v)) return true;
    return false;
  }
  if (n == "eq" || n == "equalto" || n == "==") return v.equals(arg(0));
  if (n == "ne" || n == "!=") return !v.equals(arg(0));
  if (n == "lt" || n == "lessthan" || n == "<") return v.less(arg(0));
  if (n == "le" || n == "<=") return !arg(0).less(v);
  if (n == "gt" || n == "greaterthan" || n == ">") return arg(0).less(v);
  if (n == "ge" || n == ">=") return !v.less(arg(0));
  if (n == "odd" || n == "even") {
    if (v.kind() != K::Int) fail("test '" + n + "' needs an integer");
    return (v.as_int() % 2 != 0) == (n == "odd");
  }
  if (n == "divisibleby") return arg(0).as_int() != 0 && v.as_int() % arg(0).as_int() == 0;
  if (n == "lower") return v.is_string() && lower(v.str()) == v.str();
  if (n == "upper") return v.is_string() && upper(v.str()) == v.str();
  fail("no test named '" + n + "'");
}

Value apply_filter(const std::string& n, const Value& v, const Args& a) {
  // Constant-time filters, and those whose walk charges itself (string, tojson), are free.
  const bool sized = v.kind() == Value::Kind::Array || v.is_mapping();
  if (!(((n == "length" || n == "count" || n == "first" || n == "last") && sized) || n == "default" || n == "d" ||
        n == "string" || n == "tojson" || n == "safe" || n == "attr"))
    charge_size(v);
  using K = Value::Kind;
  if (n == "tojson") {  // Transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
    const Value* indent = a.get(1, "indent");
    const int ind = indent && !indent->is_none() ? int(std::clamp<int64_t>(indent->as_int(), 0, 1000)) : -1;
    std::string item_sep = ind >= 0 ? "," : ", ", key_sep = ": ";
    if (const Value* seps = a.get(2, "separators"); seps && !seps->is_none()) {
      if (seps->kind() != K::Array || seps->array().size() != 2) fail("tojson: separators must be a pair of strings");
      item_sep = need_string(seps->array()[0], "separators");
      key_sep = need_string(seps->array()[1], "separators");
    }
    if (v.is_undefined()) fail("Object of type Undefined is not JSON serializable");
    return Value(v.to_json(ind, item_sep, key_sep, bool_arg(a, 3, "sort_keys", false), bool_arg(a, 0, "ensure_ascii", false)));
  }
  if (n == "length" || n == "count") return Value(int64_t(python_len(v)));
  if (n == "string") return Value(v.to_string());
  if (n == "trim") return Value(strip_chars(v.to_string(), a.get(0, "chars"), true, true));
  if (n == "upper") return Value(upper(v.to_string()));
  if (n == "lower") return Value(lower(v.to_string()));
  if (n == "capitalize") return Value(capitalize(v.to_string()));
  if (n == "title") return Value(title(v.to_string()));
  if (n == "safe") return v.is_markup() ? v : Value::markup(v.to_string());
  if (n == "e" || n == "escape" || n == "forceescape")
    return v.is_markup() && n != "forceescape" ? v : Value::markup(html_escape(v.to_string()));
  if (n == "default" || n == "d") {
    const Value* def = a.get(0, "default_value");
    const bool boolean = bool_arg(a, 1, "boolean", false);
    if (v.is_undefined() || (boolean && !v.truthy())) return def ? *def : Value("");
    return v;
  }
  if (n == "join") {
    const Value* sep = a.get(0, "d");
    const Value* attr = a.get(1, "attribute");
    std::string out;
    bool first = true;
    const std::string separator = sep ? sep->to_string() : "";
    for (const Value& e : iterate(v)) {
      if (!first) WorkMeter::append_text(out, separator);
      WorkMeter::append_text(out, (attr ? lookup_path(e, attr->to_string()) : e).to_string());
      first = false;
    }
    return Value(out);
  }
  if (n == "items") {
    if (v.is_undefined()) return Value(Array{});
    if (v.kind() != K::Object) fail("items: expected a mapping, got " + v.type_name());
    return Value(items_of(v));
  }
  if (n == "dictsort") {
    if (v.kind() != K::Object) fail("dictsort: expected a mapping, got " + v.type_name());
    const bool cs = bool_arg(a, 0, "case_sensitive", false);
    const Value* by = a.get(1, "by");
    const bool by_value = by && by->to_string() == "value";
    Array items = items_of(v);
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      return sort_less(x.array()[by_value ? 1 : 0], y.array()[by_value ? 1 : 0], cs);
    });
    if (bool_arg(a, 2, "reverse", false)) std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (n == "list") return Value(iterate(v));
  if (n == "first" || n == "last") {
    Array all = iterate(v);
    if (all.empty()) return Value::undefined("No first item, sequence was empty.");
    return n == "first" ? all.front() : all.back();
  }
  if (n == "reverse") {
    if (v.is_string()) {
      auto cps = code_points(v.str());
      std::string out;
      for (auto it = cps.rbegin(); it != cps.rend(); ++it) out += *it;
      return Value(out);
    }
    Array all = iterate(v);
    std::reverse(all.begin(), all.end());
    return v.is_list() ? Value::lazy(std::move(all), "list_reverseiterator") : Value(std::move(all));
  }
  if (n == "replace") {
    const Value* from = a.get(0, "old");
    const Value* to = a.get(1, "new");
    if (!from || !to) fail("replace needs old and new");
    return Value(replace(v.to_string(), from->to_string(), to->to_string(), int_arg(a, 2, "count", -1)));
  }
  if (n == "indent") {  // Jinja2's do_indent: lines after the first, not empty ones unless `blank`
    const Value* w = a.get(0, "width");
    const std::string pad = w == nullptr ? "    " : w->is_string() ? w->str()
                                                   : std::string(size_t(std::clamp<int64_t>(w->as_int(), 0, kMaxWidth)), ' ');
    const bool first = bool_arg(a, 1, "first", false), blank = bool_arg(a, 2, "blank", false);
    std::vector<std::string> lines = split_lines(v.to_string() + "\n");
    std::string out;
    if (first) WorkMeter::append_text(out, pad);
    if (!lines.empty()) WorkMeter::append_text(out, lines[0]);
    for (size_t i = 1; i < lines.size(); ++i) {
      WorkMeter::append_text(out, "\n");
      if (blank || !lines[i].empty()) WorkMeter::append_text(out, pad);
      WorkMeter::append_text(out, lines[i]);
    }
    return Value(std::move(out));
  }
  if (n == "int") {
    const Value def = a.get(0, "default") ? *a.get(0, "default") : Value(int64_t(0));
    const Value i = number_of(v, false, Value());
    if (!i.is_undefined()) return i;
    const Value f = number_of(v, true, Value());  // "3.7": int(float(x)), as Jinja2
    return f.is_undefined() ? def : Value(int64_t(std::trunc(f.as_double())));
  }
  if (n == "float") return number_of(v, true, a.get(0, "default") ? *a.get(0, "default") : Value(0.0));
  if (n == "abs") return v.kind() == K::Float ? Value(std::fabs(v.as_double())) : Value(int64_t(std::llabs(v.as_int())));
  if (n == "round") {
    const int64_t p = int_arg(a, 0, "precision", 0);
    const double m = std::pow(10.0, double(p));
    return Value(std::round(v.as_double() * m) / m);
  }
  if (n == "unique" || n == "sort" || n == "min" || n == "max") {
    const bool cs = bool_arg(a, n == "sort" ? 1 : 0, "case_sensitive", false);
    const Value* attr = a.get(n == "sort" ? 2 : 1, "attribute");
    auto key = [&](const Value& e) { return attr ? lookup_path(e, attr->to_string()) : e; };
    Array all = iterate(v);
    if (n == "unique") {
      Array out;
      for (const Value& e : all) {
        bool seen = false;
        for (const Value& o : out) {
          const Value x = key(e), y = key(o);
          seen = seen || (!cs && x.is_string() && y.is_string() ? lower(x.str()) == lower(y.str()) : x.equals(y));
        }
        if (!seen) out.push_back(e);
      }
      return Value::lazy(std::move(out), "generator");
    }
    std::stable_sort(all.begin(), all.end(), [&](const Value& x, const Value& y) { return sort_less(key(x), key(y), cs); });
    if (n == "sort") {
      if (bool_arg(a, 0, "reverse", false)) std::reverse(all.begin(), all.end());
      return Value(std::move(all));
    }
    if (all.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    return n == "min" ? all.front() : all.back();
  }
  if (n == "sum") {
    const Value* attr = a.get(0, "attribute");
    Value total = a.get(1, "start") ? *a.get(1, "start") : Value(int64_t(0));
    for (const Value& e : iterate(v)) {
      const Value x = attr ? lookup_path(e, attr->to_string()) : e;
      total = total.kind() == K::Float || x.kind() == K::Float ? Value(total.as_double() + x.as_double())
                                                               : Value(total.as_int() + x.as_int());
    }
    return total;
  }
  if (n == "wordcount") return Value(int64_t(split(v.to_string(), nullptr, -1).size()));
  if (n == "center") {
    const int64_t w = std::min<int64_t>(int_arg(a, 0, "width", 80), kMaxWidth);
    const std::string s = v.to_string();
    const int64_t len = int64_t(code_points(s).size());
    if (len >= w) return Value(s);
    const int64_t left = (w - len) / 2;
    return Value(std::string(size_t(left), ' ') + s + std::string(size_t(w - len - left), ' '));
  }
  if (n == "format") return Value(py_format(v.to_string(), a));
  if (n == "map" || n == "select" || n == "reject" || n == "selectattr" || n == "rejectattr") {
    // Generators, as Jinja2's; a false sequence (None, empty) gives an empty one.
    Array out;
    const Array all = v.truthy() ? iterate(v) : Array{};
    if (n == "map") {
      if (const Value* attr = a.get(size_t(-1), "attribute")) {
        const Value* def = a.get(size_t(-1), "default");
        for (const Value& e : all) {
          Value x = lookup_path(e, attr->to_string());
          out.push_back(x.is_undefined() && def ? *def : x);
        }
        return Value::lazy(std::move(out), "generator");
      }
      if (a.pos.empty()) fail("map needs a filter name or attribute=");
      Args rest;
      rest.pos.assign(a.pos.begin() + 1, a.pos.end());
      rest.kw = a.kw;
      for (const Value& e : all) out.push_back(apply_filter(a.pos[0].to_string(), e, rest));
      return Value::lazy(std::move(out), "generator");
    }
    const bool attr_form = n == "selectattr" || n == "rejectattr", keep = n == "select" || n == "selectattr";
    size_t test_at = attr_form ? 1 : 0;
    if (attr_form && a.pos.empty()) fail(n + " needs an attribute");
    Args targs;
    if (a.pos.size() > test_at + 1) targs.pos.assign(a.pos.begin() + long(test_at) + 1, a.pos.end());
    for (const Value& e : all) {
      const Value x = attr_form ? lookup_path(e, a.pos[0].to_string()) : e;
      const bool pass = a.pos.size() > test_at ? apply_test(a.pos[test_at].to_string(), x, targs) : x.truthy();
      if (pass == keep) out.push_back(e);
    }
    return Value::lazy(std::move(out), "generator");
  }
  if (n == "batch") {
    const int64_t size = int_arg(a, 0, "linecount", 1);
    if (size <= 0 || size > kMaxWidth) fail("batch: the size must be in [1, 1048576]");
    Array out, cur;
    for (const Value& e : iterate(v)) {
      cur.push_back(e);
      if (int64_t(cur.size()) == size) out.emplace_back(std::move(cur)), cur.clear();
    }
    if (!cur.empty()) {
      if (const Value* fill = a.get(1, "fill_with"))
        while (int64_t(cur.size()) < size) cur.push_back(*fill);
      out.emplace_back(std::move(cur));
    }
    return Value::lazy(std::move(out), "generator");
  }
  fail("no filter named '" + n + "'");
}

bool has_method(const Value& obj, const std::string& n) {
  static const char* kStr[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "splitlines", "startswith", "endswith",
                               "replace", "upper", "lower", "title", "capitalize", "format", "find", "rfind",
                               "count", "join", "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower",
                               "index", "zfill", "removeprefix", "removesuffix"};
  static const char* kList[] = {"count", "index"};
  static const char* kDict[] = {"get", "items", "keys", "values", "copy"};
  if (is_mutator(obj, n)) return true;
  auto in = [&](const auto& names) { return std::find(std::begin(names), std::end(names), n) != std::end(names); };
  if (obj.is_string()) return in(kStr);
  if (obj.is_list()) return in(kList);
  if (obj.kind() == Value::Kind::Object) return in(kDict);
  return false;
}

Value call_method(const Value& obj, const std::string& n, const Args& a) {
  // get() and the prefix tests take no walk over the subject (the prefix's bytes at most).
  if (n == "startswith" || n == "endswith") {
    for (const Value& p : a.pos) charge_size(p);
  } else if (n != "get") {
    charge_size(obj);
  }
  if (is_mutator(obj, n))
    fail("access to attribute '" + n + "' of '" + obj.type_name() + "' object is unsafe.");
  if (obj.kind() == Value::Kind::Object) {
    if (n == "get") {
      const Value* k = a.get(0, "key");
      if (!k) fail("get needs a key");
      const Value* v = obj.object().find(*k);
      return v ? *v : (a.pos.size() > 1 ? a.pos[1] : Value::none());
    }
    if (n == "items") return Value(items_of(obj));
    if (n == "copy") return Value(Object(obj.object()));
    Array out;
    for (const auto& [k, v] : obj.object().items) out.push_back(n == "keys" ? k : v);
    return Value(std::move(out));
  }
  if (obj.is_list()) {
    const Value* x = a.get(0, "x");
    if (!x) fail(n + " needs an argument");
    int64_t count = 0;
    for (size_t i = 0; i < obj.array().size(); ++i)
      if (obj.array()[i].equals(*x)) {
        if (n == "index") return Value(int64_t(i));
        ++count;
      }
    if (n == "index") fail("value is not in list");
    return Value(count);
  }
  const std::string& s = obj.str();
  if (n == "strip" || n == "lstrip" || n == "rstrip")
    return Value(strip_chars(s, a.get(0, "chars"), n != "rstrip", n != "lstrip"));
  if (n == "split") return strings(split(s, a.get(0, "sep"), int_arg(a, 1, "maxsplit", -1)));
  if (n == "rsplit") return strings(rsplit(s, a.get(0, "sep"), int_arg(a, 1, "maxsplit", -1)));
  if (n == "splitlines") {
    std::vector<std::string> lines;
    size_t start = 0;
    while (start < s.size()) {
      const size_t nl = s.find('\n', start);
      lines.push_back(s.substr(start, nl == std::string::npos ? std::string::npos : nl - start));
      if (nl == std::string::npos) break;
      start = nl + 1;
    }
    return strings(lines);
  }
  if (n == "startswith" || n == "endswith") {
    const Value* p = a.get(0, "prefix");
    if (!p) fail(n + " needs an argument");
    auto match = [&](const std::string& x) {
      return n == "startswith" ? s.compare(0, x.size(), x) == 0
                               : s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
    };
    if (p->is_list()) {
      for (const Value& e : p->array())
        if (match(need_string(e, n.c_str()))) return Value(true);
      return Value(false);
    }
    return Value(match(need_string(*p, n.c_str())));
  }
  if (n == "removeprefix" || n == "removesuffix") {
    const std::string& x = need_string(first_arg(a), n.c_str());
    if (n == "removeprefix") return Value(s.compare(0, x.size(), x) == 0 ? s.substr(x.size()) : s);
    return Value(s.size() >= x.size() && s.compare(s.size() - x.size(), x.size(), x) == 0 ? s.substr(0, s.size() - x.size()) : s);
  }
  if (n == "replace") {
    if (a.pos.size() < 2) fail("replace needs old and new");
    return Value(replace(s, need_string(a.pos[0], "replace"), need_string(a.pos[1], "replace"), int_arg(a, 2, "count", -1)));
  }
  if (n == "upper") return Value(upper(s));
  if (n == "lower") return Value(lower(s));
  if (n == "title") return Value(title(s));
  if (n == "capitalize") return Value(capitalize(s));
  if (n == "format") return Value(py_format(s, a));
  if (n == "find" || n == "rfind" || n == "index") {
    const std::string& x = need_string(first_arg(a), n.c_str());
    const size_t at = n == "rfind" ? s.rfind(x) : WorkMeter::find_text(s, x);
    if (at == std::string::npos && n == "index") fail("substring not found");
    return Value(at == std::string::npos ? int64_t(-1) : int64_t(code_points(s.substr(0, at)).size()));
  }
  if (n == "count") {
    const std::string& x = need_string(first_arg(a), "count");
    if (x.empty()) return Value(int64_t(code_points(s).size() + 1));
    int64_t c = 0;
    for (size_t at = WorkMeter::find_text(s, x); at != std::string::npos; at = WorkMeter::find_text(s, x, at + x.size())) ++c;
    return Value(c);
  }
  if (n == "join") {
    std::string out;
    bool first = true;
    for (const Value& e : iterate(first_arg(a))) {
      if (!first) WorkMeter::append_text(out, s);
      WorkMeter::append_text(out, need_string(e, "join"));
      first = false;
    }
    return Value(out);
  }
  if (n == "zfill") {
    const int64_t w = std::min<int64_t>(int_arg(a, 0, "width", 0), kMaxWidth);
    const int64_t len = int64_t(code_points(s).size());
    if (len >= w) return Value(s);
    const bool sign = !s.empty() && (s[0] == '-' || s[0] == '+');
    return Value((sign ? s.substr(0, 1) : "") + std::string(size_t(w - len), '0') + (sign ? s.substr(1) : s));
  }
  auto all_of = [&](int (*pred)(int)) {
    if (s.empty()) return Value(false);
    for (unsigned char c : s)
      if (!pred(c)) return Value(false);
    return Value(true);
  };
  if (n == "isdigit") return all_of(std::isdigit);
  if (n == "isalpha") return all_of(std::isalpha);
  if (n == "isalnum") return all_of(std::isalnum);
  if (n == "isspace") return all_of(std::isspace);
  if (n == "isupper") return Value(upper(s) == s && lower(s) != s);
  if (n == "islower") return Value(lower(s) == s && upper(s) != s);
  fail("'" + obj.type_name() + "' object has no attribute '" + n + "'");
}

}  // namespace fdl::jinja
