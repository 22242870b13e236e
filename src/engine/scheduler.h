// Internal: the scheduler — continuous batching over a Model and its paged KV cache.
// The policy is described in flashdllm/engine.h and docs/SCHEDULER.md; this class runs it:
// each step() is one Model::forward over the decode tokens (and drafts) of the running
// sequences plus prompt chunks, followed by sampling, verification, rollback, output
// delivery and the release of finished sequences.
//
// Owned by Generator (called inline) and by Engine (called on the engine thread).
// Thread-safety: none. Sinks run inside step() and abort().
#pragma once

#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "decode/draft_policy.h"
#include "decode/draft_tree.h"
#include "engine/engine_context.h"
#include "engine/live_sequence.h"
#include "engine/prefix_cache.h"

namespace fdl::engine {

/// Counters the scheduler keeps (EngineMetrics mirrors them).
struct SchedulerCounters {
  int64_t steps = 0;
  int64_t submitted = 0;
  int64_t finished = 0;
  int64_t aborted = 0;
  int64_t failed = 0;
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0;
  int64_t prefill_computed = 0;
  int64_t recomputed = 0;
  int64_t generated = 0;
  int64_t prefix_queries = 0;
  int64_t prefix_hits = 0;
};

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
  /// A decode token of the step: its sequence (null in a submitted step once the sequence
  /// ended while the step ran: its row is dropped), logits row and KV slot.
  struct DecodeSlot { LiveSequence* s; size_t row; size_t pos; size_t shadow_row; };

  // --- admission and memory (scheduler.cpp) ---
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
  /// Makes `n` pool blocks free: evicts unused prefix-cache blocks, then drops audit
  /// shadows, then preempts running sequences youngest first (never `keep`, never one with
  /// tokens in this step's batch). False when even that is not enough.
  bool reclaim(size_t n, const LiveSequence* keep);
  /// True when `s` already has tokens in this step's batch (never preempted or shadow-dropped).
  bool in_this_step(const LiveSequence* s) const;
  void preempt(LiveSequence& s);
  /// Starts tier-2 promotions of the cached blocks of waiting requests (spare blocks only).
  void prefetch_waiting();
  /// This step's prefetch_waiting (traced), once: in a step whose ids the device samples, the
  /// forward is submitted first and this runs while it computes.
  void prefetch_once();
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
  void cache_blocks(const LiveSequence& s, size_t n_tokens);
  LengthClass classify(size_t prompt_tokens) const;

  // --- the step (scheduler.cpp, decode_step.cpp) ---
  /// Adds every decoding sequence's next token (and draft) to the batch.
  void plan_decode();
  void plan_draft(LiveSequence& s, size_t n_live, bool speculate, spec::DraftTree& draft);
  /// After the forward: acceptance, rollback, tokens for each decoding sequence.
  void finish_decode();
  size_t verify(LiveSequence& s, const spec::DraftTree& draft, size_t row0, size_t pos0);
  /// Tree verification: rows and pool updates of the nodes verified below `node` (-1 = the
  /// root), see decode_step.cpp.
  void feed_tree_trajectory(LiveSequence& s, const spec::DraftTree& draft, size_t row0, size_t before,
                            int32_t x0, size_t accepted);
  void finish_prefill(Clock::time_point batch_start, Clock::time_point batch_end);
  void forward(size_t logit_rows);
  /// Row `row` of this step's logits; empty in an ids-only step (no row was copied).
  std::span<const float> logits_row(size_t row) const;
  /// The token row `row` yields for `s` when it verifies no draft: the sampler's draw from
  /// the logits, or in an ids-only step the id the model sampled.
  int32_t row_token(LiveSequence& s, size_t row);
  /// Whether every logits row of the step is consumed by one draw — no logprobs, drafts or
  /// audits; penalties go along as PenaltyTokens — so a model that samples on its device may
  /// return ids only (Model::forward_sample).
  bool ids_only_step() const;
  /// Per logits row of an ids-only step, its RowSampling: the sequence's parameters and,
  /// unless greedy, the uniform its sampler's RNG gives next (so the RNG stream is sample()'s);
  /// and its penalty window's tokens.
  void build_row_sampling(std::span<const DecodeSlot> decodes, size_t logit_rows);

  // --- async scheduling (pipelined_step.cpp) ---
  /// Whether the step just planned may be submitted (Model::submit_sample) and processed by
  /// the next step(): decodes only, ids only, nothing that needs the host between steps.
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

  // --- per token (scheduler_output.cpp) ---
  void on_token(LiveSequence& s, int32_t token, std::span<const float> logits);
  void finish(LiveSequence& s, const char* reason, const std::string& error = {});
  void emit(LiveSequence& s, std::string_view piece);
  std::string detokenize(LiveSequence& s, int32_t token);
  void deliver(LiveSequence& s);
  /// Frees `s`'s KV; `cache`: its fed full blocks go into the prefix cache first.
  void release_kv(LiveSequence& s, bool cache = true);
  void drop_finished();

  EngineContext& ctx_;
  SchedulerOptions opt_;
  PrefixCache prefix_cache_;
  spec::DraftPolicy policy_;
  SchedulerCounters counters_;
  uint64_t arrivals_ = 0;
  std::deque<SeqPtr> waiting_;   ///< preempted requests go back to the front
  std::vector<SeqPtr> running_;  ///< admission order (oldest first)

  // step scratch, reused
  std::vector<DecodeSlot> decode_;
  std::vector<spec::DraftTree> drafts_;
  std::vector<spec::Draft> candidates_;  ///< tree verification: the drafters' candidates
  spec::DraftTreeBuilder tree_builder_;
  std::vector<int32_t> path_, children_;  ///< tree verification: accepted nodes, a node's children
  struct PrefillSlot { LiveSequence* s; size_t take; bool last; };
  std::vector<PrefillSlot> prefill_;
  size_t drafted_ = 0;
  bool ids_step_ = false;               ///< this step's forward returned ids, not logits
  size_t step_logit_rows_ = 0;
  std::vector<int32_t> step_ids_;       ///< per logits row, in an ids-only step
  std::vector<RowSampling> row_sampling_;  ///< per logits row, in an ids-only step
  std::vector<PenaltyToken> penalty_tokens_;  ///< the rows' penalty windows, in an ids-only step
  size_t step_emitted_ = 0;  ///< tokens the decode part of this step produced
  /// A step was submitted (Model::submit_sample) and not collected: decode_ describes it.
  bool inflight_ = false;
  bool prefetch_due_ = false;           ///< this step's prefetch_waiting has not run yet
  std::vector<size_t> prefetch_want_;   ///< prefetch_waiting's scratch
  std::vector<DecodeSlot> next_decode_;
  std::vector<const LiveSequence*> in_flight_seqs_;  ///< submit_next: decode_'s sequences, sorted
  std::vector<int32_t> outputs_, inputs_;
  spec::Draft draft_;
  std::vector<int32_t> emitted_;
  std::vector<int32_t> emitted_q_;  ///< quantized logit of each emitted token (audit)
  std::vector<TokenProb> dist_;
};

}  // namespace fdl::engine
