// Internal: runs a StepPlan's forward on the Model and holds what it returned — logits rows,
// or in an ids-only step one sampled id per row (the "run" of plan → run → output).
//
// Three ways to run a step:
// - Logits: Model::forward; every wanted row's n_vocab logits come back (speculative
//   verification, logprobs, audits and host sampling read them).
// - Ids: the model samples every wanted row on its device (Model::forward_sample) with each
//   row's RowSampling: its parameters and, unless greedy, the uniform the sequence's RNG
//   gives next, drawn here in row order so the RNG stream is the host sampler's. Only ids
//   cross to the host. With `while_computing` set, the step is submitted, that work runs on
//   the host while the device computes, then the ids are collected.
// - Submit: queued (Model::submit_sample) and collected by collect() in a later scheduler
//   step (async scheduling, pipelined_step.cpp).
// The forward's time goes to GeneratorStats::forward_ms (a submitted step's when it is
// collected, by the scheduler) and, for steps that are mostly prompt
// tokens, to the KV tiers' recompute-speed estimate; with a trace, a "forward" span.
//
// Errors: the model's exceptions propagate; a model that returns fewer rows than asked is a
// std::logic_error (reading rows that are not there would be undefined behaviour). A step
// that fails between its submit and its collect is collected (and dropped) before the error
// propagates: nothing stays submitted.
// Thread-safety: none (the scheduler's thread).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/engine_context.h"
#include "engine/step_plan.h"

namespace fdl::engine {

class ModelRunner {
 public:
  enum class Mode { Logits, Ids, Submit };

  explicit ModelRunner(EngineContext& ctx) : ctx_(ctx) {}

  /// Runs the plan's batch (EngineContext::batch) with `mode`; `step` labels the trace span.
  /// `while_computing` (may be empty) runs while the device computes an Ids step (before
  /// it, in a step with `masks`: Model::forward_sample takes them, submit_sample does not).
  /// `masks`: grammar masks of an Ids step's rows (StepMasks).
  void run(const StepPlan& plan, Mode mode, const std::function<void()>& while_computing, int64_t step,
           const TokenMasks& masks = {});
  /// Queues the decode-only successor step `slots` (their tokens are already in the batch;
  /// no prompts, no penalties) with their rows' sampling; collect() returns its ids.
  void submit(std::span<const DecodeSlot> slots);
  /// Waits for the oldest submitted step and reads its ids (ids()).
  void collect();
  /// Collects and drops every submitted step, failing or not (each collect takes its step
  /// off the model's queue, so this ends); never throws.
  void drop_submitted() noexcept;

  /// Whether the last run() returned ids (Ids / Submit) rather than logits.
  bool ids_step() const { return ids_step_; }
  /// Rows with logits of the last run().
  size_t logit_rows() const { return logit_rows_; }
  /// Per logits row of an ids step, the sampled id.
  const std::vector<int32_t>& ids() const { return ids_; }
  /// Row `row` of the last step's logits; empty in an ids step (no row was copied).
  std::span<const float> logits_row(size_t row) const {
    if (ids_step_) return {};
    return {ctx_.logits.data() + row * size_t(ctx_.n_vocab), size_t(ctx_.n_vocab)};
  }
  /// The token row `row` yields for `s` when it verifies no draft: the sampler's draw from
  /// the logits, or in an ids step the id the model sampled.
  int32_t row_token(LiveSequence& s, size_t row) { return ids_step_ ? ids_[row] : s.sampler.sample(logits_row(row)); }

 private:
  /// Per logits row, its RowSampling (drawing the rows' uniforms in row order) and its
  /// penalty window's tokens: the decode slots' rows (a draft's rows take its root's
  /// parameters: greedy ones, Scheduler::ids_only_step), then the completing prompts'.
  void build_row_sampling(std::span<const DecodeSlot> decodes, std::span<const spec::DraftTree> drafts,
                          std::span<const PrefillSlot> prefills, size_t logit_rows);
  /// Submits, runs `while_computing`, collects; returns whether the device was still busy
  /// after the host's work (only then is the measured time the forward's own).
  bool submit_overlapped(const std::function<void()>& while_computing);

  EngineContext& ctx_;
  bool ids_step_ = false;
  size_t logit_rows_ = 0;
  std::vector<int32_t> ids_;
  std::vector<RowSampling> row_sampling_;
  std::vector<PenaltyToken> penalty_tokens_;
};

}  // namespace fdl::engine
