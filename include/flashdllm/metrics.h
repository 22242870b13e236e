// flashdllm/metrics.h — what a Generator and an Engine report: per-call totals, lower KV
// tier counters, the Engine's metrics (the server's /metrics is built from them) and the
// state of the runtime switches. Plain data, copied out under the owner's lock.
// Units: tokens, blocks, bytes, milliseconds.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "flashdllm/kv_dtype.h"
#include "flashdllm/kv_tiers.h"
#include "flashdllm/speculative.h"

namespace fdl {

/// Totals of the last generate() call, for measuring engine overhead against the model.
struct GeneratorStats {
  int64_t n_forwards = 0;
  int64_t n_prefill_tokens = 0;
  int64_t n_decode_tokens = 0;   ///< tokens fed by decode steps
  double forward_ms = 0;         ///< inside Model::forward
  double total_ms = 0;           ///< the whole generate() call
  /// Grammar-constrained sampling: rows masked, and the host time spent computing and
  /// applying the masks and cutting drafts (GenerationRequest::grammar).
  int64_t grammar_rows = 0;
  double grammar_ms = 0;
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
  int64_t grammar_rows = 0;       ///< logits rows masked by a request's grammar
  double grammar_ms = 0;          ///< host time masking them and fitting drafts to grammars
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

}  // namespace fdl
