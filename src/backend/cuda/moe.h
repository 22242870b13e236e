// moe.h — the mixture-of-experts FFN's kernels on CUDA (Mixtral; HF Transformers'
// MixtralSparseMoeBlock, llama.cpp's build_moe_ffn; the CPU's is src/model/moe_forward.cpp):
// routing, the routed projections of a few tokens, the grouping of a longer step's tokens by
// expert, and the weighted sum of each token's expert outputs.
//
// A step's routed pairs: rank r < k of token t is pair p = t * k + r, with expert ids[p] and
// weight w[p]. All pointers are device pointers; activations are fp32, row-major; launches
// go on `stream` and return at once. None of them allocates or waits for the host, so all
// may be captured in a CUDA graph; the grouped path's caller reads moe_group's offsets back
// to the host (that step is not graphed). Errors: CudaError for a launch failure or an
// argument outside the documented range. Thread-safety: as safe as the stream.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace fdl::cuda {

/// The most experts a CUDA model routes over (moe_route keeps a token's probabilities in
/// registers and local memory; moe_group runs one thread per expert).
constexpr int kMoeMaxExperts = 256;

/// For t < n: route_top_k's arithmetic (model/moe_routing.h) on logits[t][0 .. n_expert), so
/// equal logits give the CPU's ids and weights: the softmax (each exponential rounded to fp32
/// from a double exp, sums in double), the k
/// largest probabilities (ties: the lower expert index) into ids[t][0 .. k) in decreasing
/// order, renormalized to sum to 1 into w[t][0 .. k). 1 <= k <= n_expert <= kMoeMaxExperts.
void moe_route(const float* logits, int n, int n_expert, int k, int32_t* ids, float* w, cudaStream_t stream);

/// n_expert matrices of rows x cols elements of `type`, stacked: expert e's starts at element
/// e * rows * cols of data (the layout of llama.cpp's 3-D expert tensors).
struct ExpertMatrices {
  WType type = WType::F32;
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  int n_expert = 0;
  /// Expert e's matrix (a view, no copy).
  DeviceMatrix expert(int e) const {
    return DeviceMatrix{type, static_cast<const char*>(data) + size_t(e) * size_t(rows * cols) * wtype_size(type), rows,
                        cols};
  }
};

/// Y[p][0 .. W.rows) = W_{ids[p]} · X[p / x_div] for p < pairs: x_div = k reads pair p's
/// token's row, x_div = 1 the pair's own row (X rows of W.cols floats). gemv's arithmetic for
/// one token (fp32 accumulation, the same lane order and warp sums), so a pair's values equal
/// gemv of its expert on its row. Each pair streams its expert's matrix: meant for a few
/// tokens (up to kGemvMaxTokens), where the weights dominate. ids must be in [0, n_expert).
void moe_gemv(const ExpertMatrices& W, const int32_t* ids, const float* X, int x_div, int pairs, float* Y,
              cudaStream_t stream);

/// Groups a step's pairs by expert: offsets[e] = pairs routed to experts below e (offsets
/// [0 .. n_expert], the last = pairs), perm[offsets[e] ..] = expert e's pairs in increasing
/// order, slot[p] = pair p's index in perm. One block; deterministic.
void moe_group(const int32_t* ids, int pairs, int n_expert, int32_t* offsets, int32_t* perm, int32_t* slot,
               cudaStream_t stream);

/// out[j] = X[perm[j] / k] for j < m (rows of `width` floats): each pair's token row, in
/// moe_group's order.
void moe_gather(const float* X, const int32_t* perm, int m, int k, int width, float* out, cudaStream_t stream);

/// out[t][i] = sum over r < k, in rank order, of w[t * k + r] * Y[row][i], with row =
/// slot[t * k + r] (moe_group's order) or t * k + r when slot is null; out does not alias Y.
void moe_combine(const float* Y, const int32_t* slot, const float* w, int n, int k, int width, float* out,
                 cudaStream_t stream);

}  // namespace fdl::cuda
