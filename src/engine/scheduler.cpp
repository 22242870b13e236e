// The scheduler's step, admission and memory management (policy: flashdllm/engine.h,
// docs/SCHEDULER.md). Decode and verification live in decode_step.cpp, per-token output in
// scheduler_output.cpp, the shadow audit in shadow_audit.cpp.
#include "engine/scheduler.h"

#include "engine/admission_order.h"
#include "engine/prompt_simhash.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>

#include "engine/kv_offload.h"
#include "engine/step_trace.h"

namespace fdl::engine {
namespace {
// Admissions a request may be passed over while its cached prefix comes back from a lower
// tier (device copies); a prefetch lands within a few steps, so this only bounds the case
// where it never finds room.
constexpr int kMaxTierDeferrals = 256;
}  // namespace

Scheduler::Scheduler(EngineContext& ctx, const SchedulerOptions& options)
    : ctx_(ctx), opt_(options), prefix_cache_(ctx.kv.pool(), ctx.options.block_size, ctx.offload),
      policy_(ctx.spec.options, ctx.spec.cache) {
  running_.reserve(size_t(ctx.options.max_sequences));
}

Scheduler::~Scheduler() {
  drain_pipeline(false);
  for (auto& s : running_) release_kv(*s);
}

void Scheduler::add(RequestId id, GenerationRequest request, OutputSink sink) {
  auto s = std::make_unique<LiveSequence>(id, std::move(request), std::move(sink), ctx_.n_vocab,
                                          ctx_.tokenizer, Clock::now());
  s->arrival = arrivals_++;
  s->length_class = classify(s->request.prompt_ids.size());
  s->simhash = prompt_simhash(s->request.prompt_ids);
  s->timings.prompt_tokens = static_cast<int32_t>(s->request.prompt_ids.size());
  // The penalties see the prompt too, as in llama.cpp.
  if (s->request.sampling.has_penalties())
    for (int32_t t : s->request.prompt_ids) s->sampler.accept(t);
  s->spec_window = ctx_.spec.enabled()
                       ? (s->request.spec_window >= 0 ? s->request.spec_window
                                                      : ctx_.spec.options.window)
                       : 0;
  ++counters_.submitted;
  waiting_.push_back(std::move(s));
}

bool Scheduler::abort(RequestId id) {
  const auto running = [&]() -> LiveSequence* {
    for (auto& s : running_)
      if (s->id == id && !s->finished) return s.get();
    return nullptr;
  };
  // The step in flight may hold its row: emit that step first (the request may end with it).
  if (inflight_ && running() != nullptr) drain_pipeline(true);
  if (LiveSequence* s = running()) {
    finish(*s, "abort");
    deliver(*s);
    drop_finished();
    return true;
  }
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
    if ((*it)->id == id) {
      SeqPtr s = std::move(*it);
      waiting_.erase(it);
      finish(*s, "abort");
      deliver(*s);
      return true;
    }
  return false;
}

void Scheduler::fail_all(const std::string& reason, const std::string& error) {
  drain_pipeline(false);
  for (auto& s : running_)
    if (!s->finished) {
      finish(*s, reason.c_str(), error);
      deliver(*s);
    }
  drop_finished();
  while (!waiting_.empty()) {
    SeqPtr s = std::move(waiting_.front());
    waiting_.pop_front();
    finish(*s, reason.c_str(), error);
    deliver(*s);
  }
}

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
      finish(*s, "length");
      deliver(*s);
    } else {
      ++it;
    }
  }
}

void Scheduler::step() {
  if (inflight_) return step_pipelined();
  finish_trivial();
  if (!has_work()) return;
  ++counters_.steps;
  const auto t0 = Clock::now();
  ctx_.batch.clear();
  decode_.clear();
  prefill_.clear();
  drafted_ = 0;

  if (ctx_.offload != nullptr) {
    ctx_.offload->set_step(uint64_t(counters_.steps));
    ctx_.offload->poll();  // collect finished disk transfers; never blocks
  }
  plan_decode();
  // With device copies and sampling, the prefetch runs while the forward computes (forward());
  // it is for the requests after those admitted now, whose prefixes land steps later anyway.
  prefetch_due_ = ctx_.offload != nullptr;
  if (prefetch_due_ && !(ctx_.offload->copies_async() && ctx_.model.prefers_device_sampling())) prefetch_once();
  const size_t decode_tokens = ctx_.batch.size();
  size_t budget = size_t(opt_.max_num_batched_tokens) > decode_tokens
                      ? size_t(opt_.max_num_batched_tokens) - decode_tokens : 0;
  if (opt_.max_prefill_tokens > 0) budget = std::min(budget, size_t(opt_.max_prefill_tokens));
  const auto ta = Clock::now();
  plan_prefill(budget);
  if (ctx_.trace != nullptr)
    ctx_.trace->span_since(StepTrace::Track::Schedule, "plan prefill", ta, {{"step", counters_.steps}});
  for (auto& w : waiting_) ++w->waited_steps;
  if (ctx_.batch.size() == 0) prefetch_once();
  if (ctx_.batch.size() == 0 && ctx_.offload != nullptr && ctx_.offload->copies_async())
    // Nothing to run until a prefetched prefix lands (device copies): look again shortly, and
    // meanwhile let the caller hand in new requests, rather than block on the copies.
    std::this_thread::sleep_for(std::chrono::microseconds(50));

  if (ctx_.trace != nullptr)
    ctx_.trace->span_since(StepTrace::Track::Schedule, "plan", t0,
                           {{"step", counters_.steps}, {"waiting", waiting_.size()}, {"running", running_.size()}});
  if (ctx_.batch.size() > 0) {
    size_t rows = decode_tokens;
    for (const auto& p : prefill_) rows += p.last ? 1 : 0;
    ctx_.stats.n_decode_tokens += static_cast<int64_t>(decode_tokens);
    ctx_.stats.n_prefill_tokens += static_cast<int64_t>(ctx_.batch.size() - decode_tokens);
    forward(rows);
    prefetch_once();  // if the forward did not run it
    if (inflight_) return;  // submitted: the next step() emits its tokens
    const auto t1 = Clock::now();
    finish_decode();
    // Speculation's cost model and breaker see the whole decode side of the step: drafting,
    // the forward and verification (on a tiny model the drafters and the verification scans
    // are a visible share), and what it produced.
    SpecState& sp = ctx_.spec;
    if (sp.enabled()) {
      const double ms = ms_between(t0, Clock::now());
      const size_t tokens = ctx_.batch.size();
      if (!decode_.empty() || sp.cost.has_data()) sp.cost.observe(double(tokens), ms);
      const size_t emitted = step_emitted_;
      if (!decode_.empty()) {
        const size_t plain_tokens = tokens - drafted_;
        if (drafted_ == 0)
          sp.observe_plain(plain_tokens, ms);
        else
          sp.breaker.record_step(double(emitted), ms, double(decode_.size()),
                                 sp.plain_ms(plain_tokens));
      }
    }
    finish_prefill(t0, t1);
  }
  const auto t_emit = Clock::now();
  for (auto& s : running_)
    if (s->finished || !s->pending.tokens.empty() || !s->pending.text.empty()) deliver(*s);
  drop_finished();
  if (ctx_.trace != nullptr)
    ctx_.trace->span_since(StepTrace::Track::Schedule, "emit", t_emit, {{"step", counters_.steps}});
}

bool Scheduler::ids_only_step() const {
  if (drafted_ > 0 || ctx_.spec.enabled()) return false;  // verification and audits read logits
  const auto wants_logprobs = [](const LiveSequence& s) { return s.request.logprobs >= 0; };
  for (const auto& d : decode_)
    if (wants_logprobs(*d.s)) return false;
  for (const auto& p : prefill_)
    if (p.last && wants_logprobs(*p.s)) return false;
  return true;
}

void Scheduler::build_row_sampling(std::span<const DecodeSlot> decodes, size_t logit_rows) {
  row_sampling_.assign(logit_rows, RowSampling{});
  penalty_tokens_.clear();
  const auto set = [&](LiveSequence& s, size_t row) {
    Sampler& sm = s.sampler;
    row_sampling_.at(row) = Sampler::row_sampling(sm.params(), sm.params().is_greedy() ? 0.0 : sm.next_uniform());
    sm.append_penalty_tokens(int32_t(row), penalty_tokens_);
  };
  // Rows as finish_decode / finish_prefill read them: decode rows, then completing prompts.
  for (const auto& d : decodes) set(*d.s, d.row);
  size_t row = decodes.size();
  for (const auto& p : prefill_)
    if (p.last) set(*p.s, row++);
  if (row != logit_rows)
    throw std::logic_error("scheduler: " + std::to_string(row) + " sampled rows for " + std::to_string(logit_rows) +
                           " logits rows");
}

int32_t Scheduler::row_token(LiveSequence& s, size_t row) {
  return ids_step_ ? step_ids_[row] : s.sampler.sample(logits_row(row));
}

void Scheduler::forward(size_t logit_rows) {
  const auto t0 = Clock::now();
  // A GPU model samples on the device when nothing else is needed: only ids cross PCIe, no
  // n_vocab-float rows get copied or scanned on the host.
  ids_step_ = ctx_.model.prefers_device_sampling() && ids_only_step();
  step_logit_rows_ = logit_rows;
  bool timed = true;  // the measured time is the forward's (see the prefetch below)
  if (ids_step_) {
    build_row_sampling(decode_, logit_rows);
    if (may_pipeline()) {
      ctx_.model.submit_sample(ctx_.batch, ctx_.kv, row_sampling_, penalty_tokens_);
      ctx_.logits.clear();
      ++ctx_.stats.n_forwards;
      inflight_ = true;
      return;
    }
    if (prefetch_due_) {
      // The host's prefetch work runs while the device computes the step.
      ctx_.model.submit_sample(ctx_.batch, ctx_.kv, row_sampling_, penalty_tokens_);
      try {
        prefetch_once();
      } catch (...) {
        std::vector<int32_t> dropped;
        try {
          ctx_.model.collect_ids(dropped);  // nothing may stay submitted
        } catch (...) {
        }
        throw;
      }
      const auto tc = Clock::now();
      ctx_.model.collect_ids(step_ids_);
      // The forward's time is its own only when the device was still busy after the host's
      // prefetch; otherwise it holds host work, and the recompute speed skips this sample.
      timed = ms_between(tc, Clock::now()) > 0.05;
    } else {
      ctx_.model.forward_sample(ctx_.batch, ctx_.kv, row_sampling_, penalty_tokens_, step_ids_);
    }
    ctx_.logits.clear();
  } else {
    ctx_.model.forward(ctx_.batch, ctx_.kv, ctx_.logits);
  }
  const auto t1 = Clock::now();
  const double ms = ms_between(t0, t1);
  ctx_.stats.forward_ms += ms;
  size_t prefill_tokens = 0;
  for (const auto& p : prefill_) prefill_tokens += p.take;
  // The recompute speed the cost rule uses: forwards that are mostly prompt tokens (a
  // dropped block comes back the same way). At least a block's worth, or timing noise wins.
  if (timed && ctx_.offload != nullptr && prefill_tokens >= size_t(ctx_.options.block_size) &&
      2 * prefill_tokens >= ctx_.batch.size())
    ctx_.offload->observe_prefill(ctx_.batch.size(), ms / 1000.0);
  if (ctx_.trace != nullptr)
    ctx_.trace->span(StepTrace::Track::Compute, "forward", t0, ms * 1000.0,
                     {{"step", counters_.steps},
                      {"tokens", ctx_.batch.size()},
                      {"prefill_tokens", prefill_tokens},
                      {"decodes", decode_.size()}});
  ++ctx_.stats.n_forwards;
  // Reading rows that are not there would be undefined behaviour; fail loudly instead.
  if (ids_step_) {
    if (step_ids_.size() != logit_rows)
      throw std::logic_error("Model::forward_sample returned " + std::to_string(step_ids_.size()) +
                             " ids, expected " + std::to_string(logit_rows));
  } else if (ctx_.logits.size() != logit_rows * size_t(ctx_.n_vocab))
    throw std::logic_error("Model::forward returned " + std::to_string(ctx_.logits.size()) +
                           " logits, expected " + std::to_string(logit_rows) + " rows of " +
                           std::to_string(ctx_.n_vocab));
}

std::span<const float> Scheduler::logits_row(size_t row) const {
  if (ids_step_) return {};
  return {ctx_.logits.data() + row * size_t(ctx_.n_vocab), size_t(ctx_.n_vocab)};
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
  const size_t reserve = decode_.size();

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
    prefill_.push_back({&s, take, wants_logits});
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

Scheduler::CachedPath Scheduler::cached_path(const LiveSequence& s) const {
  const size_t target = s.prefill_target();
  // A request that has not sampled yet needs logits of its last prompt token, so that token
  // is always computed.
  const size_t cacheable = s.last_token >= 0 ? target : target - 1;
  return {std::span<const int32_t>(s.context).first(target), cacheable / size_t(ctx_.options.block_size)};
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

PrefixCache::PathState Scheduler::prefix_state(const LiveSequence& s) {
  const CachedPath path = cached_path(s);
  return prefix_cache_.path_state(s.request.cache_scope, path.tokens, path.max_blocks);
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

bool Scheduler::in_this_step(const LiveSequence* s) const {
  for (const auto& d : decode_)
    if (d.s == s) return true;
  for (const auto& p : prefill_)
    if (p.s == s) return true;
  return false;
}

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
    if (s->shadow && !in_this_step(s.get())) end_shadow(*s);
  }
  // Then preempt, youngest first.
  while (pool.n_free() < n) {
    LiveSequence* victim = nullptr;
    for (auto it = running_.rbegin(); it != running_.rend(); ++it)
      if (it->get() != keep && (*it)->seq >= 0 && !(*it)->finished && !in_this_step(it->get())) {
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

void Scheduler::cache_blocks(const LiveSequence& s, size_t n_tokens) {
  const auto table = ctx_.kv.block_table(s.seq);
  n_tokens = std::min({n_tokens, s.context.size(), ctx_.kv.length(s.seq)});
  prefix_cache_.insert(s.request.cache_scope, std::span<const int32_t>(s.context).first(n_tokens),
                       table);
}

void Scheduler::finish_prefill(Clock::time_point batch_start, Clock::time_point batch_end) {
  // Logit rows: the decode rows first (batch order), then one per completing prompt.
  size_t n_prefill_rows = 0;
  for (const auto& p : prefill_) n_prefill_rows += p.last ? 1 : 0;
  size_t row = step_logit_rows_ - n_prefill_rows;
  for (const auto& p : prefill_) {
    LiveSequence& s = *p.s;
    if (s.prefill_start == Clock::time_point{}) s.prefill_start = batch_start;
    s.n_prefilled += p.take;
    counters_.prefill_computed += int64_t(p.take);
    if (s.n_recompute > 0) {
      const size_t r = std::min(s.n_recompute, p.take);
      counters_.recomputed += int64_t(r);
      s.n_recompute -= r;
    }
    if (opt_.prefix_cache) cache_blocks(s, s.n_prefilled);
    if (!p.last) continue;
    s.timings.prompt_ms = ms_between(s.prefill_start, batch_end);
    on_token(s, row_token(s, row), logits_row(row));
    ++row;
    if (!s.finished) start_shadow(s);
  }
}

void Scheduler::drop_finished() {
  for (auto& s : running_)
    if (s->finished) release_kv(*s);
  std::erase_if(running_, [](const SeqPtr& s) { return s->finished; });
}

}  // namespace fdl::engine
