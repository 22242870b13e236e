// The decode step with self-verifying speculation (flashdllm/speculative.h,
// docs/SPECULATIVE.md): draft, one batched forward over every sequence's [next token,
// drafts], acceptance token by token through the normal end conditions, KV rollback.
#include <limits>

#include "decode/row_ops.h"
#include "engine/generation_run.h"

#include <xxhash.h>

namespace fdl::engine {
namespace {

constexpr size_t kNoRow = std::numeric_limits<size_t>::max();

}  // namespace

void GenerationRun::plan_draft(LiveSequence& s, size_t n_live, bool speculate,
                               std::vector<int32_t>& draft) {
  draft.clear();
  if (!speculate || s.spec_window <= 0) return;
  size_t max_k = size_t(s.spec_window);
  const size_t generated = s.result.generated_ids.size();
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

void GenerationRun::decode_step() {
  SpecState& sp = ctx_.spec;
  const auto t0 = Clock::now();
  const size_t n = live_.size();
  size_t n_shadows = 0;
  for (const auto& s : live_) n_shadows += s->shadow ? 1 : 0;
  // Plain steps for everyone: periodically, and until a plain step of this batch size has
  // been measured often enough to be the base the window controller compares against.
  const bool calibrate =
      sp.enabled() &&
      (sp.decode_steps % SpecState::kCalibrationInterval == SpecState::kCalibrationInterval - 1 ||
       sp.cost.samples(n + n_shadows) < spec::StepCostModel::kMinSamples);
  ++sp.decode_steps;
  const bool speculate = sp.enabled() && !sp.breaker.open() && !calibrate;

  drafts_.resize(n);
  first_row_.resize(n);
  first_pos_.resize(n);
  shadow_row_.assign(n, kNoRow);
  ctx_.batch.clear();
  size_t drafted = 0;
  for (size_t r = 0; r < n; ++r) {
    LiveSequence& s = *live_[r];
    auto& draft = drafts_[r];
    plan_draft(s, n, speculate, draft);
    first_row_[r] = ctx_.batch.size();
    const size_t pos = ctx_.kv.append_slots(s.seq, draft.size() + 1);
    first_pos_[r] = pos;
    ctx_.batch.add(s.last_token, static_cast<int32_t>(pos), s.seq, true);
    for (size_t i = 0; i < draft.size(); ++i)
      ctx_.batch.add(draft[i], static_cast<int32_t>(pos + 1 + i), s.seq, true);
    drafted += draft.size();
  }
  for (size_t r = 0; r < n; ++r)
    if (live_[r]->shadow) {
      shadow_row_[r] = ctx_.batch.size();
      add_shadow_token(*live_[r]);
    }
  const size_t batch_tokens = ctx_.batch.size();
  ctx_.stats.n_decode_tokens += static_cast<int64_t>(batch_tokens);
  forward(batch_tokens);

  size_t emitted = 0;
  for (size_t r = 0; r < n; ++r) {
    LiveSequence& s = *live_[r];
    emitted += verify(s, drafts_[r], first_row_[r], first_pos_[r]);
    if (shadow_row_[r] != kNoRow && s.shadow) advance_shadow(s, shadow_row_[r]);
  }

  const double ms = ms_between(t0, Clock::now());
  SpecMetrics& m = sp.metrics;
  ++m.steps;
  m.emitted += int64_t(emitted);
  if (!sp.enabled()) return;
  sp.cost.observe(double(batch_tokens), ms);
  const size_t plain_tokens = batch_tokens - drafted;  // what this step costs without drafts
  if (drafted == 0)
    sp.observe_plain(plain_tokens, ms);
  else
    sp.breaker.record_step(double(emitted), ms, double(n), sp.plain_ms(plain_tokens));
}

size_t GenerationRun::verify(LiveSequence& s, const std::vector<int32_t>& draft, size_t row0,
                             size_t pos0) {
  SpecState& sp = ctx_.spec;
  const size_t k = draft.size();
  const size_t before = s.context.size() - 1;  // the context ends with the fed token x0
  const int32_t x0 = s.last_token;
  emitted_.clear();
  size_t accepted = 0;
  for (size_t i = 0; i <= k; ++i) {
    const auto row = logits_row(row0 + i);
    // Position i's logits are those plain decoding would see after x0, d1..di: drafts
    // before it were accepted (else the loop ended), and the sampler's penalty history
    // already holds them (on_token accepted each).
    const int32_t tok = i < k ? s.sampler.sample_against_draft(row, draft[i])
                              : s.sampler.sample(row);
    const bool match = i < k && tok == draft[i];
    on_token(s, tok);
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
                                   XXH3_64bits(emitted_.data(), emitted_.size() * sizeof(int32_t))});
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
  if (!s.finished) ctx_.kv.truncate(s.seq, pos0 + accepted + 1);
  return emitted_.size();
}

}  // namespace fdl::engine
