// Lookahead drafter: Jacobi guesses + n-gram pool (see lookahead_pool.h).
#include "decode/lookahead_pool.h"

#include <algorithm>

namespace fdl::spec {
namespace {

uint64_t bigram(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

// Bounds the pool of one sequence; clearing is cheap and the pool refills from the next
// verifications within a few steps.
constexpr size_t kMaxEntries = size_t(1) << 16;

}  // namespace

void LookaheadPool::record(int32_t prev, int32_t tok, int32_t next) {
  if (by_bigram_.size() >= kMaxEntries) by_bigram_.clear();
  if (by_token_.size() >= kMaxEntries) by_token_.clear();
  if (prev >= 0) by_bigram_[bigram(prev, tok)] = next;
  by_token_[tok] = next;
}

void LookaheadPool::feed_history(std::span<const int32_t> ctx, size_t from) {
  for (size_t i = std::max<size_t>(from, 1); i < ctx.size(); ++i)
    record(i >= 2 ? ctx[i - 2] : -1, ctx[i - 1], ctx[i]);
}

void LookaheadPool::feed_verification(std::span<const int32_t> before,
                                      std::span<const int32_t> inputs,
                                      std::span<const int32_t> outputs, size_t accepted) {
  int32_t prev = before.empty() ? -1 : before.back();
  for (size_t i = 0; i < inputs.size() && i < outputs.size(); ++i) {
    record(prev, inputs[i], outputs[i]);
    prev = inputs[i];
  }
  jacobi_.clear();
  if (accepted + 1 < outputs.size()) {
    jacobi_.assign(outputs.begin() + std::ptrdiff_t(accepted + 1), outputs.end());
    // The guess follows the model's own token at position x0 + accepted + 1, i.e. the
    // context will then hold before + x0 + accepted drafts + that token.
    jacobi_at_ = before.size() + accepted + 2;
  }
}

void LookaheadPool::propose(std::span<const int32_t> ctx, size_t max_tokens, Draft& out) const {
  out.clear();
  if (max_tokens == 0 || ctx.empty()) return;
  if (!jacobi_.empty() && ctx.size() == jacobi_at_) {
    out.tokens.assign(jacobi_.begin(),
                      jacobi_.begin() + std::ptrdiff_t(std::min(max_tokens, jacobi_.size())));
    out.match_len = 1;
    out.source = DraftSource::Jacobi;
  } else {
    out.source = DraftSource::LookaheadPool;
  }
  // Extend (or build) the draft by chaining the pool from the last two tokens.
  int32_t prev = ctx.size() >= 2 ? ctx[ctx.size() - 2] : -1;
  int32_t cur = ctx.back();
  for (int32_t t : out.tokens) { prev = cur; cur = t; }
  chain(prev, cur, max_tokens, false, out);
  if (out.tokens.empty()) out.clear();
}

void LookaheadPool::chain(int32_t prev, int32_t cur, size_t max_tokens, bool unigram_first, Draft& out) const {
  while (out.tokens.size() < max_tokens) {
    int32_t next = -1;
    if (prev >= 0 && !unigram_first) {
      const auto it = by_bigram_.find(bigram(prev, cur));
      if (it != by_bigram_.end()) next = it->second;
    }
    unigram_first = false;
    if (next < 0) {
      const auto it = by_token_.find(cur);
      if (it == by_token_.end()) break;
      next = it->second;
    }
    if (out.tokens.empty() && out.match_len == 0) out.match_len = 1;
    out.tokens.push_back(next);
    prev = cur;
    cur = next;
  }
}

void LookaheadPool::propose_alternates(std::span<const int32_t> ctx, size_t max_tokens,
                                       std::vector<Draft>& out) const {
  if (max_tokens == 0 || ctx.empty()) return;
  const int32_t prev = ctx.size() >= 2 ? ctx[ctx.size() - 2] : -1;
  for (const bool unigram_first : {false, true}) {
    Draft d;
    d.source = DraftSource::LookaheadPool;
    chain(prev, ctx.back(), max_tokens, unigram_first, d);
    if (!d.tokens.empty()) out.push_back(std::move(d));
  }
}

}  // namespace fdl::spec
