// vec_ops: exact row conversion for every type, and dot/axpy accuracy, on both kernel sets.
#include "backend/cpu/vec_ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "cpu_test_util.h"

namespace fdl::cpu {
namespace {

class VecOpsTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!GetParam() && !use_avx2_kernels()) GTEST_SKIP() << "AVX2 kernels unavailable here";
  }
};

TEST_P(VecOpsTest, ConvertRowIsExactForEveryType) {
  test::KernelSetGuard guard(GetParam());
  for (GgmlType t : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0}) {
    const int64_t n = t == GgmlType::Q8_0 ? 96 : 45;
    const auto w = test::make_weights(t, 1, n, 5);
    // Offset by one element so the source is unaligned.
    std::vector<unsigned char> shifted(w.bytes.size() + 2);
    std::memcpy(shifted.data() + 2, w.bytes.data(), w.bytes.size());
    std::vector<float> out(static_cast<size_t>(n) + 1, -1.f);
    convert_row_to_f32(t, shifted.data() + 2, out.data(), n);
    EXPECT_EQ(std::memcmp(out.data(), w.widened.data(), static_cast<size_t>(n) * 4), 0) << test::type_label(t);
    EXPECT_EQ(out[static_cast<size_t>(n)], -1.f) << "wrote past the end";
  }
  // Special values survive F16 conversion.
  const uint16_t specials[9] = {0x7c00, 0xfc00, 0x7e00, 0x0001, 0x8000, 0x3c00, 0x03ff, 0x7bff, 0xc000};
  float out[9];
  convert_row_to_f32(GgmlType::F16, specials, out, 9);
  for (int i = 0; i < 9; ++i) {
    const float ref = fp16_to_fp32(specials[i]);
    if (std::isnan(ref)) EXPECT_TRUE(std::isnan(out[i]));
    else EXPECT_EQ(out[i], ref) << i;
  }
}

TEST_P(VecOpsTest, ConvertRowRejectsBadInput) {
  test::KernelSetGuard guard(GetParam());
  float out[64];
  const unsigned char src[128] = {};
  EXPECT_THROW(convert_row_to_f32(GgmlType::Q8_0, src, out, 33), std::invalid_argument);
  EXPECT_THROW(convert_row_to_f32(GgmlType::Q4_K, src, out, 32), std::invalid_argument);
  EXPECT_THROW(convert_row_to_f32(GgmlType::F16, src, out, -1), std::invalid_argument);
}

TEST_P(VecOpsTest, DotMatchesDoubleReference) {
  test::KernelSetGuard guard(GetParam());
  for (int64_t n : {0, 1, 7, 8, 31, 32, 33, 64, 100, 1000}) {
    const auto a = test::random_floats(static_cast<size_t>(n), 1);
    const auto b = test::random_floats(static_cast<size_t>(n), 2);
    double ref = 0, abs_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      ref += static_cast<double>(a[i]) * b[i];
      abs_sum += std::fabs(static_cast<double>(a[i]) * b[i]);
    }
    const float got = dot_f32(a.data(), b.data(), n);
    EXPECT_NEAR(got, ref, (static_cast<double>(n) / 8 + 6) * std::numeric_limits<float>::epsilon() * abs_sum) << n;
    // Deterministic: same inputs, same bits.
    const float again = dot_f32(a.data(), b.data(), n);
    EXPECT_EQ(std::memcmp(&got, &again, 4), 0);
  }
}

TEST_P(VecOpsTest, AxpyAccumulates) {
  test::KernelSetGuard guard(GetParam());
  for (int64_t n : {1, 7, 8, 13, 64, 129}) {
    const auto x = test::random_floats(static_cast<size_t>(n), 3);
    auto y = test::random_floats(static_cast<size_t>(n) + 1, 4);
    const auto y0 = y;
    axpy_f32(0.75f, x.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i)
      EXPECT_NEAR(y[i], y0[i] + 0.75 * x[i], 2e-7 * (std::fabs(y0[i]) + std::fabs(x[i]))) << i;
    EXPECT_EQ(y[static_cast<size_t>(n)], y0[static_cast<size_t>(n)]) << "wrote past the end";
  }
}

INSTANTIATE_TEST_SUITE_P(KernelSets, VecOpsTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "portable" : "avx2"; });

TEST(CpuFeatures, ForcePortableSwitchesKernelSet) {
  {
    test::KernelSetGuard guard(true);
    EXPECT_FALSE(use_avx2_kernels());
    EXPECT_STREQ(kernel_set_name(), "portable");
  }
  const CpuFeatures& f = cpu_features();
  const char* env = std::getenv("FLASHDLLM_NO_AVX2");
  const bool env_off = env != nullptr && *env != '\0' && std::string(env) != "0";
  // Releasing the force restores what the hardware and the environment allow.
  EXPECT_EQ(use_avx2_kernels(), f.avx2 && f.fma && f.f16c && !env_off);
  EXPECT_STREQ(kernel_set_name(), use_avx2_kernels() ? "avx2" : "portable");
}

}  // namespace
}  // namespace fdl::cpu
