// Internal: checks a GenerationRequest before any work starts, so a bad request fails the
// call cleanly instead of surfacing half-way through a batch.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashdllm/request.h"

namespace fdl::engine {

/// Throws std::invalid_argument starting with "request #<index>: " and naming the problem.
void validate_request(const GenerationRequest& request, size_t index, int32_t n_vocab,
                      int n_ctx);

}  // namespace fdl::engine
