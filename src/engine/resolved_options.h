// Internal: GeneratorOptions / SchedulerOptions checks and defaults shared by Generator and
// Engine. All throw std::invalid_argument naming the option and its value.
#pragma once

#include <cstddef>

#include "flashdllm/model.h"
#include "flashdllm/options.h"

namespace fdl::engine {

/// The default context when the caller gives none is the model's, capped at this many tokens
/// so that a large model's KV pool (sized for max_sequences full contexts) stays reasonable.
inline constexpr int kDefaultContextCap = 4096;

/// Checks `o` against the model and fills in defaults (n_ctx = min(training context,
/// kDefaultContextCap)).
GeneratorOptions resolve_options(const Model& model, GeneratorOptions o);
/// KV pool size that never preempts: max_sequences full contexts (twice that with audit
/// shadows, which fork a copy beside each audited sequence).
size_t default_pool_blocks(const GeneratorOptions& o);
/// Tier-0 pool size: `requested` blocks, or default_pool_blocks when 0. Throws
/// std::invalid_argument (prefixed by `who`) when it cannot hold one full context.
size_t resolve_pool_blocks(const GeneratorOptions& o, size_t requested, const char* who);
void validate_scheduler_options(const SchedulerOptions& s, const GeneratorOptions& g);

}  // namespace fdl::engine
