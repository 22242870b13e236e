// ModelRunner: one step's forward on the model (design in model_runner.h).
#include "engine/model_runner.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "engine/kv_offload.h"
#include "engine/step_trace.h"

namespace fdl::engine {

void ModelRunner::build_row_sampling(std::span<const DecodeSlot> decodes, std::span<const spec::DraftTree> drafts,
                                     std::span<const PrefillSlot> prefills, size_t logit_rows) {
  row_sampling_.assign(logit_rows, RowSampling{});
  penalty_tokens_.clear();
  const auto set = [&](LiveSequence& s, size_t row) {
    Sampler& sm = s.sampler;
    row_sampling_.at(row) = Sampler::row_sampling(sm.params(), sm.params().is_greedy() ? 0.0 : sm.next_uniform());
    sm.append_penalty_tokens(int32_t(row), penalty_tokens_);
  };
  // Rows as the scheduler reads them: decode rows (each slot's root, then its draft's), then
  // completing prompts.
  size_t row = 0;
  for (size_t i = 0; i < decodes.size(); ++i) {
    const DecodeSlot& d = decodes[i];
    set(*d.s, d.row);
    const size_t k = i < drafts.size() ? drafts[i].size() : 0;
    for (size_t j = 1; j <= k; ++j) row_sampling_.at(d.row + j) = row_sampling_.at(d.row);
    row += 1 + k;
  }
  for (const PrefillSlot& p : prefills)
    if (p.last) set(*p.s, row++);
  if (row != logit_rows)
    throw std::logic_error("scheduler: " + std::to_string(row) + " sampled rows for " + std::to_string(logit_rows) +
                           " logits rows");
}

bool ModelRunner::submit_overlapped(const std::function<void()>& while_computing) {
  ctx_.model.submit_sample(ctx_.batch, ctx_.kv, row_sampling_, penalty_tokens_);
  try {
    while_computing();
  } catch (...) {
    std::vector<int32_t> dropped;
    try {
      ctx_.model.collect_ids(dropped);  // nothing may stay submitted
    } catch (...) {
    }
    throw;
  }
  const auto tc = Clock::now();
  ctx_.model.collect_ids(ids_);
  // The forward's time is its own only when the device was still busy after the host's
  // work; otherwise it holds host work, and the recompute speed skips this sample.
  return ms_between(tc, Clock::now()) > 0.05;
}

void ModelRunner::run(const StepPlan& plan, Mode mode, const std::function<void()>& while_computing, int64_t step,
                      const TokenMasks& masks) {
  const auto t0 = Clock::now();
  const size_t logit_rows = plan.logit_rows();
  ids_step_ = mode != Mode::Logits;
  logit_rows_ = logit_rows;
  bool timed = true;  // the measured time is the forward's (see submit_overlapped)
  if (ids_step_) {
    build_row_sampling(plan.decodes, std::span(plan.drafts).first(std::min(plan.drafts.size(), plan.decodes.size())),
                       plan.prefills, logit_rows);
    if (mode == Mode::Submit) {
      ctx_.model.submit_sample(ctx_.batch, ctx_.kv, row_sampling_, penalty_tokens_);
      ctx_.logits.clear();
      ++ctx_.stats.n_forwards;
      return;
    }
    if (while_computing && masks.empty()) {
      timed = submit_overlapped(while_computing);
    } else {
      if (while_computing) while_computing();
      ctx_.model.forward_sample(ctx_.batch, ctx_.kv, row_sampling_, penalty_tokens_, ids_, masks);
    }
    ctx_.logits.clear();
  } else {
    ctx_.model.forward(ctx_.batch, ctx_.kv, ctx_.logits);
  }
  const auto t1 = Clock::now();
  const double ms = ms_between(t0, t1);
  ctx_.stats.forward_ms += ms;
  const size_t prefill_tokens = plan.prefill_tokens();
  // The recompute speed the cost rule uses: forwards that are mostly prompt tokens (a
  // dropped block comes back the same way). At least a block's worth, or timing noise wins.
  if (timed && ctx_.offload != nullptr && prefill_tokens >= size_t(ctx_.options.block_size) &&
      2 * prefill_tokens >= ctx_.batch.size())
    ctx_.offload->observe_prefill(ctx_.batch.size(), ms / 1000.0);
  if (ctx_.trace != nullptr)
    ctx_.trace->span(StepTrace::Track::Compute, "forward", t0, ms * 1000.0,
                     {{"step", step},
                      {"tokens", ctx_.batch.size()},
                      {"prefill_tokens", prefill_tokens},
                      {"decodes", plan.decodes.size()}});
  ++ctx_.stats.n_forwards;
  if (ids_step_) {
    if (ids_.size() != logit_rows)
      throw std::logic_error("Model::forward_sample returned " + std::to_string(ids_.size()) + " ids, expected " +
                             std::to_string(logit_rows));
  } else if (ctx_.logits.size() != logit_rows * size_t(ctx_.n_vocab)) {
    throw std::logic_error("Model::forward returned " + std::to_string(ctx_.logits.size()) + " logits, expected " +
                           std::to_string(logit_rows) + " rows of " + std::to_string(ctx_.n_vocab));
  }
}

void ModelRunner::submit(std::span<const DecodeSlot> slots) {
  ids_step_ = true;
  logit_rows_ = slots.size();
  // Uniforms now, in the order the synchronous loop draws them (each sequence's next one).
  build_row_sampling(slots, {}, {}, slots.size());
  ctx_.model.submit_sample(ctx_.batch, ctx_.kv, row_sampling_, penalty_tokens_);
  ctx_.stats.n_decode_tokens += static_cast<int64_t>(slots.size());
  ++ctx_.stats.n_forwards;
}

void ModelRunner::collect() { ctx_.model.collect_ids(ids_); }

void ModelRunner::drop_submitted() noexcept {
  std::vector<int32_t> ids;
  for (size_t n = ctx_.model.submitted_steps(); n > 0 && ctx_.model.submitted_steps() > 0; --n) {
    try {
      ctx_.model.collect_ids(ids);
    } catch (...) {
    }
  }
}

}  // namespace fdl::engine
