// Internal: the model's prefill speed, measured on the loaded model — what recomputing a
// dropped KV block costs (the storage profile's recompute figure; `flashdllm profile` prints
// it, the Auto placement starts from it until the scheduler has live measurements).
// Thread-safety: uses the model's forward (engine thread only).
#pragma once

#include "flashdllm/model.h"

namespace fdl::engine {

/// Prefill tokens/s: one warm-up, then the best of three timed forwards of `n_tokens` prompt
/// tokens in one step (capped at the model's training context). Allocates a small KV pool
/// of its own. Throws what Model::forward throws.
double measure_prefill_tok_per_s(Model& model, int block_size, int n_tokens);

}  // namespace fdl::engine
