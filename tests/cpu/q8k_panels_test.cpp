// Block-quantized matrices in panels of 16 rows (q8k_panels.h): the in-place rearrangement,
// the reference arithmetic, and the AVX-512 VNNI kernels held to it bit for bit.
#include "backend/cpu/q8k_panels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/q8k.h"
#include "backend/cpu/thread_pool.h"
#include "cpu_test_util.h"

namespace fdl::cpu {
namespace {

using test::make_weights;
using test::random_floats;

constexpr GgmlType kTypes[] = {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

struct Activations {
  std::vector<detail::BlockQ8K> rows;   // token after token
  std::vector<detail::Q8Panel> panels;  // block-major
};
Activations quantized(const std::vector<float>& x, int64_t n, int64_t cols) {
  const int64_t nb = cols / 256;
  Activations a{std::vector<detail::BlockQ8K>(size_t(n * nb)), std::vector<detail::Q8Panel>(size_t(n * nb))};
  detail::quantize_rows_q8k(x.data(), n, cols, a.rows.data());
  detail::to_panel_activations(a.rows.data(), n, nb, a.panels.data());
  return a;
}

// Row r's panel reference output for token t of `a`.
float reference(GgmlType type, const std::vector<unsigned char>& panels, int64_t cols, int64_t r, const Activations& a,
                int64_t t) {
  const int64_t nb = cols / 256;
  const size_t panel_bytes = weight_row_bytes(type, cols) * 16;
  return detail::q8k_panel_dot_reference(type, panels.data() + size_t(r / 16) * panel_bytes, nb, int(r % 16),
                                         a.rows.data() + t * nb);
}

TEST(KQuantPanels, RearrangingInPlaceIsReversibleAndKeepsTheSize) {
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0}) {
    const auto w = make_weights(type, 48, 768, 5);
    std::vector<unsigned char> bytes = w.bytes;
    detail::to_panels(type, bytes.data(), 48, 768);
    EXPECT_NE(bytes, w.bytes) << test::type_label(type);
    // A panel is self-contained: rearranging rows [16, 48) alone gives the same bytes there.
    std::vector<unsigned char> part = w.bytes;
    const size_t panel = weight_row_bytes(type, 768) * 16;
    detail::to_panels(type, part.data() + panel, 32, 768);
    EXPECT_TRUE(std::equal(part.begin() + long(panel), part.end(), bytes.begin() + long(panel))) << test::type_label(type);
    detail::from_panels(type, bytes.data(), 48, 768);
    EXPECT_EQ(bytes, w.bytes) << test::type_label(type);
  }
}

TEST(KQuantPanels, RefusesMatricesWithoutPanels) {
  std::vector<unsigned char> bytes(weight_row_bytes(GgmlType::Q4_K, 256) * 40);
  EXPECT_THROW(detail::to_panels(GgmlType::Q4_K, bytes.data(), 40, 256), std::invalid_argument);  // 40 rows
  EXPECT_THROW(detail::to_panels(GgmlType::Q4_0, bytes.data(), 16, 256), std::invalid_argument);
  EXPECT_FALSE(detail::panels_fit(WeightMatrix{GgmlType::Q8_0, bytes.data(), 16, 96}));  // 96 columns: no 256
  EXPECT_FALSE(detail::panels_fit(WeightMatrix{GgmlType::Q4_K, bytes.data(), 16, 256, true}));  // already in panels
  EXPECT_TRUE(detail::panels_fit(WeightMatrix{GgmlType::Q6_K, bytes.data(), 16, 256}));
}

// The panel reference reads the layout it was written in: against the row arithmetic
// (q8k_dot_reference: the same exact integers, other float steps) and against the
// dequantized weights in double precision (catches an overflowing int32 sum).
TEST(KQuantPanels, ReferenceAgreesWithTheRowsAndTheDequantizedWeights) {
  for (GgmlType type : kTypes) {
    const int64_t rows = 32, cols = 1024, nb = cols / 256;
    auto w = make_weights(type, rows, cols, 11);
    // Row 0 at the extremes: every level, scale and minimum at its largest.
    const size_t row_bytes = weight_row_bytes(type, cols);
    for (int64_t b = 0; b < nb; ++b) {
      unsigned char* blk = w.bytes.data() + b * (row_bytes / size_t(nb));
      const size_t keep = type == GgmlType::Q6_K ? 208 : 0;  // Q6_K's d is last; Q4_K/Q5_K's first
      std::memset(blk + (keep ? 0 : 4), 0xff, keep ? 192 : (row_bytes / size_t(nb)) - 4);
      if (type == GgmlType::Q6_K) std::memset(blk + 192, 0x7f, 16);  // int8 scales: +127
    }
    std::vector<float> x = random_floats(size_t(2 * cols), 3);
    for (int64_t k = 0; k < cols; ++k) x[size_t(k)] = 1.f;  // token 0: every activation +127
    const Activations a = quantized(x, 2, cols);
    std::vector<unsigned char> panels = w.bytes;
    detail::to_panels(type, panels.data(), rows, cols);
    std::vector<float> deq(static_cast<size_t>(cols));
    for (int64_t t = 0; t < 2; ++t)
      for (int64_t r = 0; r < rows; ++r) {
        const float got = reference(type, panels, cols, r, a, t);
        const float rows_way = detail::q8k_dot_reference(type, w.bytes.data() + r * row_bytes, a.rows.data() + t * nb, nb);
        dequantize_row(type, w.bytes.data() + r * row_bytes, deq.data(), size_t(cols));
        double exact = 0, magnitude = 0;
        for (int64_t b = 0; b < nb; ++b)
          for (int k = 0; k < 256; ++k) {
            const double term = double(deq[size_t(256 * b + k)]) * a.rows[size_t(t * nb + b)].qs[k] * a.rows[size_t(t * nb + b)].d;
            exact += term, magnitude += std::fabs(term);
          }
        EXPECT_NEAR(got, rows_way, 1e-5 * magnitude + 1e-6) << test::type_label(type) << " token " << t << " row " << r;
        EXPECT_NEAR(got, exact, 1e-4 * magnitude + 1e-6) << test::type_label(type) << " token " << t << " row " << r;
      }
  }
}

TEST(KQuantPanels, VnniKernelsGiveTheReferenceBitsForEveryTokenCount) {
  if (!use_avx512_vnni()) GTEST_SKIP() << "AVX-512 BW/VNNI kernels unavailable here";
  for (GgmlType type : kTypes) {
    const int64_t rows = 48, cols = 768;
    const auto w = make_weights(type, rows, cols, 29);
    std::vector<unsigned char> panels = w.bytes;
    detail::to_panels(type, panels.data(), rows, cols);
    const WeightMatrix W{type, panels.data(), rows, cols, true};
    for (int64_t n : {1, 2, 3, 5, 8, 13, 16, 45}) {
      const Activations a = quantized(random_floats(size_t(n * cols), 41 + uint32_t(n)), n, cols);
      std::vector<float> y(size_t(n * rows), -1.f);
      detail::q8k_panels_vnni(W, a.panels.data(), n, y.data(), 0, 16);
      detail::q8k_panels_vnni(W, a.panels.data(), n, y.data(), 16, rows);
      for (int64_t t = 0; t < n; ++t)
        for (int64_t r = 0; r < rows; ++r) {
          const float want = reference(type, panels, cols, r, a, t);
          ASSERT_EQ(std::memcmp(&y[size_t(t * rows + r)], &want, sizeof(float)), 0)
              << test::type_label(type) << " n " << n << " token " << t << " row " << r << ": " << y[size_t(t * rows + r)]
              << " vs " << want;
        }
    }
    const Activations a = quantized(random_floats(size_t(cols), 1), 1, cols);
    std::vector<float> y(static_cast<size_t>(rows));
    EXPECT_THROW(detail::q8k_panels_vnni(W, a.panels.data(), 1, y.data(), 8, rows), std::invalid_argument);
  }
}

// Through matmul (which must notice `panels`, quantize the activations for them and pass them
// on): each token's outputs are the panel reference's bits, alone or in any batch, on any
// number of threads.
TEST(KQuantPanels, MatmulOfPanelsGivesTheReferenceBitsInAnyBatch) {
  if (!use_avx512_vnni()) GTEST_SKIP() << "AVX-512 BW/VNNI kernels unavailable here";
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0}) {
    const int64_t rows = 256, cols = 512, n = 37, nb = cols / 256;
    const auto w = make_weights(type, rows, cols, 7);
    std::vector<unsigned char> panels = w.bytes;
    detail::to_panels(type, panels.data(), rows, cols);
    const WeightMatrix W{type, panels.data(), rows, cols, true};
    const std::vector<float> x = random_floats(size_t(n * cols), 9);
    ThreadPool one(1), two(2);
    std::vector<float> all(static_cast<size_t>(n * rows)), single(static_cast<size_t>(rows));
    matmul(two, W, x.data(), n, all.data());
    const Activations a = quantized(x, n, cols);
    std::vector<detail::Q16Panel> a16(static_cast<size_t>(n * nb));
    detail::quantize_rows_q16(x.data(), n, cols, a16.data());
    const size_t panel_bytes = weight_row_bytes(type, cols) * 16;
    for (int64_t t : {int64_t(0), int64_t(17), n - 1}) {
      matmul(one, W, x.data() + t * cols, 1, single.data());
      ASSERT_EQ(std::memcmp(single.data(), all.data() + t * rows, sizeof(float) * size_t(rows)), 0)
          << test::type_label(type) << " token " << t;
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* panel = panels.data() + size_t(r / 16) * panel_bytes;
        const float want = type == GgmlType::Q8_0
                               ? detail::q80_panel_dot_reference(panel, nb, int(r % 16), a16.data() + t, n)
                               : reference(type, panels, cols, r, a, t);
        ASSERT_EQ(std::memcmp(&all[size_t(t * rows + r)], &want, sizeof(float)), 0)
            << test::type_label(type) << " token " << t << " row " << r;
      }
    }
  }
}

// A matrix marked as panels that cannot be (a shape without panels) is refused, not run.
TEST(KQuantPanels, MatmulRefusesAMatrixMarkedAsPanelsWithoutTheirShape) {
  std::vector<unsigned char> bytes(weight_row_bytes(GgmlType::Q4_K, 256) * 24);
  std::vector<float> x(256), y(24);
  ThreadPool pool(1);
  EXPECT_THROW(matmul(pool, WeightMatrix{GgmlType::Q4_K, bytes.data(), 24, 256, true}, x.data(), 1, y.data()),
               std::invalid_argument);
}

// Q8_0 in panels: 16-bit activations (the vectorized rounding gives the portable bytes), the
// reference against the dequantized weights, and the kernel bit for bit.
TEST(Q80Panels, KernelGivesTheReferenceBitsCloseToTheExactSums) {
  const int64_t rows = 48, cols = 768, nb = cols / 256;
  const auto w = make_weights(GgmlType::Q8_0, rows, cols, 3);
  std::vector<unsigned char> panels = w.bytes;
  detail::to_panels(GgmlType::Q8_0, panels.data(), rows, cols);
  const size_t panel_bytes = weight_row_bytes(GgmlType::Q8_0, cols) * 16, row_bytes = weight_row_bytes(GgmlType::Q8_0, cols);
  std::vector<float> deq(static_cast<size_t>(cols));
  for (int64_t n : {1, 2, 3, 8, 13, 45}) {
    std::vector<float> x = random_floats(size_t(n * cols), 5 + uint32_t(n));
    if (n == 3) x[7] = std::nanf("");  // token 0, block 0: NaN outputs for that token only
    std::vector<detail::Q16Panel> a(size_t(n * nb)), b(a.size());
    detail::quantize_rows_q16(x.data(), n, cols, a.data());
    if (use_avx512_vnni()) {
      detail::quantize_rows_q16_vnni(x.data(), n, cols, b.data());
      for (size_t i = 0; i < a.size(); ++i)
        ASSERT_TRUE(std::memcmp(a[i].qs, b[i].qs, sizeof a[i].qs) == 0 &&
                    (std::memcmp(&a[i].d, &b[i].d, 4) == 0 || (std::isnan(a[i].d) && std::isnan(b[i].d))))
            << "block " << i;
    }
    std::vector<float> y(static_cast<size_t>(n * rows), -1.f);
    if (use_avx512_vnni()) {
      const WeightMatrix W{GgmlType::Q8_0, panels.data(), rows, cols, true};
      detail::q80_panels_vnni(W, a.data(), n, y.data(), 0, rows);
    }
    for (int64_t t = 0; t < n; ++t)
      for (int64_t r = 0; r < rows; ++r) {
        const float want = detail::q80_panel_dot_reference(panels.data() + size_t(r / 16) * panel_bytes, nb, int(r % 16),
                                                           a.data() + t, n);
        if (n == 3 && t == 0) {
          EXPECT_TRUE(std::isnan(want));
          continue;
        }
        dequantize_row(GgmlType::Q8_0, w.bytes.data() + r * row_bytes, deq.data(), size_t(cols));
        double exact = 0, magnitude = 0;
        for (int64_t k = 0; k < cols; ++k)
          exact += double(deq[size_t(k)]) * x[size_t(t * cols + k)], magnitude += std::fabs(double(deq[size_t(k)]) * x[size_t(t * cols + k)]);
        EXPECT_NEAR(want, exact, 1e-4 * magnitude) << "n " << n << " token " << t << " row " << r;
        if (use_avx512_vnni()) {
          ASSERT_EQ(std::memcmp(&y[size_t(t * rows + r)], &want, sizeof(float)), 0) << "n " << n << " token " << t << " row " << r;
        }
      }
  }
}

}  // namespace
}  // namespace fdl::cpu
