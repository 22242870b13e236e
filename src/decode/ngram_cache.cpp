// Cross-request n-gram cache (see ngram_cache.h).
#include "decode/ngram_cache.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace fdl::spec {

NgramCache::NgramCache(int n_min, int n_max, size_t max_entries)
    : n_min_(n_min), n_max_(n_max), max_entries_(max_entries) {
  if (n_min < 1 || n_max < n_min || n_max > 8 || max_entries == 0)
    throw std::invalid_argument("NgramCache: need 1 <= n_min <= n_max <= 8 and max_entries > 0");
}

void NgramCache::feed(std::span<const int32_t> ctx, size_t from) {
  for (size_t i = std::max<size_t>(from, 1); i < ctx.size(); ++i) {
    for (size_t n = size_t(n_min_); n <= size_t(n_max_) && n <= i; ++n) {
      if (next_.size() >= max_entries_) next_.clear();
      next_[ngram_key(ctx, i, n)] = ctx[i];
    }
  }
}

void NgramCache::propose(std::span<const int32_t> ctx, size_t max_tokens, Draft& out) const {
  out.clear();
  if (next_.empty() || max_tokens == 0) return;
  // Chain over context + draft so far; a small local copy keeps the key code simple.
  std::vector<int32_t> tail(ctx.end() - std::ptrdiff_t(std::min(ctx.size(), size_t(n_max_))),
                            ctx.end());
  chain(tail, max_tokens, out);
}

void NgramCache::propose_alternate(std::span<const int32_t> ctx, size_t max_tokens, Draft& out) const {
  out.clear();
  if (next_.empty() || max_tokens == 0) return;
  std::vector<int32_t> tail(ctx.end() - std::ptrdiff_t(std::min(ctx.size(), size_t(n_max_))), ctx.end());
  int32_t first = -1;
  for (size_t n = std::min(size_t(n_max_), tail.size()); n >= size_t(n_min_); --n) {
    const auto it = next_.find(ngram_key(tail, tail.size(), n));
    if (it != next_.end()) {
      if (first < 0) {
        first = it->second;
      } else if (it->second != first) {
        out.match_len = int(n);
        out.tokens.push_back(it->second);
        tail.push_back(it->second);
        chain(tail, max_tokens, out);
        out.source = DraftSource::NgramCache;
        return;
      }
    }
    if (n == 1) break;
  }
}

void NgramCache::chain(std::vector<int32_t>& tail, size_t max_tokens, Draft& out) const {
  while (out.tokens.size() < max_tokens) {
    bool found = false;
    for (size_t n = std::min(size_t(n_max_), tail.size()); n >= size_t(n_min_); --n) {
      const auto it = next_.find(ngram_key(tail, tail.size(), n));
      if (it == next_.end()) {
        if (n == 1) break;
        continue;
      }
      if (out.tokens.empty()) out.match_len = int(n);
      out.tokens.push_back(it->second);
      tail.push_back(it->second);
      found = true;
      break;
    }
    if (!found) break;
  }
  if (!out.tokens.empty()) out.source = DraftSource::NgramCache;
}

}  // namespace fdl::spec
