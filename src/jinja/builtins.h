// builtins.h — Jinja2's filters and tests and the Python methods of strings, lists and dicts
// that chat templates call, with Transformers' `tojson` (json.dumps with ensure_ascii=False).
// Methods that would mutate a list or dict are refused, as Jinja2's immutable sandbox refuses
// them. Each throws TemplateError for a wrong argument or an unknown name.
#pragma once

#include <string>

#include "jinja/value.h"

namespace fdl::jinja {

/// `subject | name(args)`. An unknown name fails only when a rendering reaches it (as in
/// Jinja2, which renders a template whose unknown filter sits in a branch not taken).
Value apply_filter(const std::string& name, const Value& subject, const Args& args);
/// `subject is name(args)`.
bool apply_test(const std::string& name, const Value& subject, const Args& args);
/// Whether `obj.name` is a method of obj's type (strings, lists, dicts).
bool has_method(const Value& obj, const std::string& name);
/// `obj.name(args)`.
Value call_method(const Value& obj, const std::string& name, const Args& args);
/// `obj[key]` / `obj.attr` lookups for filters (map, selectattr, sort, ...): a dotted path of
/// keys and integer indices; undefined where absent.
Value lookup_path(const Value& obj, const std::string& path);
/// Python's len() in code points for strings.
size_t python_len(const Value& v);
/// The items a for loop or list() visits: a list's elements, a string's characters, a dict's
/// keys; an undefined value visits nothing; TemplateError for anything else.
Array iterate(const Value& v);

}  // namespace fdl::jinja
