// The AVX-512VL tiles of the matmul (matmul_avx512.cpp: token groups of up to 6 in 32
// registers; dispatched for batches of 4+ tokens) against the AVX2 tiles (groups of up to
// 3): every output must be bit-identical,
// for every weight type, batch size 1..20 and the prefill sizes, odd shapes and 1..3
// threads. That is what lets the dispatcher pick the wider tiles on capable CPUs without
// changing any result (and keeps one kernel family for every batch size). Skipped where the
// CPU lacks AVX2 or AVX-512F/VL, or FLASHDLLM_NO_AVX512 is set.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <limits>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/matmul.h"
#include "cpu_test_util.h"

namespace fdl::cpu {
namespace {

using test::make_weights;
using test::random_floats;

/// Selects the AVX2 tiles (true) or the best available (false) while in scope.
class TilesGuard {
 public:
  explicit TilesGuard(bool avx2) { force_avx2_tiles(avx2); }
  ~TilesGuard() { force_avx2_tiles(false); }
  TilesGuard(const TilesGuard&) = delete;
  TilesGuard& operator=(const TilesGuard&) = delete;
};

class MatmulAvx512Test : public ::testing::TestWithParam<GgmlType> {
 protected:
  void SetUp() override {
    if (!use_avx2_kernels()) GTEST_SKIP() << "AVX2 kernels unavailable here (CPU or FLASHDLLM_NO_AVX2)";
    if (!use_avx512_tiles())
      GTEST_SKIP() << "AVX-512VL tiles unavailable here (CPU without AVX-512F/VL, or FLASHDLLM_NO_AVX512)";
  }
};

std::vector<float> run(ThreadPool& pool, const test::TestWeights& w, const float* x, int64_t n, bool avx2_tiles) {
  TilesGuard guard(avx2_tiles);
  std::vector<float> y(static_cast<size_t>(n * w.rows), std::numeric_limits<float>::quiet_NaN());
  matmul(pool, w.view(), x, n, y.data());
  return y;
}

TEST_P(MatmulAvx512Test, BitIdenticalToTheAvx2Tiles) {
  const GgmlType type = GetParam();
  const bool q8 = type == GgmlType::Q8_0;
  ThreadPool pool1(1), pool2(2), pool3(3);
  ThreadPool* pools[] = {&pool1, &pool2, &pool3};
  // Rows not a multiple of 4; widths with and without a partial step of 8 (Q8_0: of 32);
  // 384 = codelm-16m's width.
  const int64_t shapes[][2] = {{37, q8 ? 160 : 203}, {133, 384}, {21, q8 ? 2080 : 2085}};
  for (const auto& shape : shapes) {
    const auto w = make_weights(type, shape[0], shape[1], 41 + uint32_t(shape[0]));
    const auto x = random_floats(static_cast<size_t>(130 * shape[1]), 17 + uint32_t(shape[1]));
    std::vector<int64_t> sizes;
    for (int64_t n = 1; n <= 20; ++n) sizes.push_back(n);
    sizes.push_back(64);
    sizes.push_back(130);
    for (int64_t n : sizes) {
      ThreadPool& pool = *pools[n % 3];
      const auto wide = run(pool, w, x.data(), n, false);
      const auto narrow = run(pool, w, x.data(), n, true);
      ASSERT_EQ(std::memcmp(wide.data(), narrow.data(), wide.size() * sizeof(float)), 0)
          << test::type_label(type) << " " << shape[0] << "x" << shape[1] << " n_tokens " << n
          << " threads " << pool.size();
    }
  }
}

// The kernels themselves, below the dispatcher (which sends batches under 4 tokens to the
// AVX2 build): the AVX-512VL build must match for every batch size, in case that changes.
TEST_P(MatmulAvx512Test, KernelsBitIdenticalForEveryBatchSize) {
  const GgmlType type = GetParam();
  const int64_t rows = 43, cols = type == GgmlType::Q8_0 ? 416 : 389;
  const auto w = make_weights(type, rows, cols, 77);
  const auto x = random_floats(static_cast<size_t>(20 * cols), 78);
  for (int64_t n = 1; n <= 20; ++n) {
    std::vector<float> wide(static_cast<size_t>(n * rows)), narrow(wide.size());
    detail::matmul_rows_avx512(w.view(), x.data(), n, wide.data(), 0, rows);
    detail::matmul_rows_avx2(w.view(), x.data(), n, narrow.data(), 0, rows);
    ASSERT_EQ(std::memcmp(wide.data(), narrow.data(), wide.size() * sizeof(float)), 0)
        << test::type_label(type) << " n_tokens " << n;
  }
}

TEST(MatmulAvx512Dispatch, ForcingTheAvx2TilesIsReversible) {
  if (!use_avx512_tiles()) GTEST_SKIP() << "AVX-512VL tiles unavailable here";
  force_avx2_tiles(true);
  EXPECT_FALSE(use_avx512_tiles());
  EXPECT_TRUE(use_avx2_kernels());
  force_avx2_tiles(false);
  EXPECT_TRUE(use_avx512_tiles());
  force_portable_kernels(true);  // the tiles belong to the AVX2 set
  EXPECT_FALSE(use_avx512_tiles());
  force_portable_kernels(false);
}

TEST(MatmulAvx512Dispatch, FollowsTheHardwareAndTheEnvironment) {
  const CpuFeatures& f = cpu_features();
  const char* env = std::getenv("FLASHDLLM_NO_AVX512");
  const bool env_off = env != nullptr && *env != '\0' && std::string(env) != "0";
  EXPECT_EQ(use_avx512_tiles(), use_avx2_kernels() && f.avx512f && f.avx512vl && !env_off);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, MatmulAvx512Test,
                         ::testing::Values(GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0),
                         [](const auto& info) { return test::type_label(info.param); });

}  // namespace
}  // namespace fdl::cpu
