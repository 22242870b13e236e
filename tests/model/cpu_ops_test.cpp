// The forward's non-matmul CPU ops (backend/cpu/ops.h, attention.h) against straightforward
// double-precision references.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <random>
#include <vector>

#include "backend/cpu/attention.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/ops.h"
#include "flashdllm/kv_cache.h"

namespace fdl::cpu {
namespace {

std::vector<float> random_vector(size_t n, uint32_t seed, float lo = -1.f, float hi = 1.f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

TEST(CpuOps, RmsNormMatchesDoubleReference) {
  const int64_t rows = 3, n = 70;
  const auto x = random_vector(rows * n, 1, -3, 3), w = random_vector(n, 2);
  std::vector<float> y(x.size());
  rms_norm_rows(x.data(), w.data(), y.data(), rows, n, 1e-5f);
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(x[r * n + i]) * x[r * n + i];
    const double scale = 1.0 / std::sqrt(ss / n + 1e-5);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y[r * n + i], x[r * n + i] * scale * w[i], 1e-5);
  }
  // In place gives the same result.
  std::vector<float> z = x;
  rms_norm_rows(z.data(), w.data(), z.data(), rows, n, 1e-5f);
  EXPECT_EQ(z, y);
}

TEST(CpuOps, RopeRotatesAdjacentPairsOfTheFirstRopeDims) {
  RopeParams p;
  p.head_dim = 12;
  p.rope_dim = 8;
  p.freq_base = 500.f;
  const std::vector<float> factors{1.f, 2.f, 1.f, 4.f};
  for (bool with_factors : {false, true}) {
    p.freq_factors = with_factors ? std::span<const float>(factors) : std::span<const float>();
    for (int32_t pos : {0, 1, 7, 300}) {
      std::vector<float> cs(size_t(p.rope_dim));
      rope_cos_sin(p, pos, cs.data());
      const auto x = random_vector(2 * 12, uint32_t(pos) + 5);
      std::vector<float> y = x;
      rope_apply(p, cs.data(), y.data(), 2);
      for (int h = 0; h < 2; ++h) {
        for (int i = 0; i < 4; ++i) {
          const double theta = pos * std::pow(500.0, -2.0 * i / 8) / (with_factors ? factors[size_t(i)] : 1.0);
          const double x0 = x[size_t(h * 12 + 2 * i)], x1 = x[size_t(h * 12 + 2 * i + 1)];
          // Tolerance: float angles of up to ~300 rad carry ~1e-5 absolute error.
          EXPECT_NEAR(y[size_t(h * 12 + 2 * i)], x0 * std::cos(theta) - x1 * std::sin(theta), 1e-4);
          EXPECT_NEAR(y[size_t(h * 12 + 2 * i + 1)], x0 * std::sin(theta) + x1 * std::cos(theta), 1e-4);
        }
        for (int i = 8; i < 12; ++i) EXPECT_EQ(y[size_t(h * 12 + i)], x[size_t(h * 12 + i)]);  // pass-through
      }
    }
  }
}

TEST(CpuOps, SiluMulAndAdd) {
  const auto g = random_vector(33, 3, -6, 6), u = random_vector(33, 4);
  std::vector<float> out(33);
  silu_mul(g.data(), u.data(), out.data(), 33);
  for (size_t i = 0; i < 33; ++i) EXPECT_NEAR(out[i], g[i] / (1 + std::exp(-double(g[i]))) * u[i], 1e-6);
  std::vector<float> x = g;
  add_inplace(x.data(), u.data(), 33);
  for (size_t i = 0; i < 33; ++i) EXPECT_FLOAT_EQ(x[i], g[i] + u[i]);
}

// GeGLU's GELU (PyTorch's approximate="tanh"), soft-capping and scaling against double.
TEST(CpuOps, GeluTanhMulSoftcapAndScale) {
  const auto g = random_vector(33, 5, -6, 6), u = random_vector(33, 6);
  std::vector<float> out(33);
  gelu_tanh_mul(g.data(), u.data(), out.data(), 33);
  for (size_t i = 0; i < 33; ++i) {
    const double x = g[i];
    EXPECT_NEAR(out[i], 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x))) * u[i], 1e-5);
  }
  std::vector<float> c = g;
  softcap_inplace(c.data(), 33, 2.5f);
  for (size_t i = 0; i < 33; ++i) EXPECT_NEAR(c[i], 2.5 * std::tanh(g[i] / 2.5), 1e-6);
  c = g;
  scale_inplace(c.data(), 33, 8.f);
  for (size_t i = 0; i < 33; ++i) EXPECT_EQ(c[i], g[i] * 8.f);
}

TEST(CpuOps, GatherRowsRejectsOutOfRangeIds) {
  const auto table = random_vector(4 * 3, 6);
  std::vector<float> out(6);
  const int32_t ids[] = {2, 0};
  gather_rows_f32(GgmlType::F32, table.data(), 4, 3, ids, 2, out.data());
  EXPECT_EQ(out[0], table[6]);
  EXPECT_EQ(out[3], table[0]);
  const int32_t bad[] = {4};
  EXPECT_THROW(gather_rows_f32(GgmlType::F32, table.data(), 4, 3, bad, 1, out.data()), std::out_of_range);
}

// Paged attention over scattered blocks equals dense causal GQA attention in double, with
// both kernel sets, on one thread and split across two (the context is long enough for
// the split to happen), for a small head and for one with several 64-float chunks and a
// partial vector (75 = 64 + 8 + 3).
class PagedAttention : public ::testing::TestWithParam<int> {};

TEST_P(PagedAttention, MatchesDenseReference) {
  const int hd = GetParam(), kvd = 2 * hd;  // 2 KV heads
  const KvShape shape{.n_layer = 2, .n_kv_head = 2, .head_dim = hd, .block_size = 4};
  const int n_head = 6, layer = 1, n_ctx = 300;
  BlockPool pool(shape, 80);
  KvCache kv(pool);
  // Burn a few blocks first so the sequence's blocks are not 0, 1, 2 in order.
  const SeqId other = kv.create_sequence();
  kv.append_slots(other, 6);
  const SeqId s = kv.create_sequence();
  kv.append_slots(s, n_ctx);
  kv.free_sequence(other);
  const auto k_all = random_vector(size_t(n_ctx) * kvd, 7), v_all = random_vector(size_t(n_ctx) * kvd, 8);
  for (int p = 0; p < n_ctx; ++p) {
    std::copy_n(k_all.data() + p * kvd, kvd, kv.k_slot(s, layer, size_t(p)));
    std::copy_n(v_all.data() + p * kvd, kvd, kv.v_slot(s, layer, size_t(p)));
  }
  // Three queries of the same sequence at the first, a middle and the last position.
  const std::vector<int32_t> positions{0, 150, n_ctx - 1};
  auto q = random_vector(size_t(3 * n_head * hd), 9, -2, 2);
  std::vector<float> out(q.size());
  std::vector<const int32_t*> tables(3, kv.block_table(s).data());
  PagedAttentionArgs a;
  a.kv = {pool.k_ptr(0, layer, 0), pool.v_ptr(0, layer, 0), int64_t(shape.block_bytes() / 4), shape.block_size};
  a.n_tokens = 3;
  a.n_head = n_head;
  a.n_head_kv = 2;
  a.head_dim = hd;
  a.scale = 1.f / std::sqrt(float(hd));
  a.q = q.data();
  a.block_tables = tables.data();
  a.positions = positions.data();
  a.out = out.data();
  for (int run = 0; run < 12; ++run) {
    const int n_threads = 1 + run % 2;
    force_portable_kernels(run % 4 >= 2);
    // From the fifth pass on, large queries make most softmax weights underflow to zero (exp
    // of -100s); the last four passes soft-cap those scores (Gemma 2: cap * tanh(s / cap)).
    if (run == 4)
      for (float& x : q) x *= 40.f;
    a.softcap = run >= 8 ? 5.f : 0.f;
    ThreadPool threads(n_threads);
    AttentionScratch scratch;
    std::fill(out.begin(), out.end(), 0.f);
    paged_attention(threads, a, scratch);
    for (int t = 0; t < 3; ++t)
      for (int h = 0; h < n_head; ++h) {
        const int g = h / 3;  // 6 heads over 2 KV heads
        const float* qh = q.data() + (t * n_head + h) * hd;
        std::vector<double> w(size_t(positions[size_t(t)]) + 1);
        double mx = -1e300, sum = 0;
        for (size_t j = 0; j < w.size(); ++j) {
          double d = 0;
          for (int e = 0; e < hd; ++e) d += double(qh[e]) * k_all[j * size_t(kvd) + size_t(g * hd + e)];
          w[j] = d / std::sqrt(double(hd));
          if (a.softcap > 0) w[j] = a.softcap * std::tanh(w[j] / a.softcap);
          mx = std::max(mx, w[j]);
        }
        for (double& x : w) sum += (x = std::exp(x - mx));
        for (int e = 0; e < hd; ++e) {
          double ref = 0;
          for (size_t j = 0; j < w.size(); ++j) ref += w[j] / sum * v_all[j * size_t(kvd) + size_t(g * hd + e)];
          ASSERT_NEAR(out[size_t((t * n_head + h) * hd + e)], ref, 1e-5)
              << "t " << t << " h " << h << " e " << e << " threads " << n_threads << " run " << run;
        }
      }
  }
  force_portable_kernels(false);
  a.n_head_kv = 4;  // 6 heads do not group over 4 KV heads
  ThreadPool one(1);
  AttentionScratch scratch;
  EXPECT_THROW(paged_attention(one, a, scratch), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(HeadDims, PagedAttention, ::testing::Values(8, 75),
                         [](const auto& info) { return "head_dim" + std::to_string(info.param); });

}  // namespace
}  // namespace fdl::cpu

namespace fdl::cpu {
namespace {

// YaRN against transformers' formula computed in double: inverse frequencies mixed between
// the interpolated (/ factor) and the original ones by 1 - a linear ramp over the truncated
// correction range, cos/sin scaled by 0.1 ln(factor) + 1.
TEST(CpuOps, YarnAnglesFollowTransformersFormula) {
  const int rope_dim = 16, orig = 64;
  const double base = 1e6, factor = 4, beta_fast = 32, beta_slow = 1;
  RopeParams p{.head_dim = 16, .rope_dim = rope_dim, .freq_base = float(base), .freq_scale = float(1 / factor), .freq_factors = {}};
  set_yarn(p, orig, float(beta_fast), float(beta_slow));
  const auto corr = [&](double n_rot) {
    return rope_dim * std::log(orig / (n_rot * 2 * std::numbers::pi)) / (2 * std::log(base));
  };
  const double low = std::max(0.0, std::floor(corr(beta_fast)));
  const double high = std::min(double(rope_dim - 1), std::ceil(corr(beta_slow)));
  const double mscale = 0.1 * std::log(factor) + 1;
  for (const int pos : {0, 1, 7, 40, 200}) {
    std::vector<float> cs(rope_dim);
    rope_cos_sin(p, pos, cs.data());
    for (int i = 0; i < rope_dim / 2; ++i) {
      const double inv = std::pow(base, -2.0 * i / rope_dim);
      const double ramp = std::clamp((i - low) / std::max(high - low, 0.001), 0.0, 1.0);
      const double extrapolation = 1 - ramp;
      const double mixed = inv / factor * (1 - extrapolation) + inv * extrapolation;
      EXPECT_NEAR(cs[size_t(2 * i)], std::cos(pos * mixed) * mscale, 2e-5) << "pos " << pos << " pair " << i;
      EXPECT_NEAR(cs[size_t(2 * i + 1)], std::sin(pos * mixed) * mscale, 2e-5) << "pos " << pos << " pair " << i;
    }
  }
}

// LongRoPE against transformers' formula in double: inverse frequencies base^(-2i/d) divided by
// the pair's factor, cos/sin times the attention factor; and the attention factor multiplies
// YaRN's scale (ggml's attn_factor), leaving the angles alone.
TEST(CpuOps, LongRopeFactorsAndAttentionFactor) {
  const std::vector<float> factors{1.5f, 3.f, 7.25f, 12.f};
  RopeParams p{.head_dim = 8, .rope_dim = 8, .freq_base = 10000.f, .freq_factors = factors, .attn_factor = 1.1547005f};
  for (const int pos : {0, 1, 63, 64, 200}) {
    std::vector<float> cs(8);
    rope_cos_sin(p, pos, cs.data());
    for (int i = 0; i < 4; ++i) {
      // Tolerance: float angles of up to ~130 rad carry ~1e-5 absolute error.
      const double angle = pos * std::pow(10000.0, -2.0 * i / 8) / factors[size_t(i)];
      EXPECT_NEAR(cs[size_t(2 * i)], std::cos(angle) * 1.1547005, 3e-5) << "pos " << pos << " pair " << i;
      EXPECT_NEAR(cs[size_t(2 * i + 1)], std::sin(angle) * 1.1547005, 3e-5) << "pos " << pos << " pair " << i;
    }
  }
  RopeParams yarn{.head_dim = 16, .rope_dim = 16, .freq_base = 1e6f, .freq_scale = 0.25f, .freq_factors = {}};
  set_yarn(yarn, 64, 32, 1);
  RopeParams scaled = yarn;
  scaled.attn_factor = 2.f;  // a power of two: the products are exact
  std::vector<float> a(16), b(16);
  rope_cos_sin(yarn, 40, a.data());
  rope_cos_sin(scaled, 40, b.data());
  for (size_t i = 0; i < 16; ++i) EXPECT_EQ(b[i], 2.f * a[i]) << i;
}

}  // namespace
}  // namespace fdl::cpu
