// gemm_quant.h — the projection of a block-quantized matrix for batched steps (more than
// kGemvMaxTokens tokens, up to kGemmQuantMaxTokens): the weights are read once, in their
// blocks, and dequantized into shared memory, where tensor cores multiply them.
//
// Y[t][r] = sum_k f16(W[r][k]) * X[t][k] with fp32 accumulation, where f16(W[r][k]) is the
// value the CPU dequantizer computes in fp32, rounded to F16 (dequantize_to_f16's values), and
// X is F16: the arithmetic of the dequantized tiles multiplied by cuBLAS, which this replaces
// for such steps, in another summation order (k in steps of 16 per mma.sync m16n8k16, then
// K splits added in order). A step of 64 tokens on the Llama-3-8B shape in Q4_K moves 4.9 GB
// of weights instead of 4.9 GB read + 16 GB written + 16 GB read through the tiles.
//
// Shapes and types: W block-quantized (W.quantized()), every run Q4_K, Q5_K, Q6_K or Q8_0,
// W.cols a multiple of kGemmQuantK; X device F16 [n][W.cols] (16-byte aligned); Y device fp32
// [n][W.rows]; `workspace` device fp32 of gemm_quant_workspace_floats(W, n) floats (K splits'
// partial sums), not aliasing X or Y. Nothing is allocated (graph-capturable).
// Errors: CudaError when gemm_quant_fits is false, or the workspace is missing where needed.
// Thread-safety: enqueues on `stream`.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "backend/cuda/kernels.h"

namespace fdl::cuda {

/// Token counts above kGemvMaxTokens and up to this run gemm_quant.
constexpr int kGemmQuantMaxTokens = 128;
/// W.cols must be a multiple of this (the k of one stage of the kernel).
constexpr int kGemmQuantK = 128;

/// Whether gemm_quant takes W for a step of n tokens.
bool gemm_quant_fits(const DeviceMatrix& W, int n);
/// Floats of workspace gemm_quant needs for n tokens of W (0: none), for this device.
size_t gemm_quant_workspace_floats(const DeviceMatrix& W, int n);
void gemm_quant(const DeviceMatrix& W, const void* X, int n, float* Y, float* workspace, cudaStream_t stream);

}  // namespace fdl::cuda
