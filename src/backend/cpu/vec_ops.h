// vec_ops.h — small fp32 vector kernels used outside the matmul: embedding lookup
// (row conversion) and attention (dot products, scaled accumulation).
//
// Each function picks the AVX2 or portable implementation at runtime (cpu_features.h).
// Results depend only on the arguments (and the kernel set), never on alignment or on
// other threads: dot_f32 has a fixed reduction order for a given n.
//
// Thread-safety: pure functions of their arguments; safe to call concurrently on
// non-overlapping outputs.
#pragma once

#include <cstdint>

#include "flashdllm/dtype.h"

namespace fdl::cpu {

/// Widens `n` elements of a row of ggml type `type` to fp32: F32: copy; F16/BF16: SIMD
/// conversion (exact); Q8_0: dst = d * q (exact); the other block types: their format's values
/// (dequantize_row; n a whole number of blocks). `src` needs no alignment. Throws
/// std::invalid_argument for unsupported types, n < 0, or n not a whole number of blocks.
void convert_row_to_f32(GgmlType type, const void* src, float* dst, int64_t n);

/// sum_i a[i] * b[i] over n elements (n >= 0; 0 gives 0). fp32 accumulation in several
/// independent lanes, combined in a fixed order.
float dot_f32(const float* a, const float* b, int64_t n);

/// y[i] += a * x[i] for i < n. x and y must not partially overlap.
void axpy_f32(float a, const float* x, float* y, int64_t n);

}  // namespace fdl::cpu
