// The mixture-of-experts kernels (backend/cuda/moe.h) against the CPU: routing equal to
// route_top_k (ties included), routed GEMVs equal to gemv of each pair's expert bit for bit,
// the grouping a stable sort by expert, the weighted sum in rank order.
#include <algorithm>

#include "backend/cuda/moe.h"
#include "gpu/gpu_test_util.h"
#include "model/moe_routing.h"

namespace fdl::test {
namespace {

using cuda::DeviceBuffer;
using cuda::WType;

TEST(MoeKernels, RoutingEqualsTheCpuRouterIncludingTies) {
  FDL_SKIP_WITHOUT_GPU();
  for (const auto& shape : {std::pair{4, 2}, std::pair{8, 2}, std::pair{8, 8}, std::pair{60, 4}, std::pair{128, 8},
                            std::pair{256, 1}, std::pair{256, 8}}) {
    const int n_expert = shape.first, k = shape.second;
    const int n = 37;
    std::vector<float> logits = random_floats(size_t(n) * n_expert, -4.f, 4.f);
    // Exact ties in a third of the tokens: equal logits, which the CPU breaks by the lower index.
    for (int t = 0; t < n; t += 3)
      for (int e = 1; e < n_expert; e += 2) logits[size_t(t) * n_expert + e] = logits[size_t(t) * n_expert + e - 1];
    auto dl = to_device(logits);
    DeviceBuffer<int32_t> dids(size_t(n) * k);
    DeviceBuffer<float> dw(size_t(n) * k);
    poison(dids), poison(dw);
    cuda::moe_route(dl.get(), n, n_expert, k, dids.get(), dw.get(), nullptr);
    const auto ids = to_host(dids, size_t(n) * k);
    const auto w = to_host(dw, size_t(n) * k);
    for (int t = 0; t < n; ++t) {
      std::vector<int32_t> ref_ids(static_cast<size_t>(k));
      std::vector<float> ref_w(static_cast<size_t>(k));
      route_top_k(logits.data() + size_t(t) * n_expert, n_expert, k, ref_ids.data(), ref_w.data());
      for (int r = 0; r < k; ++r) {
        EXPECT_EQ(ids[size_t(t) * k + r], ref_ids[size_t(r)]) << n_expert << " experts, token " << t << " rank " << r;
        EXPECT_EQ(w[size_t(t) * k + r], ref_w[size_t(r)]) << n_expert << " experts, token " << t << " rank " << r;
      }
    }
  }
}

TEST(MoeKernels, RoutingRefusesExpertCountsOutOfRange) {
  FDL_SKIP_WITHOUT_GPU();
  DeviceBuffer<float> l(1024), w(16);
  DeviceBuffer<int32_t> ids(16);
  EXPECT_THROW(cuda::moe_route(l.get(), 1, cuda::kMoeMaxExperts + 1, 2, ids.get(), w.get(), nullptr), cuda::CudaError);
  EXPECT_THROW(cuda::moe_route(l.get(), 1, 4, 5, ids.get(), w.get(), nullptr), cuda::CudaError);
  EXPECT_THROW(cuda::moe_route(l.get(), 1, 4, 0, ids.get(), w.get(), nullptr), cuda::CudaError);
}

// Each pair's routed GEMV equals gemv of its expert on its row: the same bits.
TEST(MoeKernels, RoutedGemvEqualsGemvOfEachPairsExpert) {
  FDL_SKIP_WITHOUT_GPU();
  struct Case {
    WType type;
    int rows, cols;
  };
  for (const Case c : {Case{WType::F32, 96, 64}, Case{WType::F16, 130, 256}, Case{WType::BF16, 64, 1032},
                       Case{WType::BF16, 33, 7}}) {
    const int n_expert = 5, n = 3, k = 2, pairs = n * k;
    const auto bits = random_weights(c.type, size_t(n_expert) * c.rows * c.cols);
    auto dW = to_device(bits);
    const cuda::ExpertMatrices W{c.type, dW.get(), c.rows, c.cols, n_expert};
    const std::vector<int32_t> ids = {4, 0, 2, 4, 1, 3};
    auto dids = to_device(ids);
    for (const int x_div : {k, 1}) {
      const int x_rows = x_div == k ? n : pairs;
      const auto X = random_floats(size_t(x_rows) * c.cols);
      auto dX = to_device(X);
      DeviceBuffer<float> dY(size_t(pairs) * c.rows);
      poison(dY);
      cuda::moe_gemv(W, dids.get(), dX.get(), x_div, pairs, dY.get(), nullptr);
      const auto Y = to_host(dY, size_t(pairs) * c.rows);
      for (int p = 0; p < pairs; ++p) {
        DeviceBuffer<float> ref(size_t(c.rows));
        cuda::gemv(W.expert(ids[size_t(p)]), dX.get() + size_t(p / x_div) * c.cols, 1, ref.get(), nullptr);
        const auto r = to_host(ref, size_t(c.rows));
        for (int i = 0; i < c.rows; ++i)
          ASSERT_EQ(Y[size_t(p) * c.rows + i], r[size_t(i)])
              << cuda::wtype_name(c.type) << " " << c.rows << "x" << c.cols << " pair " << p << " row " << i;
      }
    }
  }
}

TEST(MoeKernels, GroupingIsAStableSortByExpert) {
  FDL_SKIP_WITHOUT_GPU();
  for (const auto& shape : {std::pair{4, 6}, std::pair{8, 1024}, std::pair{256, 9000}, std::pair{3, 1}}) {
    const int n_expert = shape.first, pairs = shape.second;
    std::vector<int32_t> ids(static_cast<size_t>(pairs));
    std::uniform_int_distribution<int32_t> e(0, n_expert - 1);
    for (auto& id : ids) id = e(rng());
    auto dids = to_device(ids);
    DeviceBuffer<int32_t> doff(size_t(n_expert) + 1), dperm{size_t(pairs)}, dslot{size_t(pairs)};
    poison(doff), poison(dperm), poison(dslot);
    cuda::moe_group(dids.get(), pairs, n_expert, doff.get(), dperm.get(), dslot.get(), nullptr);
    const auto off = to_host(doff, size_t(n_expert) + 1);
    const auto perm = to_host(dperm, size_t(pairs));
    const auto slot = to_host(dslot, size_t(pairs));
    std::vector<int32_t> ref(static_cast<size_t>(pairs));
    for (int p = 0; p < pairs; ++p) ref[size_t(p)] = p;
    std::stable_sort(ref.begin(), ref.end(), [&](int32_t a, int32_t b) { return ids[size_t(a)] < ids[size_t(b)]; });
    EXPECT_EQ(perm, ref) << n_expert << " experts, " << pairs << " pairs";
    for (int x = 0; x <= n_expert; ++x)
      EXPECT_EQ(off[size_t(x)], std::count_if(ids.begin(), ids.end(), [&](int32_t id) { return id < x; }));
    for (int j = 0; j < pairs; ++j) EXPECT_EQ(slot[size_t(perm[size_t(j)])], j);
  }
}

TEST(MoeKernels, GatherAndCombineFollowTheGroupedOrder) {
  FDL_SKIP_WITHOUT_GPU();
  const int n = 70000, k = 2, width = 3, pairs = n * k;  // more rows than a grid's y dimension
  std::vector<int32_t> perm(static_cast<size_t>(pairs)), slot(static_cast<size_t>(pairs));
  for (int j = 0; j < pairs; ++j) perm[size_t(j)] = (j * 7919) % pairs;  // 7919 is prime to pairs: a permutation
  for (int j = 0; j < pairs; ++j) slot[size_t(perm[size_t(j)])] = j;
  const auto X = random_floats(size_t(n) * width), Y = random_floats(size_t(pairs) * width);
  const auto w = random_floats(size_t(pairs), 0.f, 1.f);
  auto dX = to_device(X), dY = to_device(Y), dw = to_device(w);
  auto dperm = to_device(perm), dslot = to_device(slot);
  DeviceBuffer<float> gathered(size_t(pairs) * width), out(size_t(n) * width), plain(size_t(n) * width);
  poison(gathered), poison(out), poison(plain);
  cuda::moe_gather(dX.get(), dperm.get(), pairs, k, width, gathered.get(), nullptr);
  cuda::moe_combine(dY.get(), dslot.get(), dw.get(), n, k, width, out.get(), nullptr);
  cuda::moe_combine(dY.get(), nullptr, dw.get(), n, k, width, plain.get(), nullptr);
  const auto g = to_host(gathered, size_t(pairs) * width);
  const auto o = to_host(out, size_t(n) * width), o_plain = to_host(plain, size_t(n) * width);
  for (int j = 0; j < pairs; ++j)
    for (int i = 0; i < width; ++i)
      ASSERT_EQ(g[size_t(j) * width + i], X[size_t(perm[size_t(j)] / k) * width + i]) << "row " << j;
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < width; ++i) {
      float ref = 0.f, ref_plain = 0.f;
      for (int r = 0; r < k; ++r) {
        const size_t p = size_t(t) * k + r;
        ref += w[p] * Y[size_t(slot[p]) * width + i];
        ref_plain += w[p] * Y[p * width + i];
      }
      ASSERT_EQ(o[size_t(t) * width + i], ref) << "token " << t;
      ASSERT_EQ(o_plain[size_t(t) * width + i], ref_plain) << "token " << t;
    }
}

}  // namespace
}  // namespace fdl::test
