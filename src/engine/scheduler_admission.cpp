// Admission: which waiting requests start, in what order, and which prompt chunks a step
// prefills (policy: flashdllm/engine.h; the knobs: SchedulerOptions in flashdllm/options.h; docs/SCHEDULER.md).
#include <algorithm>
#include <vector>

#include "engine/admission_order.h"
#include "engine/kv_offload.h"
#include "engine/scheduler.h"

namespace fdl::engine {
namespace {
// Admissions a request may be passed over while its cached prefix comes back from a lower
// tier (device copies); a prefetch lands within a few steps, so this only bounds the case
// where it never finds room.
constexpr int kMaxTierDeferrals = 256;
}  // namespace

LengthClass Scheduler::classify(size_t prompt_tokens) const {
  if (prompt_tokens < size_t(opt_.short_prompt_tokens)) return LengthClass::Short;
  if (prompt_tokens > size_t(opt_.long_prompt_tokens)) return LengthClass::Long;
  return LengthClass::Medium;
}

void Scheduler::finish_trivial() {
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if ((*it)->request.max_new_tokens == 0 && !(*it)->admitted_once) {
      SeqPtr s = std::move(*it);
      it = waiting_.erase(it);
      s->admitted_at = Clock::now();
      output_.finish(*s, "length");
      output_.deliver(*s);
    } else {
      ++it;
    }
  }
}

size_t Scheduler::chunk_for(const LiveSequence& s, size_t budget) const {
  size_t take = std::min(s.prefill_target() - s.n_prefilled, budget);
  if (opt_.length_buckets && s.length_class == LengthClass::Long)
    take = std::min(take, size_t(opt_.long_prefill_chunk));
  return take;
}

void Scheduler::plan_prefill(size_t budget) {
  const size_t bs = size_t(ctx_.options.block_size);
  // Blocks every decoding sequence may need next step: admission leaves them free, so a
  // new prompt does not immediately force a preemption.
  const size_t reserve = plan_.decodes.size();

  // Prompt chunk of an admitted sequence, shrunk to the blocks that can be had.
  auto schedule_chunk = [&](LiveSequence& s) {
    size_t take = chunk_for(s, budget);
    if (take == 0) return;
    size_t need = ctx_.kv.blocks_needed(s.seq, take);
    if (need > ctx_.kv.pool().n_free()) reclaim(need, &s);
    const size_t free_blocks = ctx_.kv.pool().n_free();
    if (need > free_blocks) {
      // Take what fits into the free blocks (the partly filled tail block counts too).
      const size_t len = ctx_.kv.length(s.seq);
      const size_t tail_room = len % bs == 0 ? 0 : bs - len % bs;
      take = std::min(take, tail_room + free_blocks * bs);
      if (take == 0) return;
    }
    const size_t pos0 = ctx_.kv.append_slots(s.seq, take);
    const auto& ctxt = s.context;
    const bool completes = s.n_prefilled + take == s.prefill_target();
    // Logits only for the last prompt token of a request that has not sampled yet.
    const bool wants_logits = completes && s.last_token < 0;
    for (size_t k = 0; k < take; ++k) {
      const size_t idx = s.n_prefilled + k;
      ctx_.batch.add(ctxt[idx], static_cast<int32_t>(pos0 + k), s.seq,
                     wants_logits && k + 1 == take);
    }
    plan_.prefills.push_back({&s, take, wants_logits});
    budget -= take;
  };

  // 1. Admitted prompts still prefilling, oldest first.
  bool long_active = false;
  for (auto& s : running_)
    if (s->seq >= 0 && s->prefilling()) {
      if (s->length_class == LengthClass::Long) long_active = true;
      if (budget > 0) schedule_chunk(*s);
    }

  // 2. Admission, in the order admission_order.h describes (buckets: starved first, then
  //    short / medium / long, longest cached prefix, similarity to what runs, arrival;
  //    FCFS: arrival order).
  std::vector<LiveSequence*> order;
  order.reserve(waiting_.size());
  if (opt_.length_buckets) {
    const size_t bs = size_t(ctx_.options.block_size);
    std::vector<AdmissionCandidate> candidates;
    candidates.reserve(waiting_.size());
    for (auto& w : waiting_) {
      size_t cached = 0;
      if (opt_.prefix_cache) {
        const size_t target = w->prefill_target();
        cached = bs * prefix_cache_.match_blocks(
                          w->request.cache_scope, std::span<const int32_t>(w->context).first(target),
                          target / bs);
      }
      candidates.push_back({w->length_class, w->arrival, w->waited_steps, cached, w->simhash});
    }
    std::vector<uint64_t> running_hashes;
    running_hashes.reserve(running_.size());
    for (const auto& r : running_) running_hashes.push_back(r->simhash);
    for (size_t i : admission_order(candidates, opt_, running_hashes))
      order.push_back(waiting_[i].get());
  } else {
    for (auto& w : waiting_) order.push_back(w.get());
  }
  // With device copies, the engine thread does not wait for a request's cached prefix to come
  // back from a lower tier (see the skip below).
  using PathState = PrefixCache::PathState;
  const bool defer_loading = ctx_.offload != nullptr && ctx_.offload->copies_async() && opt_.prefix_cache;
  // Looked up only for the candidates the loop reaches (a walk of each one's chain).
  auto others_can_start = [&](size_t from) {
    if (!running_.empty()) return true;
    for (size_t j = from; j < order.size(); ++j)
      if (prefix_state(*order[j]) != PathState::Offloaded) return true;
    return false;
  };
  size_t at = 0;
  std::vector<LiveSequence*> admitted;
  for (LiveSequence* s : order) {
    ++at;
    // Admitted ones join running_ after this loop: count them too.
    if (budget == 0 || running_.size() + admitted.size() >= size_t(ctx_.options.max_sequences))
      break;
    const PathState path = defer_loading ? prefix_state(*s) : PathState::Resident;
    const bool starved = s->waited_steps >= opt_.max_wait_steps;
    if (opt_.length_buckets && s->length_class == LengthClass::Long && long_active && !starved)
      continue;
    // Its cached prefix is still coming back from a lower tier: others go first rather than
    // the engine waiting for the copies. An offloaded prefix is promoted at admission (the
    // engine thread waits for it) only when nothing else can run, its prefetch cannot start
    // and no copy in flight could make room, or after it was passed over kMaxTierDeferrals
    // times.
    if (s->tier_deferrals < kMaxTierDeferrals &&
        (path == PathState::Loading ||
         (path == PathState::Offloaded && (!admitted.empty() || others_can_start(at) || prefetch_prefix(*s) > 0 ||
                                           ctx_.offload->tiers().in_flight() > 0)))) {
      ++s->tier_deferrals;
      continue;
    }
    if (!admit(*s, reserve)) break;  // the pool is full: wait for blocks to come back
    admitted.push_back(s);
    if (s->length_class == LengthClass::Long) long_active = true;
    if (s->prefilling()) schedule_chunk(*s);
    // A re-admitted sequence whose whole context came from the cache decodes next step.
  }
  if (!admitted.empty()) {
    // Move the admitted ones from waiting_ to running_, keeping both orders.
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (std::find(admitted.begin(), admitted.end(), it->get()) != admitted.end()) {
        running_.push_back(std::move(*it));
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
  }
}

bool Scheduler::admit(LiveSequence& s, size_t reserve) {
  const size_t bs = size_t(ctx_.options.block_size);
  const size_t target = s.prefill_target();
  std::vector<BlockId> hit;
  if (opt_.prefix_cache) {
    // Offloaded blocks on the path come back into tier 0 here (verified); the run of hits
    // ends at one that cannot (its tokens are prefilled as usual).
    const CachedPath path = cached_path(s);
    hit = prefix_cache_.acquire(s.request.cache_scope, path.tokens, path.max_blocks);
  }
  const SeqId seq = ctx_.kv.create_sequence_from(hit);  // retains the hit blocks
  for (BlockId b : hit) ctx_.kv.pool().release(b);      // acquire's pins
  // Blocks for the first chunk, plus the reserve for running decodes.
  const size_t first = std::min(target - hit.size() * bs,
                                opt_.length_buckets && s.length_class == LengthClass::Long
                                    ? size_t(opt_.long_prefill_chunk) : target);
  const size_t need = ctx_.kv.blocks_needed(seq, std::max<size_t>(first, 1)) + reserve;
  if (need > ctx_.kv.pool().n_free()) {
    prefix_cache_.evict(need - ctx_.kv.pool().n_free());
    if (need > ctx_.kv.pool().n_free()) {
      ctx_.kv.free_sequence(seq);
      return false;
    }
  }
  s.seq = seq;
  s.n_prefilled = hit.size() * bs;
  const auto now = Clock::now();
  if (!s.admitted_once) {
    s.admitted_once = true;
    s.admitted_at = now;
    s.cached_prompt_tokens = static_cast<int32_t>(s.n_prefilled);
    counters_.prompt_tokens += int64_t(s.request.prompt_ids.size());
  } else {
    s.n_recompute = target - s.n_prefilled;
  }
  if (opt_.prefix_cache) {
    counters_.prefix_queries += int64_t(target);
    counters_.prefix_hits += int64_t(s.n_prefilled);
  }
  s.waited_steps = 0;
  s.tier_deferrals = 0;
  return true;
}

}  // namespace fdl::engine
