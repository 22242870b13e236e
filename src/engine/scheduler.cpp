// The scheduler's step: plan → run → output (design in scheduler.h), and the requests'
// lifecycle (add, abort, fail_all). Admission is scheduler_admission.cpp, memory
// scheduler_memory.cpp, decode and verification decode_step.cpp.
#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>

#include "engine/kv_offload.h"
#include "engine/prompt_simhash.h"
#include "engine/step_trace.h"

namespace fdl::engine {

Scheduler::Scheduler(EngineContext& ctx, const SchedulerOptions& options)
    : ctx_(ctx), opt_(options), prefix_cache_(ctx.kv.pool(), ctx.options.block_size, ctx.offload),
      policy_(ctx.spec.options, ctx.spec.cache),
      output_(ctx.tokenizer, size_t(ctx.options.n_ctx), counters_,
              [this](LiveSequence& s, bool cache) { release_kv(s, cache); }),
      runner_(ctx), maskers_(ctx.tokenizer) {
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
  if (s->request.grammar) {
    const auto& g = s->request.grammar;
    s->grammar.emplace(GrammarState{GrammarMatcher(g), maskers_.get(g, !s->request.skip_special_tokens), {}});
  }
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
    output_.finish(*s, "abort");
    output_.deliver(*s);
    drop_finished();
    return true;
  }
  for (auto it = waiting_.begin(); it != waiting_.end(); ++it)
    if ((*it)->id == id) {
      SeqPtr s = std::move(*it);
      waiting_.erase(it);
      output_.finish(*s, "abort");
      output_.deliver(*s);
      return true;
    }
  return false;
}

void Scheduler::fail_all(const std::string& reason, const std::string& error) {
  drain_pipeline(false);
  for (auto& s : running_)
    if (!s->finished) {
      output_.finish(*s, reason.c_str(), error);
      output_.deliver(*s);
    }
  drop_finished();
  while (!waiting_.empty()) {
    SeqPtr s = std::move(waiting_.front());
    waiting_.pop_front();
    output_.finish(*s, reason.c_str(), error);
    output_.deliver(*s);
  }
}

void Scheduler::step() {
  if (inflight_) return step_pipelined();
  finish_trivial();
  if (!has_work()) return;
  ++counters_.steps;
  const auto t0 = Clock::now();
  schedule();
  if (ctx_.batch.size() > 0) {
    run_plan();
    prefetch_once();  // if the forward did not run it
    if (inflight_) return;  // submitted: the next step() emits its tokens
    update_from_output(t0);
  }
  deliver_step();
}

void Scheduler::schedule() {
  const auto t0 = Clock::now();
  ctx_.batch.clear();
  plan_.clear();
  if (ctx_.offload != nullptr) {
    ctx_.offload->set_step(uint64_t(counters_.steps));
    ctx_.offload->poll();  // collect finished disk transfers; never blocks
  }
  plan_decode();
  plan_.decode_tokens = ctx_.batch.size();
  // With device copies and sampling, the prefetch runs while the forward computes (run_plan);
  // it is for the requests after those admitted now, whose prefixes land steps later anyway.
  prefetch_due_ = ctx_.offload != nullptr;
  if (prefetch_due_ && !(ctx_.offload->copies_async() && ctx_.model.prefers_device_sampling())) prefetch_once();
  size_t budget = size_t(opt_.max_num_batched_tokens) > plan_.decode_tokens
                      ? size_t(opt_.max_num_batched_tokens) - plan_.decode_tokens : 0;
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
}

void Scheduler::run_plan() {
  ctx_.stats.n_decode_tokens += static_cast<int64_t>(plan_.decode_tokens);
  ctx_.stats.n_prefill_tokens += static_cast<int64_t>(ctx_.batch.size() - plan_.decode_tokens);
  // A GPU model samples on the device when nothing else is needed: only ids cross PCIe, no
  // n_vocab-float rows get copied or scanned on the host.
  using Mode = ModelRunner::Mode;
  // Grammar rows go too: their masks go up with the step (StepMasks).
  const bool ids = ctx_.model.prefers_device_sampling() && ids_only_step() && build_step_masks();
  const Mode mode = !ids ? Mode::Logits : may_pipeline() ? Mode::Submit : Mode::Ids;
  static const std::function<void()> kNoHook;
  runner_.run(plan_, mode, prefetch_due_ ? prefetch_hook_ : kNoHook, counters_.steps,
              ids ? step_masks_.view() : TokenMasks{});
  inflight_ = mode == Mode::Submit;
}

bool Scheduler::build_step_masks() {
  step_masks_.clear(ctx_.n_vocab);
  const auto add = [&](LiveSequence& s, size_t row, const GrammarMatcher& m) {
    const auto t0 = Clock::now();
    bool ok = false;
    try {
      ok = step_masks_.add(int32_t(row), *s.grammar->masker, m);
    } catch (const GrammarError&) {
      ok = false;  // the host path's sampling reports it for this request alone
    }
    const double ms = ms_between(t0, Clock::now());
    ctx_.stats.grammar_ms += ms;
    s.grammar->host_ms += ms;
    return ok;
  };
  for (size_t r = 0; r < plan_.decodes.size(); ++r) {
    const DecodeSlot& d = plan_.decodes[r];
    if (!d.s->grammar) continue;
    GrammarState& g = *d.s->grammar;
    if (!add(*d.s, d.row, g.matcher)) return false;
    // The draft's rows (linear: a grammar's forced tokens, which constrain_draft checked)
    // draw from the states after the tokens before them.
    const spec::DraftTree& draft = plan_.drafts[r];
    if (draft.empty()) continue;
    GrammarMatcher probe = g.matcher;
    for (size_t i = 0; i < draft.size(); ++i)
      if (!g.masker->accept(probe, draft.tokens[i]) || !add(*d.s, d.row + 1 + i, probe)) return false;
  }
  size_t row = plan_.decode_tokens;
  for (const PrefillSlot& p : plan_.prefills) {
    if (!p.last) continue;
    if (p.s->grammar && !add(*p.s, row, p.s->grammar->matcher)) return false;
    ++row;
  }
  return true;
}

void Scheduler::update_from_output(Clock::time_point t0) {
  const auto t1 = Clock::now();
  finish_decode();
  // Speculation's cost model and breaker see the whole decode side of the step: drafting,
  // the forward and verification (on a tiny model the drafters and the verification scans
  // are a visible share), and what it produced.
  SpecState& sp = ctx_.spec;
  if (sp.enabled()) {
    const double ms = ms_between(t0, Clock::now());
    const size_t tokens = ctx_.batch.size();
    const bool decodes = !plan_.decodes.empty();
    if (decodes || sp.cost.has_data()) sp.cost.observe(double(tokens), ms);
    const size_t emitted = step_emitted_;
    if (decodes) {
      const size_t plain_tokens = tokens - plan_.drafted;
      if (plan_.drafted == 0)
        sp.observe_plain(plain_tokens, ms);
      else
        sp.breaker.record_step(double(emitted), ms, double(plan_.decodes.size()), sp.plain_ms(plain_tokens));
    }
  }
  finish_prefill(t0, t1);
}

void Scheduler::deliver_step() {
  const auto t_emit = Clock::now();
  output_.deliver_ready(running_);
  drop_finished();
  if (ctx_.trace != nullptr)
    ctx_.trace->span_since(StepTrace::Track::Schedule, "emit", t_emit, {{"step", counters_.steps}});
}

bool Scheduler::ids_only_step() const {
  if (ctx_.spec.enabled()) return false;  // verification statistics and audits read logits
  // Log-probabilities and logit biases need the logits on the host (Sampler).
  const auto wants_logits = [](const LiveSequence& s) {
    return s.request.logprobs >= 0 || !s.request.sampling.logit_bias.empty();
  };
  for (size_t r = 0; r < plan_.decodes.size(); ++r) {
    const LiveSequence& s = *plan_.decodes[r].s;
    if (wants_logits(s)) return false;
    // Without speculation, drafts are a grammar's forced tokens. Their rows draw on the device
    // when a draw needs nothing the host would change between rows: greedy (no uniform taken
    // from the sequence's RNG for a row verification may not reach) and no penalties (a draft
    // row's window would hold the draft tokens before it).
    if (!plan_.drafts[r].empty() &&
        (!s.grammar || !s.sampler.params().is_greedy() || s.request.sampling.has_penalties() || !plan_.drafts[r].linear()))
      return false;
  }
  for (const auto& p : plan_.prefills)
    if (p.last && wants_logits(*p.s)) return false;
  return true;
}

void Scheduler::finish_prefill(Clock::time_point batch_start, Clock::time_point batch_end) {
  // Logit rows: the decode rows first (batch order), then one per completing prompt.
  size_t n_prefill_rows = 0;
  for (const auto& p : plan_.prefills) n_prefill_rows += p.last ? 1 : 0;
  size_t row = runner_.logit_rows() - n_prefill_rows;
  for (const auto& p : plan_.prefills) {
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
    const int32_t tok = sample_row(s, row);
    if (tok >= 0) output_.on_token(s, tok, runner_.logits_row(row));
    ++row;
    if (!s.finished) start_shadow(s);
  }
}

int32_t Scheduler::sample_row(LiveSequence& s, size_t row) {
  if (!s.grammar) return runner_.row_token(s, row);
  const auto t0 = Clock::now();
  int32_t tok = -1;
  std::string error = "the grammar allows no token of the model's vocabulary after the text generated so far";
  bool engine_fault = false;
  try {
    if (runner_.ids_step()) {
      const int32_t drawn = runner_.ids()[row];
      tok = s.grammar->take(drawn, step_masks_.state_of(row));
      if (tok < 0) {
        // A token the mask allowed but the matcher refuses: the grammar's parses go past one of
        // the matcher's bounds here (the host path redraws, having the row; an ids step has
        // only the id). A token the mask did not allow: the engine's fault.
        engine_fault = !s.grammar->masker->allows(s.grammar->matcher, drawn);
        error = engine_fault ? "the token drawn under the grammar's mask does not continue the grammar"
                             : "the grammar's parses go past the matcher's bounds after the text generated so far";
      }
    } else {
      tok = s.grammar->sample(runner_.logits_row(row), [&](std::span<const float> masked) {
        return s.sampler.sample(masked);
      });
    }
  } catch (const GrammarError& e) {
    error = e.what();  // this request's grammar is too costly: it fails, the others go on
  }
  const double ms = ms_between(t0, Clock::now());
  ++ctx_.stats.grammar_rows;
  ctx_.stats.grammar_ms += ms;
  s.grammar->host_ms += ms;
  if (tok >= 0 && s.grammar->over_budget(s.n_sampled)) {
    tok = -1;
    error = "the grammar is too costly to follow: its masks took " + std::to_string(int64_t(s.grammar->host_ms)) +
            " ms of host time for " + std::to_string(s.n_sampled) + " tokens";
  }
  if (tok < 0) {
    s.pending.grammar_error = !engine_fault;
    output_.finish(s, "error", error);
  }
  return tok;
}

void Scheduler::drop_finished() {
  for (auto& s : running_)
    if (s->finished) release_kv(*s);
  std::erase_if(running_, [](const SeqPtr& s) { return s->finished; });
}

}  // namespace fdl::engine
