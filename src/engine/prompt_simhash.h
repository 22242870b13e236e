// Internal: SimHash of a prompt (Charikar 2002, "Similarity estimation techniques from
// rounding algorithms"): a 64-bit fingerprint whose Hamming distance to another prompt's
// estimates how different their token 3-gram sets are. The scheduler groups waiting prompts
// with small distances to what is running, so correlated requests (the same template, the
// same document) run together and feed each other's n-gram drafts (docs/SCHEDULER.md).
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <span>

namespace fdl::engine {

/// SimHash over the token 3-grams of `tokens` (each 3-gram hashed with XXH3-64, every bit
/// voting +1/-1); prompts shorter than 3 tokens hash their tokens one by one. Cost: one pass.
uint64_t prompt_simhash(std::span<const int32_t> tokens);

/// Hamming distance between two SimHashes: 0 = same 3-gram set (up to hash collisions),
/// about 32 = unrelated.
int simhash_distance(uint64_t a, uint64_t b);

}  // namespace fdl::engine
