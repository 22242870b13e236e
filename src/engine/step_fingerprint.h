// Internal: the audit fingerprint of one speculative step (docs/SPECULATIVE.md, "Fingerprint
// audit and breaker"): XXH3-64 over the sampled token ids followed by, for each, its logit
// quantized to 1/64.
// Ids alone would miss a verification bug that happens to pick the same ids from wrong
// logits (e.g. a stale KV row that only shifts values); the quantized logits catch that,
// while the quantization keeps the fingerprint independent of last-bit differences.
// The speculative path and its plain shadow compute it the same way over the same range.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>

#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

namespace fdl::engine {

/// The logit of the sampled token, quantized: round(logit * 64), clamped to int32.
inline int32_t quantize_logit(float logit) {
  const double q = std::nearbyint(double(logit) * 64.0);
  if (!(q > -2147483648.0)) return INT32_MIN;  // -inf (masked) and NaN
  if (q > 2147483647.0) return INT32_MAX;
  return int32_t(q);
}

inline uint64_t step_fingerprint(std::span<const int32_t> ids, std::span<const int32_t> logits_q) {
  XXH3_state_t st;
  XXH3_64bits_reset(&st);
  XXH3_64bits_update(&st, ids.data(), ids.size_bytes());
  XXH3_64bits_update(&st, logits_q.data(), logits_q.size_bytes());
  return XXH3_64bits_digest(&st);
}

}  // namespace fdl::engine
