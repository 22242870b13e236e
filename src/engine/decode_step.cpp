// The decode step with self-verifying speculation (flashdllm/speculative.h,
// docs/SPECULATIVE.md): draft, one batched forward over every sequence's [next token,
// drafts], acceptance token by token through the normal end conditions, KV rollback.
#include <limits>
#include <stdexcept>

#include "decode/row_ops.h"
#include "engine/scheduler.h"
#include "engine/step_fingerprint.h"


namespace fdl::engine {
namespace {

constexpr size_t kNoRow = std::numeric_limits<size_t>::max();

}  // namespace

void Scheduler::plan_draft(LiveSequence& s, size_t n_live, bool speculate,
                               std::vector<int32_t>& draft) {
  draft.clear();
  if (!speculate || s.spec_window <= 0) return;
  size_t max_k = size_t(s.spec_window);
  const size_t generated = s.n_generated;
  // Never draft past what the request may still emit: the step emits up to k + 1 tokens.
  if (s.request.max_new_tokens > 0)
    max_k = std::min(max_k, size_t(s.request.max_new_tokens) - generated - 1);
  // The drafts occupy positions up to prompt + generated - 1 + k, which must stay < n_ctx.
  const size_t used = s.request.prompt_ids.size() + generated;
  max_k = std::min(max_k, size_t(ctx_.options.n_ctx) - used);
  // The window depends on acceptance and cost only, so it is chosen first: a sequence for
  // which speculation does not pay skips drafting altogether (on a tiny model the drafters'
  // scans are a visible share of a step).
  if (ctx_.spec.options.adaptive && max_k > 0) max_k = s.window.choose(max_k, n_live, ctx_.spec.cost);
  if (max_k == 0) return;
  // The pool's history is brought up to date only when a draft is wanted: a sequence that
  // decodes plainly pays nothing for it.
  if (ctx_.spec.options.mode != SpecMode::Lookup) {
    s.lookahead.feed_history(s.context, s.lookahead_fed);
    s.lookahead_fed = s.context.size();
  }
  policy_.propose(s.context, max_k, s.lookahead, draft_);
  draft.assign(draft_.tokens.begin(), draft_.tokens.end());
}

void Scheduler::plan_decode() {
  SpecState& sp = ctx_.spec;
  // Sequences that decode this step: admitted, prompt in the cache, not finished.
  std::vector<LiveSequence*> seqs;
  auto collect = [&] {
    seqs.clear();
    for (auto& s : running_)
      if (s->seq >= 0 && !s->finished && !s->prefilling() && s->last_token >= 0)
        seqs.push_back(s.get());
  };
  collect();
  if (seqs.empty()) return;
  size_t n_shadows = 0;
  for (const LiveSequence* s : seqs) n_shadows += s->shadow ? 1 : 0;
  // Plain steps for everyone: periodically, and until a plain step of this batch size has
  // been measured often enough to be the base the window controller compares against. While
  // prompts are being prefilled beside the decodes, steps of exactly that size do not occur;
  // the cost model's line (fitted on every step) is the base then.
  bool prompts_pending = !waiting_.empty();
  for (const auto& s : running_) prompts_pending = prompts_pending || (s->seq >= 0 && s->prefilling());
  const bool unmeasured = prompts_pending
                              ? !sp.cost.has_data()
                              : sp.cost.samples(seqs.size() + n_shadows) < spec::StepCostModel::kMinSamples;
  const bool calibrate =
      sp.enabled() &&
      (sp.decode_steps % SpecState::kCalibrationInterval == SpecState::kCalibrationInterval - 1 ||
       unmeasured);
  ++sp.decode_steps;
  bool speculate = sp.enabled() && !sp.breaker.open() && !calibrate;

  // Drafts first (no memory taken), then make sure the blocks exist: without them the
  // drafts go, then audit shadows, then the youngest sequences are preempted (recompute).
  for (;;) {
    drafts_.resize(seqs.size());
    size_t need = 0;
    for (size_t r = 0; r < seqs.size(); ++r) {
      LiveSequence& s = *seqs[r];
      plan_draft(s, seqs.size(), speculate, drafts_[r]);
      need += ctx_.kv.blocks_needed(s.seq, drafts_[r].size() + 1);
      if (s.shadow) need += ctx_.kv.blocks_needed(s.shadow->seq, 1);
    }
    if (need <= ctx_.kv.pool().n_free()) break;
    prefix_cache_.evict(need - ctx_.kv.pool().n_free());
    if (need <= ctx_.kv.pool().n_free()) break;
    if (speculate) {
      speculate = false;  // plain decoding needs the fewest blocks
      continue;
    }
    if (!reclaim(need, nullptr)) throw std::logic_error("scheduler: KV pool cannot hold one step");
    collect();
    if (seqs.empty()) return;
  }

  for (size_t r = 0; r < seqs.size(); ++r) {
    LiveSequence& s = *seqs[r];
    const auto& draft = drafts_[r];
    const size_t row = ctx_.batch.size();
    const size_t pos = ctx_.kv.append_slots(s.seq, draft.size() + 1);
    ctx_.batch.add(s.last_token, static_cast<int32_t>(pos), s.seq, true);
    for (size_t i = 0; i < draft.size(); ++i)
      ctx_.batch.add(draft[i], static_cast<int32_t>(pos + 1 + i), s.seq, true);
    drafted_ += draft.size();
    decode_.push_back({&s, row, pos, kNoRow});
  }
  for (auto& d : decode_)
    if (d.s->shadow) {
      d.shadow_row = ctx_.batch.size();
      add_shadow_token(*d.s);
    }
}

void Scheduler::finish_decode() {
  SpecMetrics& m = ctx_.spec.metrics;
  step_emitted_ = 0;
  if (decode_.empty()) return;
  size_t emitted = 0;
  for (size_t r = 0; r < decode_.size(); ++r) {
    const DecodeSlot& d = decode_[r];
    emitted += verify(*d.s, drafts_[r], d.row, d.pos);
    if (d.shadow_row != kNoRow && d.s->shadow) advance_shadow(*d.s, d.shadow_row);
  }
  ++m.steps;
  m.emitted += int64_t(emitted);
  step_emitted_ = emitted;
}

size_t Scheduler::verify(LiveSequence& s, const std::vector<int32_t>& draft, size_t row0,
                             size_t pos0) {
  SpecState& sp = ctx_.spec;
  const size_t k = draft.size();
  const size_t before = s.context.size() - 1;  // the context ends with the fed token x0
  const int32_t x0 = s.last_token;
  emitted_.clear();
  emitted_q_.clear();
  size_t accepted = 0;
  for (size_t i = 0; i <= k; ++i) {
    const auto row = logits_row(row0 + i);
    // Position i's logits are those plain decoding would see after x0, d1..di: drafts
    // before it were accepted (else the loop ended), and the sampler's penalty history
    // already holds them (on_token accepted each).
    const int32_t tok = i < k ? s.sampler.sample_against_draft(row, draft[i]) : row_token(s, row0 + i);
    const bool match = i < k && tok == draft[i];
    emitted_q_.push_back(row.empty() ? 0 : quantize_logit(row[size_t(tok)]));  // empty: an argmax-only step
    on_token(s, tok, row);
    if (match) ++accepted;
    if (s.finished || !match) break;
  }
  if (k > 0) {
    SpecMetrics& m = sp.metrics;
    ++m.spec_seq_steps;
    m.drafted += int64_t(k);
    m.accepted += int64_t(accepted);
    m.rejected += int64_t(k - accepted);
    s.window.observe(k, accepted);
    if (s.shadow)
      s.shadow->pending.push_back({s.n_sampled - emitted_.size(), s.n_sampled,
                                   step_fingerprint(emitted_, emitted_q_)});
  }
  if (sp.enabled()) {
    const SpecMode mode = sp.options.mode;
    if (mode == SpecMode::Lookup || mode == SpecMode::Auto) sp.cache.feed(s.context, before + 1);
    // Without drafts, the one output is the next history token: nothing new to record.
    if (!s.finished && k > 0 && mode != SpecMode::Lookup) {
      // The lookahead trajectory: the model's argmax at every fed position, rejected too.
      inputs_.assign(1, x0);
      inputs_.insert(inputs_.end(), draft.begin(), draft.end());
      outputs_.resize(k + 1);
      for (size_t i = 0; i <= k; ++i)
        outputs_[i] = static_cast<int32_t>(detail::scan_row(logits_row(row0 + i)).argmax);
      const std::span<const int32_t> ctx(s.context);
      s.lookahead.feed_verification(ctx.first(before), inputs_, outputs_, accepted);
      s.lookahead.feed_history(ctx, s.lookahead_fed);
      s.lookahead_fed = ctx.size();
    }
  }
  // Local rollback: keep x0 and the accepted drafts; the rejected tail's whole blocks go
  // back to the pool. A finished sequence has already freed everything.
  if (!s.finished) {
    ctx_.kv.truncate(s.seq, pos0 + accepted + 1);
    s.n_prefilled = pos0 + accepted + 1;  // every context token but the new last one is fed
  }
  return emitted_.size();
}

}  // namespace fdl::engine
