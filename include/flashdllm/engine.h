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
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "flashdllm/generator.h"

namespace fdl {

using RequestId = uint64_t;

/// Scheduling knobs of the Engine (and of Generator, which runs the same scheduler inline).
struct SchedulerOptions {
  /// Tokens per forward at most (decode tokens, drafts and prompt chunks together);
  /// `--max-num-batched-tokens`. Must be >= max_num_seqs (each decode needs one).
  int max_num_batched_tokens = 512;
  /// Prompt tokens per step at most, on top of the decodes (0 = only the budget above
  /// limits them). Generator sets it to GeneratorOptions::prefill_chunk.
  int max_prefill_tokens = 0;
  bool length_buckets = true;       ///< false = first-come first-served admission
  int short_prompt_tokens = 128;    ///< prompts shorter than this are "short"
  int long_prompt_tokens = 512;     ///< prompts longer than this are "long"
  int long_prefill_chunk = 256;     ///< prompt tokens per step for a long prompt (buckets on)
  int max_wait_steps = 64;          ///< a request waiting this many steps is admitted first
  bool prefix_cache = true;         ///< share full KV blocks of common prompt prefixes
  /// Async scheduling (vLLM's --async-scheduling, SGLang's overlap scheduler): with a model
  /// that samples on its device (the CUDA model), a step of decodes only is queued with
  /// Model::submit_sample before the previous step's ids are back, its tokens drawn on the
  /// device, so the GPU does not wait for the host's output handling between steps. Only
  /// while nothing needs the host first: no prefilling requests and none waiting that a free
  /// sequence slot could admit (at --max-num-seqs the pipeline goes on), no speculation,
  /// logprobs or penalties, KV tiers only when their copies run on the device (the CUDA
  /// model's), and free blocks for every next slot. Outputs are the
  /// same either way (a sequence that ends meanwhile drops its extra row). `--no-async-scheduling`.
  bool async_scheduling = true;
};

struct EngineOptions {
  /// block_size, n_ctx, max_sequences (= --max-num-seqs), spec; prefill_chunk is ignored
  /// (the scheduler's token budget replaces it).
  GeneratorOptions generator{};
  SchedulerOptions scheduler{};
  /// KV pool size in blocks; 0 = max_sequences full contexts (never preempts). Smaller pools
  /// are allowed (down to one full context) and make the scheduler preempt under load.
  /// When 0, generator.kv_blocks is used if set. Lower tiers: generator.kv_tiers; the
  /// "disk_offload" breaker is the tier manager's (it pauses tier-2 offload).
  size_t kv_blocks = 0;
};

/// A token's log-probability under the model's own distribution at that position: the
/// log-softmax of the logits, before penalties, temperature, top-k, top-p and min-p (vLLM's
/// default, "raw_logprobs"), so it does not depend on the sampling parameters.
struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.f;
};

struct SampledToken {
  int32_t id = 0;
  /// Only when the request asked for logprobs (GenerationRequest::logprobs >= 0), else NaN.
  float logprob = 0.f;
  std::vector<TokenLogprob> top;  ///< the `logprobs` most likely tokens, descending
};

struct RequestOutput {
  RequestId id = 0;
  /// Tokens sampled since the previous delivery, in order. An end-of-generation token that
  /// stopped the request is not included (as in GenerationResult::generated_ids).
  std::vector<SampledToken> tokens;
  std::string text;              ///< text released since the previous delivery (whole UTF-8)
  bool finished = false;
  /// When finished: "stop", "length", "abort" (abort() or engine shutdown) or "error".
  std::string finish_reason;
  std::string matched_stop;      ///< the stop string that ended it, else empty
  std::string error;             ///< message when finish_reason == "error"
  // Set on the final delivery only:
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;      ///< == total generated ids delivered
  int32_t cached_prompt_tokens = 0;   ///< prompt tokens served from the prefix cache
  double queue_ms = 0;                ///< submit() -> admitted (first scheduled)
  GenerationTimings timings;          ///< ttft_ms counts from submit()
};

using OutputSink = std::function<void(const RequestOutput&)>;

struct EngineMetrics {
  int64_t running = 0;            ///< admitted requests not yet finished
  int64_t waiting = 0;            ///< submitted, not yet admitted (preempted ones included)
  int64_t steps = 0;              ///< forwards run
  int64_t requests_submitted = 0;
  int64_t requests_finished = 0;  ///< all reasons
  int64_t requests_aborted = 0;
  int64_t requests_failed = 0;    ///< finish_reason "error"
  int64_t preemptions = 0;
  int64_t prompt_tokens = 0;      ///< prompt tokens of admitted requests
  int64_t prefill_tokens_computed = 0;  ///< prompt tokens actually run through the model
  int64_t recomputed_tokens = 0;  ///< tokens prefilled again after a preemption
  int64_t generation_tokens = 0;  ///< tokens sampled
  int64_t prefix_cache_queries = 0;     ///< prompt tokens looked up in the prefix cache
  int64_t prefix_cache_hits = 0;        ///< of those, served from it
  size_t kv_blocks_total = 0;
  size_t kv_blocks_free = 0;
  size_t kv_blocks_cached = 0;    ///< held only by the prefix cache (evictable)
  size_t kv_block_bytes = 0;
  KvDtype kv_dtype = KvDtype::F32;  ///< element type of the pool's K/V (--kv-cache-dtype)
  int kv_block_size = 0;            ///< tokens per block (--block-size)
  uint64_t kv_blocks_copied = 0;  ///< copy-on-write copies (KvCache::blocks_copied)
  SpecMetrics spec;
  double forward_ms = 0;          ///< total time inside Model::forward
  /// Lower KV tiers (EngineOptions::generator.kv_tiers): per-tier occupancy, blocks/bytes
  /// moved each way, transfer latency, prefetch hits/late, checksum failures, lost tokens.
  KvTierMetrics kv_tiers;
};

/// A runtime switch (docs/SCHEDULER.md): "speculation" and "disk_offload".
struct BreakerState {
  std::string name;
  bool open = false;          ///< open = the feature is switched off
  int64_t trips = 0;
  std::string reason;         ///< why it last opened ("" if never)
};

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

  const EngineOptions& options() const;  ///< resolved (n_ctx, kv_blocks filled in)
  const Tokenizer& tokenizer() const;
  const ModelConfig& model_config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fdl
