// Internal: picks one draft per sequence and step from the drafters the mode enables.
//
// Order (why): a prompt-lookup match of >= 2 tokens is the strongest evidence (the text is
// being repeated or edited); then the Jacobi guess / lookahead pool (model outputs made for
// these very positions); then the cross-request cache; then a 1-token prompt-lookup match.
// A draft shorter than the window is extended by chaining the n-gram cache from its end
// (merging sources), so one weak source does not cap the window.
#pragma once

#include "decode/lookahead_pool.h"
#include "decode/ngram_cache.h"
#include "decode/prompt_lookup.h"
#include "flashdllm/speculative.h"

namespace fdl::spec {

class DraftPolicy {
 public:
  /// `cache` is the shared cross-request cache (must outlive the policy).
  DraftPolicy(const SpecOptions& options, const NgramCache& cache);
  /// Draft of up to `max_tokens` for `context` (its last token is the next input token);
  /// `pool` is the sequence's lookahead drafter. Empty when the mode is Off or nothing fits.
  void propose(std::span<const int32_t> context, size_t max_tokens, const LookaheadPool& pool,
               Draft& out);
  /// Candidates for tree verification: `main` (propose()'s draft, non-empty) first, then the
  /// alternates the enabled drafters offer — older prompt-lookup matches with other
  /// continuations, the cross-request cache's own draft and its shorter-gram alternative,
  /// the lookahead pool's chains. They may repeat each other (DraftTreeBuilder merges
  /// shared prefixes).
  void propose_candidates(std::span<const int32_t> context, size_t max_tokens, const LookaheadPool& pool,
                          const Draft& main, std::vector<Draft>& out);
  /// Most prompt-lookup matches with distinct continuations offered per step.
  static constexpr size_t kMaxLookupAlternates = 3;

 private:
  SpecMode mode_;
  PromptLookup lookup_;
  const NgramCache& cache_;
  Draft scratch_;
  std::vector<int32_t> extended_;
};

}  // namespace fdl::spec
