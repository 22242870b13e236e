// flashdllm/engine.h — the serving engine: one engine thread owns the model and its paged KV
// cache and runs continuous batching; any thread submits requests, receives their output as
// a stream, and aborts them.
//
// Scheduling (one iteration = one Model::forward; see docs/SCHEDULER.md):
//  - decodes first: every running sequence whose prompt is in the KV cache feeds its next
//    token (plus its speculative draft, flashdllm/speculative.h);
//  - the rest of the per-step token budget (`max_num_batched_tokens`) goes to prompt chunks
//    (chunked prefill), so a long prompt never stalls running decodes;
//  - length buckets (on by default): waiting prompts are classed short (< short_prompt_tokens),
//    medium, long (> long_prompt_tokens). Short ones are admitted first and packed together;
//    at most one long prompt prefills at a time and it takes at most `long_prefill_chunk`
//    tokens per step, so it never blocks short ones. A request that has waited
//    `max_wait_steps` steps goes first whatever its class (no starvation). With buckets off,
//    admission is first-come first-served and a prompt takes the whole remaining budget;
//  - prefix sharing (on by default): full KV blocks of finished and running prompts are kept
//    in a prefix cache keyed by a hash chain (XXH3-128 of the parent's hash, the request's
//    cache scope and the block's token ids; token ids are compared on every hit, so a hash
//    collision can never serve another prompt's KV). A new prompt starts from its longest
//    cached prefix of whole blocks (shared by refcount, never copied); its last prompt token
//    is always computed so that it has logits. Cached blocks nobody uses are evicted LRU
//    when the pool needs room. Requests only share KV within the same `cache_scope`.
//  - when the KV pool runs out during decode, the youngest running request is preempted: its
//    blocks are freed and it re-enters the waiting queue at the front; when re-admitted its
//    prompt and the tokens it already generated are prefilled again (recompute) and it goes
//    on where it stopped — its output is unchanged (greedy: same ids; sampling: the sampler
//    state is kept). Nothing is truncated silently: a request that cannot fit even alone is
//    refused at submit().
//
// Output: the sink of a request receives RequestOutput deliveries in order, on the engine
// thread, after each step that produced something for it; the last one has finished = true.
// The concatenation of all `text` pieces is the final text (stop strings cut as in
// flashdllm/generator.h). A sink must return quickly and must not call submit()/drain() (it
// may call abort()). Exceptions thrown by a sink abort that request.
//
// Thread-safety: every public method is thread-safe. The model, tokenizer and KV cache are
// touched only by the engine thread.
// Units: tokens, milliseconds (std::chrono::steady_clock), bytes.
// SchedulerOptions and EngineOptions are in flashdllm/options.h; RequestOutput and its tokens
// in flashdllm/request.h; EngineMetrics and BreakerState in flashdllm/metrics.h.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "flashdllm/generator.h"

namespace fdl {

class Engine {
 public:
  /// Validates the options (std::invalid_argument), sizes the KV pool and starts the engine
  /// thread. `model` and `tokenizer` must outlive the Engine.
  Engine(Model& model, const Tokenizer& tokenizer, const EngineOptions& options = {});
  /// Aborts whatever is still running or waiting (sinks get "abort") and joins the thread.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Queues a request. Validates it first on the calling thread and throws
  /// std::invalid_argument (empty prompt, id outside the vocabulary, prompt that leaves no
  /// room in the context, bad sampling parameters, logprobs > 20, ...) without queuing
  /// anything; throws std::runtime_error once drain() has begun.
  RequestId submit(GenerationRequest request, OutputSink sink);
  /// Ends a waiting or running request: its sink gets a final delivery with "abort" and its
  /// KV blocks go back to the pool before the next step. Unknown/finished ids are ignored.
  void abort(RequestId id);
  /// Stops accepting requests and blocks until every submitted request has finished.
  void drain();

  /// Counters and gauges, consistent with each other (taken between steps). During a step the
  /// call waits for the step's end, where one snapshot answers every caller that asked during
  /// it (a /metrics flood costs one snapshot per step, not one lock hand-over per caller);
  /// a step longer than 2 s, or an idle engine, is read under the state lock instead.
  /// Thread-safe; must not be called from an OutputSink (they run inside a step).
  EngineMetrics metrics() const;
  /// The breakers' states, read the same way as metrics() (the same end-of-step snapshot).
  std::vector<BreakerState> breakers() const;
  /// Opens ("trip") or closes ("reset") a breaker by name. Throws std::invalid_argument for
  /// an unknown name. A tripped breaker stays open until reset. Its reason then reads
  /// "manual trip: " + `reason` ("by an operator" when empty), on both breakers; after a reset
  /// the reason of the last trip is kept (the metrics say why it last opened).
  void trip_breaker(const std::string& name, const std::string& reason);
  void reset_breaker(const std::string& name);
  /// Fault injection for soak tests (`flashdllm serve --fault-injection`): "disk_read_eio",
  /// "disk_write_eio", "disk_write_enospc", "disk_read_short" make the next `count` tier-2
  /// transfers of that kind fail (the I/O itself runs); "flip_bit" flips one bit in `count`
  /// offloaded blocks stored in tier 1 or 2 (their checksums then refuse them, and they are
  /// recomputed). Returns how many faults were armed or applied (flip_bit: 0 when nothing
  /// is stored). Throws std::invalid_argument for an unknown fault, a count outside 1..1000,
  /// or a disk fault without a disk tier. Thread-safe (waits for the step in progress).
  int inject_fault(const std::string& fault, int count);

  const EngineOptions& options() const;  ///< resolved (n_ctx, kv_blocks filled in)
  const Tokenizer& tokenizer() const;
  const ModelConfig& model_config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fdl
