// The decode step with self-verifying speculation (flashdllm/speculative.h,
// docs/SPECULATIVE.md): draft, one batched forward over every sequence's [next token,
// drafts], acceptance token by token through the normal end conditions, KV rollback.
#include <algorithm>
#include <stdexcept>

#include "decode/row_ops.h"
#include "engine/scheduler.h"
#include "engine/step_fingerprint.h"


namespace fdl::engine {

void Scheduler::plan_draft(LiveSequence& s, size_t n_live, bool speculate, spec::DraftTree& draft) {
  draft.clear();
  SpecState& sp = ctx_.spec;
  if (!sp.enabled() || sp.breaker.open() || s.spec_window <= 0) return;
  size_t max_k = size_t(s.spec_window);
  const size_t generated = s.n_generated;
  // Never draft past what the request may still emit: the step emits up to k + 1 tokens.
  if (s.request.max_new_tokens > 0)
    max_k = std::min(max_k, size_t(s.request.max_new_tokens) - generated - 1);
  // The drafts occupy positions up to prompt + generated - 1 + k, which must stay < n_ctx.
  const size_t used = s.request.prompt_ids.size() + generated;
  max_k = std::min(max_k, size_t(ctx_.options.n_ctx) - used);
  if (max_k == 0) return;
  // Several candidates verified as a tree only where the model has tree attention.
  // (A grammar cuts drafts along one path: constrained sequences draft linearly.)
  const bool tree = sp.options.tree && ctx_.model.supports_tree_verification() && !s.grammar;
  const auto propose_timed = [&](size_t k, bool candidates) {
    const auto t0 = Clock::now();
    // The pool's history is brought up to date only when a draft is wanted: a sequence
    // that decodes plainly pays for it only with its (rate-limited) shadow drafts.
    if (sp.options.mode != SpecMode::Lookup) {
      s.lookahead.feed_history(s.context, s.lookahead_fed);
      s.lookahead_fed = s.context.size();
    }
    policy_.propose(s.context, k, s.lookahead, draft_);
    // The shadow-draft budget is priced by this: a shadow draft never collects alternates.
    sp.observe_draft(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    if (candidates && !draft_.tokens.empty() && s.tree_skip-- <= 0 &&
        spec::DraftTreeBuilder::alternates_useful(k, s.window.acceptance(), sp.alternates.gamma())) {
      policy_.propose_candidates(s.context, k, s.lookahead, draft_, candidates_);
      // The k nodes go to the most probable continuations: the main candidate's chain, and
      // alternates at the positions where it is most likely wrong (draft_tree.h).
      tree_builder_.build(candidates_, k, s.window.acceptance(), sp.alternates.gamma(), draft);
      const bool found = !draft.linear();
      s.tree_backoff = found ? 0 : std::min(2 * s.tree_backoff + 1, LiveSequence::kMaxTreeBackoff);
      s.tree_skip = s.tree_backoff;
    } else if (candidates) {
      draft.assign_linear(draft_.tokens);
    }
  };
  const size_t full = max_k;
  // The window depends on acceptance and cost only, so it is chosen first: a sequence for
  // which speculation does not pay skips drafting (on a tiny model the drafters' scans are
  // a visible share of a step), but for a shadow draft now and then.
  if (!speculate)
    max_k = 0;
  else if (sp.options.adaptive)
    max_k = s.window.choose(max_k, n_live, sp.cost);
  if (max_k == 0) {
    // Plain step: maybe a shadow draft, rate-limited by what drafting costs (on a tiny
    // model a drafter's scan is a visible share of a step).
    if (!sp.options.adaptive ||
        !s.window.shadow_due(sp.draft_ms, sp.shadow_step_ms(n_live) / double(std::max<size_t>(n_live, 1))))
      return;
    propose_timed(full, false);
    s.window.start_shadow(draft_.tokens);
    return;
  }
  s.window.drop_shadow();  // the verification below is the evidence now
  propose_timed(max_k, tree);
  if (!tree) draft.assign_linear(draft_.tokens);
}

void Scheduler::constrain_draft(LiveSequence& s, spec::DraftTree& draft) {
  // Forced tokens ride along even where the request does not speculate (up to the
  // sequence's forced window, GrammarState::observe_forced).
  size_t max_k = draft.size() + s.grammar->forced_window;
  // As plan_draft: never past what the request may still emit, or past the context.
  if (s.request.max_new_tokens > 0)
    max_k = std::min(max_k, size_t(s.request.max_new_tokens) - s.n_generated - 1);
  max_k = std::min(max_k, size_t(ctx_.options.n_ctx) - (s.request.prompt_ids.size() + s.n_generated));
  const auto t0 = Clock::now();
  draft_tokens_.assign(draft.tokens.begin(), draft.tokens.end());
  try {
    s.draft_kept = s.grammar->constrain_draft(draft_tokens_, max_k);
  } catch (const GrammarError&) {
    draft_tokens_.clear();  // the sampling of this row reports it
    s.draft_kept = 0;
  }
  draft.assign_linear(draft_tokens_);
  const double ms = ms_between(t0, Clock::now());
  ctx_.stats.grammar_ms += ms;
  s.grammar->host_ms += ms;
}

namespace {

bool refresh_base(const SpecState& sp, const std::vector<LiveSequence*>& seqs,
                  const std::vector<spec::DraftTree>& drafts, size_t plain_tokens) {
  // Every window decision compares against the measured cost of a plain step, which is
  // measured only on plain steps: while sequences speculate it goes stale, and the first
  // measurements of a generation are the slow steps right after its prefill (up to 2x the
  // later cost on codelm-16m). A stale, too-high base makes a marginal window look like a
  // win (lookahead on an edited passage ran at 0.84-0.93x plain that way). So when the base is
  // old and no sequence expects a clear gain, this step runs plain and re-measures it: it
  // costs little exactly when speculation gains little. A clear expected gain is left alone.
  if (!sp.options.adaptive || sp.cost.age(plain_tokens) <= SpecState::kBaseMaxAge) return false;
  bool drafting = false;
  for (size_t r = 0; r < seqs.size(); ++r) {
    if (drafts[r].empty()) continue;
    drafting = true;
    if (seqs[r]->window.predicted_gain() >= SpecState::kClearGain) return false;
  }
  return drafting;  // without drafts the step is plain anyway
}

}  // namespace

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
  // Plain steps for everyone: periodically (the breaker's reference), and while prompts are
  // prefilled before the cost model has any data. The plain step of this batch size, the base the window
  // controller compares against, is (re)measured by refresh_base() when a decision depends
  // on it; a fixed warm-up of plain steps would measure it on the slow first steps after the
  // prefill and cost a copying generation its first steps (3 of ~25 on codelm-16m).
  bool prompts_pending = !waiting_.empty();
  for (const auto& s : running_) prompts_pending = prompts_pending || (s->seq >= 0 && s->prefilling());
  const bool calibrate =
      sp.enabled() &&
      (sp.decode_steps % SpecState::kCalibrationInterval == SpecState::kCalibrationInterval - 1 ||
       (prompts_pending && !sp.cost.has_data()));
  ++sp.decode_steps;
  bool speculate = sp.enabled() && !sp.breaker.open() && !calibrate;

  // Drafts first (no memory taken), then make sure the blocks exist: without them the
  // drafts go (the speculative ones, then grammar-forced ones), then audit shadows, then the
  // youngest sequences are preempted (recompute).
  bool forced = true;
  for (;;) {
    plan_.drafts.resize(seqs.size());
    for (size_t r = 0; r < seqs.size(); ++r) plan_draft(*seqs[r], seqs.size(), speculate, plan_.drafts[r]);
    if (speculate && !prompts_pending && refresh_base(sp, seqs, plan_.drafts, seqs.size() + n_shadows)) {
      speculate = false;
      for (auto& d : plan_.drafts) d.clear();
    }
    for (size_t r = 0; r < seqs.size(); ++r) {
      if (!seqs[r]->grammar) continue;
      // A request that asks for plain decoding (spec_window 0) gets no forced drafts either.
      if (forced && seqs[r]->request.spec_window != 0)
        constrain_draft(*seqs[r], plan_.drafts[r]);
      else
        plan_.drafts[r].clear();
    }
    size_t need = 0;
    for (size_t r = 0; r < seqs.size(); ++r) {
      LiveSequence& s = *seqs[r];
      need += ctx_.kv.blocks_needed(s.seq, plan_.drafts[r].size() + 1);
      if (s.shadow) need += ctx_.kv.blocks_needed(s.shadow->seq, 1);
    }
    if (need <= ctx_.kv.pool().n_free()) break;
    prefix_cache_.evict(need - ctx_.kv.pool().n_free());
    if (need <= ctx_.kv.pool().n_free()) break;
    if (speculate || forced) {
      if (!speculate) forced = false;
      speculate = false;  // plain decoding needs the fewest blocks
      continue;
    }
    if (!reclaim(need, nullptr)) throw std::logic_error("scheduler: KV pool cannot hold one step");
    collect();
    if (seqs.empty()) return;
  }

  for (size_t r = 0; r < seqs.size(); ++r) {
    LiveSequence& s = *seqs[r];
    const auto& draft = plan_.drafts[r];
    const size_t row = ctx_.batch.size();
    const size_t pos = ctx_.kv.append_slots(s.seq, draft.size() + 1);
    ctx_.batch.add(s.last_token, static_cast<int32_t>(pos), s.seq, true);
    if (draft.linear()) {
      for (size_t i = 0; i < draft.size(); ++i)
        ctx_.batch.add(draft.tokens[i], static_cast<int32_t>(pos + 1 + i), s.seq, true);
    } else {
      // Node i at slot pos + 1 + i, position pos + its depth (flashdllm/model.h).
      for (size_t i = 0; i < draft.size(); ++i)
        ctx_.batch.add_child(draft.tokens[i], draft.parent[i] < 0 ? row : row + 1 + size_t(draft.parent[i]), true);
    }
    plan_.drafted += draft.size();
    plan_.decodes.push_back({&s, row, pos, DecodeSlot::kNoRow});
  }
  for (auto& d : plan_.decodes)
    if (d.s->shadow) {
      d.shadow_row = ctx_.batch.size();
      add_shadow_token(*d.s);
    }
}

void Scheduler::finish_decode() {
  SpecMetrics& m = ctx_.spec.metrics;
  step_emitted_ = 0;
  if (plan_.decodes.empty()) return;
  size_t emitted = 0;
  for (size_t r = 0; r < plan_.decodes.size(); ++r) {
    const DecodeSlot& d = plan_.decodes[r];
    emitted += verify(*d.s, plan_.drafts[r], d.row, d.pos);
    if (d.shadow_row != DecodeSlot::kNoRow && d.s->shadow) advance_shadow(*d.s, d.shadow_row);
  }
  ++m.steps;
  m.emitted += int64_t(emitted);
  step_emitted_ = emitted;
}

size_t Scheduler::verify(LiveSequence& s, const spec::DraftTree& draft, size_t row0, size_t pos0) {
  SpecState& sp = ctx_.spec;
  const size_t k = draft.size();
  const bool tree = !draft.linear();
  const size_t before = s.context.size() - 1;  // the context ends with the fed token x0
  const int32_t x0 = s.last_token;
  output_.clear_sampled();
  emitted_q_.clear();
  path_.clear();
  int32_t node = -1;  // the last accepted node; -1 = the root x0
  int32_t last = -1;
  for (;;) {
    const size_t r = node < 0 ? row0 : row0 + 1 + size_t(node);
    const auto row = runner_.logits_row(r);
    // The node's children (after it in depth-first order): the candidates for this position.
    children_.clear();
    outputs_.clear();
    for (size_t c = size_t(node + 1); c < k; ++c)
      if (draft.parent[c] == node) {
        children_.push_back(int32_t(c));
        outputs_.push_back(draft.tokens[c]);
      }
    // Row r's logits are those plain decoding would see after x0 and the accepted nodes
    // (the tree attention reads exactly that path), and the sampler's penalty history already
    // holds them (on_token accepted each). Every row emits the token plain decoding draws
    // from it, with plain decoding's one RNG draw, and a child is accepted iff it is that
    // token: with probability p(child), speculative sampling's rate for a point-mass draft
    // (Leviathan et al. 2023; SpecInfer's for several), so the emitted tokens have the
    // target distribution and a seed gives plain decoding's ids (docs/SPECULATIVE.md).
    const int32_t tok = sample_row(s, r);
    if (tok < 0) break;  // the grammar cannot continue: s is finished with an error
    int32_t next = -1;
    for (size_t c = 0; c < children_.size(); ++c)
      if (outputs_[c] == tok) next = children_[c];
    // gamma's evidence: the first child lost; did another one win?
    if (children_.size() > 1 && tok != outputs_[0]) sp.alternates.observe(next >= 0);
    emitted_q_.push_back(row.empty() ? 0 : quantize_logit(row[size_t(tok)]));  // empty: an argmax-only step
    output_.on_token(s, tok, row);
    last = tok;
    if (next >= 0) {
      path_.push_back(next);
      node = next;
    }
    if (s.finished || next < 0) break;
  }
  const size_t accepted = path_.size();
  if (k == 0 && sp.enabled()) s.window.observe_plain_token(last);  // resolves shadow drafts
  if (k > 0) {
    SpecMetrics& m = sp.metrics;
    // A grammar's forced tokens (after the drafters' `draft_kept`) have their own counters
    // and window: speculation's statistics and window controller see only the drafters'.
    const size_t spec_k = s.grammar ? std::min(s.draft_kept, k) : k;
    const size_t spec_accepted = std::min(accepted, spec_k);
    if (s.grammar) {
      const size_t forced = k - spec_k, forced_accepted = accepted - spec_accepted;
      m.forced_drafted += int64_t(forced);
      m.forced_accepted += int64_t(forced_accepted);
      s.grammar->observe_forced(forced, forced_accepted);
    }
    if (spec_k > 0) {
      ++m.spec_seq_steps;
      m.drafted += int64_t(spec_k);
      m.accepted += int64_t(spec_accepted);
      m.rejected += int64_t(spec_k - spec_accepted);
      // The window controller learns the main candidate's acceptance (what its window choice
      // assumes); tokens an alternate saved count as accepted up to the main chain's length.
      const size_t main = std::min(draft.main_depth(), spec_k);
      if (tree) {
        ++m.tree_steps;
        for (const int32_t c : path_) m.tree_alt_accepted += size_t(c) >= main ? 1 : 0;
      }
      s.window.observe(main, std::min(accepted, main));
      if (s.shadow)
        s.shadow->pending.push_back({s.n_sampled - output_.sampled().size(), s.n_sampled,
                                     step_fingerprint(output_.sampled(), emitted_q_)});
    }
  }
  if (sp.enabled()) {
    const SpecMode mode = sp.options.mode;
    if (mode == SpecMode::Lookup || mode == SpecMode::Auto) sp.cache.feed(s.context, before + 1);
    // Without drafts, the one output is the next history token: nothing new to record.
    if (!s.finished && k > 0 && mode != SpecMode::Lookup) feed_tree_trajectory(s, draft, row0, before, x0, accepted);
  }
  // Local rollback: keep x0 and the accepted nodes, packed into the slots after x0 (a tree's
  // accepted branch may sit further right; a linear draft's never moves); the rest's whole
  // blocks go back to the pool. A finished sequence has already freed everything.
  if (!s.finished) {
    for (size_t i = 0; i < accepted; ++i)
      if (size_t(path_[i]) != i) ctx_.kv.move_slot(s.seq, pos0 + 1 + size_t(path_[i]), pos0 + 1 + i);
    ctx_.kv.truncate(s.seq, pos0 + accepted + 1);
    s.n_prefilled = pos0 + accepted + 1;  // every context token but the new last one is fed
  }
  return output_.sampled().size();
}

void Scheduler::feed_tree_trajectory(LiveSequence& s, const spec::DraftTree& draft, size_t row0, size_t before,
                                     int32_t x0, size_t accepted) {
  // The lookahead trajectory: the model's argmax at every fed position along the accepted
  // path and then the first-child chain below it — for a linear draft, exactly [x0, d1..dk]
  // with its rejected tail; the Jacobi guess is the tail's outputs.
  inputs_.assign(1, x0);
  children_.assign(1, -1);  // node of each input (-1: the root)
  for (const int32_t c : path_) {
    inputs_.push_back(draft.tokens[size_t(c)]);
    children_.push_back(c);
  }
  for (int32_t n = path_.empty() ? -1 : path_.back();;) {
    int32_t first = -1;
    for (size_t c = size_t(n + 1); c < draft.size() && first < 0; ++c)
      if (draft.parent[c] == n) first = int32_t(c);
    if (first < 0) break;
    inputs_.push_back(draft.tokens[size_t(first)]);
    children_.push_back(first);
    n = first;
  }
  outputs_.resize(inputs_.size());
  for (size_t i = 0; i < inputs_.size(); ++i)
    outputs_[i] = static_cast<int32_t>(
        detail::scan_row(runner_.logits_row(children_[i] < 0 ? row0 : row0 + 1 + size_t(children_[i]))).argmax);
  const std::span<const int32_t> ctx(s.context);
  s.lookahead.feed_verification(ctx.first(before), inputs_, outputs_, accepted);
  s.lookahead.feed_history(ctx, s.lookahead_fed);
  s.lookahead_fed = ctx.size();
}

}  // namespace fdl::engine
