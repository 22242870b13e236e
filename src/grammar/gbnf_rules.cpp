// RuleSet and the repetition helper (see gbnf_rules.h).
#include "grammar/gbnf_rules.h"

#include <algorithm>
#include <stdexcept>

#include "flashdllm/grammar.h"

namespace fdl::grammar {
namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

// Counts up to this are written as x{m,n}; the compiler expands them into copies.
constexpr uint64_t kDirectCount = 100;

std::string quantified(std::string_view primary, uint64_t min, uint64_t max) {
  const std::string x(primary);
  if (max == 0) return "";
  if (min == 1 && max == 1) return x;
  if (min == 0 && max == 1) return x + "?";
  if (max == kUnbounded) {
    if (min == 0) return x + "*";
    if (min == 1) return x + "+";
    return x + "{" + std::to_string(min) + ",}";
  }
  if (min == max) return x + "{" + std::to_string(min) + "}";
  return x + "{" + std::to_string(min) + "," + std::to_string(max) + "}";
}

std::string join(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + " " + b;
}

// x exactly n times.
std::string exactly(RuleSet& rules, const std::string& x, uint64_t n, std::string_view hint, const std::string& where) {
  if (n <= kDirectCount) return quantified(x, n, n);
  const std::string block = rules.add(hint, quantified(x, kDirectCount, kDirectCount), where);
  return join(exactly(rules, block, n / kDirectCount, hint, where), quantified(x, n % kDirectCount, n % kDirectCount));
}

// x zero to n times.
std::string up_to(RuleSet& rules, const std::string& x, uint64_t n, std::string_view hint, const std::string& where) {
  if (n <= kDirectCount) return quantified(x, 0, n);
  // n = 100q + r: (x{100}){0,q-1} then x{0,100+r} reaches every count 0..n.
  const uint64_t q = n / kDirectCount, r = n % kDirectCount;
  const std::string block = rules.add(hint, quantified(x, kDirectCount, kDirectCount), where);
  return join(up_to(rules, block, q - 1, hint, where), quantified(x, 0, kDirectCount + r));
}

}  // namespace

std::string RuleSet::sanitize(std::string_view hint) {
  std::string out;
  for (const char c : hint) {
    if (is_name_char(c) && c != '-') {
      out += c;
    } else if (!out.empty() && out.back() != '-') {
      out += '-';
    }
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  size_t from = out.size() > 48 ? out.size() - 48 : 0;  // the innermost part says the most
  while (from < out.size() && out[from] == '-') ++from;
  return from < out.size() ? out.substr(from) : std::string(1, 'r');
}

std::string RuleSet::fresh_name(std::string_view hint) {
  std::string base = sanitize(hint);
  // "root" and "json-..." belong to the fixed rules.
  if (base == "root" || base.rfind("json-", 0) == 0) base = "s-" + base;
  if (!has(base) && next_suffix_.count(base) == 0) {
    next_suffix_[base] = 1;
    return base;
  }
  for (uint32_t& n = next_suffix_[base];;) {
    std::string name = base + "-" + std::to_string(++n);
    if (!has(name)) return name;
  }
}

void RuleSet::check_caps(size_t extra, const std::string& where) const {
  if (bytes_ + extra > kMaxBytes)
    throw GrammarError(where, "the schema's grammar would exceed 1 MiB of GBNF");
  if (rules_.size() + 1 >= kMaxRules)  // one more is kept for the root rule
    throw GrammarError(where, "the schema's grammar would exceed " + std::to_string(kMaxRules) + " rules");
}

std::string RuleSet::add(std::string_view hint, const std::string& body, const std::string& where) {
  if (const auto it = by_body_.find(body); it != by_body_.end()) return it->second;
  std::string name = fresh_name(hint);
  check_caps(name.size() + body.size() + 6, where);
  index_[name] = rules_.size();
  rules_.push_back(Rule{name, body, true, true});
  by_body_[body] = name;
  bytes_ += name.size() + body.size() + 6;
  return name;
}

std::string RuleSet::reserve(std::string_view hint, const std::string& where) {
  std::string name = fresh_name(hint);
  check_caps(name.size() + 6, where);
  index_[name] = rules_.size();
  rules_.push_back(Rule{name, "", false, false});
  bytes_ += name.size() + 6;
  return name;
}

void RuleSet::define(const std::string& name, const std::string& body, const std::string& where) {
  const auto it = index_.find(name);
  if (it == index_.end() || rules_[it->second].defined) throw std::logic_error("RuleSet::define: " + name);
  check_caps(body.size(), where);
  rules_[it->second].body = body;
  rules_[it->second].defined = true;
  bytes_ += body.size();
}

void RuleSet::define_fixed(const std::string& name, const std::string& body, const std::string& where) {
  if (has(name)) return;
  check_caps(name.size() + body.size() + 6, where);
  index_[name] = rules_.size();
  rules_.push_back(Rule{name, body, true, false});
  bytes_ += name.size() + body.size() + 6;
}

void RuleSet::rollback(size_t mark) {
  while (rules_.size() > mark) {
    const Rule& r = rules_.back();
    if (r.shared) by_body_.erase(r.body);
    index_.erase(r.name);
    bytes_ -= r.name.size() + r.body.size() + 6;
    rules_.pop_back();
  }
}

std::string RuleSet::text() const {
  std::string out;
  out.reserve(bytes_);
  for (const Rule& r : rules_) {
    if (!r.defined) throw std::logic_error("RuleSet::text: rule " + r.name + " was reserved but never defined");
    out += r.name;
    out += " ::= ";
    out += r.body;
    out += '\n';
  }
  return out;
}

bool is_primary(std::string_view e) {
  if (e.empty()) return false;
  size_t i = 0;
  const char c = e[0];
  if (is_name_char(c)) {
    while (i < e.size() && is_name_char(e[i])) ++i;
    return i == e.size();
  }
  if (c == '.') return e.size() == 1;
  if (c == '"' || c == '[') {
    const char close = c == '"' ? '"' : ']';
    for (i = 1; i < e.size(); ++i) {
      if (e[i] == '\\') {
        ++i;
      } else if (e[i] == close) {
        return i + 1 == e.size();
      }
    }
    return false;
  }
  if (c == '(') {
    // The group closes at the end only if the depth returns to zero there first.
    int depth = 0;
    for (i = 0; i < e.size(); ++i) {
      const char d = e[i];
      if (d == '"' || d == '[') {
        const char close = d == '"' ? '"' : ']';
        for (++i; i < e.size() && e[i] != close; ++i)
          if (e[i] == '\\') ++i;
      } else if (d == '(') {
        ++depth;
      } else if (d == ')') {
        if (--depth == 0) return i + 1 == e.size();
      }
    }
    return false;
  }
  return false;
}

std::string as_primary(std::string_view expr) {
  if (is_primary(expr)) return std::string(expr);
  return cat("(", expr, ")");
}

std::string repeat(RuleSet& rules, std::string_view expr, uint64_t min, uint64_t max, std::string_view hint,
                   const std::string& where) {
  if (max != kUnbounded && max < min) throw std::logic_error("repeat: max < min");
  if (max == 0 || expr.empty()) return "";
  std::string x = as_primary(expr);
  // The compiler copies the repeated unit item by item (at most 10,000 items in all); a
  // long unit becomes a rule, one item however long.
  const bool is_name = std::all_of(x.begin(), x.end(), is_name_char);
  if (max > 1 && !is_name && x.size() > 32) x = rules.add(hint, std::string(expr), where);
  if (min <= kDirectCount && (max == kUnbounded || max <= kDirectCount)) return quantified(x, min, max);
  // Helper rules refer to x by name.
  if (!std::all_of(x.begin(), x.end(), is_name_char)) x = rules.add(hint, std::string(expr), where);
  const std::string head = exactly(rules, x, min, hint, where);
  if (max == kUnbounded) return join(head, x + "*");
  return join(head, up_to(rules, x, max - min, hint, where));
}

}  // namespace fdl::grammar
