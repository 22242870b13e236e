// Draft selection (see draft_policy.h).
#include "decode/draft_policy.h"

#include <algorithm>

namespace fdl::spec {

DraftPolicy::DraftPolicy(const SpecOptions& options, const NgramCache& cache)
    : mode_(options.mode), lookup_(options.ngram_min, options.ngram_max), cache_(cache) {}

void DraftPolicy::propose(std::span<const int32_t> ctx, size_t max_tokens,
                          const LookaheadPool& pool, Draft& out) {
  out.clear();
  if (mode_ == SpecMode::Off || max_tokens == 0) return;
  const bool lookup = mode_ == SpecMode::Lookup || mode_ == SpecMode::Auto;
  const bool lookahead = mode_ == SpecMode::Lookahead || mode_ == SpecMode::Auto;

  if (lookup) {
    lookup_.propose(ctx, max_tokens, out);
    if (out.match_len < 2) {
      const Draft weak = out;
      out.clear();
      if (lookahead) pool.propose(ctx, max_tokens, out);
      if (out.tokens.empty()) cache_.propose(ctx, max_tokens, out);
      if (out.tokens.empty()) out = weak;
    }
  } else if (lookahead) {
    pool.propose(ctx, max_tokens, out);
  }
  if (!lookup || out.tokens.empty() || out.tokens.size() >= max_tokens) return;
  // Merge: continue a short draft from the shared cache. Only the cache's longest gram of
  // context matters, so the tail of the context is enough.
  const size_t keep = std::min(ctx.size(), size_t(8));
  extended_.assign(ctx.end() - std::ptrdiff_t(keep), ctx.end());
  extended_.insert(extended_.end(), out.tokens.begin(), out.tokens.end());
  cache_.propose(extended_, max_tokens - out.tokens.size(), scratch_);
  out.tokens.insert(out.tokens.end(), scratch_.tokens.begin(), scratch_.tokens.end());
}

void DraftPolicy::propose_candidates(std::span<const int32_t> ctx, size_t max_tokens, const LookaheadPool& pool,
                                     const Draft& main, std::vector<Draft>& out) {
  out.assign(1, main);
  const bool lookup = mode_ == SpecMode::Lookup || mode_ == SpecMode::Auto;
  const bool lookahead = mode_ == SpecMode::Lookahead || mode_ == SpecMode::Auto;
  const auto add = [&](const Draft& d) {
    if (!d.tokens.empty()) out.push_back(d);
  };
  if (lookup) {
    lookup_.propose_distinct(ctx, max_tokens, kMaxLookupAlternates, out);
    cache_.propose(ctx, max_tokens, scratch_);
    add(scratch_);
    cache_.propose_alternate(ctx, max_tokens, scratch_);
    add(scratch_);
  }
  if (lookahead) {
    pool.propose(ctx, max_tokens, scratch_);
    add(scratch_);
    pool.propose_alternates(ctx, max_tokens, out);
  }
}

}  // namespace fdl::spec
