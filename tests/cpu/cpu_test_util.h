// Helpers for the CPU kernel tests: random weights in every supported type, a double-precision
// reference matmul, and a guard that selects the kernel set for one test.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul.h"
#include "flashdllm/dtype.h"

namespace fdl::cpu::test {

/// Selects the portable (true) or the best available (false) kernels while in scope.
class KernelSetGuard {
 public:
  explicit KernelSetGuard(bool portable) { force_portable_kernels(portable); }
  ~KernelSetGuard() { force_portable_kernels(false); }
  KernelSetGuard(const KernelSetGuard&) = delete;
  KernelSetGuard& operator=(const KernelSetGuard&) = delete;
};

/// A weight matrix in `type` plus its exact fp32 widening (what the kernels multiply with).
struct TestWeights {
  GgmlType type;
  int64_t rows = 0, cols = 0;
  std::vector<unsigned char> bytes;
  std::vector<float> widened;  // rows x cols
  WeightMatrix view() const { return {type, bytes.data(), rows, cols}; }
};

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

/// Random blocks of a block-quantized type: random bytes, with the fp16 scale fields (d, and
/// m / dmin where the type has one) set to finite values of a weight's magnitude.
inline void random_blocks(GgmlType type, unsigned char* dst, size_t bytes, uint32_t seed) {
  struct Fields {
    GgmlType type;
    int offsets[2];
  };
  static constexpr Fields kHalves[] = {
      {GgmlType::Q4_0, {0, -1}},   {GgmlType::Q4_1, {0, 2}},  {GgmlType::Q5_0, {0, -1}}, {GgmlType::Q5_1, {0, 2}},
      {GgmlType::Q2_K, {80, 82}},  {GgmlType::Q3_K, {108, -1}}, {GgmlType::Q4_K, {0, 2}}, {GgmlType::Q5_K, {0, 2}},
      {GgmlType::Q6_K, {208, -1}},
  };
  std::mt19937 rng(seed);
  for (size_t i = 0; i < bytes; ++i) dst[i] = static_cast<unsigned char>(rng() & 0xff);
  const GgmlTypeTraits tr = *ggml_type_traits(static_cast<uint32_t>(type));
  std::uniform_real_distribution<float> scale(-0.02f, 0.02f);
  for (const auto& f : kHalves)
    if (f.type == type)
      for (size_t b = 0; b < bytes / tr.type_size; ++b)
        for (int off : f.offsets)
          if (off >= 0) {
            const uint16_t h = fp32_to_fp16(scale(rng));
            std::memcpy(dst + b * tr.type_size + static_cast<size_t>(off), &h, 2);
          }
}

inline TestWeights make_weights(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  TestWeights w{type, rows, cols, {}, {}};
  const std::vector<float> src = random_floats(static_cast<size_t>(rows * cols), seed, 0.5f);
  const size_t row_bytes = weight_row_bytes(type, cols);
  w.bytes.resize(row_bytes * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const float* s = src.data() + r * cols;
    unsigned char* d = w.bytes.data() + static_cast<size_t>(r) * row_bytes;
    switch (type) {
      case GgmlType::F32: std::memcpy(d, s, row_bytes); break;
      case GgmlType::F16:
        for (int64_t k = 0; k < cols; ++k) {
          const uint16_t h = fp32_to_fp16(s[k]);
          std::memcpy(d + 2 * k, &h, 2);
        }
        break;
      case GgmlType::BF16:
        for (int64_t k = 0; k < cols; ++k) {
          const uint16_t h = fp32_to_bf16(s[k]);
          std::memcpy(d + 2 * k, &h, 2);
        }
        break;
      case GgmlType::Q8_0:
        quantize_row_q8_0(s, reinterpret_cast<BlockQ8_0*>(d), static_cast<size_t>(cols));
        break;
      default: random_blocks(type, d, row_bytes, seed * 7919u + static_cast<uint32_t>(r)); break;
    }
  }
  w.widened.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row(type, w.bytes.data() + static_cast<size_t>(r) * row_bytes,
                   w.widened.data() + r * cols, static_cast<size_t>(cols));
  return w;
}

/// Y[t][r] in double, and sum_k |w*x| (the scale of the rounding error) per output.
inline void reference_matmul(const TestWeights& w, const std::vector<float>& x, int64_t n_tokens,
                             std::vector<double>& y, std::vector<double>& abs_sum) {
  y.assign(static_cast<size_t>(n_tokens * w.rows), 0.0);
  abs_sum.assign(y.size(), 0.0);
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t r = 0; r < w.rows; ++r) {
      double s = 0, a = 0;
      for (int64_t k = 0; k < w.cols; ++k) {
        const double p = static_cast<double>(w.widened[r * w.cols + k]) * x[t * w.cols + k];
        s += p;
        a += std::fabs(p);
      }
      y[t * w.rows + r] = s;
      abs_sum[t * w.rows + r] = a;
    }
}

inline std::string type_label(GgmlType t) { return ggml_type_name(static_cast<uint32_t>(t)); }

}  // namespace fdl::cpu::test
