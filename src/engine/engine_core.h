// Internal: what Generator and Engine both own to run a Scheduler — the model and tokenizer
// references, the KV pool and block tables, the step scratch, the speculation state, the
// lower KV tiers and the step trace. Generator runs the scheduler inline over it, Engine on
// its engine thread.
//
// Member order is destruction order in reverse: the offload layer and the tier manager die
// before the pool (they finish in-flight transfers into it).
// Thread-safety: none; the owner serializes access.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/engine_context.h"
#include "engine/kv_offload.h"
#include "engine/spec_state.h"
#include "engine/step_trace.h"
#include "flashdllm/kv_cache.h"
#include "flashdllm/kv_tiers.h"
#include "flashdllm/metrics.h"
#include "flashdllm/model.h"
#include "flashdllm/options.h"
#include "flashdllm/tokenizer.h"

namespace fdl::engine {

struct EngineCore {
  /// `options` must be resolved (resolve_options) and options.kv_blocks the pool size.
  /// Throws std::invalid_argument (naming `owner`) when the tokenizer's vocabulary is larger
  /// than the model's; what the tier setup throws (docs/KV_TIERS.md) propagates.
  EngineCore(Model& m, const Tokenizer& t, const GeneratorOptions& options, const char* owner);

  /// The references the scheduler works with; `tracing` turns the step trace on.
  EngineContext context(bool tracing);
  /// Speculation totals with the breaker's state filled in.
  SpecMetrics spec_metrics() const;
  /// Tier statistics and what the offload layer did (the placement mode only without tiers).
  KvTierMetrics tier_metrics() const;

  Model& model;
  const Tokenizer& tokenizer;
  GeneratorOptions options;
  int32_t n_vocab;
  BlockPool pool;
  KvCache kv;
  StepBatch batch;
  std::vector<float> logits;
  GeneratorStats stats;
  SpecState spec;
  StepTrace trace;
  /// Always present: its breaker is the "disk_offload" breaker even without lower tiers.
  std::unique_ptr<TierManager> tiers;
  std::unique_ptr<KvOffload> offload;  ///< null when no lower tier is configured
};

}  // namespace fdl::engine
