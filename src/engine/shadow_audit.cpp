// Fingerprint audit with a plain shadow (docs/SPECULATIVE.md, "Fingerprint audit and breaker").
//
// An audited greedy sequence gets, right after its prefill, a fork of its KV sequence (the
// prompt blocks are shared by refcount) that decodes plainly, one token per step, in the
// same batched forwards. Each speculative step of the audited sequence records an XXH3-64
// fingerprint of the ids it sampled and their quantized logits (step_fingerprint.h), with
// their index range; once the shadow has sampled the
// same range, the fingerprints are compared and the result goes to the breaker. The shadow
// trails (it makes one token per step), so the comparisons cover the steps it reaches
// before the audited sequence finishes; it is freed with the sequence.
// Only greedy requests are audited: a sampled request's spec and plain steps may draw with
// different samplers (the CUDA model samples plain steps on the device, verified rows on the
// host), so a draw near a boundary may legitimately differ.
#include "engine/scheduler.h"
#include "engine/step_fingerprint.h"


namespace fdl::engine {

void Scheduler::start_shadow(LiveSequence& s) {
  SpecState& sp = ctx_.spec;
  if (!sp.enabled() || sp.options.audit_fraction <= 0.0 || s.spec_window <= 0 ||
      !s.request.sampling.is_greedy() || sp.breaker.open() || s.grammar)
    return;  // (a grammar's shadow would need its own matcher; constrained rows are not audited)
  // Deterministic selection of exactly `audit_fraction` of the eligible requests.
  sp.audit_credit += sp.options.audit_fraction;
  if (sp.audit_credit < 1.0) return;
  sp.audit_credit -= 1.0;
  ShadowCopy& sh = s.shadow.emplace(s.sampler);
  sh.seq = ctx_.kv.fork_sequence(s.seq);
  sh.last_token = s.last_token;
  sh.base = s.n_sampled;
}

void Scheduler::add_shadow_token(LiveSequence& s) {
  ShadowCopy& sh = *s.shadow;
  const size_t pos = ctx_.kv.append_slots(sh.seq, 1);
  ctx_.batch.add(sh.last_token, static_cast<int32_t>(pos), sh.seq, true);
}

void Scheduler::advance_shadow(LiveSequence& s, size_t row) {
  SpecState& sp = ctx_.spec;
  ShadowCopy& sh = *s.shadow;
  const int32_t tok = sh.sampler.sample(runner_.logits_row(row));
  sh.sampler.accept(tok);
  sh.ids.push_back(tok);
  sh.logits_q.push_back(quantize_logit(runner_.logits_row(row)[size_t(tok)]));
  sh.last_token = tok;
  while (!sh.pending.empty() && sh.pending.front().end <= sh.base + sh.ids.size()) {
    const auto p = sh.pending.front();
    sh.pending.pop_front();
    const size_t at = p.begin - sh.base, n = p.end - p.begin;
    const uint64_t fp = step_fingerprint(std::span<const int32_t>(sh.ids).subspan(at, n),
                                         std::span<const int32_t>(sh.logits_q).subspan(at, n));
    bool mismatch = fp != p.fingerprint;
    if (sp.forced_mismatches > 0) {
      --sp.forced_mismatches;
      mismatch = true;
    }
    ++sp.metrics.audited_steps;
    if (mismatch) ++sp.metrics.audit_mismatches;
    sp.breaker.record_audit(mismatch);
  }
}

void Scheduler::end_shadow(LiveSequence& s) {
  if (!s.shadow) return;
  if (s.shadow->seq >= 0) ctx_.kv.free_sequence(s.shadow->seq);
  s.shadow.reset();
}

}  // namespace fdl::engine
