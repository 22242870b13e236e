// Internal: the long-lived pieces a generate() call works with, owned by Generator::Impl and
// reused across calls so that the decode loop never reallocates its batch or logits.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/spec_state.h"
#include "flashdllm/kv_cache.h"
#include "flashdllm/metrics.h"
#include "flashdllm/model.h"
#include "flashdllm/options.h"
#include "flashdllm/tokenizer.h"

namespace fdl::engine {

class KvOffload;
class StepTrace;

struct EngineContext {
  Model& model;
  const Tokenizer& tokenizer;
  KvCache& kv;
  const GeneratorOptions& options;  ///< resolved (n_ctx set)
  int32_t n_vocab;                  ///< the model's: the width of a logits row
  StepBatch& batch;                 ///< scratch, cleared per forward
  std::vector<float>& logits;       ///< scratch, written by Model::forward
  GeneratorStats& stats;
  SpecState& spec;                  ///< speculation state across calls
  KvOffload* offload = nullptr;     ///< lower KV tiers under the prefix cache (null: none)
  StepTrace* trace = nullptr;       ///< per-step Chrome trace (null: off)
};

}  // namespace fdl::engine
