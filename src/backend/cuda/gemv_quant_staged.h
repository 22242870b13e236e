// gemv_quant_staged.h — the block-quantized GEMV of short steps (up to kStagedMaxTokens
// tokens), whose blocks round the fp32 activations into shared memory themselves (after
// normalizing them, in the _norm variants) and stream their rows through register buffers
// (gemv_quant_staged.cu). gemv_quant (kernels.h) runs it
// where it fits; its results have the bits of gemv_quant's other kernel, token by token.
// Host functions; not thread-safe per stream (they enqueue on `stream`).
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/kernels.h"

namespace fdl::cuda {

/// Tokens per step the staged kernels take (their per-token sums live in registers).
constexpr int kStagedMaxTokens = 4;

/// Whether gemv_quant_staged can run W (block-quantized) for n tokens: 1 <= n <=
/// kStagedMaxTokens and n rows of rounded activations (1.375 bytes per value) fit in one
/// block's shared memory (W.cols up to ~169,000 for one token on an H200; the _norm variants
/// below, which also hold the fp32 row, ~43,000). False when
/// FLASHDLLM_GEMV_QUANT_STAGED=0 (for A/B timing: gemv_quant's other kernel then runs).
bool gemv_quant_staged_fits(const DeviceMatrix& W, int n);

/// Y[t][r] = sum_k X[t][k] * W[r][k] for t < n: X fp32 [n][W.cols] (device), Y fp32
/// [n][W.rows] (device), the activations rounded as Q8Activations says. Throws CudaError where
/// gemv_quant_staged_fits is false.
void gemv_quant_staged(const DeviceMatrix& W, const float* X, int n, float* Y, cudaStream_t stream);

/// Whether gemv_quant_swiglu can run W: gemv_quant_staged_fits, one run of one type, an even
/// number of rows.
bool gemv_quant_swiglu_fits(const DeviceMatrix& W, int n);

/// The gated FFN's first half for a fused gate/up matrix W ([2 n_ff][cols]: gate rows, then up
/// rows): H[t][p] = act(gate_p · x_t) * (up_p · x_t) for p < n_ff, act SiLU or, with `gelu`,
/// tanh-GELU (ffn_act.cuh): the bits gemv_quant then silu_mul give. H fp32 [n][n_ff].
/// Throws CudaError where gemv_quant_swiglu_fits is false.
void gemv_quant_swiglu(const DeviceMatrix& W, const float* X, int n, float* H, bool gelu, cudaStream_t stream);

/// One decode token with the norm in the kernel, as gemv_norm_qkv does for 16-bit rows: every
/// block computes v = in.x + in.add (in.add_w: Gemma's post-norm of the addend) and
/// xn = (v * scale) * in.w (kernels.h: NormIn; the fp64 sum of norm_to_smem, whose bits may
/// differ from add_rms_norm's in the last place), block 0 writes v to in.x_out, which must
/// not alias in.x (other blocks still read it); then Y = W · round8(xn) (Y fp32 [W.rows]).
/// Whether W fits: block-quantized and the row's staging fits in shared memory.
bool gemv_quant_norm_fits(const DeviceMatrix& W);
void gemv_quant_norm(const DeviceMatrix& W, const NormIn& in, float* Y, cudaStream_t stream);
/// gemv_quant_swiglu of one token with gemv_quant_norm's norm: H fp32 [W.rows / 2].
bool gemv_quant_norm_swiglu_fits(const DeviceMatrix& W);
void gemv_quant_norm_swiglu(const DeviceMatrix& W, const NormIn& in, float* H, bool gelu, cudaStream_t stream);

}  // namespace fdl::cuda
