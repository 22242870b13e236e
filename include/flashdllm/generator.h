// flashdllm/generator.h — the generation engine: batched prefill and decode over a Model and
// its paged KV cache, with sampling, stop strings and streaming text.
//
// One generate() call serves a list of requests with continuous batching:
//  - up to `max_sequences` requests are live at once; when one finishes, it frees its KV
//    blocks and the next waiting request is admitted;
//  - newly admitted prompts are prefilled in chunks: each forward carries up to
//    `prefill_chunk` prompt tokens (several short prompts share one forward), and only the
//    last token of each prompt asks for logits;
//  - then every live sequence advances by one token per forward (one decode step = one
//    forward over all live sequences).
// Because the model's logits for a token do not depend on what else is in the batch, a
// request's tokens are the same whether it runs alone or with others (the tests check it).
//
// Streaming: each generated token goes through a StreamingDetokenizer (whole UTF-8 only)
// and a stop-string matcher (OpenAI semantics: the stop string and what follows are not
// emitted; text that may start a stop string is held back until decided). The callback
// receives exactly the pieces whose concatenation is GenerationResult::text.
//
// Units: token counts in tokens, times in milliseconds measured with std::chrono::steady_clock.
// Errors: an invalid request (empty prompt, token id outside the vocabulary, prompt that
// leaves no room in the context, bad sampling parameters, empty stop string, max_new_tokens
// < -1) throws std::invalid_argument naming the request index, before any work is done.
// Errors from the model propagate; the KV cache is left empty either way, so the Generator
// stays usable. Reaching the context limit is not an error: the request ends with "length".
// Thread-safety: a Generator is not thread-safe; one thread calls generate() at a time. The
// callback runs on that thread, between forwards.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "flashdllm/kv_cache.h"
#include "flashdllm/kv_tiers.h"
#include "flashdllm/model.h"
#include "flashdllm/sampling.h"
#include "flashdllm/speculative.h"
#include "flashdllm/tokenizer.h"

namespace fdl {

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;  ///< must not be empty (pass [BOS] for an empty prompt)
  SamplingParams sampling;
  /// Tokens to generate at most; -1 = until end-of-generation or the context is full;
  /// 0 = none (the request finishes at once with "length").
  int32_t max_new_tokens = 128;
  std::vector<std::string> stop;  ///< stop strings (non-empty)
  bool ignore_eos = false;        ///< keep going past end-of-generation tokens
  /// Speculation window of this request: -1 = GeneratorOptions::spec.window, 0 = never
  /// speculate (plain decoding), 1..64 = at most this many draft tokens per step.
  int32_t spec_window = -1;
  /// Log-probabilities of sampled tokens (Engine only, see flashdllm/engine.h): -1 = none,
  /// 0..20 = each sampled token's logprob plus this many most likely alternatives.
  int32_t logprobs = -1;
  /// Prefix-cache scope (e.g. derived from the API key): requests share KV blocks only with
  /// requests of the same scope. Empty = the default scope.
  std::string cache_scope;
};

struct GenerationTimings {
  int32_t prompt_tokens = 0;
  double prompt_ms = 0;   ///< start of this prompt's first prefill forward -> end of its last
  double ttft_ms = 0;     ///< generate() call -> first token sampled (includes waiting)
  /// Tokens sampled, the end-of-generation token that stopped the request included.
  int32_t gen_tokens = 0;
  double decode_ms = 0;   ///< first token sampled -> last token sampled
  /// Time between consecutive sampled tokens (gen_tokens - 1 entries), for ITL statistics.
  std::vector<double> token_latencies_ms;

  double prompt_tokens_per_s() const {
    return prompt_ms > 0 ? prompt_tokens * 1000.0 / prompt_ms : 0.0;
  }
  /// Decode throughput of this request: tokens after the first over decode_ms.
  double decode_tokens_per_s() const {
    return decode_ms > 0 && gen_tokens > 1 ? (gen_tokens - 1) * 1000.0 / decode_ms : 0.0;
  }
};

struct GenerationResult {
  std::vector<int32_t> prompt_ids;
  /// Generated ids. An end-of-generation token that stopped the request is not included;
  /// the token that completed a stop string is.
  std::vector<int32_t> generated_ids;
  std::string text;            ///< detokenized generated text, cut before any stop string
  std::string finish_reason;   ///< "stop" (end-of-generation or stop string) or "length"
  std::string matched_stop;    ///< the stop string that ended the request, else empty
  GenerationTimings timings;
};

/// Totals of the last generate() call, for measuring engine overhead against the model.
struct GeneratorStats {
  int64_t n_forwards = 0;
  int64_t n_prefill_tokens = 0;
  int64_t n_decode_tokens = 0;   ///< tokens fed by decode steps
  double forward_ms = 0;         ///< inside Model::forward
  double total_ms = 0;           ///< the whole generate() call
};

/// Where the prefix cache sends a tier-0 block it must give up (docs/KV_TIERS.md):
/// Auto = the cost rule over the measured storage profile and the model's measured prefill
/// speed; Recompute = always drop (recompute on reuse); Host = tier 1, dropped when tier 1 is
/// full; Disk = tier 1, ageing to tier 2 when tier 1 is full (tier 2 directly without a
/// tier 1). A tier that is not configured (or disabled by an error) is skipped.
enum class KvPlacementMode : uint8_t { Auto, Recompute, Host, Disk };
const char* to_string(KvPlacementMode m);
/// "auto", "recompute", "host" or "disk"; std::invalid_argument otherwise.
KvPlacementMode parse_kv_placement(std::string_view text);

/// Lower KV tiers for a Generator / Engine. Tiers are on when `tiers` gives tier 1 or tier 2
/// a capacity (tier 2 also needs tiers.disk_path).
struct KvTierOptions {
  TierConfig tiers{};
  KvPlacementMode placement = KvPlacementMode::Auto;
  /// Auto only: a StorageProfile as JSON (`flashdllm profile --json`); empty = the cached
  /// profile for this disk path and block size, measured (about a second) when missing.
  std::string profile_json;
  std::filesystem::path profile_cache_dir;  ///< empty = $XDG_CACHE_HOME/flashdllm
  /// Reuse-score half-life of a cached block, in engine steps (decayed access frequency).
  double reuse_half_life_steps = 256.0;
  bool enabled() const {
    return tiers.host.bytes > 0 || tiers.host.fraction > 0 ||
           (!tiers.disk_path.empty() && (tiers.disk.bytes > 0 || tiers.disk.fraction > 0));
  }
};

/// What the tiered KV layer did (Generator::tier_metrics, EngineMetrics::kv_tiers).
struct KvTierMetrics {
  bool enabled = false;
  std::string placement;            ///< the mode ("auto", ...)
  TierStats tiers;                  ///< occupancy, moves, latency, checksums, breaker
  int64_t demoted_host = 0;         ///< prefix-cache blocks sent tier 0 -> 1
  int64_t demoted_disk = 0;         ///< ... tier 0 -> 2 or tier 1 -> 2
  int64_t dropped = 0;              ///< ... released (recompute if reused)
  int64_t promoted = 0;             ///< offloaded blocks brought back into tier 0 on a hit
  int64_t failed_promotions = 0;    ///< Corrupt / IoError / Lost on the way back
  int64_t lost_tokens = 0;          ///< cached tokens lost that way (recomputed by prefill)
  int64_t prefetches = 0;           ///< promotions started early for waiting requests
  double recompute_tok_per_s = 0;   ///< the prefill speed the cost rule uses now
  double disk_write_ms_per_block = 0;  ///< measured engine-side cost of a tier-2 write (0 = none yet)
  double disk_read_ms_per_block = 0;   ///< ... of bringing a tier-2 block back
  /// Engine-thread waits for device copies (GPU tiers: a promotion needed before it landed).
  int64_t copy_waits = 0;
  double copy_wait_ms_total = 0;
  double copy_wait_ms_max = 0;
  std::string profile;              ///< the storage profile used (JSON), empty if none
};

struct GeneratorOptions {
  int block_size = 16;      ///< tokens per KV block (--block-size), >= 1
  /// Context limit per sequence in tokens (prompt + generated); 0 = min(model's training
  /// context, 4096). Must not exceed the model's training context.
  int n_ctx = 0;
  int max_sequences = 8;    ///< live sequences at once; the KV pool holds n_ctx for each
  int prefill_chunk = 512;  ///< prompt tokens per prefill forward, >= 1
  /// Self-verifying speculative decoding (flashdllm/speculative.h); off by default. With it
  /// on, outputs stay exactly those of plain decoding (greedy: the same ids; sampling: the
  /// same distribution), only faster when drafts are accepted.
  SpecOptions spec{};
  /// Tier-0 KV pool size in blocks (--kv-tier0-bytes / block bytes); 0 = max_sequences full
  /// contexts (never preempts). Smaller pools (at least one full context) make the scheduler
  /// preempt, and with kv_tiers configured, move cached blocks down the tiers.
  size_t kv_blocks = 0;
  /// Lower KV tiers (host DRAM, disk) under the prefix cache; off unless configured.
  KvTierOptions kv_tiers{};
  /// Async scheduling: SchedulerOptions::async_scheduling (flashdllm/engine.h); `--no-async-scheduling`.
  /// An Engine runs it only when both this and EngineOptions::scheduler's flag are set.
  bool async_scheduling = true;
  /// When set, a Chrome trace-event JSON (Perfetto opens it) of the last generate() call is
  /// written here: per-step forward spans and demote/promote spans with byte counts.
  std::filesystem::path trace_file{};
};

/// Called with (request index, text piece) for every non-empty piece of generated text.
using TextCallback = std::function<void(size_t request_index, std::string_view piece)>;

class Generator {
 public:
  /// Sizes the KV pool: max_sequences * ceil(n_ctx / block_size) blocks, allocated once.
  /// `model` and `tokenizer` must outlive the Generator. Throws std::invalid_argument for
  /// bad options, or when the tokenizer's vocabulary is larger than the model's.
  Generator(Model& model, const Tokenizer& tokenizer, const GeneratorOptions& options = {});
  ~Generator();
  Generator(Generator&&) noexcept;
  Generator& operator=(Generator&&) noexcept;

  /// Runs every request to completion; results are in request order.
  std::vector<GenerationResult> generate(const std::vector<GenerationRequest>& requests,
                                         const TextCallback& on_text = {});

  /// Options with defaults resolved (n_ctx is the effective context limit).
  const GeneratorOptions& options() const;
  const GeneratorStats& last_stats() const;
  const BlockPool& block_pool() const;

  /// Speculation totals since construction (see SpecMetrics), breaker state included.
  const SpecMetrics& spec_metrics() const;
  /// Manual reset of the speculation breaker (closes it; speculation resumes next step).
  void reset_spec_breaker();
  /// Test hook: the next `n` audit comparisons count as mismatches, as if the speculative
  /// and the shadow ids had differed. Needs spec.audit_fraction > 0 to have any effect.
  void force_audit_mismatches(int n);
  /// Tier counters since construction (enabled = false when no lower tier is configured).
  KvTierMetrics tier_metrics() const;
  /// Test hook: the tier manager (nullptr without lower tiers), e.g. to corrupt a block.
  TierManager* tier_manager_for_test();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// A model and the tokenizer from its GGUF metadata. Members are destroyed tokenizer first.
struct LoadedModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
};
/// Model::load(path) + Tokenizer::from_gguf(model->gguf()). Throws what those throw.
LoadedModel load_model(const std::filesystem::path& path, const ModelOptions& options = {});

/// Prompt text -> ids as the CLI and server use them: special tokens added as the model's
/// metadata says (add_bos / add_eos); an empty result becomes [BOS], or throws
/// std::invalid_argument when the vocabulary has no BOS.
std::vector<int32_t> encode_prompt(const Tokenizer& tokenizer, std::string_view text,
                                   bool parse_special = false);

}  // namespace fdl
