// Internal: whole-vocabulary passes of the sampler. They run on every generated token over
// up to ~150k logits, so they are written with GCC/Clang vector extensions (4 floats per
// operation, SSE2 on x86-64, NEON on ARM): GCC does not auto-vectorize a float max
// reduction or a polynomial exp written as scalar code.
#pragma once

#include <cstddef>
#include <span>

#include "decode/draw_arithmetic.h"

namespace fdl::detail {

struct RowScan {
  size_t argmax = 0;        ///< lowest index holding the maximum
  float max = 0.0f;         ///< -Inf if every entry is -Inf (or the row is empty)
  bool has_nan_or_pos_inf = false;
};

/// Maximum, its lowest index, and whether any entry is NaN or +Inf.
RowScan scan_row(std::span<const float> row);

/// The first index >= `from` whose value is > `threshold`, or row.size() if none. Checks
/// 8 values per step: made for scans where almost nothing passes (top-k selection).
size_t next_above(std::span<const float> row, size_t from, float threshold);

/// values[i] = draw::tempered(values[i], top, temperature) in place (the same bits), for
/// values <= top and temperature > 0 (denormal included). Relative error ~2e-7; 0 where the
/// exponent is at or below -87.
void exp_shifted_in_place(std::span<float> values, float top, float temperature);

/// The sum of draw::to_mass over `weights` (exact).
draw::Mass sum_mass(std::span<const float> weights);

/// draw::exp_nonpositive: exp(x) for x <= 0 (larger x is clamped to 0), the same bits as
/// exp_shifted_in_place; 0 at or below -87.
float exp_nonpositive(float x);

}  // namespace fdl::detail
