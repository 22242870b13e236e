// matmul: accuracy against a double reference and the batch-invariance guarantee, for every
// weight type and for both kernel sets (AVX2 when the CPU has it, and forced portable).
#include "backend/cpu/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/q8k.h"
#include "cpu_test_util.h"

namespace fdl::cpu {
namespace {

using test::KernelSetGuard;
using test::make_weights;
using test::random_floats;

struct Shape {
  int64_t rows, cols;
};

// Odd shapes: rows not a multiple of any tile, cols not a multiple of 8 (Q8_0 needs 32).
// Variant 2 is wide enough that the AVX2 GEMM splits k into chunks and 130 tokens into
// several cache blocks (see matmul_avx2.cpp).
constexpr int kShapeVariants = 3;
Shape odd_shape(GgmlType t, int variant) {
  const uint32_t block = ggml_type_traits(static_cast<uint32_t>(t))->block_size;
  const bool q8 = block == 32;
  if (block == 256) {  // K-quants: whole 256-element blocks; variant 2 is chunked in k, into a
    switch (variant) {   // chunk of 96 steps and one of 64 (rounded up to whole blocks)
      case 0: return Shape{37, 256};
      case 1: return Shape{133, 512};
      default: return Shape{21, 1280};
    }
  }
  switch (variant) {
    case 0: return q8 ? Shape{37, 160} : Shape{37, 203};
    case 1: return q8 ? Shape{133, 544} : Shape{133, 517};
    default: return q8 ? Shape{21, 2080} : Shape{21, 2085};
  }
}

class MatmulTest : public ::testing::TestWithParam<std::tuple<GgmlType, bool>> {
 protected:
  GgmlType type() const { return std::get<0>(GetParam()); }
  bool portable() const { return std::get<1>(GetParam()); }
  // The K-quants on the AVX2 set: integer dot products with 8-bit activations (q8k.h).
  bool integer() const { return !portable() && detail::q8k_weight_type(type()); }
  void SetUp() override {
    if (!portable() && !use_avx2_kernels()) GTEST_SKIP() << "AVX2 kernels unavailable here";
  }
};

std::vector<float> run(ThreadPool& pool, const test::TestWeights& w, const float* x, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n * w.rows), std::numeric_limits<float>::quiet_NaN());
  matmul(pool, w.view(), x, n, y.data());
  return y;
}

bool same_bits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

TEST_P(MatmulTest, MatchesDoubleReference) {
  KernelSetGuard guard(portable());
  ThreadPool pool(2);
  for (int variant = 0; variant < kShapeVariants; ++variant) {
    const Shape s = odd_shape(type(), variant);
    const auto w = make_weights(type(), s.rows, s.cols, 11 + variant);
    for (int64_t n : {1, 5, 64}) {
      const auto x = random_floats(static_cast<size_t>(n * s.cols), 99 + n);
      const auto y = run(pool, w, x.data(), n);
      std::vector<double> ref, abs_sum;
      test::reference_matmul(w, x, n, ref, abs_sum);
      // fp32 accumulation: each lane adds cols/8 products, then 3 tree levels.
      const double steps = static_cast<double>(s.cols) / 8 + 4;
      for (size_t i = 0; i < y.size(); ++i) {
        double bound = steps * std::numeric_limits<float>::epsilon() * abs_sum[i] + 1e-30;
        if (integer()) {  // plus each activation's rounding: half a step of its block's 127 levels
          const int64_t t = static_cast<int64_t>(i) / s.rows, r = static_cast<int64_t>(i) % s.rows;
          double q = 0;
          for (int64_t b = 0; b < s.cols / 256; ++b) {
            double amax = 0, wsum = 0;
            for (int64_t k = 256 * b; k < 256 * (b + 1); ++k) {
              amax = std::max(amax, std::fabs(double(x[t * s.cols + k])));
              wsum += std::fabs(double(w.widened[r * s.cols + k]));
            }
            q += wsum * amax * (0.5 / 127);
          }
          bound += 1.001 * q;
        }
        ASSERT_NEAR(y[i], ref[i], bound) << "output " << i << " n_tokens " << n;
      }
    }
  }
}

TEST_P(MatmulTest, BitIdenticalAcrossBatchSizesThreadsAndNeighbours) {
  KernelSetGuard guard(portable());
  ThreadPool pool1(1), pool2(2), pool3(3);
  for (int variant = 0; variant < kShapeVariants; ++variant) {
    const Shape s = odd_shape(type(), variant);
    const auto w = make_weights(type(), s.rows, s.cols, 21 + variant);
    constexpr int64_t kBig = 130;
    const auto x = random_floats(static_cast<size_t>(kBig * s.cols), 7 + variant);
    const auto y64 = run(pool1, w, x.data(), kBig);
    auto expect_rows = [&](const std::vector<float>& y, int64_t first_token, int64_t n, const char* what) {
      for (int64_t t = 0; t < n; ++t)
        ASSERT_TRUE(same_bits(y.data() + t * s.rows, y64.data() + (first_token + t) * s.rows, s.rows))
            << what << ": token " << t << " rows " << s.rows << " cols " << s.cols;
    };
    // Thread count.
    expect_rows(run(pool2, w, x.data(), kBig), 0, kBig, "2 threads");
    expect_rows(run(pool3, w, x.data(), kBig), 0, kBig, "3 threads");
    // Single tokens (the GEMV path) and a batch of 7 at several offsets.
    for (int64_t t = 0; t < kBig; t += 5) expect_rows(run(pool2, w, x.data() + t * s.cols, 1), t, 1, "n=1");
    for (int64_t t : {0, 3, 57}) expect_rows(run(pool3, w, x.data() + t * s.cols, 7), t, 7, "n=7");
    for (int64_t t : {1, 60}) expect_rows(run(pool2, w, x.data() + t * s.cols, 2), t, 2, "n=2");
    for (int64_t t : {4, 99}) expect_rows(run(pool2, w, x.data() + t * s.cols, 3), t, 3, "n=3");
    for (int64_t t : {0, 66}) expect_rows(run(pool3, w, x.data() + t * s.cols, 64), t, 64, "n=64");
    // The same token among random neighbours, at every position of a batch of 7.
    for (int64_t pos = 0; pos < 7; ++pos) {
      auto mixed = random_floats(static_cast<size_t>(7 * s.cols), 1000 + pos, 3.f);
      std::memcpy(mixed.data() + pos * s.cols, x.data() + 10 * s.cols, s.cols * sizeof(float));
      const auto y = run(pool2, w, mixed.data(), 7);
      ASSERT_TRUE(same_bits(y.data() + pos * s.rows, y64.data() + 10 * s.rows, s.rows)) << "position " << pos;
    }
  }
}

TEST_P(MatmulTest, RowResultsDoNotDependOnTilePosition) {
  // Dropping the first d weight rows shifts every row to a different place in the 4-row
  // tiles (and to the matrix-edge tiles of 1..3 rows); each output must keep its bits.
  KernelSetGuard guard(portable());
  ThreadPool pool(2);
  const Shape s = odd_shape(type(), 1);
  const auto w = make_weights(type(), s.rows, s.cols, 31);
  const size_t row_bytes = weight_row_bytes(type(), s.cols);
  for (int64_t n : {1, 3, 20}) {
    const auto x = random_floats(static_cast<size_t>(n * s.cols), 5 + n);
    const auto full = run(pool, w, x.data(), n);
    for (int64_t d : {1, 2, 3, 5}) {
      const WeightMatrix sub{type(), w.bytes.data() + d * row_bytes, s.rows - d, s.cols};
      std::vector<float> y(static_cast<size_t>(n * sub.rows));
      matmul(pool, sub, x.data(), n, y.data());
      for (int64_t t = 0; t < n; ++t)
        ASSERT_TRUE(same_bits(y.data() + t * sub.rows, full.data() + t * s.rows + d, sub.rows))
            << "n " << n << " dropped " << d << " token " << t;
    }
  }
}

TEST_P(MatmulTest, GivesTheF32BitsOfTheDequantizedRows) {
  // The kernels widen each type to its exact fp32 values (matmul.h): the same matrix written
  // as F32 must give the same bits, on every path (1-4 tokens stream, more pack panels).
  if (integer()) GTEST_SKIP() << "8-bit activations: IntegerKQuantsGiveTheirReferenceSums";
  KernelSetGuard guard(portable());
  ThreadPool pool(2);
  for (int variant = 0; variant < kShapeVariants; ++variant) {
    const Shape s = odd_shape(type(), variant);
    const auto w = make_weights(type(), s.rows, s.cols, 41 + variant);
    test::TestWeights f32{GgmlType::F32, s.rows, s.cols, {}, w.widened};
    f32.bytes.resize(w.widened.size() * sizeof(float));
    std::memcpy(f32.bytes.data(), w.widened.data(), f32.bytes.size());
    for (int64_t n : {1, 2, 4, 5, 20}) {
      const auto x = random_floats(static_cast<size_t>(n * s.cols), 3 + n);
      const auto a = run(pool, w, x.data(), n), b = run(pool, f32, x.data(), n);
      ASSERT_TRUE(same_bits(a.data(), b.data(), n * s.rows)) << "n_tokens " << n << " variant " << variant;
    }
  }
}

TEST_P(MatmulTest, IntegerKQuantsGiveTheirReferenceSums) {
  // The AVX2 integer kernels compute q8k_dot_reference's exact integer sums and float steps:
  // the same bits for every output, on every token count.
  if (!integer()) GTEST_SKIP() << "float kernels: GivesTheF32BitsOfTheDequantizedRows";
  KernelSetGuard guard(false);
  ThreadPool pool(2);
  for (int variant = 0; variant < kShapeVariants; ++variant) {
    const Shape s = odd_shape(type(), variant);
    const auto w = make_weights(type(), s.rows, s.cols, 51 + variant);
    const size_t row_bytes = weight_row_bytes(type(), s.cols);
    for (int64_t n : {1, 3, 20, 45}) {  // 45: groups of 16 (AVX-512VL), 8, 4 and 1
      const auto x = random_floats(static_cast<size_t>(n * s.cols), 13 + n);
      const auto y = run(pool, w, x.data(), n);
      std::vector<detail::BlockQ8K> xq(static_cast<size_t>(n * s.cols / 256));
      detail::quantize_rows_q8k(x.data(), n, s.cols, xq.data());
      for (int64_t t = 0; t < n; ++t)
        for (int64_t r = 0; r < s.rows; ++r) {
          const float want = detail::q8k_dot_reference(type(), w.bytes.data() + r * row_bytes,
                                                       xq.data() + t * (s.cols / 256), s.cols / 256);
          ASSERT_EQ(std::memcmp(&y[t * s.rows + r], &want, sizeof(float)), 0)
              << "token " << t << " row " << r << ": " << y[t * s.rows + r] << " vs " << want;
        }
    }
  }
}

TEST(Matmul, Q8KActivationsAreTheSameBytesOnAvx2) {
  if (!use_avx2_kernels()) GTEST_SKIP() << "AVX2 kernels unavailable here";
  for (const float scale : {1.f, 1e-3f, 1e4f}) {
    auto x = random_floats(4 * 512, 77, scale);
    x[5] = 0.5f * scale, x[300] = -2.5f * scale;  // halfway cases of some scales
    std::fill(x.begin() + 512, x.begin() + 768, 0.f);  // an all-zero block
    x[1000] = std::numeric_limits<float>::quiet_NaN();  // a NaN or an infinity makes its block's scale NaN
    x[1300] = std::numeric_limits<float>::infinity();
    for (int i = 1536; i < 1792; ++i) x[size_t(i)] = i % 2 ? 1e-38f : -1e-39f;  // too small for 127 / amax
    std::vector<detail::BlockQ8K> a(8), b(8);
    detail::quantize_rows_q8k(x.data(), 4, 512, a.data());
    detail::quantize_rows_q8k_avx2(x.data(), 4, 512, b.data());
    ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(detail::BlockQ8K)), 0) << "scale " << scale;
    EXPECT_TRUE(std::isnan(a[3].d));
    EXPECT_TRUE(std::isnan(a[5].d));
    EXPECT_FALSE(std::isnan(a[6].d));  // the tiny block: zeros, not NaN
    for (int i = 0; i < 256; ++i) EXPECT_EQ(a[6].qs[i], 0) << i;
  }
  // NaN and infinite activations reach the outputs as NaN, as with the float kernels.
  ThreadPool pool(1);
  const auto w = make_weights(GgmlType::Q4_K, 3, 512, 5);
  for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    auto x = random_floats(512, 8);
    x[100] = bad;
    for (float y : run(pool, w, x.data(), 1)) EXPECT_TRUE(std::isnan(y)) << bad;
  }
}

// Each build of the K-quants' integer kernels this CPU can run (AVX2's groups of 8, AVX-512VL's
// of 16, AVX-512 VNNI's vpdpwssd), called directly on block-major activations, against
// q8k_dot_reference: the same bits from every build, whatever the dispatch would pick here.
TEST(Matmul, EveryIntegerKernelBuildGivesTheReferenceBits) {
  if (!use_avx2_kernels()) GTEST_SKIP() << "AVX2 kernels unavailable here";
  const CpuFeatures& f = cpu_features();
  std::vector<std::pair<const char*, void (*)(const WeightMatrix&, const detail::BlockQ8K*, int64_t, float*, int64_t,
                                              int64_t)>>
      builds = {{"avx2", detail::q8k_rows_avx2}};
  if (f.avx512f && f.avx512vl) builds.push_back({"avx512", detail::q8k_rows_avx512});
  if (f.avx512f && f.avx512vl && f.avx512bw && f.avx512vnni) builds.push_back({"vnni", detail::q8k_rows_vnni});
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    const int64_t rows = 37, cols = 512, nb = cols / 256;
    const auto w = make_weights(type, rows, cols, 61);
    const size_t row_bytes = weight_row_bytes(type, cols);
    for (int64_t n : {1, 5, 16, 45}) {
      const auto x = random_floats(static_cast<size_t>(n * cols), 17 + static_cast<uint32_t>(n));
      std::vector<detail::BlockQ8K> xq(static_cast<size_t>(n * nb)), block_major(xq.size());
      detail::quantize_rows_q8k(x.data(), n, cols, xq.data());
      detail::to_block_major(xq.data(), n, nb, block_major.data());
      for (const auto& [name, rows_fn] : builds) {
        std::vector<float> y(static_cast<size_t>(n * rows), -1.f);
        rows_fn(w.view(), block_major.data(), n, y.data(), 0, rows);
        for (int64_t t = 0; t < n; ++t)
          for (int64_t r = 0; r < rows; ++r) {
            const float want = detail::q8k_dot_reference(type, w.bytes.data() + r * row_bytes, xq.data() + t * nb, nb);
            ASSERT_EQ(std::memcmp(&y[static_cast<size_t>(t * rows + r)], &want, sizeof(float)), 0)
                << test::type_label(type) << " " << name << " n " << n << " token " << t << " row " << r;
          }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatmulTest,
                         ::testing::Combine(::testing::Values(GgmlType::F32, GgmlType::F16, GgmlType::BF16,
                                                              GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1,
                                                              GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q2_K,
                                                              GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K,
                                                              GgmlType::Q6_K),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return test::type_label(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_portable" : "_avx2");
                         });

TEST(Matmul, RejectsBadArguments) {
  ThreadPool pool(1);
  float x[32] = {}, y[4] = {};
  uint16_t wdata[64] = {};
  EXPECT_THROW(matmul(pool, {GgmlType::IQ2_XXS, wdata, 1, 256}, x, 1, y), std::invalid_argument);
  EXPECT_THROW(matmul(pool, {GgmlType::Q4_K, wdata, 1, 32}, x, 1, y), std::invalid_argument);
  EXPECT_THROW(matmul(pool, {GgmlType::Q8_0, wdata, 1, 31}, x, 1, y), std::invalid_argument);
  EXPECT_THROW(matmul(pool, {GgmlType::F16, wdata, -1, 8}, x, 1, y), std::invalid_argument);
  EXPECT_THROW(matmul(pool, {GgmlType::F16, nullptr, 1, 8}, x, 1, y), std::invalid_argument);
  EXPECT_THROW(matmul(pool, {GgmlType::F16, wdata, 1, 8}, nullptr, 1, y), std::invalid_argument);
  EXPECT_NO_THROW(matmul(pool, {GgmlType::F16, wdata, 1, 8}, x, 0, nullptr));
  // The K-quants' integer path quantizes the activations only after the shapes are checked:
  // a row that is not whole 256-element blocks is refused in matmul_multi too.
  const WeightMatrix q4k{GgmlType::Q4_K, wdata, 1, 288}, q8{GgmlType::Q8_0, wdata, 1, 288};
  const WeightMatrix* const both[] = {&q8, &q4k};
  float y0[64], y1[64];
  float* const ys[] = {y0, y1};
  std::vector<float> wide(288 * 64, 1.f);
  EXPECT_THROW(matmul_multi(pool, both, ys, 2, wide.data(), 64), std::invalid_argument);
}

TEST(Matmul, ZeroColumnsGiveZeros) {
  ThreadPool pool(2);
  float y[6] = {1, 2, 3, 4, 5, 6};
  matmul(pool, {GgmlType::F32, nullptr, 3, 0}, nullptr, 2, y);
  for (float v : y) EXPECT_EQ(v, 0.f);
}

TEST(Matmul, WeightRowBytes) {
  EXPECT_EQ(weight_row_bytes(GgmlType::F32, 10), 40u);
  EXPECT_EQ(weight_row_bytes(GgmlType::BF16, 10), 20u);
  EXPECT_EQ(weight_row_bytes(GgmlType::Q8_0, 64), 68u);
  EXPECT_THROW(weight_row_bytes(GgmlType::Q8_0, 40), std::invalid_argument);
  EXPECT_EQ(weight_row_bytes(GgmlType::Q4_K, 512), 288u);
  EXPECT_EQ(weight_row_bytes(GgmlType::Q6_K, 256), 210u);
  EXPECT_EQ(weight_row_bytes(GgmlType::Q5_0, 64), 44u);
  EXPECT_THROW(weight_row_bytes(GgmlType::Q4_K, 384), std::invalid_argument);
}

}  // namespace
}  // namespace fdl::cpu
