// ffn_act.cuh — the gated FFN activations, one definition for every kernel that applies them
// (silu_mul, the fused single-token GEMV epilogue, the batch-1 FFN block). Device code only.
#pragma once

#include <cuda_runtime.h>

namespace fdl::cuda {

/// SwiGLU: silu(g) * u = g / (1 + e^-g) * u (IEEE division, as the CPU's portable kernel).
__device__ __forceinline__ float silu_times(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

/// GeGLU with PyTorch's approximate="tanh" GELU (Gemma's gelu_pytorch_tanh):
/// 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * u, in the CPU's operation order.
__device__ __forceinline__ float gelu_tanh_times(float g, float u) {
  const float inner = __fmul_rn(0.7978845608028654f, __fadd_rn(g, __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, g), g), g)));
  return __fmul_rn(__fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, tanhf(inner))), u);
}

__device__ __forceinline__ float ffn_act(float g, float u, bool gelu) {
  return gelu ? gelu_tanh_times(g, u) : silu_times(g, u);
}

}  // namespace fdl::cuda
