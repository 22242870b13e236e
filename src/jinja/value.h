// value.h — the values a Jinja template computes with, in Python's semantics as Jinja2 gives
// them to chat templates: undefined, None, booleans, integers, floats, strings, lists,
// insertion-ordered dicts (JSON objects: messages, tools), namespaces and callables.
// Lists, dicts and namespaces are shared by reference, as Python objects are; the sandbox
// (render.cpp) refuses to mutate lists and dicts, as Jinja2's ImmutableSandboxedEnvironment does.
// Thread-safety: a Value is not synchronized; a rendering owns the values it creates.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace fdl::jinja {

/// A template that cannot be parsed or rendered, or raised (raise_exception): what() says why,
/// with the template line where known.
class TemplateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
  /// what() already says where (a template line), or is the template's own text
  /// (raise_exception): the renderer adds no line to it.
  bool located = false;
};

class Value;
using Array = std::vector<Value>;

/// A dict: keys in insertion order (Python 3.7+ dicts, and JSON objects as parsed).
struct Object {
  std::vector<std::pair<Value, Value>> items;
  const Value* find(const Value& key) const;
  Value* find(const Value& key);
  void set(const Value& key, Value v);
};

/// Positional and keyword arguments of a call.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  /// The argument at position i or named `name`, else nullptr.
  const Value* get(size_t i, std::string_view name) const;
};

using Function = std::function<Value(const Args&)>;

class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, Array, Object, Namespace, Function };

  Value() = default;  ///< undefined
  static Value none();
  Value(bool b) : v_(b) {}
  Value(int v) : v_(int64_t(v)) {}
  Value(int64_t v) : v_(v) {}
  Value(double v) : v_(v) {}
  Value(std::string s) : v_(std::move(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(Array a) : v_(std::make_shared<Array>(std::move(a))) {}
  Value(Object o) : v_(std::make_shared<Object>(std::move(o))) {}
  static Value namespace_of(Object o);
  /// A lazy sequence (Jinja2's generators: map, select, reject, unique, reverse): it iterates
  /// like a list, but has no len(), no JSON form and no indexing, and is always true.
  /// `type` names it in errors ("generator", "list_reverseiterator").
  static Value lazy(Array a, std::string type);
  /// A tuple: a list that prints as Python prints tuples ("(1, 2)", "(1,)").
  static Value tuple(Array a);
  /// markupsafe's Markup: a string marked safe (the `safe` filter); `+` with a plain string
  /// HTML-escapes the plain one.
  static Value markup(std::string s);
  static Value function(Function f, std::string name);
  /// JSON to Value: objects keep their key order. Throws TemplateError for JSON nested more
  /// than kMaxJsonDepth deep (the conversion, and every later walk of the value, recurses).
  static Value from_json(const nlohmann::ordered_json& j, int depth = 0);
  static constexpr int kMaxJsonDepth = 512;

  Kind kind() const;
  /// For undefined values: the name that was looked up (for error messages).
  const std::string& undefined_name() const { return name_; }
  static Value undefined(std::string name);

  bool is_undefined() const { return kind() == Kind::Undefined; }
  bool is_none() const { return kind() == Kind::None; }
  bool is_string() const { return kind() == Kind::String; }
  bool is_number() const { return kind() == Kind::Int || kind() == Kind::Float || kind() == Kind::Bool; }
  bool is_mapping() const { return kind() == Kind::Object || kind() == Kind::Namespace; }
  bool is_list() const { return kind() == Kind::Array && lazy_.empty(); }
  bool is_lazy() const { return kind() == Kind::Array && !lazy_.empty(); }
  bool is_markup() const { return markup_; }
  bool is_tuple() const { return kind() == Kind::Array && tuple_; }

  bool as_bool() const { return kind() == Kind::Bool ? std::get<bool>(v_) : truthy(); }
  int64_t as_int() const;     ///< Int or Bool; TemplateError otherwise
  double as_double() const;   ///< Int, Float or Bool; TemplateError otherwise
  // The accessors below throw TemplateError for a value of another kind (a template that
  // passes a list where a string belongs fails cleanly).
  const std::string& str() const;
  Array& array() const;
  Object& object() const;  ///< Object or Namespace
  const Function& fn() const;
  const std::string& fn_name() const { return name_; }

  /// Python's truth value (undefined and None false; empty strings, lists, dicts false).
  bool truthy() const;
  /// str(x) as Jinja2 prints it: None as "None", True as "True", lists and dicts as Python's repr.
  std::string to_string() const;
  /// repr(x): strings quoted as Python quotes them.
  std::string repr() const;
  /// json.dumps(x, ensure_ascii, indent, separators, sort_keys) as Transformers' tojson
  /// (indent < 0: none; ensure_ascii: non-ASCII as \uXXXX escapes, surrogate pairs beyond
  /// the BMP).
  std::string to_json(int indent, const std::string& item_sep, const std::string& key_sep, bool sort_keys,
                      bool ensure_ascii = false) const;
  /// Python's ==. TemplateError for lists or dicts nested past kMaxJsonDepth, or once the
  /// rendering's work budget is spent (work_meter.h), as for less, repr and to_json.
  bool equals(const Value& o) const;
  /// Python's <, for numbers and strings (and lists, element-wise); TemplateError otherwise.
  bool less(const Value& o) const;
  /// Identity of a list, dict or namespace (for `is` between shared values).
  const void* identity() const;
  std::string type_name() const;

 private:
  struct NoneTag {};
  struct NamespaceObj {
    std::shared_ptr<Object> o;
  };
  struct FunctionObj {
    std::shared_ptr<Function> f;
  };
  std::variant<std::monostate, NoneTag, bool, int64_t, double, std::string, std::shared_ptr<Array>,
               std::shared_ptr<Object>, NamespaceObj, FunctionObj>
      v_;
  void repr_into(std::string& out, int depth) const;
  bool equals_at(const Value& o, int depth) const;
  bool less_at(const Value& o, int depth) const;
  /// TemplateError once a walk is more than kMaxJsonDepth levels down.
  static void check_depth(int depth);

  std::string name_;  // an undefined value's name, or a function's
  std::string lazy_;  // a lazy sequence's type name
  bool markup_ = false;
  bool tuple_ = false;
};

/// markupsafe's escape: & < > " ' as HTML entities.
std::string html_escape(const std::string& s);

/// Python's repr of a float (shortest round trip: "1.0", "0.1", "1e-05").
std::string python_float(double d);

}  // namespace fdl::jinja
