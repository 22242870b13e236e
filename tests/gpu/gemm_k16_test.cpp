// gemm_k16: every tiling and every token count gives each row the bits of the reference
// kernel (the definition: one chain of m16n8k16 steps per element), a row alone the bits it has
// among 300 others at any place in the batch, and the values of a double-precision product of
// the same 16-bit operands.
#include <cstring>
#include <string>

#include "backend/cuda/gemm_k16.h"
#include "gpu/gpu_test_util.h"

namespace fdl::test {
namespace {

using cuda::WType;

struct Case {
  WType type;
  int rows, cols;
};

std::vector<uint16_t> as_u16(const std::vector<uint8_t>& bytes) {
  std::vector<uint16_t> v(bytes.size() / 2);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

float widen(WType t, uint16_t h) { return t == WType::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h); }

class GemmK16 : public ::testing::TestWithParam<Case> {};

TEST_P(GemmK16, EveryVariantAndPlaceInTheBatchGivesTheReferenceBits) {
  FDL_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  const int n_all = 300;
  const auto w = as_u16(random_weights(c.type, size_t(c.rows) * c.cols));
  const auto x = as_u16(random_weights(c.type, size_t(n_all) * c.cols));
  auto dw = to_device(w);
  auto dx = to_device(x);
  const cuda::DeviceMatrix W{c.type, dw.get(), c.rows, c.cols};
  cuda::DeviceBuffer<float> dref(size_t(n_all) * c.rows), dy(size_t(n_all) * c.rows);
  poison(dref);
  cuda::gemm_k16(W, dx.get(), n_all, dref.get(), nullptr, 0);
  const auto ref = to_host(dref, size_t(n_all) * c.rows);

  // Against double: the same 16-bit operands, summed exactly.
  double worst = 0;
  for (int t : {0, 151, n_all - 1})
    for (int r = 0; r < c.rows; r += 7) {
      double dot = 0, mag = 0;
      for (int k = 0; k < c.cols; ++k) {
        const double p = double(widen(c.type, x[size_t(t) * c.cols + k])) * widen(c.type, w[size_t(r) * c.cols + k]);
        dot += p, mag += std::abs(p);
      }
      worst = std::max(worst, std::abs(ref[size_t(t) * c.rows + r] - dot) / (mag + 1e-30));
    }
  EXPECT_LT(worst, 1e-5) << "reference against double, rows " << c.rows << " cols " << c.cols;

  // -1: the pick by token count (with and without a workspace); the tilings need 16-byte rows.
  std::vector<int> variants{-1, -2};
  if (c.cols % 8 == 0)
    for (int t = 1; t < cuda::gemm_k16_tilings(); ++t)
      if (cuda::gemm_k16_tiling_available(t) &&
          (std::string(cuda::gemm_k16_tiling_name(t)).rfind("stream", 0) != 0 ||
           c.cols <= int64_t(cuda::kGemmK16StreamMaxSegments) * cuda::kGemmK16Segment))
        variants.push_back(t);  // the streaming kernels take rows of up to that many segments
  // (first token, count): alone, at odd places, across every tiling's edges.
  const std::pair<int, int> runs[] = {{0, 1},  {151, 1}, {299, 1},  {3, 2},   {17, 7},   {100, 16},
                                      {33, 17}, {5, 64},  {200, 65}, {40, 129}, {0, 300}};
  for (int v : variants)
    for (auto [first, n] : runs) {
      poison(dy);
      const int tiling = std::max(v, -1);
      const size_t ws_floats = v == -1 ? 0 : cuda::gemm_k16_workspace_floats(W, n, tiling);
      cuda::DeviceBuffer<float> ws(std::max<size_t>(ws_floats, 1));
      poison(ws);
      cuda::gemm_k16(W, dx.get() + size_t(first) * c.cols, n, dy.get(), nullptr, tiling,
                     ws_floats > 0 ? ws.get() : nullptr);
      const auto y = to_host(dy, size_t(n) * c.rows);
      size_t differ = 0;
      for (size_t i = 0; i < y.size(); ++i)
        differ += std::memcmp(&y[i], &ref[size_t(first) * c.rows + i], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0u) << "tiling " << v << " (" << cuda::gemm_k16_tiling_name(tiling) << "), tokens " << first << ".." << first + n - 1 << " of "
                            << c.rows << " x " << c.cols;
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmK16,
                         ::testing::Values(Case{WType::F16, 1000, 4096}, Case{WType::BF16, 1000, 4096},
                                           Case{WType::F16, 72, 14336}, Case{WType::BF16, 130, 200},
                                           Case{WType::F16, 33, 172}, Case{WType::BF16, 8, 40},
                                           Case{WType::BF16, 40, 5000}, Case{WType::F16, 16, 36864}),
                         [](const auto& info) {
                           return std::string(info.param.type == WType::F16 ? "F16_" : "BF16_") +
                                  std::to_string(info.param.rows) + "x" + std::to_string(info.param.cols);
                         });

// The warpgroup tilings' blocks are persistent: with more work items than SMs a block runs
// several, each over several K segments (an odd count here, so consecutive items start their
// chains in either bank of accumulators), and stores one item while the next one's MMAs run.
TEST(GemmK16Persistent, BlocksWithManyItemsGiveTheReferenceBits) {
  FDL_SKIP_WITHOUT_GPU();
  const WType type = WType::BF16;
  const int rows = 4096, cols = 5000, n = 2000;  // 16 x 32 tiles of 128 x 128, 5 segments each
  const auto w = as_u16(random_weights(type, size_t(rows) * cols));
  const auto x = as_u16(random_weights(type, size_t(n) * cols));
  auto dw = to_device(w);
  auto dx = to_device(x);
  const cuda::DeviceMatrix W{type, dw.get(), rows, cols};
  cuda::DeviceBuffer<float> dref(size_t(n) * rows), dy(size_t(n) * rows);
  poison(dref);
  cuda::gemm_k16(W, dx.get(), n, dref.get(), nullptr, 0);
  const auto ref = to_host(dref, size_t(n) * rows);
  for (int t = -1; t < cuda::gemm_k16_tilings(); ++t) {
    if (t >= 0 && (!cuda::gemm_k16_tiling_available(t) ||
                   std::string(cuda::gemm_k16_tiling_name(t)).find("wgmma") == std::string::npos))
      continue;
    poison(dy);
    const size_t ws_floats = cuda::gemm_k16_workspace_floats(W, n, t);
    cuda::DeviceBuffer<float> ws(std::max<size_t>(ws_floats, 1));
    cuda::gemm_k16(W, dx.get(), n, dy.get(), nullptr, t, ws_floats > 0 ? ws.get() : nullptr);
    const auto y = to_host(dy, size_t(n) * rows);
    size_t differ = 0;
    for (size_t i = 0; i < y.size(); ++i) differ += std::memcmp(&y[i], &ref[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << "tiling " << t << " (" << (t < 0 ? "picked" : cuda::gemm_k16_tiling_name(t)) << ")";
  }
}

TEST(GemmK16Errors, RefusesOtherTypesAndUnalignedTiles) {
  FDL_SKIP_WITHOUT_GPU();
  cuda::DeviceBuffer<float> y(64), x(64);
  cuda::DeviceBuffer<uint16_t> w(64);
  EXPECT_THROW(cuda::gemm_k16(cuda::DeviceMatrix{WType::F32, w.get(), 2, 4}, x.get(), 1, y.get(), nullptr),
               cuda::CudaError);
  EXPECT_THROW(cuda::gemm_k16(cuda::DeviceMatrix{WType::F16, w.get(), 2, 12}, x.get(), 1, y.get(), nullptr,
                              1),
               cuda::CudaError);
  EXPECT_THROW(cuda::gemm_k16(cuda::DeviceMatrix{WType::F16, w.get(), 2, 16}, x.get(), 1, y.get(), nullptr,
                              cuda::gemm_k16_tilings()),
               cuda::CudaError);
  // A split tiling (a block per K segment) over rows of two segments needs its workspace.
  cuda::DeviceBuffer<uint16_t> w2(size_t(2) * 2 * cuda::kGemmK16Segment), x2(size_t(2) * cuda::kGemmK16Segment);
  const cuda::DeviceMatrix W2{WType::F16, w2.get(), 2, 2 * cuda::kGemmK16Segment};
  for (int t = 1; t < cuda::gemm_k16_tilings(); ++t)
    if (cuda::gemm_k16_workspace_floats(W2, 1, t) > 0) {
      EXPECT_EQ(cuda::gemm_k16_workspace_floats(W2, 1, t), 2u * 2u);
      EXPECT_THROW(cuda::gemm_k16(W2, x2.get(), 1, y.get(), nullptr, t), cuda::CudaError) << t;
    }
}

}  // namespace
}  // namespace fdl::test
