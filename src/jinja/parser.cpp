// Jinja source to syntax tree (parser.h): the tags and text with their whitespace rules, then a
// recursive-descent parser of statements and of expressions with Jinja2's precedence (lowest
// first): `x if c else y`, or, and, not, comparisons (== != < > <= >= in, not in), + -, ~,
// * / // %, **, unary - +, then primaries with their postfixes (.attr, [item], [a:b:c], calls)
// and filters (| f) and tests (is [not] t).
#include "jinja/parser.h"

#include <cctype>
#include <cstdlib>
#include <string>


namespace fdl::jinja {
namespace {

[[noreturn]] void fail(int line, const std::string& what) {
  throw TemplateError("template syntax error at line " + std::to_string(line) + ": " + what);
}

// ---------------------------------------------------------------- tags and text

struct Piece {
  enum class Kind { Text, Var, Block } kind;
  std::string src;
  int line;
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// The end of a tag opened at `from` (just past its opener): the position of `close`, outside
// string literals.
// outside string literals and, as Jinja2's lexer balances them, outside brackets: `{{ {"a":
// {"b": 1}} }}` closes at the last `}}`.
size_t tag_end(std::string_view s, size_t from, std::string_view close, int line) {
  char quote = 0;
  int depth = 0;
  for (size_t i = from; i < s.size(); ++i) {
    const char c = s[i];
    if (quote) {
      if (c == '\\') ++i;
      else if (c == quote) quote = 0;
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (depth == 0 && s.compare(i, close.size(), close) == 0) {
      return i;
    } else if (c == '(' || c == '[' || c == '{') {
      ++depth;
    } else if ((c == ')' || c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  fail(line, "a tag is not closed (missing '" + std::string(close) + "')");
}

std::vector<Piece> segment(std::string_view s) {
  std::vector<Piece> out;
  size_t pos = 0;
  int line = 1;
  size_t line_counted = 0;
  auto line_at = [&](size_t p) {
    for (; line_counted < p; ++line_counted)
      if (s[line_counted] == '\n') ++line;
    return line;
  };
  bool strip_next = false, drop_newline = false;
  while (pos <= s.size()) {
    size_t open = s.find('{', pos);
    while (open != std::string_view::npos && open + 1 < s.size() && s[open + 1] != '{' && s[open + 1] != '%' &&
           s[open + 1] != '#')
      open = s.find('{', open + 1);
    if (open != std::string_view::npos && open + 1 >= s.size()) open = std::string_view::npos;
    std::string text(s.substr(pos, open == std::string_view::npos ? std::string_view::npos : open - pos));
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && is_space(text[k])) ++k;
      text.erase(0, k);
    } else if (drop_newline) {
      if (text.rfind("\r\n", 0) == 0) text.erase(0, 2);
      else if (!text.empty() && text[0] == '\n') text.erase(0, 1);
    }
    strip_next = drop_newline = false;
    if (open == std::string_view::npos) {
      if (!text.empty()) out.push_back({Piece::Kind::Text, text, line_at(pos)});
      break;
    }
    const char kind = s[open + 1];
    const int tag_line = line_at(open);
    size_t inner = open + 2;
    const bool minus_left = inner < s.size() && s[inner] == '-', plus_left = inner < s.size() && s[inner] == '+';
    if (minus_left || plus_left) ++inner;
    if (minus_left) {
      while (!text.empty() && is_space(text.back())) text.pop_back();
    } else if (kind != '{' && !plus_left) {  // lstrip_blocks: a block tag alone at a line's start
      size_t j = open;
      while (j > 0 && (s[j - 1] == ' ' || s[j - 1] == '\t')) --j;
      if (j == 0 || s[j - 1] == '\n') {
        size_t k = text.size(), n = open - j;
        while (n > 0 && k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k, --n;
        text.erase(k);
      }
    }
    if (!text.empty()) out.push_back({Piece::Kind::Text, text, line_at(pos)});
    const std::string_view close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t end;
    if (kind == '#') {
      end = s.find("#}", inner);
      if (end == std::string_view::npos) fail(tag_line, "a comment is not closed (missing '#}')");
    } else {
      end = tag_end(s, inner, close, tag_line);
    }
    std::string body(s.substr(inner, end - inner));
    bool minus_right = false, plus_right = false;
    if (!body.empty() && body.back() == '-') minus_right = true, body.pop_back();
    else if (!body.empty() && body.back() == '+') plus_right = true, body.pop_back();
    pos = end + 2;
    strip_next = minus_right;
    drop_newline = kind != '{' && !minus_right && !plus_right;
    if (kind == '#') continue;
    if (kind == '%') {
      // {% raw %} ... {% endraw %}: the text between, verbatim.
      size_t a = 0;
      while (a < body.size() && is_space(body[a])) ++a;
      size_t b = body.size();
      while (b > a && is_space(body[b - 1])) --b;
      if (body.substr(a, b - a) == "raw") {
        size_t search = pos;
        for (;;) {
          const size_t t = s.find("{%", search);
          if (t == std::string_view::npos) fail(tag_line, "'raw' is not closed (missing 'endraw')");
          size_t k = t + 2;
          const bool m = k < s.size() && (s[k] == '-' || s[k] == '+');
          if (m) ++k;
          while (k < s.size() && is_space(s[k])) ++k;
          if (s.compare(k, 6, "endraw") == 0) {
            std::string raw(s.substr(pos, t - pos));
            if (drop_newline && !raw.empty() && raw[0] == '\n') raw.erase(0, 1);
            if (m && s[t + 2] == '-')
              while (!raw.empty() && is_space(raw.back())) raw.pop_back();
            if (!raw.empty()) out.push_back({Piece::Kind::Text, raw, tag_line});
            const size_t close_at = tag_end(s, k, "%}", tag_line);
            strip_next = close_at > 0 && s[close_at - 1] == '-';
            drop_newline = !strip_next;
            pos = close_at + 2;
            break;
          }
          search = t + 2;
        }
        continue;
      }
    }
    out.push_back({kind == '{' ? Piece::Kind::Var : Piece::Kind::Block, body, tag_line});
  }
  return out;
}

// ---------------------------------------------------------------- expression tokens

struct Tok {
  enum class T { Name, Str, Int, Float, Op, End } t;
  std::string s;
  Value v;
};

std::vector<Tok> tokenize(const std::string& src, int line) {
  std::vector<Tok> out;
  size_t i = 0;
  while (i < src.size()) {
    const char c = src[i];
    if (is_space(c)) {
      ++i;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < src.size() && (std::isalnum(static_cast<unsigned char>(src[j])) || src[j] == '_')) ++j;
      out.push_back({Tok::T::Name, src.substr(i, j - i), {}});
      i = j;
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      while (j < src.size() && (std::isdigit(static_cast<unsigned char>(src[j])) || src[j] == '_')) ++j;
      if (j + 1 < src.size() && src[j] == '.' && std::isdigit(static_cast<unsigned char>(src[j + 1]))) {
        is_float = true;
        ++j;
        while (j < src.size() && std::isdigit(static_cast<unsigned char>(src[j]))) ++j;
      }
      if (j < src.size() && (src[j] == 'e' || src[j] == 'E')) {
        size_t k = j + 1;
        if (k < src.size() && (src[k] == '+' || src[k] == '-')) ++k;
        if (k < src.size() && std::isdigit(static_cast<unsigned char>(src[k]))) {
          is_float = true;
          j = k;
          while (j < src.size() && std::isdigit(static_cast<unsigned char>(src[j]))) ++j;
        }
      }
      std::string num;
      for (size_t k = i; k < j; ++k)
        if (src[k] != '_') num += src[k];
      out.push_back(is_float ? Tok{Tok::T::Float, num, Value(std::strtod(num.c_str(), nullptr))}
                             : Tok{Tok::T::Int, num, Value(int64_t(std::strtoll(num.c_str(), nullptr, 10)))});
      i = j;
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string s;
      size_t j = i + 1;
      for (; j < src.size() && src[j] != c; ++j) {
        if (src[j] != '\\' || j + 1 >= src.size()) {
          s += src[j];
          continue;
        }
        const char e = src[++j];
        switch (e) {
          case 'n': s += '\n'; break;
          case 't': s += '\t'; break;
          case 'r': s += '\r'; break;
          case '0': s += '\0'; break;
          case 'b': s += '\b'; break;
          case 'f': s += '\f'; break;
          case '\\': s += '\\'; break;
          case '\'': s += '\''; break;
          case '"': s += '"'; break;
          case 'u':
          case 'x': {
            const size_t digits = e == 'u' ? 4 : 2;
            if (j + digits < src.size()) {
              const unsigned long cp = std::strtoul(src.substr(j + 1, digits).c_str(), nullptr, 16);
              j += digits;
              if (cp < 0x80) s += char(cp);
              else if (cp < 0x800) s += char(0xc0 | (cp >> 6)), s += char(0x80 | (cp & 0x3f));
              else s += char(0xe0 | (cp >> 12)), s += char(0x80 | ((cp >> 6) & 0x3f)), s += char(0x80 | (cp & 0x3f));
            }
            break;
          }
          default: s += '\\', s += e;
        }
      }
      if (j >= src.size()) fail(line, "unterminated string literal");
      out.push_back({Tok::T::Str, s, Value(s)});
      i = j + 1;
      continue;
    }
    static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                 "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", "="};
    bool matched = false;
    for (const char* op : kOps) {
      const size_t n = std::char_traits<char>::length(op);
      if (src.compare(i, n, op) == 0) {
        out.push_back({Tok::T::Op, op, {}});
        i += n;
        matched = true;
        break;
      }
    }
    if (!matched) fail(line, std::string("unexpected character '") + c + "'");
  }
  out.push_back({Tok::T::End, "", {}});
  return out;
}

// ---------------------------------------------------------------- expressions

// Nesting deeper than this (brackets, `not`, unary signs; blocks in Parser) is refused: the
// recursive parser and interpreter must not run out of stack.
constexpr int kMaxNesting = 200;

class ExprParser {
 public:
  ExprParser(const std::string& src, int line) : toks_(tokenize(src, line)), line_(line) {}

  // Counts one level of recursion for as long as it lives.
  struct Nest {
    ExprParser& p;
    explicit Nest(ExprParser& parser) : p(parser) {
      if (++p.depth_ > kMaxNesting) fail(p.line_, "expressions nest deeper than " + std::to_string(kMaxNesting));
    }
    ~Nest() { --p.depth_; }
  };

  bool at_end() const { return toks_[i_].t == Tok::T::End; }
  bool is_op(const char* op) const { return toks_[i_].t == Tok::T::Op && toks_[i_].s == op; }
  bool is_name(const char* n) const { return toks_[i_].t == Tok::T::Name && toks_[i_].s == n; }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    ++i_;
    return true;
  }
  bool accept_name(const char* n) {
    if (!is_name(n)) return false;
    ++i_;
    return true;
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) fail(line_, std::string("expected '") + op + "', found '" + toks_[i_].s + "'");
  }
  std::string expect_name() {
    if (toks_[i_].t != Tok::T::Name) fail(line_, "expected a name, found '" + toks_[i_].s + "'");
    return toks_[i_++].s;
  }
  void expect_end() {
    if (!at_end()) fail(line_, "unexpected '" + toks_[i_].s + "'");
  }
  int line() const { return line_; }

  ExprPtr make(Expr::Kind k) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line_;
    return e;
  }

  /// A full expression; with `tuples`, `a, b` is a tuple (set and for statements).
  ExprPtr expression(bool tuples = false) {
    ExprPtr first = cond();
    if (!tuples || !is_op(",")) return first;
    auto t = make(Expr::Kind::Tuple);
    t->kids.push_back(std::move(first));
    while (accept_op(",")) {
      if (at_end() || is_op(")")) break;
      t->kids.push_back(cond());
    }
    return t;
  }

  ExprPtr cond() {
    const Nest nest(*this);
    ExprPtr e = or_expr();
    while (accept_name("if")) {
      auto c = make(Expr::Kind::Cond);
      c->kids.push_back(std::move(e));
      c->kids.push_back(or_expr());
      c->kids.push_back(accept_name("else") ? cond() : nullptr);
      e = std::move(c);
    }
    return e;
  }
  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (accept_name("or")) e = binary(Expr::Kind::Or, "or", std::move(e), and_expr());
    return e;
  }
  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (accept_name("and")) e = binary(Expr::Kind::And, "and", std::move(e), not_expr());
    return e;
  }
  ExprPtr not_expr() {
    const Nest nest(*this);
    if (accept_name("not")) {
      auto n = make(Expr::Kind::Not);
      n->kids.push_back(not_expr());
      return n;
    }
    return compare();
  }
  // a < b < c is (a < b) and (b < c), as in Python (b is evaluated twice: expressions have no
  // side effects a template can see).
  ExprPtr compare() {
    ExprPtr first = math1();
    std::vector<std::pair<std::string, ExprPtr>> rest;
    for (;;) {
      static const char* kCmp[] = {"==", "!=", "<=", ">=", "<", ">"};
      std::string op;
      for (const char* c : kCmp)
        if (accept_op(c)) {
          op = c;
          break;
        }
      if (op.empty() && accept_name("in")) op = "in";
      if (op.empty() && is_name("not") && toks_[i_ + 1].t == Tok::T::Name && toks_[i_ + 1].s == "in") {
        i_ += 2;
        op = "not in";
      }
      if (op.empty()) break;
      rest.emplace_back(op, math1());
    }
    if (rest.empty()) return first;
    ExprPtr chain;
    const Expr* left = first.get();
    ExprPtr left_owned = std::move(first);
    for (auto& [op, right] : rest) {
      ExprPtr lhs = left_owned ? std::move(left_owned) : clone(*left);
      const Expr* next_left = right.get();
      ExprPtr cmp = binary(Expr::Kind::Binary, op, std::move(lhs), std::move(right));
      left = next_left;
      chain = chain ? binary(Expr::Kind::And, "and", std::move(chain), std::move(cmp)) : std::move(cmp);
    }
    return chain;
  }

  // A deep copy (chained comparisons use their middle operands twice).
  ExprPtr clone(const Expr& e) {
    auto c = std::make_unique<Expr>();
    c->kind = e.kind;
    c->line = e.line;
    c->value = e.value;
    c->name = e.name;
    c->negate = e.negate;
    for (const auto& k : e.kids) c->kids.push_back(k ? clone(*k) : nullptr);
    for (const auto& [n, k] : e.kw) c->kw.emplace_back(n, clone(*k));
    return c;
  }
  ExprPtr math1() {
    ExprPtr e = concat();
    for (;;) {
      if (accept_op("+")) e = binary(Expr::Kind::Binary, "+", std::move(e), concat());
      else if (accept_op("-")) e = binary(Expr::Kind::Binary, "-", std::move(e), concat());
      else return e;
    }
  }
  ExprPtr concat() {
    ExprPtr e = math2();
    while (accept_op("~")) e = binary(Expr::Kind::Binary, "~", std::move(e), math2());
    return e;
  }
  ExprPtr math2() {
    ExprPtr e = power();
    for (;;) {
      static const char* kOps[] = {"//", "*", "/", "%"};
      bool any = false;
      for (const char* op : kOps)
        if (accept_op(op)) {
          e = binary(Expr::Kind::Binary, op, std::move(e), power());
          any = true;
          break;
        }
      if (!any) return e;
    }
  }
  ExprPtr power() {
    ExprPtr e = unary(true);
    while (accept_op("**")) e = binary(Expr::Kind::Binary, "**", std::move(e), unary(true));
    return e;
  }
  ExprPtr unary(bool with_filter) {
    const Nest nest(*this);
    ExprPtr e;
    if (accept_op("-")) {
      e = make(Expr::Kind::Neg);
      e->kids.push_back(unary(false));
    } else if (accept_op("+")) {
      e = make(Expr::Kind::Pos);
      e->kids.push_back(unary(false));
    } else {
      e = postfix(primary());
    }
    return with_filter ? filters(std::move(e)) : std::move(e);
  }

  ExprPtr primary() {
    const Tok& t = toks_[i_];
    if (t.t == Tok::T::Str) {  // adjacent literals concatenate
      std::string s;
      while (toks_[i_].t == Tok::T::Str) s += toks_[i_++].s;
      auto e = make(Expr::Kind::Literal);
      e->value = Value(s);
      return e;
    }
    if (t.t == Tok::T::Int || t.t == Tok::T::Float) {
      auto e = make(Expr::Kind::Literal);
      e->value = toks_[i_++].v;
      return e;
    }
    if (t.t == Tok::T::Name) {
      const std::string n = toks_[i_++].s;
      auto e = make(Expr::Kind::Literal);
      if (n == "true" || n == "True") e->value = Value(true);
      else if (n == "false" || n == "False") e->value = Value(false);
      else if (n == "none" || n == "None") e->value = Value::none();
      else {
        e->kind = Expr::Kind::Name;
        e->name = n;
      }
      return e;
    }
    if (accept_op("(")) {
      if (accept_op(")")) return make(Expr::Kind::Tuple);
      ExprPtr first = cond();
      if (accept_op(")")) return first;
      auto tup = make(Expr::Kind::Tuple);
      tup->kids.push_back(std::move(first));
      while (accept_op(",")) {
        if (is_op(")")) break;
        tup->kids.push_back(cond());
      }
      expect_op(")");
      return tup;
    }
    if (accept_op("[")) {
      auto list = make(Expr::Kind::List);
      while (!accept_op("]")) {
        list->kids.push_back(cond());
        if (!accept_op(",")) {
          expect_op("]");
          break;
        }
      }
      return list;
    }
    if (accept_op("{")) {
      auto dict = make(Expr::Kind::Dict);
      while (!accept_op("}")) {
        dict->kids.push_back(cond());
        expect_op(":");
        dict->kids.push_back(cond());
        if (!accept_op(",")) {
          expect_op("}");
          break;
        }
      }
      return dict;
    }
    fail(line_, t.t == Tok::T::End ? "an expression ends too early" : "unexpected '" + t.s + "'");
  }

  ExprPtr postfix(ExprPtr e) {
    for (;;) {
      if (accept_op(".")) {
        auto a = make(Expr::Kind::Attr);
        if (toks_[i_].t == Tok::T::Int) a->name = toks_[i_++].s;  // x.0: item 0
        else a->name = expect_name();
        a->kids.push_back(std::move(e));
        e = std::move(a);
      } else if (accept_op("[")) {
        ExprPtr parts[3];
        bool slice = false;
        if (!is_op(":")) parts[0] = cond();
        if (accept_op(":")) {
          slice = true;
          if (!is_op("]") && !is_op(":")) parts[1] = cond();
          if (accept_op(":") && !is_op("]")) parts[2] = cond();
        }
        expect_op("]");
        auto s = make(slice ? Expr::Kind::Slice : Expr::Kind::Item);
        s->kids.push_back(std::move(e));
        s->kids.push_back(std::move(parts[0]));
        if (slice) s->kids.push_back(std::move(parts[1])), s->kids.push_back(std::move(parts[2]));
        e = std::move(s);
      } else if (is_op("(")) {
        auto c = make(Expr::Kind::Call);
        c->kids.push_back(std::move(e));
        arguments(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  // (a, b, k=v): appended to e.kids / e.kw.
  void arguments(Expr& e) {
    expect_op("(");
    while (!accept_op(")")) {
      if (toks_[i_].t == Tok::T::Name && toks_[i_ + 1].t == Tok::T::Op && toks_[i_ + 1].s == "=") {
        std::string k = toks_[i_].s;
        i_ += 2;
        e.kw.emplace_back(std::move(k), cond());
      } else {
        e.kids.push_back(cond());
      }
      if (!accept_op(",")) {
        expect_op(")");
        break;
      }
    }
  }

  ExprPtr filters(ExprPtr e) {
    for (;;) {
      if (accept_op("|")) {
        auto f = make(Expr::Kind::Filter);
        f->name = dotted_name();
        f->kids.push_back(std::move(e));
        if (is_op("(")) arguments(*f);
        e = std::move(f);
      } else if (accept_name("is")) {
        auto t = make(Expr::Kind::Test);
        t->negate = accept_name("not");
        // Tests named like operators or keywords: `is none`, `is true`, `is eq 1`.
        if (toks_[i_].t == Tok::T::Op && (toks_[i_].s == "==" || toks_[i_].s == "!=" || toks_[i_].s == "<" ||
                                          toks_[i_].s == ">" || toks_[i_].s == "<=" || toks_[i_].s == ">=")) {
          t->name = toks_[i_++].s;
        } else {
          t->name = dotted_name();
        }
        t->kids.push_back(std::move(e));
        if (is_op("(")) {
          arguments(*t);
        } else if (!at_end() && (toks_[i_].t == Tok::T::Str || toks_[i_].t == Tok::T::Int ||
                                 toks_[i_].t == Tok::T::Float ||
                                 (toks_[i_].t == Tok::T::Name && !is_name("and") && !is_name("or") &&
                                  !is_name("else") && !is_name("if") && !is_name("in") && !is_name("not") &&
                                  !is_name("is")))) {
          t->kids.push_back(postfix(primary()));  // `is divisibleby 3`, `is sameas x`
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  std::string dotted_name() {
    std::string n = expect_name();
    while (is_op(".") && toks_[i_ + 1].t == Tok::T::Name) {
      ++i_;
      n += '.';
      n += expect_name();
    }
    return n;
  }

 private:
  ExprPtr binary(Expr::Kind k, std::string op, ExprPtr a, ExprPtr b) {
    auto e = make(k);
    e->name = std::move(op);
    e->kids.push_back(std::move(a));
    e->kids.push_back(std::move(b));
    return e;
  }

  std::vector<Tok> toks_;
  size_t i_ = 0;
  int line_;
  int depth_ = 0;
};

// ---------------------------------------------------------------- statements

class Parser {
 public:
  explicit Parser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  Body parse_all() {
    std::string end;
    Body b = body({}, end);
    return b;
  }

 private:
  static std::string first_word(const std::string& s) {
    size_t a = 0;
    while (a < s.size() && is_space(s[a])) ++a;
    size_t b = a;
    while (b < s.size() && (std::isalnum(static_cast<unsigned char>(s[b])) || s[b] == '_')) ++b;
    return s.substr(a, b - a);
  }
  static std::string rest(const std::string& s, const std::string& word) {
    const size_t at = s.find(word);
    return s.substr(at + word.size());
  }

  // Statements until one of `ends` (its keyword returned in `end`; its piece consumed).
  Body body(const std::vector<std::string>& ends, std::string& end) {
    Body out;
    while (i_ < pieces_.size()) {
      const Piece& p = pieces_[i_];
      if (p.kind == Piece::Kind::Text) {
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::Text;
        n->text = p.src;
        n->line = p.line;
        out.push_back(std::move(n));
        ++i_;
        continue;
      }
      if (p.kind == Piece::Kind::Var) {
        ExprParser ep(p.src, p.line);
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::Output;
        n->line = p.line;
        n->expr = ep.expression(true);
        ep.expect_end();
        out.push_back(std::move(n));
        ++i_;
        continue;
      }
      const std::string word = first_word(p.src);
      for (const std::string& e : ends)
        if (word == e) {
          end = word;
          return out;
        }
      ++i_;
      out.push_back(statement(word, p));
    }
    if (!ends.empty()) fail(pieces_.empty() ? 0 : pieces_.back().line, "missing '" + ends.back() + "' (end of template)");
    return out;
  }

  NodePtr statement(const std::string& word, const Piece& p) {
    if (++depth_ > kMaxNesting) fail(p.line, "blocks nest deeper than " + std::to_string(kMaxNesting));
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth_};
    auto n = std::make_unique<Node>();
    n->line = p.line;
    ExprParser ep(rest(p.src, word), p.line);
    if (word == "if") {
      n->kind = Node::Kind::If;
      ExprPtr c = ep.expression();
      ep.expect_end();
      for (;;) {
        std::string end;
        Body b = body({"elif", "else", "endif"}, end);
        n->branches.emplace_back(std::move(c), std::move(b));
        const Piece& q = pieces_[i_++];
        if (end == "endif") break;
        ExprParser eq(rest(q.src, end), q.line);
        if (end == "elif") {
          c = eq.expression();
          eq.expect_end();
        } else {
          eq.expect_end();
          Body e = body({"endif"}, end);
          ++i_;
          n->branches.emplace_back(nullptr, std::move(e));
          break;
        }
      }
      return n;
    }
    if (word == "for") {
      n->kind = Node::Kind::For;
      do n->targets.push_back(ep.expect_name());
      while (ep.accept_op(","));
      if (!ep.accept_name("in")) fail(p.line, "expected 'in' in a for statement");
      n->expr = ep.or_expr();
      if (ep.is_op(",")) {  // for x in a, b: a tuple
        auto tup = ep.make(Expr::Kind::Tuple);
        tup->kids.push_back(std::move(n->expr));
        while (ep.accept_op(",")) tup->kids.push_back(ep.or_expr());
        n->expr = std::move(tup);
      }
      if (ep.accept_name("if")) n->filter = ep.or_expr();
      ep.accept_name("recursive");
      ep.expect_end();
      std::string end;
      ++loops_;
      n->body = body({"else", "endfor"}, end);
      --loops_;
      ++i_;
      if (end == "else") {
        n->else_body = body({"endfor"}, end);
        ++i_;
      }
      return n;
    }
    if (word == "set") {
      std::string target = ep.expect_name();
      if (ep.accept_op(".")) target.append(1, '.').append(ep.expect_name());
      n->targets.push_back(target);
      while (ep.accept_op(",")) n->targets.push_back(ep.expect_name());
      if (ep.accept_op("=")) {
        n->kind = Node::Kind::Set;
        n->expr = ep.expression(true);
        ep.expect_end();
        return n;
      }
      n->kind = Node::Kind::SetBlock;  // {% set x %}...{% endset %}, optionally `| filters`
      if (ep.is_op("|")) n->filter = ep.filters(ep.make(Expr::Kind::Literal));
      ep.expect_end();
      std::string end;
      n->body = body({"endset"}, end);
      ++i_;
      return n;
    }
    if (word == "macro" || word == "call") {
      n->kind = word == "macro" ? Node::Kind::Macro : Node::Kind::CallBlock;
      const int outer_loops = loops_;  // a loop around a macro does not reach into its body
      loops_ = 0;
      struct Restore {
        int& l;
        int v;
        ~Restore() { l = v; }
      } restore{loops_, outer_loops};
      if (word == "call" && ep.is_op("(")) params(ep, *n);  // {% call(args) m() %}
      if (word == "macro") {
        n->name = ep.expect_name();
        params(ep, *n);
      } else {
        n->expr = ep.expression();
      }
      ep.expect_end();
      std::string end;
      n->body = body({word == "macro" ? "endmacro" : "endcall"}, end);
      ++i_;
      return n;
    }
    if (word == "filter") {
      n->kind = Node::Kind::FilterBlock;
      auto placeholder = ep.make(Expr::Kind::Literal);
      auto f = ep.make(Expr::Kind::Filter);
      f->name = ep.dotted_name();
      f->kids.push_back(std::move(placeholder));
      if (ep.is_op("(")) ep.arguments(*f);
      n->filter = ep.filters(std::move(f));
      ep.expect_end();
      std::string end;
      n->body = body({"endfilter"}, end);
      ++i_;
      return n;
    }
    if (word == "generation") {  // Transformers' assistant-mask marker: renders its body
      n->kind = Node::Kind::Block;
      ep.expect_end();
      std::string end;
      n->body = body({"endgeneration"}, end);
      ++i_;
      return n;
    }
    if (word == "break" || word == "continue") {
      ep.expect_end();
      if (loops_ == 0) fail(p.line, "'" + word + "' outside a for loop");
      n->kind = word == "break" ? Node::Kind::Break : Node::Kind::Continue;
      return n;
    }
    fail(p.line, word.empty() ? "an empty statement" : "unknown statement '" + word + "'");
  }

  static void params(ExprParser& ep, Node& n) {
    ep.expect_op("(");
    while (!ep.accept_op(")")) {
      std::string name = ep.expect_name();
      ExprPtr def = ep.accept_op("=") ? ep.cond() : nullptr;
      n.params.emplace_back(std::move(name), std::move(def));
      if (!ep.accept_op(",")) {
        ep.expect_op(")");
        break;
      }
    }
  }

  std::vector<Piece> pieces_;
  size_t i_ = 0;
  int depth_ = 0;  // statements open around the current one
  int loops_ = 0;  // for loops open around it (within the current macro)
};

}  // namespace

Body parse_template(std::string_view source) {
  // Jinja2's lexer: line endings become \n, and one trailing newline is dropped
  // (keep_trailing_newline off).
  std::string text;
  text.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      text += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      text += source[i];
    }
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return Parser(segment(text)).parse_all();
}

}  // namespace fdl::jinja
