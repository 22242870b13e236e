// Sampler::sample_against_draft(s) — verification of draft tokens (see flashdllm/sampling.h).
//
// Why it is exact: the emitted token is sample()'s draw from the target distribution p, so it
// is distributed as p whatever was drafted; a point-mass draft x is accepted with probability
// p(x) (speculative sampling's rate for q = delta_x), several distinct candidates each with
// their own p. And because the draw is sample()'s own, one per emitted token, speculation does
// not change which ids a seed gives: the drafts only decide how many tokens one forward yields.
#include "flashdllm/sampling.h"

namespace fdl {

int32_t Sampler::sample_against_draft(std::span<const float> logits, int32_t /*draft*/) { return sample(logits); }

int32_t Sampler::sample_against_drafts(std::span<const float> logits, std::span<const int32_t> /*drafts*/) {
  return sample(logits);
}

}  // namespace fdl
