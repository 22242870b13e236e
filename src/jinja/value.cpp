// Values of the Jinja interpreter (value.h): Python's truth, equality, order, str, repr and
// json.dumps as chat templates see them.
#include "jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "jinja/work_meter.h"

namespace fdl::jinja {

const Value* Object::find(const Value& key) const {
  for (const auto& [k, v] : items)
    if (k.equals(key)) return &v;
  return nullptr;
}
Value* Object::find(const Value& key) {
  for (auto& [k, v] : items)
    if (k.equals(key)) return &v;
  return nullptr;
}
void Object::set(const Value& key, Value v) {
  if (Value* at = find(key))
    *at = std::move(v);
  else
    items.emplace_back(key, std::move(v));
}

const Value* Args::get(size_t i, std::string_view name) const {
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return i < pos.size() ? &pos[i] : nullptr;
}

Value Value::none() {
  Value v;
  v.v_ = NoneTag{};
  return v;
}
Value Value::undefined(std::string name) {
  Value v;
  v.name_ = std::move(name);
  return v;
}
Value Value::namespace_of(Object o) {
  Value v;
  v.v_ = NamespaceObj{std::make_shared<Object>(std::move(o))};
  return v;
}
Value Value::lazy(Array a, std::string type) {
  Value v(std::move(a));
  v.lazy_ = std::move(type);
  return v;
}
Value Value::tuple(Array a) {
  Value v(std::move(a));
  v.tuple_ = true;
  return v;
}
Value Value::markup(std::string s) {
  Value v(std::move(s));
  v.markup_ = true;
  return v;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

Value Value::function(Function f, std::string name) {
  Value v;
  v.v_ = FunctionObj{std::make_shared<Function>(std::move(f))};
  v.name_ = std::move(name);
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxJsonDepth)
    throw TemplateError("the template's input nests arrays and objects more than " + std::to_string(kMaxJsonDepth) +
                        " levels deep");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return Value(int64_t(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Array a;
      for (const auto& e : j) a.push_back(from_json(e, depth + 1));
      return Value(std::move(a));
    }
    case nlohmann::ordered_json::value_t::object: {
      Object o;
      for (const auto& [k, e] : j.items()) o.items.emplace_back(Value(k), from_json(e, depth + 1));
      return Value(std::move(o));
    }
    default: return Value();
  }
}

Value::Kind Value::kind() const {
  switch (v_.index()) {
    case 0: return Kind::Undefined;
    case 1: return Kind::None;
    case 2: return Kind::Bool;
    case 3: return Kind::Int;
    case 4: return Kind::Float;
    case 5: return Kind::String;
    case 6: return Kind::Array;
    case 7: return Kind::Object;
    case 8: return Kind::Namespace;
    default: return Kind::Function;
  }
}

int64_t Value::as_int() const {
  switch (kind()) {
    case Kind::Bool: return int64_t(as_bool());
    case Kind::Int: return std::get<int64_t>(v_);
    default: throw TemplateError("an integer is required, got '" + type_name() + "'");
  }
}
double Value::as_double() const {
  switch (kind()) {
    case Kind::Bool: return as_bool() ? 1.0 : 0.0;
    case Kind::Int: return double(std::get<int64_t>(v_));
    case Kind::Float: return std::get<double>(v_);
    default: throw TemplateError("a number is required, got '" + type_name() + "'");
  }
}
const std::string& Value::str() const {
  if (const auto* s = std::get_if<std::string>(&v_)) return *s;
  throw TemplateError("a string is required, got '" + type_name() + "'");
}
Array& Value::array() const {
  if (const auto* a = std::get_if<std::shared_ptr<Array>>(&v_)) return **a;
  throw TemplateError("a list is required, got '" + type_name() + "'");
}
Object& Value::object() const {
  if (const auto* n = std::get_if<NamespaceObj>(&v_)) return *n->o;
  if (const auto* o = std::get_if<std::shared_ptr<Object>>(&v_)) return **o;
  throw TemplateError("a mapping is required, got '" + type_name() + "'");
}
const Function& Value::fn() const {
  if (const auto* f = std::get_if<FunctionObj>(&v_)) return *f->f;
  throw TemplateError("'" + type_name() + "' object is not callable");
}

const void* Value::identity() const {
  switch (kind()) {
    case Kind::Array: return std::get<std::shared_ptr<Array>>(v_).get();
    case Kind::Object: return std::get<std::shared_ptr<Object>>(v_).get();
    case Kind::Namespace: return std::get<NamespaceObj>(v_).o.get();
    case Kind::Function: return std::get<FunctionObj>(v_).f.get();
    default: return nullptr;
  }
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::Undefined: return "Undefined";
    case Kind::None: return "NoneType";
    case Kind::Bool: return "bool";
    case Kind::Int: return "int";
    case Kind::Float: return "float";
    case Kind::String: return markup_ ? "Markup" : "str";
    case Kind::Array: return lazy_.empty() ? "list" : lazy_;
    case Kind::Object: return "dict";
    case Kind::Namespace: return "Namespace";
    default: return "function";
  }
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::Undefined:
    case Kind::None: return false;
    case Kind::Bool: return as_bool();
    case Kind::Int: return as_int() != 0;
    case Kind::Float: return as_double() != 0.0;
    case Kind::String: return !str().empty();
    case Kind::Array: return !lazy_.empty() || !array().empty();
    case Kind::Object: return !object().items.empty();
    default: return true;
  }
}

std::string python_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  // The shortest digits that round-trip, then Python's choice of notation: positional for
  // decimal exponents in [-4, 16), else d.ddde+XX.
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string s(buf, r.ptr);
  const size_t e = s.find('e');
  std::string mant = s.substr(0, e);
  const int exp = std::stoi(s.substr(e + 1));
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0." + std::string(size_t(-exp - 1), '0') + digits;
    } else if (size_t(exp) + 1 >= digits.size()) {
      out = digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return neg ? "-" + out : out;
}

namespace {

std::string python_quote(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c == static_cast<unsigned char>(q)) out += std::string("\\") + char(q);
    else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += char(c);
    }
  }
  return out + q;
}

std::string json_quote(const std::string& s, bool ensure_ascii) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (ensure_ascii && c >= 0x80) {  // one UTF-8 character as \uXXXX (a surrogate pair above U+FFFF)
      const size_t n = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
      uint32_t cp = n == 2 ? c & 0x1f : n == 3 ? c & 0x0f : n == 4 ? c & 0x07 : 0xfffd;
      for (size_t k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
      i += n - 1;
      char b[16];
      if (cp >= 0x10000) {
        cp -= 0x10000;
        std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
      } else {
        std::snprintf(b, sizeof b, "\\u%04x", cp);
      }
      out += b;
      continue;
    }
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += char(c);
        }
    }
  }
  return out + "\"";
}

std::string json_number(const Value& v) {
  if (v.kind() == Value::Kind::Int) return std::to_string(v.as_int());
  const double d = v.as_double();
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d < 0 ? "-Infinity" : "Infinity";
  return python_float(d);
}

}  // namespace

std::string Value::to_string() const {
  switch (kind()) {
    case Kind::Undefined: return "";
    case Kind::String: return str();
    default: return repr();
  }
}

std::string Value::repr() const {
  std::string out;
  repr_into(out, 0);
  return out;
}

// Nested deeper than this, a value prints as "..." (Python's mark for a container holding
// itself: a namespace can).
constexpr int kMaxReprDepth = 64;

void Value::repr_into(std::string& out, int depth) const {
  WorkMeter::charge_elements(1);
  if (depth > kMaxReprDepth) {
    out += "...";
    return;
  }
  switch (kind()) {
    case Kind::Undefined: out += "Undefined"; return;
    case Kind::None: out += "None"; return;
    case Kind::Bool: out += as_bool() ? "True" : "False"; return;
    case Kind::Int: out += std::to_string(as_int()); return;
    case Kind::Float: out += python_float(as_double()); return;
    case Kind::String:
      WorkMeter::charge(int64_t(str().size()));
      out += python_quote(str());
      return;
    case Kind::Array: {
      if (!lazy_.empty()) {
        out += "<" + lazy_ + " object>";
        return;
      }
      out += tuple_ ? "(" : "[";
      for (size_t i = 0; i < array().size(); ++i) {
        if (i) out += ", ";
        array()[i].repr_into(out, depth + 1);
      }
      if (tuple_) out += array().size() == 1 ? ",)" : ")";
      else out += "]";
      return;
    }
    case Kind::Object:
    case Kind::Namespace: {
      const bool ns = kind() == Kind::Namespace;
      out += ns ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, v] : object().items) {
        if (!first) out += ", ";
        first = false;
        k.repr_into(out, depth + 1);
        out += ": ";
        v.repr_into(out, depth + 1);
      }
      out += ns ? "}>" : "}";
      return;
    }
    default: out += "<function " + name_ + ">"; return;
  }
}

std::string Value::to_json(int indent, const std::string& item_sep, const std::string& key_sep, bool sort_keys,
                           bool ensure_ascii) const {
  std::string out;
  std::function<void(const Value&, int)> emit = [&](const Value& v, int level) {
    WorkMeter::charge_elements(1);
    check_depth(level);
    auto newline = [&](int l) {
      if (indent >= 0) out.append(1, '\n').append(size_t(indent) * size_t(l), ' ');
    };
    switch (v.kind()) {
      case Kind::None: out += "null"; return;
      case Kind::Bool: out += v.as_bool() ? "true" : "false"; return;
      case Kind::Int:
      case Kind::Float: out += json_number(v); return;
      case Kind::String:
        WorkMeter::charge(int64_t(v.str().size()));
        out += json_quote(v.str(), ensure_ascii);
        return;
      case Kind::Array: {
        if (v.is_lazy()) throw TemplateError("Object of type " + v.type_name() + " is not JSON serializable");
        if (v.array().empty()) {
          out += "[]";
          return;
        }
        out += "[";
        for (size_t i = 0; i < v.array().size(); ++i) {
          if (i) out += item_sep;
          newline(level + 1);
          emit(v.array()[i], level + 1);
        }
        newline(level);
        out += "]";
        return;
      }
      case Kind::Object:
      case Kind::Namespace: {
        if (v.kind() == Kind::Namespace)
          throw TemplateError("Object of type Namespace is not JSON serializable");
        auto items = v.object().items;
        if (items.empty()) {
          out += "{}";
          return;
        }
        auto key_text = [](const Value& k) -> std::string {
          switch (k.kind()) {
            case Kind::String: return k.str();
            case Kind::None: return "null";
            case Kind::Bool: return k.as_bool() ? "true" : "false";
            case Kind::Int:
            case Kind::Float: return json_number(k);
            default: throw TemplateError("keys must be str, int, float, bool or None, not " + k.type_name());
          }
        };
        if (sort_keys)
          std::stable_sort(items.begin(), items.end(), [&](const auto& a, const auto& b) { return key_text(a.first) < key_text(b.first); });
        out += "{";
        for (size_t i = 0; i < items.size(); ++i) {
          if (i) out += item_sep;
          newline(level + 1);
          out += json_quote(key_text(items[i].first), ensure_ascii) + key_sep;
          emit(items[i].second, level + 1);
        }
        newline(level);
        out += "}";
        return;
      }
      default: throw TemplateError("Object of type " + v.type_name() + " is not JSON serializable");
    }
  };
  emit(*this, 0);
  return out;
}

bool Value::equals(const Value& o) const { return equals_at(o, 0); }

// Walks charge the rendering's meter by what they visit (work_meter.h): comparing scalars is
// free (Object::find compares keys all the time), strings are charged as copied bytes, lists
// and dicts per element. Values nested past kMaxJsonDepth are refused rather than recursed into.
bool Value::equals_at(const Value& o, int depth) const {
  const Kind a = kind(), b = o.kind();
  if (is_number() && o.is_number()) {
    if (a != Kind::Float && b != Kind::Float) return as_int() == o.as_int();
    return as_double() == o.as_double();
  }
  if (a != b) return false;
  switch (a) {
    case Kind::Undefined:
    case Kind::None: return true;
    case Kind::String:
      WorkMeter::charge_copy(int64_t(std::min(str().size(), o.str().size())));
      return str() == o.str();
    case Kind::Array: {
      // The same list: equal without a walk (Python's == compares its elements by identity
      // first), which also keeps a list shared many times over cheap to compare.
      if (identity() == o.identity()) return true;
      if (array().size() != o.array().size()) return false;
      check_depth(depth);
      WorkMeter::charge_elements(int64_t(array().size()));
      for (size_t i = 0; i < array().size(); ++i)
        if (!array()[i].equals_at(o.array()[i], depth + 1)) return false;
      return true;
    }
    case Kind::Object: {
      if (identity() == o.identity()) return true;
      if (object().items.size() != o.object().items.size()) return false;
      check_depth(depth);
      WorkMeter::charge_elements(int64_t(object().items.size()));
      for (const auto& [k, v] : object().items) {
        const Value* other = o.object().find(k);
        if (other == nullptr || !v.equals_at(*other, depth + 1)) return false;
      }
      return true;
    }
    default: return identity() == o.identity();
  }
}

bool Value::less(const Value& o) const { return less_at(o, 0); }

bool Value::less_at(const Value& o, int depth) const {
  if (is_number() && o.is_number()) {
    if (kind() != Kind::Float && o.kind() != Kind::Float) return as_int() < o.as_int();
    return as_double() < o.as_double();
  }
  if (is_string() && o.is_string()) {
    WorkMeter::charge_copy(int64_t(std::min(str().size(), o.str().size())));
    return str() < o.str();
  }
  if (is_list() && o.is_list()) {
    // Python's order: the first elements that differ (by ==) decide, else the lengths. One
    // descent per level, so equal nested lists cost their size, not 2^depth.
    check_depth(depth);
    const Array &x = array(), &y = o.array();
    WorkMeter::charge_elements(int64_t(std::min(x.size(), y.size())));
    for (size_t i = 0; i < x.size() && i < y.size(); ++i)
      if (!x[i].equals_at(y[i], depth + 1)) return x[i].less_at(y[i], depth + 1);
    return x.size() < y.size();
  }
  throw TemplateError("'<' not supported between instances of '" + type_name() + "' and '" + o.type_name() + "'");
}

void Value::check_depth(int depth) {
  if (depth > kMaxJsonDepth)
    throw TemplateError("a value nested more than " + std::to_string(kMaxJsonDepth) + " deep (Python's recursion limit)");
}

}  // namespace fdl::jinja
