// The fused single-token projections (gemv_fused.cu) against the unfused kernel chains they
// replace (add_rms_norm -> gemv -> rope_qkv_store / silu_mul, each tested against CPU
// references in kernels_test.cpp), on random inputs of every weight type, with sizes that
// leave the last block partly empty; plus the residual written to x_out.
#include "backend/cpu/ops.h"
#include "backend/cuda/kernels.h"
#include "flashdllm/dtype.h"
#include "gpu/gpu_test_util.h"

namespace fdl::test {
namespace {

using cuda::DeviceBuffer;
using cuda::WType;

class FusedGemv : public ::testing::TestWithParam<WType> {};

TEST_P(FusedGemv, NormSwigluEqualsNormGemvSiluChain) {
  FDL_SKIP_WITHOUT_GPU();
  const WType type = GetParam();
  // 520: the last block partly empty; 4096: Llama-3-8B's rows; 4104: a row of 513 vectors.
  for (const int cols : {520, 4096, 4104}) {
    const int n_ff = 333;  // 333 pairs: the last block has one
    const float eps = 1e-5f;
    auto dW = to_device(random_weights(type, size_t(2 * n_ff) * cols));
    const cuda::DeviceMatrix W{type, dW.get(), 2 * n_ff, cols};
    ASSERT_TRUE(cuda::gemv_norm_supported(W));
    const auto x = random_floats(cols, -3.f, 3.f), add = random_floats(cols), w = random_floats(cols, 0.5f, 1.5f);
    auto dx = to_device(x), dadd = to_device(add), dw = to_device(w);
    for (bool with_add : {true, false}) {
      DeviceBuffer<float> x_out{size_t(cols)}, h{size_t(n_ff)};
      poison(x_out);
      poison(h);
      cuda::gemv_norm_swiglu(W, cuda::NormIn{dx.get(), with_add ? dadd.get() : nullptr, dw.get(), x_out.get(), eps},
                             h.get(), nullptr);
      // Unfused: norm (in place on a copy of x), gemv, silu.
      auto dx2 = to_device(x);
      DeviceBuffer<float> xn{size_t(cols)}, gu{size_t(2 * n_ff)}, h_ref{size_t(n_ff)};
      cuda::add_rms_norm(dx2.get(), with_add ? dadd.get() : nullptr, dw.get(), xn.get(), nullptr, 1, cols, eps, true,
                         nullptr);
      cuda::gemv(W, xn.get(), 1, gu.get(), nullptr);
      cuda::silu_mul(gu.get(), h_ref.get(), 1, n_ff, nullptr);
      EXPECT_LT(rel_error(to_host(h, size_t(n_ff)), widen(to_host(h_ref, size_t(n_ff)))), 1e-6)
          << "cols " << cols << ", add " << with_add;
      EXPECT_EQ(to_host(x_out, size_t(cols)), to_host(dx2, size_t(cols))) << "residual, add " << with_add;
    }
  }
}

TEST_P(FusedGemv, NormRopeQkvEqualsNormGemvRopeChain) {
  FDL_SKIP_WITHOUT_GPU();
  const WType type = GetParam();
  const int n_head = 6, n_kv = 2, hd = 20, rope_dim = 12, cols = 264, block_size = 3, n_layer = 2, layer = 1;
  const int q_dim = n_head * hd, kv_dim = n_kv * hd, rows = q_dim + 2 * kv_dim;  // 200 rows: last block partial
  const float eps = 1e-6f;
  auto dW = to_device(random_weights(type, size_t(rows) * cols));
  const cuda::DeviceMatrix W{type, dW.get(), rows, cols};
  ASSERT_TRUE(cuda::gemv_norm_supported(W));
  const std::vector<float> factors = random_floats(rope_dim / 2, 0.5f, 4.f);
  cpu::RopeParams rp{.head_dim = hd, .rope_dim = rope_dim, .freq_base = 10000.f, .freq_scale = 1.f,
                     .freq_factors = factors};
  const std::vector<int32_t> pos = {7}, blk = {2};
  std::vector<float> cs(static_cast<size_t>(rope_dim));
  cpu::rope_cos_sin(rp, pos[0], cs.data());
  auto dcs = to_device(cs);
  auto dpos = to_device(pos), dblk = to_device(blk);
  const auto x = random_floats(cols, -3.f, 3.f), add = random_floats(cols), w = random_floats(cols, 0.5f, 1.5f);
  auto dx = to_device(x), dadd = to_device(add), dw = to_device(w);
  const int64_t stride = int64_t(n_layer) * 2 * block_size * kv_dim;
  const size_t arena_floats = size_t(4 * stride);
  DeviceBuffer<float> arena{arena_floats}, arena_ref{arena_floats}, q{size_t(q_dim)}, q_ref{size_t(q_dim)},
      x_out{size_t(cols)};
  FDL_CUDA_CHECK(cudaMemset(arena.get(), 0, arena.bytes()));
  FDL_CUDA_CHECK(cudaMemset(arena_ref.get(), 0, arena_ref.bytes()));
  poison(q);
  poison(x_out);
  cuda::KvLayerView kv{arena.get(), int64_t(layer) * 2 * block_size * kv_dim, stride, block_size, n_kv, hd};
  cuda::gemv_norm_rope_qkv(W, cuda::NormIn{dx.get(), dadd.get(), dw.get(), x_out.get(), eps}, dcs.get(), dpos.get(),
                           dblk.get(), n_head, rope_dim, kv, q.get(), nullptr);
  auto dx2 = to_device(x);
  DeviceBuffer<float> xn{size_t(cols)}, qkv{size_t(rows)};
  cuda::add_rms_norm(dx2.get(), dadd.get(), dw.get(), xn.get(), nullptr, 1, cols, eps, true, nullptr);
  cuda::gemv(W, xn.get(), 1, qkv.get(), nullptr);
  cuda::KvLayerView kv_ref = kv;
  kv_ref.base = arena_ref.get();
  cuda::rope_qkv_store(qkv.get(), dcs.get(), dpos.get(), dblk.get(), 1, n_head, rope_dim, kv_ref, q_ref.get(), nullptr);
  EXPECT_LT(rel_error(to_host(q, size_t(q_dim)), widen(to_host(q_ref, size_t(q_dim)))), 1e-6);
  const auto a = to_host(arena, arena_floats), a_ref = to_host(arena_ref, arena_floats);
  EXPECT_LT(rel_error(a, widen(a_ref)), 1e-6);
  size_t written = 0;  // K and V of the token: 2 * kv_dim nonzero floats, in the same slots
  for (size_t i = 0; i < arena_floats; ++i) {
    ASSERT_EQ(a[i] != 0.f, a_ref[i] != 0.f) << "slot " << i;
    written += a[i] != 0.f;
  }
  EXPECT_EQ(written, size_t(2 * kv_dim));
  EXPECT_EQ(to_host(x_out, size_t(cols)), to_host(dx2, size_t(cols)));
}

INSTANTIATE_TEST_SUITE_P(Types, FusedGemv, ::testing::Values(WType::F32, WType::F16, WType::BF16),
                         [](const auto& info) { return std::string(cuda::wtype_name(info.param)); });

}  // namespace
}  // namespace fdl::test
