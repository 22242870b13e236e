// Portable matmul kernel: plain C++ with the 8-lane reduction order of matmul.h, so it is
// batch invariant like the SIMD kernels. Used on CPUs without AVX2/FMA/F16C and in tests.
#include <vector>

#include "backend/cpu/kernels.h"

namespace fdl::cpu::detail {
namespace {

constexpr int kLanes = 8;

// The canonical per-output reduction (matmul.h) with separate multiply and add. `w` is the
// exactly-widened weight row; the last partial group of 8 is zero-padded.
float dot_in_lanes(const float* w, const float* x, int64_t n) {
  float acc[kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] = acc[l] + w[k + l] * x[k + l];
  if (k < n) {
    for (int l = 0; l < kLanes; ++l) {
      const bool in = k + l < n;
      const float wv = in ? w[k + l] : 0.f;
      const float xv = in ? x[k + l] : 0.f;
      acc[l] = acc[l] + wv * xv;
    }
  }
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

}  // namespace

void matmul_rows_portable(const WeightMatrix& W, const float* X, int64_t n_tokens, float* Y,
                          int64_t row_begin, int64_t row_end) {
  // One widened weight row per thread, reused across calls (grows to the widest matrix).
  thread_local std::vector<float> wrow;
  if (wrow.size() < static_cast<size_t>(W.cols)) wrow.resize(static_cast<size_t>(W.cols));
  const size_t row_bytes = weight_row_bytes(W.type, W.cols);
  const auto* base = static_cast<const unsigned char*>(W.data);
  for (int64_t r = row_begin; r < row_end; ++r) {
    convert_row_to_f32(W.type, base + static_cast<size_t>(r) * row_bytes, wrow.data(), W.cols);
    for (int64_t t = 0; t < n_tokens; ++t)
      Y[t * W.rows + r] = dot_in_lanes(wrow.data(), X + t * W.cols, W.cols);
  }
}

}  // namespace fdl::cpu::detail
