// Async scheduling (SchedulerOptions::async_scheduling): a step of decodes is submitted with
// Model::submit_sample and processed by the next step(), which first plans and submits its
// successor — the same sequences, each fed the id its row of the step in flight draws
// (previous_step_id), in a slot reserved now. The device then runs step k+1 while the host
// emits step k's tokens (detokenizing, stop strings, sinks) and, with KV tiers, starts the
// copies that bring waiting requests' prefixes back. The outputs are those of the
// synchronous loop: the uniforms of sampled rows are drawn in the same order from each
// sequence's RNG, and a sequence that ends with step k (end of generation, a stop string,
// an abort) drops its row of step k+1, whose KV slot is freed with the sequence (the prefix
// cache keeps only positions fed with a context token, so never that slot).
#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>

#include "engine/kv_offload.h"
#include "engine/scheduler.h"
#include "engine/step_trace.h"

namespace fdl::engine {
namespace {

// Whether a sequence's next token can still be followed by another: otherwise it ends by
// length with that token (on_token's conditions), and the step after must not feed it.
bool continues_after_next(const LiveSequence& s, size_t n_ctx) {
  const size_t generated = s.n_generated + 1;
  if (s.request.max_new_tokens > 0 && generated >= size_t(s.request.max_new_tokens)) return false;
  return s.request.prompt_ids.size() + generated < n_ctx;
}

}  // namespace

bool Scheduler::admission_possible() const {
  return !waiting_.empty() && running_.size() < size_t(ctx_.options.max_sequences);
}

bool Scheduler::may_pipeline() const {
  if (!opt_.async_scheduling || !ctx_.model.prefers_device_sampling() || !ids_only_step()) return false;
  // Waiting requests that could be admitted need a planned step, which needs this one's
  // tokens first: submitting now would only put one more scheduler iteration between two
  // tokens. Those that wait for a free sequence slot do not hold the pipeline up.
  if (admission_possible()) return false;
  if (ctx_.spec.enabled() || plan_.drafted > 0 || !plan_.prefills.empty()) return false;
  // Synchronous tier copies run on the engine thread between forwards; device copies are
  // ordered against the step in flight by the copy streams (a copy group waits for the work
  // submitted before it; a step waits for the pulls of the blocks it writes).
  if (ctx_.offload != nullptr && !ctx_.offload->copies_async()) return false;
  // A grammar's next mask needs this step's token: its sequences step synchronously.
  for (const auto& d : plan_.decodes)
    if (d.s->shadow || d.s->request.sampling.has_penalties() || d.s->grammar) return false;
  return !plan_.decodes.empty();
}

bool Scheduler::submit_next(std::vector<DecodeSlot>& next) {
  next.clear();
  if (admission_possible()) return false;  // admit them: the next step is a planned one
  // Every running sequence must be in the step in flight: one that is not (prefilling, or
  // re-admitted after a preemption with its whole context found in the prefix cache) needs a
  // planned step, or the pipeline would leave it out until the others end.
  // (Sorted pointers and a binary search: O(n log n) per step on the host, while the GPU runs
  // the step in flight, instead of a scan of the decodes per running sequence.)
  in_flight_seqs_.clear();
  for (const DecodeSlot& d : plan_.decodes) in_flight_seqs_.push_back(d.s);
  std::sort(in_flight_seqs_.begin(), in_flight_seqs_.end(), std::less<>());  // a total order of pointers
  for (const auto& s : running_) {
    if (s->finished) continue;
    if (s->seq >= 0 && s->prefilling()) return false;
    if (!std::binary_search(in_flight_seqs_.begin(), in_flight_seqs_.end(), s.get(), std::less<>())) return false;
  }
  size_t need = 0;
  for (const DecodeSlot& d : plan_.decodes)
    if (d.s != nullptr && !d.s->finished && continues_after_next(*d.s, size_t(ctx_.options.n_ctx))) {
      next.push_back({d.s, d.row, 0, DecodeSlot::kNoRow});  // row: where its token comes from
      need += ctx_.kv.blocks_needed(d.s->seq, 1);
    }
  if (next.empty()) return false;
  if (need > ctx_.kv.pool().n_free()) prefix_cache_.evict(need - ctx_.kv.pool().n_free());
  if (need > ctx_.kv.pool().n_free()) return false;  // preemption is the planned step's business
  ctx_.batch.clear();
  for (size_t r = 0; r < next.size(); ++r) {
    DecodeSlot& d = next[r];
    d.pos = ctx_.kv.append_slots(d.s->seq, 1);
    ctx_.batch.add(previous_step_id(int32_t(d.row)), static_cast<int32_t>(d.pos), d.s->seq, true);
    d.row = r;
  }
  // No penalty tokens: sequences with penalties never pipeline.
  runner_.submit(next);
  // From here the plan describes the successor: decode slots only, one token each.
  plan_.prefills.clear();
  plan_.drafted = 0;
  plan_.decode_tokens = next.size();
  return true;
}

void Scheduler::finish_inflight(Clock::time_point t0) {
  output_.clear_sampled();  // on_token appends to it for the audit fingerprint, which these steps skip
  runner_.collect();
  const std::vector<int32_t>& ids = runner_.ids();
  const auto t1 = Clock::now();
  ctx_.stats.forward_ms += ms_between(t0, t1);
  if (ctx_.trace != nullptr)
    ctx_.trace->span(StepTrace::Track::Compute, "forward (pipelined)", t0, ms_between(t0, t1) * 1000.0,
                     {{"step", counters_.steps}, {"decodes", plan_.decodes.size()}});
  size_t emitted = 0;
  for (const DecodeSlot& d : plan_.decodes) {
    if (d.s == nullptr || d.s->finished) continue;  // ended while the step ran
    if (d.row >= ids.size())
      throw std::logic_error("Model::collect_ids returned " + std::to_string(ids.size()) + " ids, row " +
                             std::to_string(d.row) + " expected");
    output_.on_token(*d.s, ids[d.row], {});
    if (!d.s->finished) d.s->n_prefilled = d.pos + 1;
    ++emitted;
  }
  ++ctx_.spec.metrics.steps;
  ctx_.spec.metrics.emitted += int64_t(emitted);
  step_emitted_ = emitted;
}

void Scheduler::step_pipelined() {
  finish_trivial();  // waiting requests with nothing to generate end now, pipeline or not
  ++counters_.steps;
  const auto t0 = Clock::now();
  // The successor first: the device runs it while the host handles the step in flight.
  const bool next = submit_next(next_decode_);
  if (ctx_.trace != nullptr)
    ctx_.trace->span_since(StepTrace::Track::Schedule, next ? "submit next" : "plan (none submitted)", t0,
                           {{"step", counters_.steps}});
  try {
    finish_inflight(t0);
  } catch (...) {
    if (next) plan_.decodes.swap(next_decode_);  // what is still submitted (drain_pipeline drops it)
    throw;
  }
  const auto t_emit = Clock::now();
  inflight_ = next;
  // Rows of the successor whose sequence ended with this step are dropped.
  for (DecodeSlot& d : next_decode_)
    if (d.s->finished) d.s = nullptr;
  plan_.decodes.swap(next_decode_);
  output_.deliver_ready(running_);
  for (DecodeSlot& d : plan_.decodes)  // a sink may have ended its request
    if (d.s != nullptr && d.s->finished) d.s = nullptr;
  drop_finished();
  if (ctx_.trace != nullptr)
    ctx_.trace->span_since(StepTrace::Track::Schedule, "emit", t_emit, {{"step", counters_.steps}});
  if (ctx_.offload != nullptr) {
    // Still while the successor runs: collect landed copies and bring back the cached
    // prefixes of the requests next in line (ended sequences' blocks are in the prefix cache
    // by now), so that they are resident when a slot frees up.
    ctx_.offload->set_step(uint64_t(counters_.steps));
    ctx_.offload->poll();
    prefetch_due_ = true;
    prefetch_once();
  }
}

void Scheduler::drain_pipeline(bool process) {
  if (!inflight_) return;
  inflight_ = false;
  if (process) {
    try {
      finish_inflight(Clock::now());
    } catch (const std::exception& e) {
      // The step failed (a NaN row, a device error): its sequences' KV holds a slot whose
      // token they never got, so they cannot go on. They end with the error, as a failed
      // step ends everything it ran in the synchronous loop; the others are not touched.
      for (const DecodeSlot& d : plan_.decodes)
        if (d.s != nullptr && !d.s->finished) output_.finish(*d.s, "error", e.what());
    }
  }
  // Whatever is still submitted (after a failure) is collected and dropped; each collect
  // takes its step off the queue, failing or not, so this ends (bounded all the same).
  runner_.drop_submitted();
  plan_.decodes.clear();
  if (process) {
    output_.deliver_ready(running_);
    drop_finished();
  }
}

}  // namespace fdl::engine
