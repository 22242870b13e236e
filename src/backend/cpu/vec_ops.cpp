// vec_ops dispatchers and their portable implementations.
#include "backend/cpu/vec_ops.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernels.h"

namespace fdl::cpu {

void convert_row_to_f32(GgmlType type, const void* src, float* dst, int64_t n) {
  if (n < 0) throw std::invalid_argument("convert_row_to_f32: negative length");
  if (n == 0) return;
  const bool simd = use_avx2_kernels();
  switch (type) {
    case GgmlType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case GgmlType::F16: {
      const auto* s = static_cast<const uint16_t*>(src);
      if (simd) return detail::f16_to_f32_avx2(s, dst, n);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_fp32(s[i]);
      return;
    }
    case GgmlType::BF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      if (simd) return detail::bf16_to_f32_avx2(s, dst, n);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_fp32(s[i]);
      return;
    }
    case GgmlType::Q8_0: {
      if (n % 32 != 0)
        throw std::invalid_argument("convert_row_to_f32: Q8_0 length " + std::to_string(n) +
                                    " is not a multiple of 32");
      const auto* b = static_cast<const BlockQ8_0*>(src);
      if (simd) return detail::q8_0_to_f32_avx2(b, dst, n / 32);
      for (int64_t i = 0; i < n / 32; ++i) {
        const float d = fp16_to_fp32(b[i].d);
        for (int j = 0; j < 32; ++j) dst[i * 32 + j] = d * static_cast<float>(b[i].qs[j]);
      }
      return;
    }
    default:  // the other block types (src/core/quant_blocks.cpp); throws for unsupported ones
      return dequantize_row(type, src, dst, static_cast<size_t>(n));
  }
}

float dot_f32(const float* a, const float* b, int64_t n) {
  return use_avx2_kernels() ? detail::dot_f32_avx2(a, b, n) : detail::dot_f32_portable(a, b, n);
}

void axpy_f32(float a, const float* x, float* y, int64_t n) {
  if (use_avx2_kernels()) return detail::axpy_f32_avx2(a, x, y, n);
  detail::axpy_f32_portable(a, x, y, n);
}

namespace detail {

float dot_f32_portable(const float* a, const float* b, int64_t n) {
  // Eight independent partial sums let the compiler vectorize and hide add latency.
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  for (int l = 0; i < n; ++i, ++l) acc[l] += a[i] * b[i];
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

void axpy_f32_portable(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

}  // namespace detail
}  // namespace fdl::cpu
