// Memory for the scheduler: making blocks free (prefix-cache eviction, dropping audit
// shadows, preemption), caching finished prefixes, and bringing cached prefixes back from
// lower KV tiers ahead of admission (docs/KV_TIERS.md).
#include <algorithm>
#include <vector>

#include "engine/kv_offload.h"
#include "engine/scheduler.h"
#include "engine/step_trace.h"

namespace fdl::engine {

bool Scheduler::reclaim(size_t n, const LiveSequence* keep) {
  BlockPool& pool = ctx_.kv.pool();
  if (pool.n_free() >= n) return true;
  prefix_cache_.evict(n - pool.n_free());
  // Sequences that already have tokens in this step's batch (decodes and their shadows,
  // earlier prompt chunks) are off limits: freeing their KV would leave the batch pointing
  // at a dead sequence. (Only a prompt chunk's reclaim runs after the batch has entries.)
  // Audit shadows are a luxury: drop them before anyone's work.
  for (auto& s : running_) {
    if (pool.n_free() >= n) return true;
    if (s->shadow && !plan_.contains(s.get())) end_shadow(*s);
  }
  // Then preempt, youngest first.
  while (pool.n_free() < n) {
    LiveSequence* victim = nullptr;
    for (auto it = running_.rbegin(); it != running_.rend(); ++it)
      if (it->get() != keep && (*it)->seq >= 0 && !(*it)->finished && !plan_.contains(it->get())) {
        victim = it->get();
        break;
      }
    if (victim == nullptr) return false;
    preempt(*victim);
    prefix_cache_.evict(pool.n_free() < n ? n - pool.n_free() : 0);
  }
  return true;
}

void Scheduler::preempt(LiveSequence& s) {
  // Keep its full blocks findable: if nobody needs the memory first, re-admission gets its
  // context back from the prefix cache instead of recomputing it.
  if (opt_.prefix_cache) cache_blocks(s, std::min(ctx_.kv.length(s.seq), s.context.size() - 1));
  end_shadow(s);
  ctx_.kv.free_sequence(s.seq);
  s.seq = -1;
  s.n_prefilled = 0;
  ++counters_.preemptions;
  auto it = std::find_if(running_.begin(), running_.end(),
                         [&](const SeqPtr& p) { return p.get() == &s; });
  SeqPtr owned = std::move(*it);
  running_.erase(it);
  waiting_.push_front(std::move(owned));
}

void Scheduler::release_kv(LiveSequence& s, bool cache) {
  end_shadow(s);
  if (s.seq < 0) return;
  // Its full blocks stay findable for later requests with the same prefix (multi-turn chat,
  // shared system prompts); unused ones are evicted when the pool needs room.
  // Only positions whose token is in the context were fed with it: not the last sampled
  // token, and not a rejected draft beyond it.
  if (cache && opt_.prefix_cache && s.finished && !s.context.empty())
    cache_blocks(s, std::min(ctx_.kv.length(s.seq), s.context.size() - 1));
  ctx_.kv.free_sequence(s.seq);
  s.seq = -1;
}

void Scheduler::cache_blocks(const LiveSequence& s, size_t n_tokens) {
  const auto table = ctx_.kv.block_table(s.seq);
  n_tokens = std::min({n_tokens, s.context.size(), ctx_.kv.length(s.seq)});
  prefix_cache_.insert(s.request.cache_scope, std::span<const int32_t>(s.context).first(n_tokens),
                       table);
}

Scheduler::CachedPath Scheduler::cached_path(const LiveSequence& s) const {
  const size_t target = s.prefill_target();
  // A request that has not sampled yet needs logits of its last prompt token, so that token
  // is always computed.
  const size_t cacheable = s.last_token >= 0 ? target : target - 1;
  return {std::span<const int32_t>(s.context).first(target), cacheable / size_t(ctx_.options.block_size)};
}

PrefixCache::PathState Scheduler::prefix_state(const LiveSequence& s) {
  const CachedPath path = cached_path(s);
  return prefix_cache_.path_state(s.request.cache_scope, path.tokens, path.max_blocks);
}

size_t Scheduler::prefetch_prefix(const LiveSequence& s, size_t want) {
  const CachedPath path = cached_path(s);
  if (want == 0) want = prefix_cache_.to_prefetch(s.request.cache_scope, path.tokens, path.max_blocks);
  if (want == 0) return 0;
  BlockPool& pool = ctx_.kv.pool();
  const size_t reserve = running_.size() + 1;
  if (want + reserve > pool.n_free()) prefix_cache_.evict(want + reserve - pool.n_free(), false);
  if (want + reserve > pool.n_free()) return 0;
  return prefix_cache_.prefetch(s.request.cache_scope, path.tokens, path.max_blocks, want);
}

void Scheduler::prefetch_once() {
  if (!prefetch_due_) return;
  prefetch_due_ = false;
  const auto t0 = Clock::now();
  prefetch_waiting();
  if (ctx_.trace != nullptr)
    ctx_.trace->span_since(StepTrace::Track::Schedule, "prefetch", t0, {{"step", counters_.steps}});
}

void Scheduler::prefetch_waiting() {
  if (!opt_.prefix_cache || waiting_.empty()) return;
  // Prefetched blocks occupy tier 0 until their request is admitted, so only spare blocks
  // are used: beyond one per running sequence (its next decode) and never more than a
  // context's worth, for the requests next in line.
  const size_t bs = size_t(ctx_.options.block_size);
  const size_t reserve = running_.size() + 1;
  const size_t context_blocks = (size_t(ctx_.options.n_ctx) + bs - 1) / bs;
  BlockPool& pool = ctx_.kv.pool();
  if (ctx_.offload->copies_async()) {
    // Device copies run beside the forwards: bring back the cached prefixes of the next
    // requests in line (two rounds of running sequences; up to two contexts' worth of blocks
    // at a time), making room by demoting colder cached blocks, so that they are resident when
    // a slot frees up. Their paths are marked used first, last to first, so evictions take
    // other blocks, and the next in line's last.
    const size_t ahead = std::min(waiting_.size(), 2 * size_t(ctx_.options.max_sequences));
    std::vector<size_t>& want = prefetch_want_;  // kept: this runs every step
    want.assign(ahead, 0);
    for (size_t i = ahead; i-- > 0;) {
      const CachedPath path = cached_path(*waiting_[i]);
      want[i] = prefix_cache_.to_prefetch(waiting_[i]->request.cache_scope, path.tokens, path.max_blocks);
    }
    size_t in_flight = prefix_cache_.n_prefetching();
    for (size_t i = 0; i < ahead; ++i) {
      if (want[i] == 0) continue;
      if (want[i] > context_blocks || in_flight + want[i] > 2 * context_blocks) break;
      const size_t started = prefetch_prefix(*waiting_[i], want[i]);
      if (started == 0) break;  // tier 0 holds running sequences' blocks
      in_flight += started;
    }
    return;
  }
  size_t spare = pool.n_free() > reserve ? pool.n_free() - reserve : 0;
  spare = std::min(spare, context_blocks);
  for (auto& w : waiting_) {
    if (spare == 0) break;
    const CachedPath path = cached_path(*w);
    spare -= prefix_cache_.prefetch(w->request.cache_scope, path.tokens, path.max_blocks, spare);
  }
}

}  // namespace fdl::engine
