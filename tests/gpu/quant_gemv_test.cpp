// Block-quantized matrices on the GPU (kernels.h: gemv_quant, dequantize_to_f16, embed_rows of
// a quantized table), uploaded as a model's are (upload_matrix), against host references built
// from the CPU dequantizer (dtype.h): the values each kernel sees are the file's values.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cuda/cuda_weights.h"
#include "backend/cuda/gemm_quant.h"
#include "backend/cuda/gemv_quant_staged.h"
#include "flashdllm/dtype.h"
#include "gpu/gpu_test_util.h"

namespace fdl {
namespace {

using cuda::DeviceBuffer;
using test::to_device;
using test::to_host;

// A random matrix quantized by the project's quantizer (make-model's), its bytes kept alive.
struct HostQuantMatrix {
  std::vector<uint8_t> bytes;
  cpu::WeightMatrix m;
  std::vector<float> values;  // the dequantized values, row-major
};

HostQuantMatrix random_quant(GgmlType t, int64_t rows, int64_t cols) {
  HostQuantMatrix h;
  const size_t row_bytes = cpu::weight_row_bytes(t, cols);
  h.bytes.resize(row_bytes * size_t(rows));
  // Rows of different magnitudes, so scales vary across blocks.
  std::vector<float> src = test::random_floats(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) src[size_t(r * cols + k)] *= 0.25f + float(r % 7);
  for (int64_t r = 0; r < rows; ++r)
    quantize_row(t, src.data() + r * cols, h.bytes.data() + size_t(r) * row_bytes, size_t(cols));
  h.m = cpu::WeightMatrix{t, h.bytes.data(), rows, cols};
  h.values.resize(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row(t, h.bytes.data() + size_t(r) * row_bytes, h.values.data() + r * cols, size_t(cols));
  return h;
}

// The activations as gemv_quant rounds them (kernels.h: Q8Activations), widened back.
std::vector<float> q8_rounded(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  for (size_t g = 0; g < x.size(); g += 32) {
    float amax = 0.f;
    for (size_t i = g; i < g + 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.f;
    for (size_t i = g; i < g + 32; ++i) out[i] = amax == 0.f ? 0.f : d * std::nearbyint(x[i] / d);
  }
  return out;
}

struct Q8Buffers {
  DeviceBuffer<int8_t> q;
  DeviceBuffer<float> d;
  DeviceBuffer<int32_t> s;
  explicit Q8Buffers(size_t values) : q(values), d(values / 32), s(values / 16) {}
  cuda::Q8Activations view() { return {q.get(), d.get(), s.get(), q.size()}; }
};

const GgmlType kTypes[] = {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

std::string name_of(GgmlType t) { return ggml_type_name(uint32_t(t)); }

TEST(GemvQuant, EveryTypeMatchesTheDequantizedRowsOnRoundedActivations) {
  FDL_SKIP_WITHOUT_GPU();
  for (GgmlType t : kTypes) {
    for (int64_t cols : {int64_t(256), int64_t(1024), int64_t(2816), int64_t(96)}) {
      if (cols % 256 != 0 && t != GgmlType::Q8_0) continue;  // 96: 3 Q8_0 blocks, a pair's second one absent
      SCOPED_TRACE(name_of(t) + " cols " + std::to_string(cols));
      const int64_t rows = 77;
      const HostQuantMatrix h = random_quant(t, rows, cols);
      const cuda::CudaMatrix W = cuda::upload_matrix({&h.m}, true);
      ASSERT_TRUE(W.view.quantized());
      for (int n : {1, 2, 3, 5, 8, 13, 16}) {
        const std::vector<float> x = test::random_floats(size_t(n * cols), -2.f, 2.f);
        const std::vector<float> xr = q8_rounded(x);
        auto dx = to_device(x);
        DeviceBuffer<float> dy(size_t(n * rows));
        test::poison(dy);
        Q8Buffers q8{size_t(n * cols)};
        cuda::gemv_quant(W.view, dx.get(), n, dy.get(), q8.view(), nullptr);
        const std::vector<float> y = to_host(dy, size_t(n * rows));
        for (int tok = 0; tok < n; ++tok)
          for (int64_t r = 0; r < rows; ++r) {
            double ref = 0, mag = 0;
            for (int64_t k = 0; k < cols; ++k) {
              ref += double(h.values[size_t(r * cols + k)]) * double(xr[size_t(tok * cols + k)]);
              mag += std::fabs(double(h.values[size_t(r * cols + k)]) * double(xr[size_t(tok * cols + k)]));
            }
            ASSERT_NEAR(y[size_t(tok * rows + r)], ref, 2e-6 * mag + 1e-6) << "token " << tok << " row " << r;
          }
      }
    }
  }
}

TEST(GemvQuant, ATokensResultDoesNotDependOnTheOtherTokens) {
  FDL_SKIP_WITHOUT_GPU();
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(name_of(t));
    const int64_t rows = 40, cols = 512;
    const HostQuantMatrix h = random_quant(t, rows, cols);
    const cuda::CudaMatrix W = cuda::upload_matrix({&h.m}, true);
    const std::vector<float> x = test::random_floats(size_t(16 * cols));
    auto dx = to_device(x);
    Q8Buffers q8{size_t(16 * cols)};
    DeviceBuffer<float> all{size_t(16 * rows)}, one{size_t(rows)};
    cuda::gemv_quant(W.view, dx.get(), 16, all.get(), q8.view(), nullptr);
    const std::vector<float> together = to_host(all, size_t(16 * rows));
    for (int tok = 0; tok < 16; ++tok) {
      cuda::gemv_quant(W.view, dx.get() + tok * cols, 1, one.get(), q8.view(), nullptr);
      const std::vector<float> alone = to_host(one, size_t(rows));
      for (int64_t r = 0; r < rows; ++r)
        ASSERT_EQ(std::memcmp(&alone[size_t(r)], &together[size_t(tok * rows + r)], 4), 0) << "token " << tok;
    }
  }
}

// Steps of up to kStagedMaxTokens tokens run the staged kernel, longer ones the row kernel:
// each token's values must have the same bits either way, on rows as long as an FFN's down
// projection and on fewer rows than a block has warps.
TEST(GemvQuant, StagedAndRowKernelsGiveTheSameBits) {
  FDL_SKIP_WITHOUT_GPU();
  for (GgmlType t : kTypes) {
    for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1000, 14336}, {7, 4096}, {300, 256}, {45, 288}}) {
      if (cols % 256 != 0 && t != GgmlType::Q8_0) continue;  // 288: 9 Q8_0 blocks, a pair's second one absent
      SCOPED_TRACE(name_of(t) + " " + std::to_string(rows) + "x" + std::to_string(cols));
      const HostQuantMatrix h = random_quant(t, rows, cols);
      const cuda::CudaMatrix W = cuda::upload_matrix({&h.m}, true);
      constexpr int kLong = cuda::kStagedMaxTokens + 1;
      ASSERT_TRUE(cuda::gemv_quant_staged_fits(W.view, cuda::kStagedMaxTokens));
      ASSERT_FALSE(cuda::gemv_quant_staged_fits(W.view, kLong));
      const std::vector<float> x = test::random_floats(size_t(kLong * cols), -3.f, 3.f);
      auto dx = to_device(x);
      Q8Buffers q8{size_t(kLong * cols)};
      DeviceBuffer<float> all{size_t(kLong * rows)}, some{size_t(kLong * rows)};
      cuda::gemv_quant(W.view, dx.get(), kLong, all.get(), q8.view(), nullptr);
      const std::vector<float> row_kernel = to_host(all, size_t(kLong * rows));
      for (int n = 1; n <= cuda::kStagedMaxTokens; ++n) {
        test::poison(some);
        cuda::gemv_quant(W.view, dx.get(), n, some.get(), q8.view(), nullptr);
        const std::vector<float> staged = to_host(some, size_t(n * rows));
        for (int tok = 0; tok < n; ++tok)
          for (int64_t r = 0; r < rows; ++r)
            ASSERT_EQ(std::memcmp(&staged[size_t(tok * rows + r)], &row_kernel[size_t(tok * rows + r)], 4), 0)
                << "n " << n << " token " << tok << " row " << r << ": " << staged[size_t(tok * rows + r)] << " vs "
                << row_kernel[size_t(tok * rows + r)];
      }
    }
  }
}

// gemv_quant_swiglu gives the bits of gemv_quant then silu_mul (SiLU and GeGLU).
TEST(GemvQuant, SwigluGivesTheBitsOfTheGemvThenSiluMul) {
  FDL_SKIP_WITHOUT_GPU();
  for (GgmlType t : kTypes) {
    const int64_t n_ff = 333, cols = 1024;
    SCOPED_TRACE(name_of(t));
    const HostQuantMatrix gate = random_quant(t, n_ff, cols), up = random_quant(t, n_ff, cols);
    const cuda::CudaMatrix W = cuda::upload_matrix({&gate.m, &up.m}, true);
    ASSERT_EQ(W.view.quant.n, 1);
    const std::vector<float> x = test::random_floats(size_t(cuda::kStagedMaxTokens * cols), -2.f, 2.f);
    auto dx = to_device(x);
    Q8Buffers q8{size_t(cuda::kStagedMaxTokens * cols)};
    for (bool gelu : {false, true}) {
      for (int n = 1; n <= cuda::kStagedMaxTokens; ++n) {
        SCOPED_TRACE(std::string(gelu ? "gelu" : "silu") + " n " + std::to_string(n));
        ASSERT_TRUE(cuda::gemv_quant_swiglu_fits(W.view, n));
        DeviceBuffer<float> gu{size_t(n * 2 * n_ff)}, want{size_t(n * n_ff)}, got{size_t(n * n_ff)};
        cuda::gemv_quant(W.view, dx.get(), n, gu.get(), q8.view(), nullptr);
        cuda::silu_mul(gu.get(), want.get(), n, int(n_ff), nullptr, cuda::WType::F32, gelu);
        test::poison(got);
        cuda::gemv_quant_swiglu(W.view, dx.get(), n, got.get(), gelu, nullptr);
        const std::vector<float> a = to_host(want, size_t(n * n_ff)), b = to_host(got, size_t(n * n_ff));
        for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(std::memcmp(&a[i], &b[i], 4), 0) << "value " << i;
      }
    }
  }
  // Not for a gate and an up of different types, nor for longer steps.
  const HostQuantMatrix g4 = random_quant(GgmlType::Q4_K, 16, 256), u6 = random_quant(GgmlType::Q6_K, 16, 256);
  const cuda::CudaMatrix mixed = cuda::upload_matrix({&g4.m, &u6.m}, true);
  EXPECT_FALSE(cuda::gemv_quant_swiglu_fits(mixed.view, 1));
  const cuda::CudaMatrix same = cuda::upload_matrix({&g4.m, &g4.m}, true);
  EXPECT_TRUE(cuda::gemv_quant_swiglu_fits(same.view, 1));
  EXPECT_FALSE(cuda::gemv_quant_swiglu_fits(same.view, cuda::kStagedMaxTokens + 1));
  DeviceBuffer<float> x(256), h(16);
  EXPECT_THROW(cuda::gemv_quant_swiglu(mixed.view, x.get(), 1, h.get(), false, nullptr), cuda::CudaError);
}

// The one-token variants that normalize in the kernel against add_rms_norm then the staged
// GEMV: the residual row written exactly, the products within what a last-place difference of
// the norm can move through the 8-bit rounding. Runs of two types (the later run normalizes
// the residual the first one wrote) and Gemma's post-norm of the addend included.
TEST(GemvQuant, NormVariantsMatchAddRmsNormThenTheGemv) {
  FDL_SKIP_WITHOUT_GPU();
  const int64_t cols = 2048, n_ff = 160;
  const HostQuantMatrix q = random_quant(GgmlType::Q4_K, 96, cols), v = random_quant(GgmlType::Q6_K, 32, cols);
  const HostQuantMatrix gate = random_quant(GgmlType::Q5_K, n_ff, cols), up = random_quant(GgmlType::Q5_K, n_ff, cols);
  const cuda::CudaMatrix qkv = cuda::upload_matrix({&q.m, &v.m}, true);
  const cuda::CudaMatrix gu = cuda::upload_matrix({&gate.m, &up.m}, true);
  ASSERT_EQ(qkv.view.quant.n, 2);
  ASSERT_TRUE(cuda::gemv_quant_norm_fits(qkv.view));
  ASSERT_TRUE(cuda::gemv_quant_norm_swiglu_fits(gu.view));
  EXPECT_FALSE(cuda::gemv_quant_norm_swiglu_fits(qkv.view));
  const std::vector<float> x = test::random_floats(size_t(cols), -2.f, 2.f), add = test::random_floats(size_t(cols));
  const std::vector<float> w = test::random_floats(size_t(cols), 0.5f, 1.5f), aw = test::random_floats(size_t(cols));
  auto dx = to_device(x), dadd = to_device(add), dw = to_device(w), daw = to_device(aw);
  for (bool post_norm : {false, true}) {
    SCOPED_TRACE(post_norm ? "post-norm of the addend" : "plain");
    const float* add_w = post_norm ? daw.get() : nullptr;
    // Reference: add_rms_norm into xn (writing the residual into a copy of x), then the GEMVs.
    auto ref_x = to_device(x);
    DeviceBuffer<float> xn{size_t(cols)}, want_y{size_t(qkv.view.rows)}, want_h{size_t(n_ff)};
    cuda::add_rms_norm(ref_x.get(), dadd.get(), dw.get(), xn.get(), nullptr, 1, int(cols), 1e-5f, true, nullptr,
                       cuda::WType::F32, add_w);
    cuda::gemv_quant_staged(qkv.view, xn.get(), 1, want_y.get(), nullptr);
    cuda::gemv_quant_swiglu(gu.view, xn.get(), 1, want_h.get(), false, nullptr);
    const std::vector<float> resid = to_host(ref_x, size_t(cols));

    DeviceBuffer<float> x_out{size_t(cols)}, got_y{size_t(qkv.view.rows)}, got_h{size_t(n_ff)};
    test::poison(x_out);
    test::poison(got_y);
    const cuda::NormIn in{dx.get(), dadd.get(), dw.get(), x_out.get(), 1e-5f, add_w};
    cuda::gemv_quant_norm(qkv.view, in, got_y.get(), nullptr);
    const std::vector<float> out = to_host(x_out, size_t(cols));
    for (int64_t i = 0; i < cols; ++i) ASSERT_EQ(out[size_t(i)], resid[size_t(i)]) << "residual " << i;
    const cuda::NormIn in2{dx.get(), dadd.get(), dw.get(), nullptr, 1e-5f, add_w};
    cuda::gemv_quant_norm_swiglu(gu.view, in2, got_h.get(), false, nullptr);

    auto close = [](const std::vector<float>& a, const std::vector<float>& b, const char* what) {
      float scale = 0.f;
      for (float f : a) scale = std::max(scale, std::fabs(f));
      for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 3e-3f * scale) << what << " " << i;
    };
    close(to_host(want_y, size_t(qkv.view.rows)), to_host(got_y, size_t(qkv.view.rows)), "qkv row");
    close(to_host(want_h, size_t(n_ff)), to_host(got_h, size_t(n_ff)), "h");
  }
  // x_out may not alias x: other blocks still read x.
  DeviceBuffer<float> y{size_t(qkv.view.rows)};
  auto dx2 = to_device(x);
  EXPECT_THROW(cuda::gemv_quant_norm(qkv.view, cuda::NormIn{dx2.get(), dadd.get(), dw.get(), dx2.get(), 1e-5f, nullptr},
                                     y.get(), nullptr),
               cuda::CudaError);
}

TEST(GemvQuant, RunsOfDifferentTypesInOneMatrix) {
  FDL_SKIP_WITHOUT_GPU();
  const int64_t cols = 768;
  const HostQuantMatrix q = random_quant(GgmlType::Q4_K, 48, cols), k = random_quant(GgmlType::Q4_K, 16, cols),
                        v = random_quant(GgmlType::Q6_K, 16, cols);
  const cuda::CudaMatrix W = cuda::upload_matrix({&q.m, &k.m, &v.m}, true);
  ASSERT_EQ(W.view.quant.n, 2);  // q and k merged into one Q4_K run
  EXPECT_EQ(W.view.rows, 80);
  const std::vector<float> x = test::random_floats(size_t(cols));
  const std::vector<float> xr = q8_rounded(x);
  auto dx = to_device(x);
  Q8Buffers q8{size_t(cols)};
  DeviceBuffer<float> dy(80);
  cuda::gemv_quant(W.view, dx.get(), 1, dy.get(), q8.view(), nullptr);
  const std::vector<float> y = to_host(dy, 80);
  int64_t row = 0;
  for (const HostQuantMatrix* part : {&q, &k, &v})
    for (int64_t r = 0; r < part->m.rows; ++r, ++row) {
      double ref = 0, mag = 0;
      for (int64_t c = 0; c < cols; ++c) {
        ref += double(part->values[size_t(r * cols + c)]) * xr[size_t(c)];
        mag += std::fabs(double(part->values[size_t(r * cols + c)]) * xr[size_t(c)]);
      }
      ASSERT_NEAR(y[size_t(row)], ref, 2e-6 * mag + 1e-6) << "row " << row;
    }
  // Dequantization and the embedding gather cross the runs too.
  DeviceBuffer<uint16_t> f16(size_t(80 * cols));
  cuda::dequantize_to_f16(W.view, 0, 80, f16.get(), nullptr);
  const std::vector<uint16_t> got = to_host(f16, size_t(80 * cols));
  std::vector<float> all;
  for (const HostQuantMatrix* part : {&q, &k, &v}) all.insert(all.end(), part->values.begin(), part->values.end());
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(got[i], fp32_to_fp16(all[i])) << "value " << i;
  const std::vector<int32_t> ids = {0, 63, 64, 79};
  auto dids = to_device(ids);
  DeviceBuffer<float> rows{ids.size() * size_t(cols)};
  cuda::embed_rows(W.view, dids.get(), nullptr, int(ids.size()), rows.get(), nullptr, 1.f);
  const std::vector<float> emb = to_host(rows, ids.size() * size_t(cols));
  for (size_t i = 0; i < ids.size(); ++i)
    for (int64_t c = 0; c < cols; ++c)
      ASSERT_EQ(emb[i * size_t(cols) + size_t(c)], all[size_t(ids[i] * cols + c)]) << "id " << ids[i];
  // A part of a type kept as is only by widening turns the whole matrix F16.
  const HostQuantMatrix q40 = random_quant(GgmlType::Q4_0, 16, cols);
  EXPECT_FALSE(cuda::upload_matrix({&q.m, &q40.m}, true).view.quantized());
  EXPECT_FALSE(cuda::upload_matrix({&q.m}, false).view.quantized());
}

TEST(GemvQuant, NonFiniteActivationsGiveNaNRows) {
  FDL_SKIP_WITHOUT_GPU();
  const HostQuantMatrix h = random_quant(GgmlType::Q4_K, 8, 256);
  const cuda::CudaMatrix W = cuda::upload_matrix({&h.m}, true);
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> x = test::random_floats(256);
    x[100] = bad;
    auto dx = to_device(x);
    Q8Buffers q8(256);
    DeviceBuffer<float> dy(8);
    cuda::gemv_quant(W.view, dx.get(), 1, dy.get(), q8.view(), nullptr);
    for (float v : to_host(dy, 8)) EXPECT_TRUE(std::isnan(v)) << bad;
  }
}

TEST(GemvQuant, RefusesWhatItCannotRun) {
  FDL_SKIP_WITHOUT_GPU();
  const HostQuantMatrix h = random_quant(GgmlType::Q8_0, 8, 256);
  const cuda::CudaMatrix W = cuda::upload_matrix({&h.m}, true);
  DeviceBuffer<float> x(17 * 256), y(17 * 8);
  Q8Buffers small(256);
  EXPECT_THROW(cuda::gemv_quant(W.view, x.get(), 17, y.get(), small.view(), nullptr), cuda::CudaError);
  EXPECT_THROW(cuda::gemv_quant(W.view, x.get(), 2, y.get(), small.view(), nullptr), cuda::CudaError);
  EXPECT_THROW(cuda::gemv(W.view, x.get(), 1, y.get(), nullptr), cuda::CudaError);
  const cuda::CudaMatrix F = cuda::upload_matrix({&h.m}, false);
  EXPECT_THROW(cuda::gemv_quant(F.view, x.get(), 1, y.get(), small.view(), nullptr), cuda::CudaError);
}

// Row r of the F16-rounded `values` ([.][cols]) times token tok of the F16 activations xh, in
// double, and the sum of the products' magnitudes (the tolerance's scale).
std::pair<double, double> f16_dot(const std::vector<float>& values, int64_t r, const std::vector<uint16_t>& xh, int tok,
                                  int64_t cols) {
  double ref = 0, mag = 0;
  for (int64_t k = 0; k < cols; ++k) {
    const double p = double(fp16_to_fp32(fp32_to_fp16(values[size_t(r * cols + k)]))) *
                     double(fp16_to_fp32(xh[size_t(tok * cols + k)]));
    ref += p;
    mag += std::fabs(p);
  }
  return {ref, mag};
}

// gemm_quant multiplies the F16-rounded CPU values by F16 activations (dequantize_to_f16's
// values, as the tiles it replaces): each row against a double reference, for every type, row
// counts that leave a partial tile, token counts around its 64-token tiles, and rows long
// enough that K is split.
TEST(GemmQuant, EveryTypeMatchesTheF16ValuesForBatchedSteps) {
  FDL_SKIP_WITHOUT_GPU();
  {
    const HostQuantMatrix probe = random_quant(GgmlType::Q8_0, 8, 256);
    if (!cuda::gemm_quant_fits(cuda::upload_matrix({&probe.m}, true).view, 32))
      GTEST_SKIP() << "this GPU gives a block less shared memory than gemm_quant's two stages";
  }
  // (cols, rows, token counts): K split over up to 8 ranges; rows enough for more tiles than
  // two per SM, so K is not split and the blocks write Y directly.
  struct Case {
    int64_t cols, rows;
    std::vector<int> ns;
  };
  const Case cases[] = {{512, 300, {17, 40, 64, 65, 128}}, {4096, 136, {17, 64, 65, 128}}, {256, 40000, {17, 100}}};
  for (GgmlType t : kTypes) {
    for (const Case& c : cases) {
      const int64_t cols = c.cols, rows = c.rows;
      SCOPED_TRACE(name_of(t) + " cols " + std::to_string(cols) + " rows " + std::to_string(rows));
      const HostQuantMatrix h = random_quant(t, rows, cols);
      const cuda::CudaMatrix W = cuda::upload_matrix({&h.m}, true);
      ASSERT_TRUE(W.view.quantized());
      for (int n : c.ns) {
        ASSERT_TRUE(cuda::gemm_quant_fits(W.view, n));
        const std::vector<float> x = test::random_floats(size_t(n * cols), -2.f, 2.f);
        std::vector<uint16_t> xh(x.size());
        for (size_t i = 0; i < x.size(); ++i) xh[i] = fp32_to_fp16(x[i]);
        auto dx = to_device(xh);
        DeviceBuffer<float> dy(size_t(n * rows));
        test::poison(dy);
        DeviceBuffer<float> ws(std::max<size_t>(1, cuda::gemm_quant_workspace_floats(W.view, n)));
        cuda::gemm_quant(W.view, dx.get(), n, dy.get(), ws.get(), nullptr);
        const std::vector<float> y = to_host(dy, size_t(n * rows));
        for (int tok = 0; tok < n; ++tok)
          for (int64_t r = 0; r < rows; ++r) {
            const auto [ref, mag] = f16_dot(h.values, r, xh, tok, cols);
            ASSERT_NEAR(y[size_t(tok * rows + r)], ref, 1e-5 * mag + 1e-6) << "n " << n << " token " << tok << " row " << r;
          }
      }
    }
  }
}

TEST(GemmQuant, RunsOfDifferentTypesAndRepeatableBits) {
  FDL_SKIP_WITHOUT_GPU();
  const int64_t cols = 2048;
  const HostQuantMatrix q = random_quant(GgmlType::Q4_K, 192, cols), v = random_quant(GgmlType::Q6_K, 64, cols);
  const cuda::CudaMatrix W = cuda::upload_matrix({&q.m, &v.m}, true);
  ASSERT_EQ(W.view.quant.n, 2);
  const int n = 33;
  const std::vector<float> x = test::random_floats(size_t(n * cols));
  std::vector<uint16_t> xh(x.size());
  for (size_t i = 0; i < x.size(); ++i) xh[i] = fp32_to_fp16(x[i]);
  auto dx = to_device(xh);
  DeviceBuffer<float> ws(std::max<size_t>(1, cuda::gemm_quant_workspace_floats(W.view, n)));
  DeviceBuffer<float> dy(size_t(n) * 256), dy2(size_t(n) * 256);
  cuda::gemm_quant(W.view, dx.get(), n, dy.get(), ws.get(), nullptr);
  cuda::gemm_quant(W.view, dx.get(), n, dy2.get(), ws.get(), nullptr);
  const std::vector<float> y = to_host(dy, size_t(n) * 256), y2 = to_host(dy2, size_t(n) * 256);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(std::memcmp(&y[i], &y2[i], sizeof(float)), 0) << "element " << i;
  for (int tok = 0; tok < n; ++tok) {
    int64_t row = 0;
    for (const HostQuantMatrix* part : {&q, &v})
      for (int64_t r = 0; r < part->m.rows; ++r, ++row) {
        const auto [ref, mag] = f16_dot(part->values, r, xh, tok, cols);
        ASSERT_NEAR(y[size_t(tok) * 256 + size_t(row)], ref, 1e-5 * mag + 1e-6) << "token " << tok << " row " << row;
      }
  }
  // What it cannot run: one token's step, too many tokens, rows not a whole number of stages.
  EXPECT_FALSE(cuda::gemm_quant_fits(W.view, 16));
  EXPECT_FALSE(cuda::gemm_quant_fits(W.view, cuda::kGemmQuantMaxTokens + 1));
  const HostQuantMatrix odd = random_quant(GgmlType::Q8_0, 8, 96);
  EXPECT_FALSE(cuda::gemm_quant_fits(cuda::upload_matrix({&odd.m}, true).view, 32));
  if (cuda::gemm_quant_workspace_floats(W.view, n) == 0) ADD_FAILURE() << "this small matrix should split K";
  EXPECT_THROW(cuda::gemm_quant(W.view, dx.get(), 16, dy.get(), ws.get(), nullptr), cuda::CudaError);
}

TEST(DequantizeToF16, EveryValueIsTheCpuValueRounded) {
  FDL_SKIP_WITHOUT_GPU();
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(name_of(t));
    const int64_t rows = 37, cols = 512;
    const HostQuantMatrix h = random_quant(t, rows, cols);
    const cuda::CudaMatrix W = cuda::upload_matrix({&h.m}, true);
    const int64_t row0 = 5, n_rows = 29;
    DeviceBuffer<uint16_t> out(size_t(n_rows * cols));
    test::poison(out);
    cuda::dequantize_to_f16(W.view, row0, n_rows, out.get(), nullptr);
    const std::vector<uint16_t> got = to_host(out, size_t(n_rows * cols));
    for (int64_t i = 0; i < n_rows * cols; ++i)
      ASSERT_EQ(got[size_t(i)], fp32_to_fp16(h.values[size_t(row0 * cols + i)])) << "value " << i;
    EXPECT_THROW(cuda::dequantize_to_f16(W.view, 30, 8, out.get(), nullptr), cuda::CudaError);
  }
}

TEST(EmbedRows, QuantizedTableGivesTheCpuValues) {
  FDL_SKIP_WITHOUT_GPU();
  for (GgmlType t : kTypes) {
    SCOPED_TRACE(name_of(t));
    const int64_t rows = 50, cols = 512;
    const HostQuantMatrix h = random_quant(t, rows, cols);
    const cuda::CudaMatrix E = cuda::upload_matrix({&h.m}, true);
    const std::vector<int32_t> ids = {3, 49, 0, 17};
    auto dids = to_device(ids);
    DeviceBuffer<float> out(ids.size() * size_t(cols));
    for (float scale : {1.f, 1.5f}) {
      cuda::embed_rows(E.view, dids.get(), nullptr, int(ids.size()), out.get(), nullptr, scale);
      const std::vector<float> got = to_host(out, ids.size() * size_t(cols));
      for (size_t i = 0; i < ids.size(); ++i)
        for (int64_t c = 0; c < cols; ++c) {
          const float want = h.values[size_t(ids[i] * cols + c)] * (scale == 1.f ? 1.f : scale);
          ASSERT_EQ(got[i * size_t(cols) + size_t(c)], want) << "id " << ids[i] << " col " << c;
        }
    }
  }
}

}  // namespace
}  // namespace fdl
