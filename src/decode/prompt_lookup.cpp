// Prompt lookup (see prompt_lookup.h).
#include "decode/prompt_lookup.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace fdl::spec {

PromptLookup::PromptLookup(int n_min, int n_max) : n_min_(n_min), n_max_(n_max) {
  if (n_min < 1 || n_max < n_min)
    throw std::invalid_argument("PromptLookup: need 1 <= n_min <= n_max, got " +
                                std::to_string(n_min) + ".." + std::to_string(n_max));
}

void PromptLookup::propose(std::span<const int32_t> ctx, size_t max_tokens, Draft& out) const {
  out.clear();
  const size_t len = ctx.size();
  if (max_tokens == 0 || len < 2) return;
  // Wanted: the longest n in [n_min, n_max] whose last-n-token suffix occurred earlier, and
  // its most recent occurrence. One backwards pass over the match *ends* e finds it: the
  // common suffix length m(e) of ctx[..e] and the whole context (capped at n_max) is the
  // longest n matching there, and the first e reaching a new maximum is the most recent
  // occurrence of that n. Most positions fail at the first comparison, so this is one
  // compare per position, where scanning once per n was up to n_max passes of std::equal
  // (3 us at 500 tokens, 6% of a stories260K step, paid by every draft and shadow draft).
  const size_t cap = std::min(size_t(n_max_), len - 1);
  size_t best_n = 0, best_end = 0;
  for (size_t e = len - 1; e-- > 0;) {
    if (ctx[e] != ctx[len - 1]) continue;
    size_t m = 1;
    while (m < cap && m <= e && ctx[e - m] == ctx[len - 1 - m]) ++m;
    if (m > best_n && m >= size_t(n_min_)) {
      best_n = m;
      best_end = e;
      if (m == cap) break;  // nothing longer exists, nothing older is preferred
    }
  }
  if (best_n == 0) return;
  const size_t from = best_end + 1;
  const size_t take = std::min(max_tokens, len - from);
  out.tokens.assign(ctx.begin() + std::ptrdiff_t(from), ctx.begin() + std::ptrdiff_t(from + take));
  out.match_len = int(best_n);
  out.source = DraftSource::PromptLookup;
}

void PromptLookup::propose_distinct(std::span<const int32_t> ctx, size_t max_tokens, size_t max_drafts,
                                    std::vector<Draft>& out) const {
  const size_t len = ctx.size();
  if (max_tokens == 0 || max_drafts == 0) return;
  const size_t first_new = out.size();
  for (size_t n = std::min(size_t(n_max_), len > 0 ? len - 1 : 0); n >= size_t(n_min_); --n) {
    const auto suffix = ctx.subspan(len - n, n);
    for (size_t start = len - n; start-- > 0;) {
      if (!std::equal(suffix.begin(), suffix.end(), ctx.begin() + std::ptrdiff_t(start))) continue;
      const size_t from = start + n;
      const int32_t next = ctx[from];
      bool seen = false;
      for (size_t i = first_new; i < out.size(); ++i) seen = seen || out[i].tokens.front() == next;
      if (seen) continue;
      Draft& d = out.emplace_back();
      const size_t take = std::min(max_tokens, len - from);
      d.tokens.assign(ctx.begin() + std::ptrdiff_t(from), ctx.begin() + std::ptrdiff_t(from + take));
      d.match_len = int(n);
      d.source = DraftSource::PromptLookup;
      if (out.size() - first_new == max_drafts) return;
    }
    if (n == 1) break;
  }
}

}  // namespace fdl::spec
