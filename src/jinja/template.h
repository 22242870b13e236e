// template.h — Jinja chat templates, parsed once and rendered many times, as Hugging Face
// Transformers renders them (jinja2's ImmutableSandboxedEnvironment with trim_blocks and
// lstrip_blocks, the loop controls, `raise_exception`, `strftime_now`, and `tojson` as
// json.dumps with ensure_ascii=False). The interpreter is the project's own (parser.h,
// builtins.h, value.h): templates run in a sandbox that can only compute on the values given
// to it (no file, network or attribute access beyond dict keys and the string/list/dict
// methods of builtins.h), lists and dicts are immutable, and a rendering's work is bounded:
// 2M loop iterations and macro calls, macros nested 256 deep, strings and the output 64 MiB,
// ranges and lists 1M items, values walked no deeper than 512, integers checked for overflow,
// and a work budget over all walks of values that grows with the variables' size
// (work_meter.h); the parser refuses nesting deeper than 200.
//
// Errors: TemplateError (value.h) for a syntax error (naming the line), a failed operation
// (an undefined value's attribute, a type error, an unknown filter), or raise_exception's
// message. Thread-safety: a Template is immutable after construction; render is const and
// may run concurrently.
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "jinja/ast.h"
#include "jinja/value.h"

namespace fdl::jinja {

struct RenderOptions {
  /// The local time strftime_now formats; unset: the system clock at the call.
  std::function<std::tm()> clock;
};

/// The variables Transformers gives a chat template, from a JSON object of them: every key
/// becomes a variable (messages, tools, add_generation_prompt, bos_token, eos_token, and any
/// template option such as enable_thinking), with `tools` and `documents` None and
/// `add_generation_prompt` false where absent. Throws TemplateError if `vars` is not an object
/// or `messages` is present and not a list.
Object chat_context(const nlohmann::ordered_json& vars);

class Template {
 public:
  /// Parses `source`; throws TemplateError for a syntax error.
  explicit Template(std::string_view source);

  /// Renders with the variables of `context` (a dict: names to values).
  std::string render(const Object& context, const RenderOptions& options = {}) const;

 private:
  std::shared_ptr<const Body> body_;
};

}  // namespace fdl::jinja
