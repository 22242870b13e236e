// Every element-wise/GEMV kernel against a CPU reference in double, on fresh random inputs
// with odd sizes; outputs are poisoned first so unwritten elements fail.
#include <algorithm>
#include <numeric>

#include "backend/cpu/ops.h"
#include "backend/cuda/kernels.h"
#include "flashdllm/dtype.h"
#include "flashdllm/model.h"
#include "gpu/gpu_test_util.h"

namespace fdl::test {
namespace {

using cuda::DeviceBuffer;
using cuda::WType;

// Random weights of `type` as raw bits, and their exact fp32 values.
struct HostMatrix {
  std::vector<uint8_t> bits;
  std::vector<float> values;
};
HostMatrix random_matrix(WType type, size_t count) {
  HostMatrix m;
  m.values = random_floats(count);
  m.bits.resize(count * cuda::wtype_size(type));
  for (size_t i = 0; i < count; ++i) {
    if (type == WType::F32) {
      std::memcpy(&m.bits[4 * i], &m.values[i], 4);
    } else {
      const uint16_t h = type == WType::F16 ? fp32_to_fp16(m.values[i]) : fp32_to_bf16(m.values[i]);
      std::memcpy(&m.bits[2 * i], &h, 2);
      m.values[i] = type == WType::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
    }
  }
  return m;
}

struct GemvCase {
  WType type;
  int rows, cols;
};

class Gemv : public ::testing::TestWithParam<GemvCase> {};

TEST_P(Gemv, MatchesDoubleReferenceForEveryTokenCount) {
  FDL_SKIP_WITHOUT_GPU();
  const GemvCase c = GetParam();
  const HostMatrix W = random_matrix(c.type, size_t(c.rows) * c.cols);
  auto dW = to_device(W.bits);
  for (int n : {1, 2, 3, 5, 8, 11, 16}) {
    const std::vector<float> X = random_floats(size_t(n) * c.cols);
    auto dX = to_device(X);
    DeviceBuffer<float> dY(size_t(n) * c.rows);
    poison(dY);
    cuda::gemv(cuda::DeviceMatrix{c.type, dW.get(), c.rows, c.cols}, dX.get(), n, dY.get(), nullptr);
    const std::vector<float> Y = to_host(dY, size_t(n) * c.rows);
    std::vector<double> ref(size_t(n) * c.rows);
    for (int t = 0; t < n; ++t)
      for (int r = 0; r < c.rows; ++r) {
        double s = 0;
        for (int k = 0; k < c.cols; ++k) s += double(W.values[size_t(r) * c.cols + k]) * X[size_t(t) * c.cols + k];
        ref[size_t(t) * c.rows + r] = s;
      }
    EXPECT_LT(rel_error(Y, ref), 1e-5) << "n=" << n;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Gemv,
    ::testing::Values(GemvCase{WType::F32, 37, 64}, GemvCase{WType::F32, 1000, 172}, GemvCase{WType::F32, 130, 13},
                      GemvCase{WType::F16, 1031, 384}, GemvCase{WType::F16, 257, 100}, GemvCase{WType::F16, 96, 1024},
                      GemvCase{WType::BF16, 4099, 4096}, GemvCase{WType::BF16, 33, 2056}, GemvCase{WType::BF16, 65, 7}),
    [](const auto& info) {
      return std::string(cuda::wtype_name(info.param.type)) + "_" + std::to_string(info.param.rows) + "x" +
             std::to_string(info.param.cols);
    });

TEST(GpuKernels, AddRmsNormWithResidualAndRowSelection) {
  FDL_SKIP_WITHOUT_GPU();
  const int n = 7, width = 4100;
  const float eps = 1e-5f;
  const auto x = random_floats(size_t(n) * width, -3.f, 3.f), add = random_floats(size_t(n) * width),
             w = random_floats(size_t(width));
  auto dx = to_device(x), dadd = to_device(add), dw = to_device(w);
  DeviceBuffer<float> dy(size_t(n) * width);
  poison(dy);
  cuda::add_rms_norm(dx.get(), dadd.get(), dw.get(), dy.get(), nullptr, n, width, eps, true, nullptr);
  const auto x_after = to_host(dx, x.size()), y = to_host(dy, x.size());
  std::vector<float> sum(x.size()), cpu_y(x.size());
  for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + add[i];
  cpu::rms_norm_rows(sum.data(), w.data(), cpu_y.data(), n, width, eps);
  EXPECT_EQ(x_after, sum);  // the residual add is exact
  EXPECT_LT(rel_error(y, std::vector<double>(cpu_y.begin(), cpu_y.end())), 1e-6);

  // Selected rows, no write-back: y[r] = norm(x[idx[r]] + add[idx[r]]).
  const std::vector<int32_t> idx = {5, 0, 3};
  auto didx = to_device(idx);
  auto dx2 = to_device(x);
  poison(dy);
  cuda::add_rms_norm(dx2.get(), dadd.get(), dw.get(), dy.get(), didx.get(), 3, width, eps, false, nullptr);
  EXPECT_EQ(to_host(dx2, x.size()), x);
  const auto y2 = to_host(dy, size_t(3) * width);
  std::vector<double> ref;
  for (int r : idx) ref.insert(ref.end(), cpu_y.begin() + size_t(r) * width, cpu_y.begin() + size_t(r + 1) * width);
  EXPECT_LT(rel_error(y2, ref), 1e-6);
}

// Every cache dtype: a 16-bit cache holds the fp32 result rounded to nearest even (the
// host's conversion), and nothing outside the written slots changes.
TEST(GpuKernels, RopeRotatesQAndKAndStoresKvInItsPagedSlot) {
  FDL_SKIP_WITHOUT_GPU();
  for (const KvDtype kv_t : {KvDtype::F32, KvDtype::F16, KvDtype::BF16}) {
  const int n = 5, n_head = 6, n_kv = 2, hd = 64, rope_dim = 32, block_size = 5, n_blocks = 9;
  const int q_dim = n_head * hd, kv_dim = n_kv * hd, n_layer = 3, layer = 1;
  const std::vector<float> factors = random_floats(rope_dim / 2, 0.5f, 4.f);
  cpu::RopeParams rp{.head_dim = hd, .rope_dim = rope_dim, .freq_base = 500000.f, .freq_scale = 0.5f,
                     .freq_factors = factors};
  const auto qkv = random_floats(size_t(n) * (q_dim + 2 * kv_dim));
  const std::vector<int32_t> pos = {0, 3, 17, 44, 5};
  const std::vector<int32_t> blocks = {8, 2, 6, 0, 4};
  std::vector<float> cs(size_t(n) * rope_dim);
  for (int t = 0; t < n; ++t) cpu::rope_cos_sin(rp, pos[size_t(t)], cs.data() + size_t(t) * rope_dim);
  const int64_t block_stride = int64_t(n_layer) * 2 * block_size * kv_dim;
  DeviceBuffer<uint8_t> arena(size_t(n_blocks * block_stride) * kv_dtype_bytes(kv_t));
  DeviceBuffer<float> q_out(size_t(n) * q_dim);
  poison(arena);
  poison(q_out);
  auto dqkv = to_device(qkv), dcs = to_device(cs);
  auto dpos = to_device(pos), dblk = to_device(blocks);
  cuda::KvLayerView kv{arena.get(), int64_t(layer) * 2 * block_size * kv_dim, block_stride, block_size, n_kv, hd, kv_t};
  cuda::rope_qkv_store(dqkv.get(), dcs.get(), dpos.get(), dblk.get(), n, n_head, rope_dim, kv, q_out.get(), nullptr);
  const auto q = to_host(q_out, size_t(n) * q_dim);
  const std::vector<uint8_t> bytes = to_host(arena, arena.size());
  const std::vector<float> ar = kv_values(kv_t, bytes);
  for (int t = 0; t < n; ++t) {
    std::vector<float> row(qkv.begin() + size_t(t) * (q_dim + 2 * kv_dim), qkv.begin() + size_t(t + 1) * (q_dim + 2 * kv_dim));
    cpu::rope_apply(rp, cs.data() + size_t(t) * rope_dim, row.data(), n_head);
    cpu::rope_apply(rp, cs.data() + size_t(t) * rope_dim, row.data() + q_dim, n_kv);
    for (int i = 0; i < q_dim; ++i) ASSERT_EQ(q[size_t(t) * q_dim + i], row[size_t(i)]) << "t=" << t << " i=" << i;
    const size_t k_at = size_t(blocks[size_t(t)] * block_stride + kv.layer_offset + (pos[size_t(t)] % block_size) * kv_dim);
    for (int i = 0; i < kv_dim; ++i) {
      ASSERT_EQ(ar[k_at + size_t(i)], kv_round(kv_t, row[size_t(q_dim + i)])) << "k t=" << t << " i=" << i;
      ASSERT_EQ(ar[k_at + size_t(block_size * kv_dim + i)], kv_round(kv_t, row[size_t(q_dim + kv_dim + i)]))
          << "v t=" << t << " " << kv_dtype_name(kv_t);
    }
  }
  // Untouched elements keep poison()'s 0xff bytes.
  size_t written = 0;
  for (size_t e = 0; e < ar.size(); ++e) {
    bool all_ff = true;
    for (size_t b = 0; b < kv_dtype_bytes(kv_t); ++b) all_ff = all_ff && bytes[e * kv_dtype_bytes(kv_t) + b] == 0xff;
    written += all_ff ? 0 : 1;
  }
  EXPECT_EQ(written, size_t(n) * 2 * kv_dim) << kv_dtype_name(kv_t);
  }
}



TEST(GpuKernels, SiluMulOfFusedGateUp) {
  FDL_SKIP_WITHOUT_GPU();
  const int n = 3, ff = 1001;
  const auto gu = random_floats(size_t(n) * 2 * ff, -6.f, 6.f);
  auto dgu = to_device(gu);
  DeviceBuffer<float> out(size_t(n) * ff);
  poison(out);
  cuda::silu_mul(dgu.get(), out.get(), n, ff, nullptr);
  const auto got = to_host(out, size_t(n) * ff);
  std::vector<double> ref;
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < ff; ++i) {
      const double g = gu[size_t(t) * 2 * ff + i], u = gu[size_t(t) * 2 * ff + ff + i];
      ref.push_back(g / (1 + std::exp(-g)) * u);
    }
  EXPECT_LT(rel_error(got, ref), 1e-6);
}

// Rows whose width is a multiple of 4 run four columns per thread; an output one element past
// an aligned address takes the one-column kernel. Both give the same bits, in every output type.
TEST(GpuKernels, SiluMulFourColumnsPerThreadGivesTheOneColumnBits) {
  FDL_SKIP_WITHOUT_GPU();
  const int n = 5, ff = 1024;
  const auto gu = random_floats(size_t(n) * 2 * ff, -12.f, 12.f);
  auto dgu = to_device(gu);
  for (const WType type : {WType::F32, WType::F16, WType::BF16}) {
    for (const bool gelu : {false, true}) {
      const size_t elem = cuda::wtype_size(type), bytes = size_t(n) * ff * elem;
      DeviceBuffer<uint8_t> wide(bytes + 16), narrow(bytes + 16);
      poison(wide);
      poison(narrow);
      cuda::silu_mul(dgu.get(), wide.get(), n, ff, nullptr, type, gelu);
      cuda::silu_mul(dgu.get(), narrow.get() + elem, n, ff, nullptr, type, gelu);
      const auto a = to_host(wide, bytes + 16), b = to_host(narrow, bytes + 16);
      EXPECT_TRUE(std::equal(a.begin(), a.begin() + long(bytes), b.begin() + long(elem)))
          << cuda::wtype_name(type) << (gelu ? " gelu" : " silu");
    }
  }
}

TEST(GpuKernels, EmbeddingGatherWidensEveryType) {
  FDL_SKIP_WITHOUT_GPU();
  const int rows = 301, cols = 77;
  for (WType type : {WType::F32, WType::F16, WType::BF16}) {
    const HostMatrix E = random_matrix(type, size_t(rows) * cols);
    auto dE = to_device(E.bits);
    const std::vector<int32_t> ids = {300, 0, 17, 17, 250};
    auto dids = to_device(ids);
    DeviceBuffer<float> out(ids.size() * cols);
    poison(out);
    cuda::embed_rows(cuda::DeviceMatrix{type, dE.get(), rows, cols}, dids.get(), nullptr, int(ids.size()), out.get(),
                     nullptr);
    const auto got = to_host(out, ids.size() * cols);
    for (size_t t = 0; t < ids.size(); ++t)
      for (int c = 0; c < cols; ++c)
        ASSERT_EQ(got[t * cols + size_t(c)], E.values[size_t(ids[t]) * cols + size_t(c)]) << cuda::wtype_name(type);
  }
}

// Negative ids (previous_step_id) read the id from prev_ids; a drawn id outside the table (a
// failed row's -1, or garbage) reads row 0 instead of memory past the table.
TEST(GpuKernels, EmbeddingGatherResolvesPreviousStepIds) {
  FDL_SKIP_WITHOUT_GPU();
  const int rows = 301, cols = 77;
  const HostMatrix E = random_matrix(WType::BF16, size_t(rows) * cols);
  auto dE = to_device(E.bits);
  const std::vector<int32_t> prev = {42, 299, -1, 301};
  const std::vector<int32_t> ids = {previous_step_id(1), 5, previous_step_id(0), previous_step_id(2), previous_step_id(3)};
  const std::vector<int32_t> want = {299, 5, 42, 0, 0};
  auto dprev = to_device(prev);
  auto dids = to_device(ids);
  DeviceBuffer<float> out(ids.size() * cols);
  poison(out);
  cuda::embed_rows(cuda::DeviceMatrix{WType::BF16, dE.get(), rows, cols}, dids.get(), dprev.get(), int(ids.size()),
                   out.get(), nullptr);
  const auto got = to_host(out, ids.size() * cols);
  for (size_t t = 0; t < ids.size(); ++t)
    for (int c = 0; c < cols; ++c)
      ASSERT_EQ(got[t * cols + size_t(c)], E.values[size_t(want[t]) * cols + size_t(c)]) << t;
}

TEST(GpuKernels, CastRoundsLikeTheHostConversions) {
  FDL_SKIP_WITHOUT_GPU();
  const auto x = random_floats(12345, -100.f, 100.f);
  auto dx = to_device(x);
  for (WType type : {WType::F16, WType::BF16}) {
    DeviceBuffer<uint16_t> out(x.size());
    poison(out);
    cuda::cast_f32(dx.get(), x.size(), type, out.get(), nullptr);
    const auto got = to_host(out, x.size());
    for (size_t i = 0; i < x.size(); ++i)
      ASSERT_EQ(got[i], type == WType::F16 ? fp32_to_fp16(x[i]) : fp32_to_bf16(x[i])) << i;
  }
}

TEST(GpuKernels, ArgmaxTakesTheLowestIdOnTies) {
  FDL_SKIP_WITHOUT_GPU();
  const int rows = 4, cols = 10007;
  auto logits = random_floats(size_t(rows) * cols);
  logits[size_t(1) * cols + 9000] = 5.f;
  logits[size_t(1) * cols + 123] = 5.f;  // tie: the lower id wins
  logits[size_t(3) * cols + cols - 1] = 7.f;
  auto dl = to_device(logits);
  DeviceBuffer<int32_t> ids(rows);
  poison(ids);
  cuda::argmax_rows(dl.get(), rows, cols, ids.get(), nullptr);
  const auto got = to_host(ids, rows);
  for (int r = 0; r < rows; ++r) {
    const float* row = logits.data() + size_t(r) * cols;
    EXPECT_EQ(got[size_t(r)], int32_t(std::max_element(row, row + cols) - row)) << "row " << r;
  }
  EXPECT_EQ(got[1], 123);
}

}  // namespace
}  // namespace fdl::test

namespace fdl::test {
namespace {

// The host's answer for one row: lowest index of the maximum (NaN never wins); checked rows
// with NaN / +Inf or nothing above -Inf give -1, unchecked ones 0 when nothing is finite.
int32_t host_argmax(const float* row, int n, bool checked) {
  int32_t best = -1;
  bool bad = false;
  for (int i = 0; i < n; ++i) {
    if (std::isnan(row[i]) || row[i] == INFINITY) bad = true;
    if (std::isnan(row[i]) || row[i] == -INFINITY) continue;
    if (best < 0 || row[i] > row[best]) best = i;
  }
  if (checked) return bad || best < 0 || row[best] == INFINITY ? -1 : best;
  return best < 0 ? 0 : best;
}

// argmax_rows split over several blocks per row (scratch) gives the ids of one block per row
// and of the host, checked and unchecked, for small and large batches and odd row lengths;
// ties go to the lowest index even when they sit in different blocks' slices; the counters
// are left at zero (every size runs twice on the same scratch, smallest batch last).
TEST(GpuKernels, ArgmaxSplitOverBlocksEqualsOneBlockPerRow) {
  FDL_SKIP_WITHOUT_GPU();
  int n_sm = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  DeviceBuffer<unsigned> counters(64);
  ASSERT_EQ(cudaMemset(counters.get(), 0, counters.bytes()), cudaSuccess);
  DeviceBuffer<unsigned char> partials(size_t(1) << 20);
  int split_rows = 0;
  for (const int n : {5, 4097, 100003, 128256})
    for (const int m : {64, 3, 1}) {
      std::vector<float> x = random_floats(size_t(n) * size_t(m), -4.f, 4.f);
      for (int r = 0; r < m; ++r) {
        float* row = x.data() + size_t(r) * size_t(n);
        switch (r % 6) {
          case 1:  // a tie between the row's ends (different slices when split)
            row[n - 1] = row[0] = 9.f;
            break;
          case 2: row[size_t(r * 7919) % size_t(n)] = NAN; break;
          case 3: row[n / 2] = INFINITY; break;
          case 4: std::fill(row, row + n, -INFINITY); break;
          case 5: row[n - 1] = 8.f, row[n / 3] = -INFINITY; break;
          default: break;
        }
      }
      auto dx = to_device(x);
      ASSERT_LE(cuda::argmax_partial_bytes(m, n, n_sm), partials.size());
      if (cuda::argmax_blocks_per_row(m, n, n_sm) > 1) ++split_rows;
      for (const bool checked : {false, true})
        for (int rep = 0; rep < 2; ++rep) {
          DeviceBuffer<int32_t> one{size_t(m)}, split{size_t(m)};
          cuda::argmax_rows(dx.get(), m, n, one.get(), nullptr, checked);
          cuda::argmax_rows(dx.get(), m, n, split.get(), nullptr, checked,
                            cuda::ArgmaxScratch{counters.get(), partials.get(), n_sm});
          const auto a = to_host(one, size_t(m)), b = to_host(split, size_t(m));
          for (int r = 0; r < m; ++r) {
            const int32_t want = host_argmax(x.data() + size_t(r) * size_t(n), n, checked);
            ASSERT_EQ(a[size_t(r)], want) << "n " << n << " m " << m << " row " << r << " checked " << checked;
            ASSERT_EQ(b[size_t(r)], want) << "n " << n << " m " << m << " row " << r << " checked " << checked;
          }
        }
      EXPECT_EQ(to_host(counters, 64), std::vector<unsigned>(64, 0u));
    }
  EXPECT_GT(split_rows, 2);  // the split path ran (H200: up to 8 blocks per row)
}

}  // namespace
}  // namespace fdl::test
