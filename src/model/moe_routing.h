// moe_routing.h — a token's experts in a mixture-of-experts FFN (Mixtral; HF Transformers'
// MixtralSparseMoeBlock and llama.cpp's build_moe_ffn): the softmax of the router logits over all
// experts, the k largest probabilities (ties: the lower expert index), renormalized to sum to 1.
//
// Thread-safety: a pure function.
#pragma once

#include <cstdint>

namespace fdl {

/// logits: n_expert router logits of one token. Writes the k chosen expert ids to `ids` in
/// decreasing probability and their weights to `weights` (fp32; each exponential of the fp32
/// difference to the maximum computed in double and rounded once to fp32, sums in double, in
/// a fixed order: the result depends on the token's logits only).
/// 1 <= k <= n_expert (the caller's config checks guarantee it).
void route_top_k(const float* logits, int n_expert, int k, int32_t* ids, float* weights);

}  // namespace fdl
