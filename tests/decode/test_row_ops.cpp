// The vectorized row helpers: exp accuracy and the max/argmax/NaN scan, including row
// lengths that are not a multiple of the lane count.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "decode/row_ops.h"

namespace fdl::detail {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(RowOps, ExpNonPositiveIsAccurate) {
  double worst = 0;
  for (float x = -86.9f; x <= 0.0f; x += 0.00731f) {
    const double want = std::exp(double(x));
    worst = std::max(worst, std::abs(double(exp_nonpositive(x)) - want) / want);
  }
  EXPECT_LT(worst, 3e-7);
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(2.0f), 1.0f);  // clamped
  EXPECT_EQ(exp_nonpositive(-90.0f), 0.0f);
  EXPECT_EQ(exp_nonpositive(-kInf), 0.0f);
}

TEST(RowOps, VectorExpMatchesScalarAndHandlesTinyTemperature) {
  std::vector<float> values;
  for (int i = 0; i < 1003; ++i) values.push_back(-0.137f * float(i));
  values.push_back(-kInf);
  auto shifted = values;
  exp_shifted_in_place(shifted, 1.0f, 2.0f);
  for (size_t i = 0; i < values.size(); ++i) {
    // The argument is rounded to float before the exp, as in the kernel.
    const double want = std::exp(double((values[i] - 1.0f) / 2.0f));
    EXPECT_NEAR(shifted[i], want, 3e-7 * want + 1e-38) << i;
  }
  std::vector<float> row{0.5f, 0.9f, 0.89999f, -kInf, 0.9f, 0.1f, 0.2f, 0.3f, 0.4f};
  exp_shifted_in_place(row, 0.9f, std::numeric_limits<float>::denorm_min());
  const std::vector<float> want{0, 1, 0, 0, 1, 0, 0, 0, 0};
  EXPECT_EQ(row, want);
  // Exact integers: 2^44 per unit of weight, truncated.
  EXPECT_EQ(sum_mass(std::vector<float>{0.5f, 0.25f, 1.f, 2.f, 0.125f}), draw::Mass(3.875 * 0x1p44));
  EXPECT_EQ(sum_mass(std::vector<float>{0x1p-45f, 0x1p-45f, 0x1p-44f}), 1u);
}

TEST(RowOps, VectorExpHasTheScalarsBits) {
  // exp_shifted_in_place's lanes and draw::tempered (what the GPU sampler computes) agree
  // bit for bit: the draw's weights are the same wherever they are computed.
  std::vector<float> row = {0.0f, -1e-30f, -0.5f, -0.693147f, -1.0f, -20.5f, -86.99f, -87.0f, -90.0f, -kInf};
  for (int i = 0; i < 4000; ++i) row.push_back(-0.01f * float(i) * std::sin(float(i)) * std::sin(float(i)));
  for (const float t : {1.0f, 0.7f, 1.3f, 1e-3f}) {
    std::vector<float> got = row;
    exp_shifted_in_place(got, 0.0f, t);
    for (size_t i = 0; i < row.size(); ++i) ASSERT_EQ(got[i], draw::tempered(row[i], 0.0f, t)) << i << " t " << t;
  }
}

TEST(RowOps, ScanFindsLowestArgmaxAtAnyLength) {
  for (size_t n : {1u, 15u, 16u, 17u, 100u, 1001u}) {
    std::vector<float> row(n);
    for (size_t i = 0; i < n; ++i) row[i] = std::sin(float(i));
    const size_t a = n / 2, b = n - 1;
    row[b] = 5.f;
    row[a] = 5.f;  // tie: the lower index must win
    const auto s = scan_row(row);
    EXPECT_EQ(s.argmax, std::min(a, b)) << n;
    EXPECT_EQ(s.max, 5.f);
    EXPECT_FALSE(s.has_nan_or_pos_inf);
  }
}

TEST(RowOps, NextAboveFindsEachHitInOrder) {
  std::vector<float> row(53, 0.f);
  const std::vector<size_t> hits{0, 7, 8, 9, 31, 52};
  for (size_t h : hits) row[h] = 2.f;
  row[20] = 1.f;  // equal to the threshold: not above
  row[21] = -kInf;
  std::vector<size_t> got;
  for (size_t i = next_above(row, 0, 1.f); i < row.size(); i = next_above(row, i + 1, 1.f))
    got.push_back(i);
  EXPECT_EQ(got, hits);
  EXPECT_EQ(next_above(row, 53, 1.f), 53u);
  EXPECT_EQ(next_above(std::vector<float>(5, 0.f), 0, 0.f), 5u);
}

TEST(RowOps, ScanFlagsNanAndPositiveInfinityAnywhere) {
  for (size_t n : {3u, 16u, 37u}) {
    for (size_t at : {size_t(0), n / 2, n - 1}) {
      for (float bad : {std::numeric_limits<float>::quiet_NaN(), kInf}) {
        std::vector<float> row(n, 1.f);
        row[at] = bad;
        EXPECT_TRUE(scan_row(row).has_nan_or_pos_inf) << n << " " << at;
      }
      std::vector<float> masked(n, 1.f);
      masked[at] = -kInf;
      EXPECT_FALSE(scan_row(masked).has_nan_or_pos_inf);
    }
  }
  EXPECT_EQ(scan_row(std::vector<float>(20, -kInf)).max, -kInf);
}

}  // namespace
}  // namespace fdl::detail
