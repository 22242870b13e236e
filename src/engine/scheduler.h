// Internal: the scheduler — continuous batching over a Model and its paged KV cache.
// The policy is described in flashdllm/engine.h and docs/SCHEDULER.md. Each step() is
// plan → run → output (the split of docs/DESIGN.md):
//   1. schedule() makes the StepPlan (step_plan.h): the decode token and draft of every
//      decoding sequence, prompt chunks within the token budget, admissions, the KV slots
//      they take (preempting or evicting when blocks run out)   decode_step.cpp, scheduler_admission.cpp
//   2. a ModelRunner runs its forward (model_runner.h)
//   3. update_from_output() verifies drafts, accepts tokens, rolls the KV back and advances
//      prompts; the OutputProcessor (output_processor.h) turns each token into text, stops,
//      logprobs and deliveries                                    decode_step.cpp, scheduler.cpp
// Memory (preemption, the prefix cache, tier prefetch) is scheduler_memory.cpp; async
// scheduling (a step submitted and processed by the next step()) pipelined_step.cpp; the
// speculation audit shadow_audit.cpp.
//
// Owned by Generator (called inline) and by Engine (called on the engine thread).
// Thread-safety: none. Sinks run inside step() and abort().
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "decode/draft_policy.h"
#include "decode/draft_tree.h"
#include "engine/engine_context.h"
#include "engine/grammar_state.h"
#include "engine/live_sequence.h"
#include "engine/model_runner.h"
#include "engine/output_processor.h"
#include "engine/prefix_cache.h"
#include "engine/scheduler_counters.h"
#include "engine/step_plan.h"

namespace fdl::engine {

class Scheduler {
 public:
  Scheduler(EngineContext& ctx, const SchedulerOptions& options);
  /// Frees the KV blocks of every sequence (no deliveries).
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  /// Queues an already validated request. A request with max_new_tokens == 0 finishes
  /// ("length") at the next step without touching the model.
  void add(RequestId id, GenerationRequest request, OutputSink sink);
  /// Finishes a waiting or running request with "abort" and frees its blocks now.
  /// Returns false when the id is unknown (already finished).
  bool abort(RequestId id);
  /// Finishes every request with `reason` ("abort" or "error", with `error` as message).
  void fail_all(const std::string& reason, const std::string& error);

  /// Requests waiting or running, or a submitted step still to be collected.
  bool has_work() const { return inflight_ || !waiting_.empty() || !running_.empty(); }
  /// One scheduling iteration: at most one forward. Model errors propagate (the caller
  /// decides: Generator rethrows, Engine fails the running requests).
  void step();

  size_t n_running() const { return running_.size(); }
  size_t n_waiting() const { return waiting_.size(); }
  const SchedulerCounters& counters() const { return counters_; }
  const PrefixCache& prefix_cache() const { return prefix_cache_; }
  /// Frees every cached prefix block (tests use it to compare pool counts with the start).
  void clear_prefix_cache() { prefix_cache_.clear(); }

 private:
  using SeqPtr = std::unique_ptr<LiveSequence>;

  // --- plan (scheduler.cpp, decode_step.cpp, scheduler_admission.cpp) ---
  /// Fills plan_ and the context's batch for this step (empty when nothing can run).
  void schedule();
  /// Adds every decoding sequence's next token (and draft) to the batch.
  void plan_decode();
  void plan_draft(LiveSequence& s, size_t n_live, bool speculate, spec::DraftTree& draft);
  /// Requests with max_new_tokens == 0 finish at once.
  void finish_trivial();
  /// Prompt chunks for this step within `budget` tokens: continues admitted prompts, admits
  /// waiting requests in length-bucket (or FCFS) order while sequences and blocks allow.
  void plan_prefill(size_t budget);
  /// Admits `s` (creates its KV sequence, reusing cached prefix blocks); false when the
  /// pool cannot take its first chunk and still keep `reserve` blocks free.
  bool admit(LiveSequence& s, size_t reserve);
  /// Tokens of `s`'s prompt to prefill this step under `budget`.
  size_t chunk_for(const LiveSequence& s, size_t budget) const;
  LengthClass classify(size_t prompt_tokens) const;

  // --- run (scheduler.cpp) ---
  /// Runs plan_'s forward: ids sampled on the device when the model prefers it and nothing
  /// needs logits, submitted for the next step() when the step may pipeline.
  void run_plan();
  /// Whether every logits row of the step is consumed by one draw — no logprobs, logit
  /// biases, speculation or audits; penalties go along as PenaltyTokens, grammars as masks,
  /// a grammar's forced drafts when greedy without penalties — so a model that samples on its
  /// device may return ids only (Model::forward_sample).
  bool ids_only_step() const;
  /// Fills step_masks_ with the grammar masks of the step's rows; false (the step then
  /// samples on the host) when a row's state allows no token or its mask costs too much, so
  /// that request's error is reported as the host path reports it.
  bool build_step_masks();

  // --- output (scheduler.cpp, decode_step.cpp) ---
  /// After the forward: verification and tokens for the decodes, the speculation cost
  /// model, prompt progress; `t0`: when the step began.
  void update_from_output(Clock::time_point t0);
  /// Acceptance, rollback, tokens for each decoding sequence.
  void finish_decode();
  size_t verify(LiveSequence& s, const spec::DraftTree& draft, size_t row0, size_t pos0);
  /// Tree verification: rows and pool updates of the nodes verified below `node` (-1 = the
  /// root), see decode_step.cpp.
  void feed_tree_trajectory(LiveSequence& s, const spec::DraftTree& draft, size_t row0, size_t before,
                            int32_t x0, size_t accepted);
  void finish_prefill(Clock::time_point batch_start, Clock::time_point batch_end);
  /// The token logits row `row` gives `s` (runner_.row_token), masked by its grammar if it
  /// has one; -1 when the grammar allows no token of the vocabulary (`s` is then finished
  /// with an error).
  int32_t sample_row(LiveSequence& s, size_t row);
  /// Fits `s`'s draft to its grammar (GrammarState::constrain_draft): the drafters' tokens
  /// the grammar allows, then the forced ones, within the request's limits.
  void constrain_draft(LiveSequence& s, spec::DraftTree& draft);
  /// Delivers what the step produced and drops the finished sequences.
  void deliver_step();
  void drop_finished();

  // --- memory (scheduler_memory.cpp) ---
  /// Makes `n` pool blocks free: evicts unused prefix-cache blocks, then drops audit
  /// shadows, then preempts running sequences youngest first (never `keep`, never one with
  /// tokens in this step's batch). False when even that is not enough.
  bool reclaim(size_t n, const LiveSequence* keep);
  void preempt(LiveSequence& s);
  /// Frees `s`'s KV; `cache`: its fed full blocks go into the prefix cache first.
  void release_kv(LiveSequence& s, bool cache = true);
  void cache_blocks(const LiveSequence& s, size_t n_tokens);
  /// The part of `s`'s context the prefix cache may serve: its tokens and how many whole
  /// blocks of them.
  struct CachedPath {
    std::span<const int32_t> tokens;
    size_t max_blocks = 0;
  };
  CachedPath cached_path(const LiveSequence& s) const;
  /// Where `s`'s cached prefix is (PrefixCache::path_state).
  PrefixCache::PathState prefix_state(const LiveSequence& s);
  /// Starts bringing `s`'s offloaded prefix blocks back (want: how many, 0 = count them),
  /// demoting colder cached blocks for room; returns how many were started (0: no room).
  size_t prefetch_prefix(const LiveSequence& s, size_t want = 0);
  /// Starts tier-2 promotions of the cached blocks of waiting requests (spare blocks only).
  void prefetch_waiting();
  /// This step's prefetch_waiting (traced), once: in a step whose ids the device samples, the
  /// forward is submitted first and this runs while it computes.
  void prefetch_once();

  // --- async scheduling (pipelined_step.cpp) ---
  /// Whether the ids-only step just planned may be submitted (Model::submit_sample) and
  /// processed by the next step(): decodes only, nothing that needs the host between steps.
  bool may_pipeline() const;
  /// Whether a waiting request could be admitted by a planned step now (a sequence slot is
  /// free); requests that wait for one do not stop the pipeline.
  bool admission_possible() const;
  /// With a step in flight: plans and submits the next one from it (its sequences that
  /// cannot end by length, their tokens previous_step_id), then collects and processes the
  /// one in flight.
  void step_pipelined();
  /// The next step's decode slots from the in-flight ones, submitted; false when the
  /// pipeline must drain (new requests, too few free blocks, nothing to continue).
  bool submit_next(std::vector<DecodeSlot>& next);
  /// Collects the in-flight step's ids and emits its tokens.
  void finish_inflight(Clock::time_point t0);
  /// Ends the pipeline before abort / fail_all / destruction: collects what is submitted;
  /// `process`: emit the in-flight step's tokens (else they are dropped, with any error).
  void drain_pipeline(bool process);

  // --- audit (shadow_audit.cpp) ---
  void start_shadow(LiveSequence& s);
  void add_shadow_token(LiveSequence& s);
  void advance_shadow(LiveSequence& s, size_t row);
  void end_shadow(LiveSequence& s);

  EngineContext& ctx_;
  SchedulerOptions opt_;
  PrefixCache prefix_cache_;
  spec::DraftPolicy policy_;
  SchedulerCounters counters_;
  OutputProcessor output_;
  ModelRunner runner_;
  StepMasks step_masks_;  ///< grammar masks of a step sampled on the device (build_step_masks)
  GrammarMaskers maskers_;
  uint64_t arrivals_ = 0;
  std::deque<SeqPtr> waiting_;   ///< preempted requests go back to the front
  std::vector<SeqPtr> running_;  ///< admission order (oldest first)

  StepPlan plan_;  ///< this step's (reused); in a submitted step, the step in flight
  /// A step was submitted (Model::submit_sample) and not collected: plan_.decodes describes it.
  bool inflight_ = false;
  size_t step_emitted_ = 0;  ///< tokens the decode part of this step produced
  bool prefetch_due_ = false;  ///< this step's prefetch_waiting has not run yet
  const std::function<void()> prefetch_hook_ = [this] { prefetch_once(); };

  // scratch, reused across steps
  std::vector<spec::Draft> candidates_;  ///< tree verification: the drafters' candidates
  spec::DraftTreeBuilder tree_builder_;
  std::vector<int32_t> path_, children_;  ///< tree verification: accepted nodes, a node's children
  std::vector<size_t> prefetch_want_;     ///< prefetch_waiting's
  std::vector<DecodeSlot> next_decode_;   ///< submit_next's successor step
  std::vector<const LiveSequence*> in_flight_seqs_;  ///< submit_next: plan_.decodes' sequences, sorted
  std::vector<int32_t> outputs_, inputs_;
  spec::Draft draft_;
  std::vector<int32_t> draft_tokens_;  ///< constrain_draft's
  std::vector<int32_t> emitted_q_;  ///< quantized logit of each emitted token (audit)
};

}  // namespace fdl::engine
