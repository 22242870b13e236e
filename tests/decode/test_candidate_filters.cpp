// The fast truncation stages against straightforward full-sort implementations, on random
// rows of several sizes, spreads and parameters.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "decode/candidate_filters.h"

namespace fdl::detail {
namespace {

std::vector<TokenLogit> all_sorted(const std::vector<float>& row) {
  std::vector<TokenLogit> c;
  for (size_t i = 0; i < row.size(); ++i)
    if (!std::isinf(row[i])) c.push_back({int32_t(i), row[i]});
  std::sort(c.begin(), c.end(), ranks_before);
  return c;
}

std::vector<int32_t> ids_sorted_by_rank(std::vector<TokenLogit> c) {
  std::sort(c.begin(), c.end(), ranks_before);
  std::vector<int32_t> ids;
  for (const auto& x : c) ids.push_back(x.id);
  return ids;
}

std::vector<float> random_row(std::mt19937& rng, size_t n, float spread, bool with_ties) {
  std::normal_distribution<float> normal(0.f, spread);
  std::vector<float> row(n);
  for (auto& v : row) v = with_ties ? std::round(normal(rng)) : normal(rng);
  row[n / 3] = -std::numeric_limits<float>::infinity();  // a masked token
  return row;
}

TEST(CandidateFilters, SelectTopKEqualsFullSortPrefix) {
  std::mt19937 rng(1);
  for (size_t n : {1u, 5u, 1000u, 40000u})
    for (size_t k : {1u, 3u, 40u, 999u})
      for (bool ties : {false, true}) {
        const auto row = random_row(rng, n, 3.f, ties);
        std::vector<TokenLogit> got;
        select_top_k(row, k, got);
        auto want = all_sorted(row);
        want.resize(std::min(k, want.size()));
        ASSERT_EQ(got.size(), want.size()) << n << " " << k;
        for (size_t i = 0; i < want.size(); ++i) {
          EXPECT_EQ(got[i].id, want[i].id) << "n " << n << " k " << k << " rank " << i;
        }
      }
}

TEST(CandidateFilters, BucketedTopPEqualsSortedWalk) {
  std::mt19937 rng(2);
  std::vector<float> weights;
  std::vector<draw::Mass> buckets;
  for (size_t n : {2u, 100u, 30000u})
    for (float spread : {0.1f, 2.f, 20.f})
      for (double p : {1e-4, 0.3, 0.9, 0.999})
        for (bool ties : {false, true}) {
          const auto row = random_row(rng, n, spread, ties);
          auto want = all_sorted(row);
          keep_top_p(want, p, /*sorted=*/true, weights, buckets);

          std::vector<TokenLogit> got;
          select_at_least(row, -std::numeric_limits<double>::infinity(), got);
          keep_top_p(got, p, /*sorted=*/false, weights, buckets);
          ASSERT_EQ(got.size(), want.size()) << "n " << n << " spread " << spread << " p " << p;
          EXPECT_EQ(ids_sorted_by_rank(got), ids_sorted_by_rank(want));
          EXPECT_GE(got.size(), 1u);
        }
}

TEST(CandidateFilters, SelectAtLeastSkipsMaskedAndLowTokens) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<TokenLogit> got;
  select_at_least(std::vector<float>{1.f, -inf, 3.f, 0.5f, 2.f}, 1.0, got);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].id, 0);
  EXPECT_EQ(got[1].id, 2);
  EXPECT_EQ(got[2].id, 4);
}

TEST(CandidateFilters, MinPKeepsOrder) {
  std::vector<TokenLogit> c{{5, 0.f}, {2, 2.f}, {9, -3.f}, {1, 1.5f}};
  keep_min_p(c, std::exp(-1.0));  // keep logit >= 2 - 1
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].id, 2);
  EXPECT_EQ(c[1].id, 1);
}

}  // namespace
}  // namespace fdl::detail
