// When kernels split across the pool (parallel_policy.h), and the kernels that go with it:
// matmul_multi (several matrices, optionally SwiGLU, in one parallel region) must give the
// bits of separate matmul + silu_mul calls whatever the pool, and silu_mul's SIMD build must
// be element-wise (no element depends on n or on its index) and close to std::exp.
#include "backend/cpu/parallel_policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/ops.h"
#include "cpu_test_util.h"

namespace fdl::cpu {
namespace {

using test::KernelSetGuard;
using test::make_weights;
using test::random_floats;

WeightMatrix shape(GgmlType type, int64_t rows, int64_t cols) { return {type, nullptr, rows, cols}; }

TEST(ParallelPolicy, OneThreadNeverSplits) {
  ThreadPool one(1);
  EXPECT_FALSE(worth_splitting(one, 1e12));
}

TEST(ParallelPolicy, SplitsByWorkNotTokenCount) {
  // The 2-thread pathology: stories260K's 172x64 FFN matmuls were split from 6 tokens on
  // (a multiply-add count threshold), ~2-3 µs of work each, and every split cost ~8 µs in
  // the forward (activations moving between the cores). They must stay on one thread at any
  // verification size, while codelm-16m's matrices split even for a single token.
  ThreadPool two(2);
  for (int n = 1; n <= 9; ++n) {
    EXPECT_FALSE(worth_splitting(two, matmul_cost_ns(shape(GgmlType::F32, 172, 64), n))) << n << " tokens";
    EXPECT_FALSE(worth_splitting(two, matmul_cost_ns(shape(GgmlType::F32, 64, 172), n))) << n << " tokens";
    EXPECT_FALSE(worth_splitting(two, matmul_cost_ns(shape(GgmlType::F32, 64, 64), n))) << n << " tokens";
    EXPECT_TRUE(worth_splitting(two, matmul_cost_ns(shape(GgmlType::F16, 384, 384), n))) << n << " tokens";
    EXPECT_TRUE(worth_splitting(two, matmul_cost_ns(shape(GgmlType::F16, 8192, 384), n))) << n << " tokens";
  }
  // Attention: stories260K (8 heads of 8) stays serial for a verification window at a short
  // context and for one token at 300 positions, and splits for 6 tokens at 300 positions.
  EXPECT_FALSE(worth_splitting(two, attention_cost_ns(6 * 8, 8, 8)));
  EXPECT_FALSE(worth_splitting(two, attention_cost_ns(300, 8, 8)));
  EXPECT_TRUE(worth_splitting(two, attention_cost_ns(6 * 300, 8, 8)));
  EXPECT_LT(attention_cost_ns(100, 8, 8), attention_cost_ns(101, 8, 8));
  EXPECT_LT(matmul_cost_ns(shape(GgmlType::F16, 128, 384), 1), matmul_cost_ns(shape(GgmlType::F16, 128, 384), 2));
}

class MatmulMultiTest : public ::testing::TestWithParam<bool> {
 protected:
  bool portable() const { return GetParam(); }
  void SetUp() override {
    if (!portable() && !use_avx2_kernels()) GTEST_SKIP() << "AVX2 kernels unavailable here";
  }
};

TEST_P(MatmulMultiTest, BitIdenticalToSeparateCalls) {
  KernelSetGuard guard(portable());
  // Small (below the split threshold) and large shapes, an odd row count (a partial 16-row
  // unit), 1 and 2 threads, plain and SwiGLU.
  for (int64_t cols : {40, 384})
    for (int64_t rows : {36, 1000})
      for (int n : {1, 3, 6, 17}) {
        const auto a = make_weights(GgmlType::F16, rows, cols, 1), b = make_weights(GgmlType::F16, rows, cols, 2);
        const auto c = make_weights(GgmlType::F16, rows / 2 + 5, cols, 3);
        const auto x = random_floats(size_t(n * cols), 4);
        ThreadPool one(1);
        std::vector<float> ra(size_t(n * rows)), rb(ra.size()), rc(size_t(n * c.rows)), rs(ra.size());
        matmul(one, a.view(), x.data(), n, ra.data());
        matmul(one, b.view(), x.data(), n, rb.data());
        matmul(one, c.view(), x.data(), n, rc.data());
        silu_mul(ra.data(), rb.data(), rs.data(), n * rows);
        for (int threads : {1, 2}) {
          ThreadPool pool(threads);
          const WeightMatrix wa = a.view(), wb = b.view(), wc = c.view();
          std::vector<float> ya(ra.size(), NAN), yb(ra.size(), NAN), yc(rc.size(), NAN);
          const WeightMatrix* three[] = {&wa, &wb, &wc};
          float* outs[] = {ya.data(), yb.data(), yc.data()};
          matmul_multi(pool, three, outs, 3, x.data(), n);
          EXPECT_EQ(std::memcmp(ya.data(), ra.data(), ra.size() * 4), 0) << rows << "x" << cols << " n " << n;
          EXPECT_EQ(std::memcmp(yb.data(), rb.data(), rb.size() * 4), 0) << rows << "x" << cols << " n " << n;
          EXPECT_EQ(std::memcmp(yc.data(), rc.data(), rc.size() * 4), 0) << rows << "x" << cols << " n " << n;
          std::fill(ya.begin(), ya.end(), NAN);
          matmul_multi(pool, three, outs, 2, x.data(), n, /*swiglu=*/true);
          EXPECT_EQ(std::memcmp(ya.data(), rs.data(), rs.size() * 4), 0)
              << "swiglu " << rows << "x" << cols << " n " << n << " threads " << threads;
        }
      }
}

TEST_P(MatmulMultiTest, SiluMulIsElementWiseAndAccurate) {
  KernelSetGuard guard(portable());
  auto g = random_floats(1000, 5, 4.f);
  // Extremes: exp(-g) overflows / underflows.
  g[0] = 100.f, g[1] = -100.f, g[2] = 88.5f, g[3] = -88.5f, g[4] = 0.f, g[5] = -0.f, g[6] = 1e-30f;
  const auto u = random_floats(g.size(), 6);
  std::vector<float> whole(g.size());
  silu_mul(g.data(), u.data(), whole.data(), int64_t(g.size()));
  for (size_t i = 0; i < g.size(); ++i) {
    const double want = double(g[i]) / (1.0 + std::exp(-double(g[i]))) * double(u[i]);
    EXPECT_NEAR(whole[i], want, 1e-6 * std::fabs(want) + 1e-30) << "g " << g[i];
  }
  // Any split, any offset: the same bits (the tail is a masked vector, not a scalar loop).
  for (size_t start : {0, 1, 5, 13})
    for (size_t len : {1, 7, 8, 9, 30}) {
      std::vector<float> part(len);
      silu_mul(g.data() + start, u.data() + start, part.data(), int64_t(len));
      EXPECT_EQ(std::memcmp(part.data(), whole.data() + start, len * 4), 0) << start << "+" << len;
    }
}

INSTANTIATE_TEST_SUITE_P(KernelSets, MatmulMultiTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "portable" : "avx2"; });

}  // namespace
}  // namespace fdl::cpu
