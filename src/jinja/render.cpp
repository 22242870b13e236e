// The Jinja interpreter (template.h): statements write into one output string; expressions
// evaluate to Values with Python's semantics. Scopes: the context at the bottom; each for loop
// and macro call opens one (assignments inside stay there, as in Jinja2; namespaces carry
// values out); macros close over the scopes where they were defined.
#include "jinja/template.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <cmath>
#include <unordered_map>

#include "jinja/builtins.h"
#include "jinja/parser.h"
#include "jinja/work_meter.h"

namespace fdl::jinja {
namespace {

constexpr int64_t kMaxRange = 1 << 20;       // elements one range() may make
constexpr size_t kMaxString = WorkMeter::kMaxText;  // bytes of one string or of the output
constexpr int kMaxDepth = 256;               // nested macro calls
constexpr int64_t kMaxSteps = int64_t(1) << 21;  // loop iterations and macro calls of one rendering

[[noreturn]] void fail(int line, const std::string& what) {
  TemplateError e(what + (line > 0 ? " (template line " + std::to_string(line) + ")" : ""));
  e.located = line > 0;
  throw e;
}

// An error raised where no line is known (a builtin, the work budget) gets the line of the
// expression or statement it came from.
[[noreturn]] void locate(int line, const TemplateError& err) {
  if (err.located) throw err;
  fail(line, err.what());
}

std::string undefined_message(const Value& v) {
  const std::string& n = v.undefined_name();
  if (n.empty()) return "a value is undefined";
  return n.front() == '\'' ? n : "'" + n + "' is undefined";
}

using Scope = std::unordered_map<std::string, Value>;
using Scopes = std::vector<std::shared_ptr<Scope>>;

enum class Flow { Normal, Break, Continue };

class Renderer {
 public:
  Renderer(const Object& context, const RenderOptions& options) : options_(options) {
    auto root = std::make_shared<Scope>();
    for (const auto& [k, v] : context.items) {
      (*root)[k.to_string()] = v;
      input_bytes_ += input_bytes(k, 0) + input_bytes(v, 0);
    }
    add_globals(*root);
    scopes_.push_back(std::move(root));
  }

  // A namespace may hold itself (`{% set ns.me = ns %}`): emptied at the end, so no reference
  // cycle outlives the rendering.
  ~Renderer() {
    for (const Value& ns : namespaces_) ns.object().items.clear();
  }

  std::string run(const Body& body) {
    WorkMeter meter(WorkMeter::budget_for(input_bytes_));
    std::string out;
    exec(body, out);
    return out;
  }

 private:
  // ------------------------------------------------------------ names

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = (*it)->find(name);
      if (found != (*it)->end()) return found->second;
    }
    return Value::undefined(name);
  }
  void assign(const std::string& target, Value v, int line) {
    const size_t dot = target.find('.');
    if (dot == std::string::npos) {
      (*scopes_.back())[target] = std::move(v);
      return;
    }
    const Value ns = lookup(target.substr(0, dot));
    if (ns.kind() != Value::Kind::Namespace)
      fail(line, "cannot assign attribute on non-namespace object '" + target.substr(0, dot) + "'");
    ns.object().set(Value(target.substr(dot + 1)), std::move(v));
  }

  void add_globals(Scope& g) {
    g["range"] = Value::function(
        [](const Args& a) {
          int64_t start = 0, stop = 0, step = 1;
          if (a.pos.size() == 1) stop = a.pos[0].as_int();
          else if (a.pos.size() >= 2) start = a.pos[0].as_int(), stop = a.pos[1].as_int();
          if (a.pos.size() >= 3) step = a.pos[2].as_int();
          if (a.pos.empty() || a.pos.size() > 3) throw TemplateError("range expects 1 to 3 integers");
          if (step == 0) throw TemplateError("range() arg 3 must not be zero");
          Array out;
          for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
            if (int64_t(out.size()) >= kMaxRange) throw TemplateError("range() is too large for a template");
            WorkMeter::charge_elements(1);
            out.emplace_back(i);
          }
          return Value(std::move(out));
        },
        "range");
    g["namespace"] = Value::function(
        [this](const Args& a) {
          Object o;
          if (!a.pos.empty() && a.pos[0].kind() == Value::Kind::Object) o = a.pos[0].object();
          for (const auto& [k, v] : a.kw) o.set(Value(k), v);
          namespaces_.push_back(Value::namespace_of(std::move(o)));
          return namespaces_.back();
        },
        "namespace");
    g["dict"] = Value::function(
        [](const Args& a) {
          Object o;
          if (!a.pos.empty() && a.pos[0].kind() == Value::Kind::Object) o = a.pos[0].object();
          for (const auto& [k, v] : a.kw) o.set(Value(k), v);
          return Value(std::move(o));
        },
        "dict");
    g["raise_exception"] = Value::function(
        [](const Args& a) -> Value {
          TemplateError e(a.pos.empty() ? "raise_exception" : a.pos[0].to_string());
          e.located = true;  // the template's own message, as it wrote it
          throw e;
        },
        "raise_exception");
    const RenderOptions* opt = &options_;
    g["strftime_now"] = Value::function(
        [opt](const Args& a) {
          std::tm t{};
          if (opt->clock) {
            t = opt->clock();
          } else {
            const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
            localtime_r(&now, &t);
          }
          char buf[256];
          const size_t n = std::strftime(buf, sizeof buf, a.pos.empty() ? "" : a.pos[0].to_string().c_str(), &t);
          return Value(std::string(buf, n));
        },
        "strftime_now");
  }

  // ------------------------------------------------------------ statements

  Flow exec(const Body& body, std::string& out) {
    for (const NodePtr& n : body) {
      Flow f = Flow::Normal;
      try {
        f = exec(*n, out);
      } catch (const TemplateError& err) {
        locate(n->line, err);
      }
      if (f != Flow::Normal) return f;
      if (out.size() > kMaxString) fail(n->line, "the rendered text exceeds 64 MiB");
    }
    return Flow::Normal;
  }

  Flow exec(const Node& n, std::string& out) {
    switch (n.kind) {
      case Node::Kind::Text: out += n.text; return Flow::Normal;
      case Node::Kind::Output: out += eval(*n.expr).to_string(); return Flow::Normal;
      case Node::Kind::If:
        for (const auto& [cond, body] : n.branches)
          if (!cond || eval(*cond).truthy()) return exec(body, out);
        return Flow::Normal;
      case Node::Kind::For: return exec_for(n, out);
      case Node::Kind::Set: {
        Value v = eval(*n.expr);
        if (n.targets.size() == 1) {
          assign(n.targets[0], std::move(v), n.line);
        } else {
          const Array items = iterate(v);
          if (items.size() != n.targets.size())
            fail(n.line, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(n.targets.size()));
          for (size_t i = 0; i < items.size(); ++i) assign(n.targets[i], items[i], n.line);
        }
        return Flow::Normal;
      }
      case Node::Kind::SetBlock: {
        std::string text;
        exec(n.body, text);
        Value v(text);
        if (n.filter) v = apply_chain(*n.filter, v);
        assign(n.targets[0], v, n.line);
        return Flow::Normal;
      }
      case Node::Kind::Macro: assign(n.name, macro(n, ""), n.line); return Flow::Normal;
      case Node::Kind::CallBlock: {
        const Value caller = macro(n, "caller");
        const Expr& call = *n.expr;
        if (call.kind != Expr::Kind::Call) fail(n.line, "a call block needs a call");
        Args args = arguments(call);
        args.kw.emplace_back("caller", caller);
        out += callee(call, args).to_string();
        return Flow::Normal;
      }
      case Node::Kind::FilterBlock: {
        std::string text;
        exec(n.body, text);
        out += apply_chain(*n.filter, Value(text)).to_string();
        return Flow::Normal;
      }
      case Node::Kind::Block: return exec(n.body, out);
      case Node::Kind::Break: return Flow::Break;
      case Node::Kind::Continue: return Flow::Continue;
    }
    return Flow::Normal;
  }

  void bind_targets(const Node& n, const Value& item) {
    if (n.targets.size() == 1) {
      (*scopes_.back())[n.targets[0]] = item;
      return;
    }
    const Array parts = iterate(item);
    if (parts.size() != n.targets.size())
      fail(n.line, "cannot unpack " + std::to_string(parts.size()) + " values into " + std::to_string(n.targets.size()));
    for (size_t i = 0; i < parts.size(); ++i) (*scopes_.back())[n.targets[i]] = parts[i];
  }

  Flow exec_for(const Node& n, std::string& out) {
    Array items = iterate(eval(*n.expr));
    scopes_.push_back(std::make_shared<Scope>());
    struct Pop {
      Scopes& s;
      ~Pop() { s.pop_back(); }
    } pop{scopes_};
    if (n.filter) {
      Array kept;
      for (const Value& item : items) {
        bind_targets(n, item);
        if (eval(*n.filter).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      exec(n.else_body, out);
      return Flow::Normal;
    }
    const int64_t len = int64_t(items.size());
    for (int64_t i = 0; i < len; ++i) {
      spend(n.line);
      bind_targets(n, items[size_t(i)]);
      Object loop;
      loop.set(Value("index"), Value(i + 1));
      loop.set(Value("index0"), Value(i));
      loop.set(Value("revindex"), Value(len - i));
      loop.set(Value("revindex0"), Value(len - i - 1));
      loop.set(Value("first"), Value(i == 0));
      loop.set(Value("last"), Value(i == len - 1));
      loop.set(Value("length"), Value(len));
      loop.set(Value("previtem"), i > 0 ? items[size_t(i - 1)] : Value::undefined("loop.previtem"));
      loop.set(Value("nextitem"), i + 1 < len ? items[size_t(i + 1)] : Value::undefined("loop.nextitem"));
      loop.set(Value("cycle"), Value::function(
                                   [i](const Args& a) {
                                     if (a.pos.empty()) throw TemplateError("loop.cycle needs at least one value");
                                     return a.pos[size_t(i) % a.pos.size()];
                                   },
                                   "cycle"));
      (*scopes_.back())["loop"] = Value(std::move(loop));
      if (exec(n.body, out) == Flow::Break) break;
    }
    return Flow::Normal;
  }

  // A macro (or a call block's caller) as a function value closing over the current scopes.
  Value macro(const Node& n, const std::string& name) {
    // Weak references: the macro lives in one of these scopes, and strong ones would make a
    // cycle that keeps the rendering's values alive after it ends.
    std::vector<std::weak_ptr<Scope>> closure(scopes_.begin(), scopes_.end());
    const Node* node = &n;
    return Value::function(
        [this, node, closure](const Args& a) -> Value {
          if (depth_ >= kMaxDepth) fail(node->line, "macros nest deeper than " + std::to_string(kMaxDepth));
          spend(node->line);
          if (a.pos.size() > node->params.size())
            fail(node->line, "macro '" + node->name + "' takes not more than " + std::to_string(node->params.size()) +
                                 " argument(s)");
          for (const auto& [k, v] : a.kw) {
            bool known = k == "caller";
            for (const auto& p : node->params) known = known || p.first == k;
            if (!known) fail(node->line, "macro '" + node->name + "' takes no keyword argument '" + k + "'");
          }
          Scopes saved = std::move(scopes_);
          scopes_.clear();
          for (const auto& w : closure)
            if (auto sp = w.lock()) scopes_.push_back(std::move(sp));
          auto frame = std::make_shared<Scope>();
          for (size_t i = 0; i < node->params.size(); ++i) {
            const auto& [pname, def] = node->params[i];
            const Value* given = a.get(i, pname);
            (*frame)[pname] = given ? *given : def ? eval(*def) : Value::undefined(pname);
          }
          for (const auto& [k, v] : a.kw)
            if (k == "caller") (*frame)["caller"] = v;
          scopes_.push_back(frame);
          ++depth_;
          std::string text;
          try {
            exec(node->body, text);
          } catch (...) {
            --depth_;
            scopes_ = std::move(saved);
            throw;
          }
          --depth_;
          scopes_ = std::move(saved);
          return Value(text);
        },
        name.empty() ? n.name : name);
  }

  // A filter chain parsed around a placeholder literal (set blocks, filter blocks), applied to v.
  Value apply_chain(const Expr& chain, const Value& v) {
    if (chain.kind != Expr::Kind::Filter) return v;
    const Value subject = apply_chain(*chain.kids[0], v);
    return apply_filter(chain.name, subject, arguments(chain, 1));
  }

  // ------------------------------------------------------------ expressions

  Args arguments(const Expr& e, size_t first = 1) {
    Args a;
    for (size_t i = first; i < e.kids.size(); ++i) a.pos.push_back(eval(*e.kids[i]));
    for (const auto& [k, v] : e.kw) a.kw.emplace_back(k, eval(*v));
    return a;
  }

  // obj.name: as Jinja2's sandbox, a dict's methods before its keys (`tool.items` is the method
  // even where a key "items" exists), then the key; other objects' items and methods.
  Value attribute(const Value& obj, const std::string& name, int line) {
    if (obj.is_undefined()) fail(line, undefined_message(obj));
    if (obj.kind() == Value::Kind::Object && has_method(obj, name))
      return Value::function([obj, name](const Args& a) { return call_method(obj, name, a); }, name);
    if (obj.is_mapping()) {
      if (const Value* v = obj.object().find(Value(name))) return *v;
    } else if (obj.is_list() && !name.empty() && std::isdigit(static_cast<unsigned char>(name[0]))) {
      const size_t i = size_t(std::atoll(name.c_str()));
      if (i < obj.array().size()) return obj.array()[i];
    }
    if (has_method(obj, name)) {
      return Value::function([obj, name](const Args& a) { return call_method(obj, name, a); }, name);
    }
    return Value::undefined("'" + std::string(obj.kind() == Value::Kind::Object ? "dict" : obj.type_name()) +
                            " object' has no attribute '" + name + "'");
  }

  Value item(const Value& obj, const Value& key, int line) {
    if (obj.is_undefined()) fail(line, undefined_message(obj));
    if (obj.is_mapping()) {
      if (const Value* v = obj.object().find(key)) return *v;
      if (key.is_string() && has_method(obj, key.str())) return attribute(obj, key.str(), line);
      return Value::undefined("'dict object' has no attribute " + key.repr());
    }
    if (obj.is_lazy()) fail(line, "'" + obj.type_name() + "' object is not subscriptable");
    if (obj.is_list() || obj.is_string()) {
      if (!key.is_number()) {
        if (key.is_string()) return attribute(obj, key.str(), line);
        fail(line, obj.type_name() + " indices must be integers");
      }
      const Array all = obj.is_list() ? Array{} : iterate(obj);
      const Array& seq = obj.is_list() ? obj.array() : all;
      int64_t i = key.as_int();
      if (i < 0) i += int64_t(seq.size());
      if (i < 0 || i >= int64_t(seq.size())) return Value::undefined(obj.type_name() + " index out of range");
      return seq[size_t(i)];
    }
    // Jinja2's getitem: anything else is undefined (it fails only when used).
    return Value::undefined("'" + obj.type_name() + "' object is not subscriptable");
  }

  Value slice(const Value& obj, const Expr& e) {
    if (obj.is_undefined()) fail(e.line, undefined_message(obj));
    if (!obj.is_list() && !obj.is_string()) fail(e.line, "'" + obj.type_name() + "' object is not subscriptable");
    if (obj.is_list()) WorkMeter::charge_elements(int64_t(obj.array().size()));  // copied below
    const Array seq = obj.is_list() ? obj.array() : iterate(obj);
    const int64_t n = int64_t(seq.size());
    auto part = [&](size_t k) -> std::optional<int64_t> {
      if (!e.kids[k]) return std::nullopt;
      const Value v = eval(*e.kids[k]);
      if (v.is_none()) return std::nullopt;
      return v.as_int();
    };
    const int64_t step = part(3).value_or(1);
    if (step == 0) fail(e.line, "slice step cannot be zero");
    auto clamp = [&](std::optional<int64_t> v, int64_t def) {
      if (!v) return def;
      int64_t x = *v;
      if (x < 0) x += n;
      if (step > 0) return std::clamp<int64_t>(x, 0, n);
      return std::clamp<int64_t>(x, -1, n - 1);
    };
    const int64_t start = clamp(part(1), step > 0 ? 0 : n - 1), stop = clamp(part(2), step > 0 ? n : -1);
    Array out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(seq[size_t(i)]);
    if (obj.is_list()) return Value(std::move(out));
    std::string s;
    for (const Value& c : out) s += c.str();
    return Value(s);
  }

  Value callee(const Expr& call, const Args& args) {
    const Expr& f = *call.kids[0];
    if (f.kind == Expr::Kind::Attr) {  // a method call: no bound function value needed
      const Value obj = eval(*f.kids[0]);
      if (obj.is_undefined()) fail(call.line, undefined_message(obj));
      const bool dict_method = obj.kind() == Value::Kind::Object && has_method(obj, f.name);
      const Value* member = obj.is_mapping() && !dict_method ? obj.object().find(Value(f.name)) : nullptr;
      if (!member && has_method(obj, f.name)) return call_method(obj, f.name, args);
    }
    const Value fn = eval(f);
    if (fn.kind() != Value::Kind::Function) {
      if (fn.is_undefined()) fail(call.line, undefined_message(fn));
      fail(call.line, "'" + fn.type_name() + "' object is not callable");
    }
    return fn.fn()(args);
  }

  Value arithmetic(const std::string& op, const Value& a, const Value& b, int line) {
    using K = Value::Kind;
    if (a.is_undefined()) fail(line, undefined_message(a));
    if (b.is_undefined()) fail(line, undefined_message(b));
    const bool ints = (a.kind() == K::Int || a.kind() == K::Bool) && (b.kind() == K::Int || b.kind() == K::Bool);
    auto bad = [&]() -> Value {
      fail(line, "unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
    };
    if (op == "+") {
      if (a.is_string() && b.is_string()) {
        if (a.str().size() + b.str().size() > kMaxString) fail(line, "a string longer than 64 MiB");
        WorkMeter::charge_copy(int64_t(a.str().size() + b.str().size()));
        if (a.is_markup() || b.is_markup())  // Markup + str escapes the plain side (markupsafe)
          return Value::markup((a.is_markup() ? a.str() : html_escape(a.str())) + (b.is_markup() ? b.str() : html_escape(b.str())));
        return Value(a.str() + b.str());
      }
      if (a.is_list() && b.is_list()) {
        if (a.array().size() + b.array().size() > size_t(kMaxRange)) fail(line, "a list too long for a template");
        WorkMeter::charge_elements(int64_t(a.array().size() + b.array().size()));
        Array out = a.array();
        out.insert(out.end(), b.array().begin(), b.array().end());
        return Value(std::move(out));
      }
      if (a.is_string() || b.is_string())
        fail(line, a.is_string() ? "can only concatenate str (not \"" + b.type_name() + "\") to str" : "unsupported operand type(s) for +: '" + a.type_name() + "' and 'str'");
      if (!a.is_number() || !b.is_number()) return bad();
      if (!ints) return Value(a.as_double() + b.as_double());
      int64_t r;
      if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) fail(line, "integer overflow");
      return Value(r);
    }
    if (op == "*" && (a.is_string() || a.is_list() || b.is_string() || b.is_list())) {
      const Value& seq = a.is_string() || a.is_list() ? a : b;
      const Value& count = &seq == &a ? b : a;
      if (count.kind() != K::Int && count.kind() != K::Bool) return bad();
      const int64_t times = std::max<int64_t>(0, count.as_int());
      const bool empty = seq.is_string() ? seq.str().empty() : seq.array().empty();
      if (times == 0 || empty) return seq.is_string() ? Value(std::string()) : seq.is_tuple() ? Value::tuple({}) : Value(Array{});
      if (seq.is_string()) {
        if (!seq.str().empty() && size_t(times) > kMaxString / seq.str().size()) fail(line, "a string longer than 64 MiB");
        WorkMeter::charge_copy(times * int64_t(seq.str().size()));
        std::string out;
        for (int64_t i = 0; i < times; ++i) out += seq.str();
        return Value(out);
      }
      if (!seq.array().empty() && size_t(times) > size_t(kMaxRange) / seq.array().size())
        fail(line, "a list too long for a template");
      WorkMeter::charge_elements(times * int64_t(seq.array().size()));
      Array out;
      for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.array().begin(), seq.array().end());
      return seq.is_tuple() ? Value::tuple(std::move(out)) : Value(std::move(out));
    }
    if (op == "%" && a.is_string()) return Value(percent_format(a.str(), b, line));
    if (!a.is_number() || !b.is_number()) return bad();
    if ((op == "-" || op == "*") && ints) {
      int64_t r;
      if (op == "-" ? __builtin_sub_overflow(a.as_int(), b.as_int(), &r) : __builtin_mul_overflow(a.as_int(), b.as_int(), &r))
        fail(line, "integer overflow");
      return Value(r);
    }
    if (op == "-") return Value(a.as_double() - b.as_double());
    if (op == "*") return Value(a.as_double() * b.as_double());
    if (op == "/") {
      if (b.as_double() == 0) fail(line, "division by zero");
      return Value(a.as_double() / b.as_double());
    }
    if (op == "//" || op == "%") {
      if (b.as_double() == 0) fail(line, "integer division or modulo by zero");
      if (ints) {
        const int64_t x = a.as_int(), y = b.as_int();
        if (x == INT64_MIN && y == -1) fail(line, "integer overflow");
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) --q, r += y;
        return op == "//" ? Value(q) : Value(r);
      }
      const double x = a.as_double(), y = b.as_double();
      const double q = std::floor(x / y);
      return op == "//" ? Value(q) : Value(x - q * y);
    }
    if (op == "**") {
      if (ints && b.as_int() >= 0) {
        const int64_t x = a.as_int(), y = b.as_int();
        if (x == 0 || x == 1) return Value(int64_t(y == 0 ? 1 : x));
        if (x == -1) return Value(int64_t(y % 2 == 0 ? 1 : -1));
        int64_t r = 1;  // |x| >= 2: at most 63 multiplications before an overflow
        for (int64_t i = 0; i < y; ++i)
          if (__builtin_mul_overflow(r, x, &r)) fail(line, "integer overflow");
        return Value(r);
      }
      return Value(std::pow(a.as_double(), b.as_double()));
    }
    return bad();
  }

  // printf-style "%s" % x, with a tuple/list of values or one value.
  std::string percent_format(const std::string& f, const Value& args, int line) {
    const Array vals = args.is_tuple() ? args.array() : Array{args};  // Python: only a tuple is several values
    size_t k = 0;
    std::string out;
    WorkMeter::make_text(f.size());
    for (size_t i = 0; i < f.size(); ++i) {
      if (f[i] != '%') {
        out += f[i];
        continue;
      }
      if (++i >= f.size()) fail(line, "incomplete format");
      if (f[i] == '%') {
        out += '%';
        continue;
      }
      if (k >= vals.size()) fail(line, "not enough arguments for format string");
      const Value& v = vals[k++];
      switch (f[i]) {
        case 's': WorkMeter::append_text(out, v.to_string()); break;
        case 'r': WorkMeter::append_text(out, v.repr()); break;
        case 'd':
        case 'i': out += std::to_string(v.kind() == Value::Kind::Float ? int64_t(v.as_double()) : v.as_int()); break;
        case 'f': {
          char b[64];
          std::snprintf(b, sizeof b, "%f", v.as_double());
          out += b;
          break;
        }
        default: fail(line, std::string("unsupported format character '") + f[i] + "'");
      }
    }
    return out;
  }

  bool contains(const Value& hay, const Value& needle, int line) {
    if (hay.is_string()) {
      if (!needle.is_string()) fail(line, "'in <string>' requires string as left operand, not " + needle.type_name());
      return WorkMeter::find_text(hay.str(), needle.str()) != std::string::npos;
    }
    if (hay.is_mapping()) return hay.object().find(needle) != nullptr;
    if (hay.kind() == Value::Kind::Array) {
      for (const Value& e : hay.array())
        if (e.equals(needle)) return true;
      return false;
    }
    if (hay.is_undefined()) return false;
    fail(line, "argument of type '" + hay.type_name() + "' is not iterable");
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::Literal: return e.value;
      case Expr::Kind::Name: return lookup(e.name);
      case Expr::Kind::Attr: return attribute(eval(*e.kids[0]), e.name, e.line);
      case Expr::Kind::Item: return item(eval(*e.kids[0]), eval(*e.kids[1]), e.line);
      case Expr::Kind::Slice: return slice(eval(*e.kids[0]), e);
      case Expr::Kind::Call: return callee(e, arguments(e));
      case Expr::Kind::Filter: {
        const Value subject = eval(*e.kids[0]);
        try {
          return apply_filter(e.name, subject, arguments(e));
        } catch (const TemplateError& err) {
          locate(e.line, err);
        }
      }
      case Expr::Kind::Test: {
        const Value subject = eval(*e.kids[0]);
        try {
          return Value(apply_test(e.name, subject, arguments(e)) != e.negate);
        } catch (const TemplateError& err) {
          locate(e.line, err);
        }
      }
      case Expr::Kind::Not: return Value(!eval(*e.kids[0]).truthy());
      case Expr::Kind::Neg:
      case Expr::Kind::Pos: {
        const Value v = eval(*e.kids[0]);
        if (!v.is_number()) fail(e.line, "bad operand type for unary " + std::string(e.kind == Expr::Kind::Neg ? "-" : "+") + ": '" + v.type_name() + "'");
        if (e.kind == Expr::Kind::Pos) return v;
        return v.kind() == Value::Kind::Float ? Value(-v.as_double()) : Value(-v.as_int());
      }
      case Expr::Kind::And: {
        Value a = eval(*e.kids[0]);
        return a.truthy() ? eval(*e.kids[1]) : a;
      }
      case Expr::Kind::Or: {
        Value a = eval(*e.kids[0]);
        return a.truthy() ? a : eval(*e.kids[1]);
      }
      case Expr::Kind::Cond:
        if (eval(*e.kids[1]).truthy()) return eval(*e.kids[0]);
        return e.kids[2] ? eval(*e.kids[2]) : Value::undefined("");
      case Expr::Kind::List:
      case Expr::Kind::Tuple: {
        Array a;
        for (const auto& k : e.kids) a.push_back(eval(*k));
        return e.kind == Expr::Kind::Tuple ? Value::tuple(std::move(a)) : Value(std::move(a));
      }
      case Expr::Kind::Dict: {
        Object o;
        for (size_t i = 0; i + 1 < e.kids.size(); i += 2) o.set(eval(*e.kids[i]), eval(*e.kids[i + 1]));
        return Value(std::move(o));
      }
      case Expr::Kind::Binary: {
        const Value a = eval(*e.kids[0]), b = eval(*e.kids[1]);
        const std::string& op = e.name;
        if (op == "==") return Value(a.equals(b));
        if (op == "!=") return Value(!a.equals(b));
        if (op == "in") return Value(contains(b, a, e.line));
        if (op == "not in") return Value(!contains(b, a, e.line));
        if (op == "~") {
          std::string s = a.to_string() + b.to_string();
          if (s.size() > kMaxString) fail(e.line, "a string longer than 64 MiB");
          WorkMeter::charge_copy(int64_t(s.size()));
          return Value(std::move(s));
        }
        if (op == "<" || op == ">" || op == "<=" || op == ">=") {
          if (a.is_undefined()) fail(e.line, undefined_message(a));
          if (b.is_undefined()) fail(e.line, undefined_message(b));
          try {
            if (op == "<") return Value(a.less(b));
            if (op == ">") return Value(b.less(a));
            if (op == "<=") return Value(!b.less(a));
            return Value(!a.less(b));
          } catch (const TemplateError& err) {
            locate(e.line, err);
          }
        }
        return arithmetic(op, a, b, e.line);
      }
    }
    fail(e.line, "an unknown expression");
  }

  // One unit of the rendering's work budget (loop iterations, macro calls): no template may
  // spin for long, whatever nesting it builds.
  void spend(int line) {
    if (++steps_ > kMaxSteps) fail(line, "the template does too much work (over 2M loop iterations and macro calls)");
    WorkMeter::charge_elements(1);
  }

  // The size of the rendering's variables, which its work budget grows with: string bytes and
  // WorkMeter::kElement per element. The variables come from JSON (chat_context): no deeper than
  // Value::kMaxJsonDepth, no namespaces, no cycles.
  static int64_t input_bytes(const Value& v, int depth) {
    if (depth > Value::kMaxJsonDepth) return 0;
    switch (v.kind()) {
      case Value::Kind::String: return int64_t(v.str().size());
      case Value::Kind::Array: {
        int64_t n = WorkMeter::kElement;
        for (const Value& e : v.array()) n += WorkMeter::kElement + input_bytes(e, depth + 1);
        return n;
      }
      case Value::Kind::Object: {
        int64_t n = WorkMeter::kElement;
        for (const auto& [k, e] : v.object().items) n += WorkMeter::kElement + input_bytes(k, depth + 1) + input_bytes(e, depth + 1);
        return n;
      }
      default: return WorkMeter::kElement;
    }
  }

  const RenderOptions& options_;
  int64_t input_bytes_ = 0;
  Scopes scopes_;
  std::vector<Value> namespaces_;  // every namespace() of the rendering
  int depth_ = 0;
  int64_t steps_ = 0;
};

}  // namespace

Object chat_context(const nlohmann::ordered_json& vars) {
  if (!vars.is_object()) throw TemplateError("the template's variables must be a JSON object");
  if (vars.contains("messages") && !vars["messages"].is_array()) throw TemplateError("'messages' must be a list");
  Object ctx;
  for (const char* absent_none : {"tools", "documents"}) ctx.set(Value(absent_none), Value::none());
  ctx.set(Value("add_generation_prompt"), Value(false));
  for (const auto& [k, v] : vars.items()) ctx.set(Value(k), Value::from_json(v));
  return ctx;
}

Template::Template(std::string_view source) : body_(std::make_shared<const Body>(parse_template(source))) {}

std::string Template::render(const Object& context, const RenderOptions& options) const {
  return Renderer(context, options).run(*body_);
}

}  // namespace fdl::jinja
