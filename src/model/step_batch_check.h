// step_batch_check.h — the checks every backend makes on a forward's batch before it writes
// anything: one description of a valid StepBatch (flashdllm/model.h), one set of messages and
// exception types, whatever runs the forward.
// Thread-safety: none beyond the arguments' (called by the model's forward).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "flashdllm/kv_cache.h"
#include "flashdllm/model.h"
#include "model/token_tree.h"

namespace fdl {

/// Accepts token `i`'s negative id (a backend's reference to something other than the
/// vocabulary, e.g. the CUDA model's previous_step_id) by returning, refuses it by throwing.
using NegativeTokenCheck = std::function<void(size_t i, int32_t token)>;

/// Checks `b` against the model `c` (whose KV cache holds `kv_dtype`) and `kv`, and resolves
/// its token trees into `tree`. Throws std::invalid_argument for vectors of different lengths,
/// a KV cache of another shape or type, a malformed tree, or a slot in a block shared with
/// another sequence; std::out_of_range for an id outside the vocabulary, a position that is not
/// a reserved slot, or a dead sequence; each message names the token. `negative_token` null:
/// every negative id is out of range.
void check_step_batch(const StepBatch& b, const KvCache& kv, const ModelConfig& c, KvDtype kv_dtype,
                      TokenTreeLayout& tree, const NegativeTokenCheck& negative_token = nullptr);

}  // namespace fdl
