// Vectorized whole-row passes (see row_ops.h).
#include "decode/row_ops.h"

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>

namespace fdl::detail {
namespace {

// 16-byte vectors: every x86-64 build has them natively (SSE2). Wider ones would be split
// into scalar code by GCC 12 when AVX is not enabled, which is the default build.
using V4f = float __attribute__((vector_size(16)));
using V4i = int32_t __attribute__((vector_size(16)));
constexpr size_t kLanes = 4;
constexpr float kInf = std::numeric_limits<float>::infinity();

using draw::kLn2Hi;
using draw::kLn2Lo;
using draw::kLog2e;
using draw::kMinArg;

// draw::exp_reduced's operations on four lanes (the same roundings: this file compiles with
// -ffp-contract=off, and x86-64's baseline has no fused multiply-add anyway).
inline V4f exp_reduced(const V4f& x, const V4i& n) {
  const V4f nf = __builtin_convertvector(n, V4f);
  const V4f r = (x - nf * kLn2Hi) - nf * kLn2Lo;
  V4f p = r * (1.0f / 5040.0f) + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const V4i bits = (n + 127) << 23;
  V4f scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

}  // namespace

float exp_nonpositive(float x) { return draw::exp_nonpositive(x); }

void exp_shifted_in_place(std::span<float> values, float top, float temperature) {
  const size_t count = values.size();
  size_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    V4f x;
    std::memcpy(&x, values.data() + i, sizeof x);
    // Divide rather than multiply by 1/t: for a denormal t, 1/t is Inf and 0 * Inf is NaN,
    // while 0 / t is 0.
    x = (x - top) / temperature;
    x = x > 0.0f ? 0.0f : x;
    const auto underflow = !(x > kMinArg);  // also catches -Inf
    x = underflow ? kMinArg : x;
    // Truncation of (x * log2e - 0.5) rounds to nearest for x <= 0.
    const V4i n = __builtin_convertvector(x * kLog2e - 0.5f, V4i);
    V4f y = exp_reduced(x, n);
    y = underflow ? 0.0f : y;
    std::memcpy(values.data() + i, &y, sizeof y);
  }
  for (; i < count; ++i) values[i] = draw::tempered(values[i], top, temperature);
}

draw::Mass sum_mass(std::span<const float> weights) {
  // Integers: any order gives the same sum; four chains hide the latency.
  draw::Mass partial[4] = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 4 <= weights.size(); i += 4)
    for (size_t j = 0; j < 4; ++j) partial[j] += draw::to_mass(weights[i + j]);
  for (; i < weights.size(); ++i) partial[0] += draw::to_mass(weights[i]);
  return partial[0] + partial[1] + partial[2] + partial[3];
}

size_t next_above(std::span<const float> row, size_t from, float threshold) {
  const size_t n = row.size();
  size_t i = from;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    V4f a, b;
    std::memcpy(&a, row.data() + i, sizeof a);
    std::memcpy(&b, row.data() + i + kLanes, sizeof b);
    const V4i hit = (a > threshold) | (b > threshold);
    if ((hit[0] | hit[1] | hit[2] | hit[3]) != 0) break;  // the exact index is found below
  }
  for (; i < n; ++i)
    if (row[i] > threshold) return i;
  return n;
}

RowScan scan_row(std::span<const float> row) {
  const size_t n = row.size();
  // Two independent accumulators per quantity so consecutive iterations do not wait on
  // each other's max.
  V4f max_a = {-kInf, -kInf, -kInf, -kInf};
  V4f max_b = max_a;
  V4i bad_lanes = {};
  size_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    V4f a, b;
    std::memcpy(&a, row.data() + i, sizeof a);
    std::memcpy(&b, row.data() + i + kLanes, sizeof b);
    max_a = a > max_a ? a : max_a;  // NaN never wins
    max_b = b > max_b ? b : max_b;
    bad_lanes |= (!(a < kInf)) | (!(b < kInf));  // NaN or +Inf
  }
  RowScan out;
  out.max = -kInf;
  bool bad = false;
  for (size_t j = 0; j < kLanes; ++j) {
    out.max = max_a[j] > out.max ? max_a[j] : out.max;
    out.max = max_b[j] > out.max ? max_b[j] : out.max;
    bad = bad || bad_lanes[j] != 0;
  }
  for (; i < n; ++i) {
    const float v = row[i];
    out.max = v > out.max ? v : out.max;
    bad = bad || !(v < kInf);
  }
  out.has_nan_or_pos_inf = bad;
  // Second pass: the first index holding the maximum (lowest id wins ties).
  for (size_t k = 0; k < n; ++k)
    if (row[k] == out.max) {
      out.argmax = k;
      break;
    }
  return out;
}

}  // namespace fdl::detail
