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
  if (max_tokens == 0) return;
  for (size_t n = std::min(size_t(n_max_), len > 0 ? len - 1 : 0); n >= size_t(n_min_); --n) {
    const auto suffix = ctx.subspan(len - n, n);
    // Most recent earlier occurrence first: recent text predicts best what comes next.
    // `start` ranges over match starts whose match ends before the suffix itself ends.
    for (size_t start = len - n; start-- > 0;) {
      if (!std::equal(suffix.begin(), suffix.end(), ctx.begin() + std::ptrdiff_t(start)))
        continue;
      const size_t from = start + n;
      const size_t take = std::min(max_tokens, len - from);
      out.tokens.assign(ctx.begin() + std::ptrdiff_t(from),
                        ctx.begin() + std::ptrdiff_t(from + take));
      out.match_len = int(n);
      out.source = DraftSource::PromptLookup;
      return;
    }
    if (n == 1) break;
  }
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
