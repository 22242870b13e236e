// flashdllm/options.h — the options of a Generator and an Engine: KV block size, context,
// sequences, speculation, lower KV tiers, scheduling. Plain data; the CLI flags that set each
// one are named beside it (docs/CLI.md lists them all). Checks happen where they are used:
// Generator / Engine constructors throw std::invalid_argument for out-of-range values.
// Units: tokens, blocks, bytes, engine steps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "flashdllm/kv_tiers.h"
#include "flashdllm/speculative.h"

namespace fdl {

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

struct GeneratorOptions {
  int block_size = 16;      ///< tokens per KV block (--block-size), >= 1
  /// Context limit per sequence in tokens (prompt + generated); 0 = min(model's training
  /// context, 4096). Must not exceed the model's training context.
  int n_ctx = 0;
  int max_sequences = 8;    ///< live sequences at once; the KV pool holds n_ctx for each
  int prefill_chunk = 512;  ///< prompt tokens per prefill forward, >= 1
  /// Self-verifying speculative decoding (flashdllm/speculative.h); off by default. With it
  /// on, outputs stay exactly those of plain decoding (the same ids, greedy or seeded
  /// sampling), only faster when drafts are accepted.
  SpecOptions spec{};
  /// Tier-0 KV pool size in blocks (--kv-tier0-bytes / block bytes); 0 = max_sequences full
  /// contexts (never preempts). Smaller pools (at least one full context) make the scheduler
  /// preempt, and with kv_tiers configured, move cached blocks down the tiers.
  size_t kv_blocks = 0;
  /// Lower KV tiers (host DRAM, disk) under the prefix cache; off unless configured.
  KvTierOptions kv_tiers{};
  /// Async scheduling: SchedulerOptions::async_scheduling (below); `--no-async-scheduling`.
  /// An Engine runs it only when both this and EngineOptions::scheduler's flag are set.
  bool async_scheduling = true;
  /// When set, a Chrome trace-event JSON (Perfetto opens it) of the last generate() call is
  /// written here: per-step forward spans and demote/promote spans with byte counts.
  std::filesystem::path trace_file{};
};

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

}  // namespace fdl
