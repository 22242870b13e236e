// kernels.h — internal: the per-ISA kernel entry points behind matmul.h and vec_ops.h.
// Each *_portable / *_avx2 pair computes the same function; the dispatchers in matmul.cpp
// and vec_ops.cpp choose one with use_avx2_kernels(). The *_avx2 functions must only be
// called when use_avx2_kernels() is true.
#pragma once

#include <cstdint>

#include "backend/cpu/matmul.h"

namespace fdl::cpu::detail {

using MatmulRowsFn = void (*)(const WeightMatrix& W, const float* X, int64_t n_tokens, float* Y,
                              int64_t row_begin, int64_t row_end);

/// Computes Y[t*W.rows + r] for every t < n_tokens and r in [row_begin, row_end), with the
/// per-output reduction order documented in matmul.h. Arguments are already validated.
void matmul_rows_portable(const WeightMatrix& W, const float* X, int64_t n_tokens, float* Y,
                          int64_t row_begin, int64_t row_end);
void matmul_rows_avx2(const WeightMatrix& W, const float* X, int64_t n_tokens, float* Y,
                      int64_t row_begin, int64_t row_end);
/// The AVX2 kernels with AVX-512VL's 32 registers (wider token tiles), bit-identical to
/// matmul_rows_avx2; only call when use_avx512_tiles() is true.
void matmul_rows_avx512(const WeightMatrix& W, const float* X, int64_t n_tokens, float* Y,
                        int64_t row_begin, int64_t row_end);

/// Row conversion for F16 and BF16 (the other types are handled by the dispatcher).
void f16_to_f32_avx2(const uint16_t* src, float* dst, int64_t n);
void bf16_to_f32_avx2(const uint16_t* src, float* dst, int64_t n);
void q8_0_to_f32_avx2(const BlockQ8_0* src, float* dst, int64_t n_blocks);

/// block_dequantizer(t) built for AVX2 (the same values, vectorized); nullptr where that is.
DequantizeBlockFn block_dequantizer_avx2(GgmlType t);

/// out[i] = silu(gate[i]) * up[i] with a vectorized exp (ops.h's silu_mul on AVX2).
void silu_mul_avx2(const float* gate, const float* up, float* out, int64_t n);

float dot_f32_portable(const float* a, const float* b, int64_t n);
float dot_f32_avx2(const float* a, const float* b, int64_t n);
void axpy_f32_portable(float a, const float* x, float* y, int64_t n);
void axpy_f32_avx2(float a, const float* x, float* y, int64_t n);

}  // namespace fdl::cpu::detail
