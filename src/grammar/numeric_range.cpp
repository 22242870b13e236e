// Decimal ranges as digit blocks (see numeric_range.h).
#include "grammar/numeric_range.h"

#include "grammar/gbnf_rules.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

namespace fdl::grammar {
namespace {

// The digits one position of a block may take.
struct Digits {
  char lo = '0', hi = '9';
  bool operator==(const Digits&) const = default;
  bool has_zero() const { return lo == '0'; }
};
using Block = std::vector<Digits>;

std::string digits_gbnf(const Digits& d) {
  if (d.lo == d.hi) return std::string("\"") + d.lo + "\"";
  if (d.lo == '0' && d.hi == '9') return "[0-9]";
  return std::string("[") + d.lo + "-" + d.hi + "]";
}

// Blocks covering exactly the digit strings in [x, y] (same length, x <= y), ascending.
void split(const std::string& x, const std::string& y, Block& prefix, std::vector<Block>& out) {
  if (x.empty()) {
    out.push_back(prefix);
    return;
  }
  const size_t rest = x.size() - 1;
  if (x[0] == y[0]) {
    prefix.push_back({x[0], x[0]});
    split(x.substr(1), y.substr(1), prefix, out);
    prefix.pop_back();
    return;
  }
  const bool low_full = x.find_first_not_of('0', 1) == std::string::npos;   // x = d000...
  const bool high_full = y.find_first_not_of('9', 1) == std::string::npos;  // y = d999...
  if (!low_full) {
    prefix.push_back({x[0], x[0]});
    split(x.substr(1), std::string(rest, '9'), prefix, out);
    prefix.pop_back();
  }
  const char a = low_full ? x[0] : char(x[0] + 1), b = high_full ? y[0] : char(y[0] - 1);
  if (a <= b) {
    Block blk = prefix;
    blk.push_back({a, b});
    blk.resize(blk.size() + rest, Digits{});
    out.push_back(blk);
  }
  if (!high_full) {
    prefix.push_back({y[0], y[0]});
    split(std::string(rest, '0'), y.substr(1), prefix, out);
    prefix.pop_back();
  }
}

// A block's text as tokens: literal text (digits, the point) or a digit class repeated.
struct Token {
  std::string literal;  // when count == 0
  Digits set;
  size_t count = 0;
};

void add_literal(std::vector<Token>& out, std::string_view text) {
  if (out.empty() || out.back().count != 0) out.emplace_back();
  out.back().literal += text;
}

// Positions [from, to): runs of equal classes become one token with a count.
void add_positions(const Block& b, size_t from, size_t to, std::vector<Token>& out) {
  for (size_t i = from; i < to;) {
    size_t j = i;
    while (j < to && b[j] == b[i]) ++j;
    if (b[i].lo == b[i].hi)
      add_literal(out, std::string(j - i, b[i].lo));
    else
      out.push_back(Token{"", b[i], j - i});
    i = j;
  }
}

std::string render(const std::vector<Token>& tokens) {
  std::string out;
  for (const Token& t : tokens) {
    if (!out.empty()) out += ' ';
    if (t.count == 0) {
      out += cat("\"", t.literal, "\"");
    } else {
      out += digits_gbnf(t.set);
      if (t.count > 1) out += cat("{", std::to_string(t.count), "}");
    }
  }
  return out;
}

// Any prefix (the empty one included) of positions [from, end) of a block whose positions
// from `from` on all allow 0: stopping early leaves zeros, a value in the block.
std::string optional_prefixes(const Block& b, size_t from) {
  if (from == b.size()) return "";
  size_t j = from;
  while (j < b.size() && b[j] == b[from]) ++j;
  if (j == b.size()) {
    const std::string d = digits_gbnf(b[from]);
    const size_t n = b.size() - from;
    return n == 1 ? d + "?" : cat(d, "{0,", std::to_string(n), "}");
  }
  return cat("(", digits_gbnf(b[from]), " ", optional_prefixes(b, from + 1), ")?");
}

// One block as a number with k fraction digits.
std::string block_gbnf(const Block& b, int k) {
  const size_t frac = b.size() - size_t(k);
  std::vector<Token> tokens;
  add_positions(b, 0, frac, tokens);
  if (k == 0) return render(tokens);
  // The fraction digits from `drop` on may be left out.
  size_t drop = b.size();
  while (drop > frac && b[drop - 1].has_zero()) --drop;
  if (drop == frac) {
    // All of them, the point too: ("." d (d (...)?)?)?, or ("." d{1,k})? for equal classes.
    const bool same = std::all_of(b.begin() + long(frac), b.end(), [&](const Digits& d) { return d == b[frac]; });
    const std::string first = digits_gbnf(b[frac]);
    const std::string rest = same ? (k > 1 ? cat("{1,", std::to_string(k), "}") : "")
                                  : cat(" ", optional_prefixes(b, frac + 1));
    return cat(render(tokens), " (\".\" ", first, rest, ")?");
  }
  add_literal(tokens, ".");
  add_positions(b, frac, drop, tokens);
  const std::string out = render(tokens);
  return drop < b.size() ? cat(out, " ", optional_prefixes(b, drop)) : out;
}

std::string pad(Int128 v, size_t width) {
  std::string s = to_string_128(v);
  return std::string(width > s.size() ? width - s.size() : 0, '0') + s;
}

// The values N / 10^k for N in [lo, hi], 0 <= lo <= hi, without a sign.
std::string unsigned_gbnf(Int128 lo, Int128 hi, int k) {
  std::vector<std::string> alts;
  const size_t first_len = size_t(k) + 1;  // one integer digit, k fraction digits
  const size_t last_len = std::max(first_len, to_string_128(hi).size());
  // Lengths whose every value is in the range, written together as [1-9][0-9]{a,b}.
  size_t full_from = 0, full_to = 0;
  auto flush_full = [&] {
    if (full_from == 0) return;
    const size_t a = full_from - size_t(k) - 1, b = full_to - size_t(k) - 1;
    std::string s = a == 1 && b == 1
                        ? "[1-9] [0-9]"
                        : cat("[1-9] [0-9]{", std::to_string(a), a == b ? "" : cat(",", std::to_string(b)), "}");
    if (k > 0) s += " (\".\" [0-9]" + (k > 1 ? "{1," + std::to_string(k) + "}" : std::string()) + ")?";
    alts.push_back(s);
    full_from = 0;
  };
  for (size_t len = first_len; len <= last_len; ++len) {
    const Int128 cls_lo = len == first_len ? 0 : pow10_128(int(len) - 1);
    const Int128 cls_hi = pow10_128(int(len)) - 1;
    const Int128 a = std::max(lo, cls_lo), b = std::min(hi, cls_hi);
    if (a > b) continue;
    if (len > first_len && a == cls_lo && b == cls_hi) {
      if (full_from == 0) full_from = len;
      full_to = len;
      continue;
    }
    flush_full();
    std::vector<Block> blocks;
    Block prefix;
    split(pad(a, len), pad(b, len), prefix, blocks);
    for (const Block& blk : blocks) alts.push_back(block_gbnf(blk, k));
  }
  flush_full();
  std::string out;
  for (const auto& s : alts) out += (out.empty() ? "" : " | ") + s;
  return alts.size() > 1 ? "(" + out + ")" : out;
}

}  // namespace

Int128 pow10_128(int n) {
  Int128 v = 1;
  for (int i = 0; i < n; ++i) v *= 10;
  return v;
}

std::string to_string_128(Int128 v) {
  if (v == 0) return "0";
  const bool neg = v < 0;
  std::string s;
  while (v != 0) {
    const int d = int(v % 10);
    s += char('0' + (d < 0 ? -d : d));
    v /= 10;
  }
  if (neg) s += '-';
  std::reverse(s.begin(), s.end());
  return s;
}

std::string decimal_range_gbnf(Int128 lo, Int128 hi, int k) {
  if (lo > hi || k < 0 || k > 30) throw std::logic_error("decimal_range_gbnf: bad range");
  std::vector<std::string> alts;
  if (lo < 0) {
    // Negative values by magnitude; zero belongs to the non-negative part.
    const Int128 mag_lo = hi < 0 ? -hi : 1, mag_hi = -lo;
    alts.push_back("\"-\" " + unsigned_gbnf(mag_lo, mag_hi, k));
  }
  if (hi >= 0) alts.push_back(unsigned_gbnf(std::max<Int128>(lo, 0), hi, k));
  return alts.size() == 1 ? alts[0] : alts[0] + " | " + alts[1];
}

}  // namespace fdl::grammar
