// Paged attention (attention.h): the properties batch invariance rests on, for both kernel
// sets. A token's output may depend only on its own query, position and K/V contents — not
// on how the positions are laid out in blocks (the AVX2 kernel scores four positions of a
// block at a time and the rest one by one), nor on how many query heads share its KV head
// (it scores up to three heads at once and sums V for up to four). Accuracy against a dense
// double reference is tests/model/cpu_ops_test.cpp's.
#include "backend/cpu/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cpu_test_util.h"

namespace fdl::cpu {
namespace {

using test::KernelSetGuard;
using test::random_floats;

/// A KV arena of one layer holding `n_pos` positions of `n_kv` heads in blocks of
/// `block_size` slots, the blocks in scrambled order.
struct Arena {
  int block_size, n_kv, hd;
  int64_t block_stride;  // floats per block (K or V)
  std::vector<float> k, v;
  std::vector<int32_t> table;
  Arena(int bs, int n_kv_, int hd_, int n_pos, const std::vector<float>& k_dense, const std::vector<float>& v_dense)
      : block_size(bs), n_kv(n_kv_), hd(hd_), block_stride(int64_t(bs) * n_kv_ * hd_) {
    const int n_blocks = (n_pos + bs - 1) / bs;
    for (int b = 0; b < n_blocks; ++b) table.push_back(n_blocks - 1 - b);  // reversed: not 0, 1, 2, ...
    k.assign(size_t(n_blocks * block_stride), 0.f);
    v.assign(k.size(), 0.f);
    const int64_t slot = int64_t(n_kv) * hd;
    for (int p = 0; p < n_pos; ++p) {
      const int64_t at = table[size_t(p / bs)] * block_stride + (p % bs) * slot;
      std::memcpy(k.data() + at, k_dense.data() + p * slot, size_t(slot) * sizeof(float));
      std::memcpy(v.data() + at, v_dense.data() + p * slot, size_t(slot) * sizeof(float));
    }
  }
};

/// Attention of tokens at `positions` with `n_head` query heads over the arena.
std::vector<float> attend(const Arena& a, int n_head, const std::vector<float>& q, const std::vector<int32_t>& positions,
                          int threads, int window = 0) {
  std::vector<float> out(q.size(), std::nanf(""));
  std::vector<const int32_t*> tables(positions.size(), a.table.data());
  PagedAttentionArgs args;
  args.kv = {a.k.data(), a.v.data(), a.block_stride, a.block_size};
  args.n_tokens = int64_t(positions.size());
  args.n_head = n_head;
  args.n_head_kv = a.n_kv;
  args.head_dim = a.hd;
  args.scale = 1.f / std::sqrt(float(a.hd));
  args.q = q.data();
  args.block_tables = tables.data();
  args.positions = positions.data();
  args.out = out.data();
  args.window = window;
  ThreadPool pool(threads);
  AttentionScratch scratch;
  paged_attention(pool, args, scratch);
  return out;
}

class AttentionTest : public ::testing::TestWithParam<bool> {
 protected:
  bool portable() const { return GetParam(); }
  void SetUp() override {
    if (!portable() && !use_avx2_kernels()) GTEST_SKIP() << "AVX2 kernels unavailable here";
  }
};

TEST_P(AttentionTest, OutputDoesNotDependOnBlockLayoutOrThreads) {
  KernelSetGuard guard(portable());
  const int n_pos = 77, n_kv = 2;
  for (int hd : {1, 3, 8, 12, 16, 64, 75}) {
    const int n_head = 2 * n_kv;
    const auto kd = random_floats(size_t(n_pos * n_kv * hd), 3 + hd), vd = random_floats(kd.size(), 5 + hd);
    const std::vector<int32_t> positions{0, 3, 4, 31, 76};
    const auto q = random_floats(positions.size() * n_head * hd, 7 + hd, 2.f);
    const Arena base(1, n_kv, hd, n_pos, kd, vd);
    const auto ref = attend(base, n_head, q, positions, 1);
    for (int bs : {3, 4, 16, 80})
      for (int threads : {1, 3}) {
        const auto out = attend(Arena(bs, n_kv, hd, n_pos, kd, vd), n_head, q, positions, threads);
        ASSERT_EQ(std::memcmp(out.data(), ref.data(), out.size() * sizeof(float)), 0)
            << "head dim " << hd << " block size " << bs << " threads " << threads;
      }
  }
}

TEST_P(AttentionTest, HeadOutputDoesNotDependOnGroupSize) {
  // GQA groups of 1..7 query heads per KV head, every head of a group a copy of the same
  // query: each must give the bits of the 1-head (MHA) run.
  KernelSetGuard guard(portable());
  const int n_pos = 45, n_kv = 2;
  for (int hd : {8, 16, 64, 75}) {
    const auto kd = random_floats(size_t(n_pos * n_kv * hd), 11 + hd), vd = random_floats(kd.size(), 13 + hd);
    const Arena arena(16, n_kv, hd, n_pos, kd, vd);
    const std::vector<int32_t> positions{44, 9};
    const auto q1 = random_floats(positions.size() * n_kv * hd, 17 + hd, 2.f);
    const auto ref = attend(arena, n_kv, q1, positions, 1);
    for (int group = 2; group <= 7; ++group) {
      const int n_head = group * n_kv;
      std::vector<float> q(positions.size() * size_t(n_head) * hd);
      for (size_t t = 0; t < positions.size(); ++t)
        for (int h = 0; h < n_head; ++h)
          std::memcpy(q.data() + (t * n_head + h) * hd, q1.data() + (t * n_kv + h / group) * hd, hd * sizeof(float));
      const auto out = attend(arena, n_head, q, positions, 1);
      for (size_t t = 0; t < positions.size(); ++t)
        for (int h = 0; h < n_head; ++h)
          ASSERT_EQ(std::memcmp(out.data() + (t * n_head + h) * hd, ref.data() + (t * n_kv + h / group) * hd,
                                hd * sizeof(float)),
                    0)
              << "head dim " << hd << " group " << group << " token " << t << " head " << h;
    }
  }
}

TEST_P(AttentionTest, HeadOutputDoesNotDependOnKvHeadCount) {
  // Small heads are processed several KV heads per work item (the V sums as independent
  // lanes), how many depending on the thread count: each head must still give the bits of a
  // model that has only that KV head. Tokens form one run (a verification window), GQA
  // groups of 1 and 2.
  KernelSetGuard guard(portable());
  const int n_pos = 70;
  const std::vector<int32_t> positions{64, 65, 66, 67, 68, 69};
  for (int hd : {8, 16, 24, 32, 64})
    for (int group : {1, 2})
      for (int n_kv : {1, 3, 4, 8}) {
        const int n_head = group * n_kv;
        const int64_t slot = int64_t(n_kv) * hd;
        const auto kd = random_floats(size_t(n_pos * slot), 19 + hd), vd = random_floats(kd.size(), 23 + hd);
        const auto q = random_floats(positions.size() * n_head * hd, 29 + hd, 2.f);
        const Arena arena(16, n_kv, hd, n_pos, kd, vd);
        for (int threads : {1, 2}) {
          const auto out = attend(arena, n_head, q, positions, threads);
          for (int c = 0; c < n_kv; ++c) {
            // KV head c alone: its K/V columns, its query heads.
            std::vector<float> k1(size_t(n_pos * hd)), v1(k1.size()), q1(positions.size() * group * hd);
            for (int p = 0; p < n_pos; ++p) {
              std::memcpy(k1.data() + p * hd, kd.data() + p * slot + c * hd, hd * sizeof(float));
              std::memcpy(v1.data() + p * hd, vd.data() + p * slot + c * hd, hd * sizeof(float));
            }
            for (size_t t = 0; t < positions.size(); ++t)
              std::memcpy(q1.data() + t * group * hd, q.data() + (t * n_head + c * group) * hd,
                          size_t(group) * hd * sizeof(float));
            const auto ref = attend(Arena(16, 1, hd, n_pos, k1, v1), group, q1, positions, 1);
            for (size_t t = 0; t < positions.size(); ++t)
              ASSERT_EQ(std::memcmp(out.data() + (t * n_head + c * group) * hd, ref.data() + t * group * hd,
                                    size_t(group) * hd * sizeof(float)),
                        0)
                  << "head dim " << hd << " group " << group << " kv heads " << n_kv << " kv head " << c
                  << " token " << t << " threads " << threads;
          }
        }
      }
}

// Tree tokens (PagedAttentionArgs::tree_slots): a token reading slots 0..base-1 and then
// the slot list S must give the bits of an ordinary token at position base + |S| - 1 over an
// arena whose rows are laid out in that order — next to ordinary tokens of the same table
// (the tree token is cut out of their run), for any block size, thread count and group size.
TEST_P(AttentionTest, TreeSlotListsEqualADenseLayoutOfThePath) {
  KernelSetGuard guard(portable());
  const int base = 37, window = 9, n_phys = base + window;
  const std::vector<int32_t> path{base + 4, base + 7, base + 8};  // ancestors' and own slots
  for (int hd : {8, 16, 64, 75})
    for (int group : {1, 3}) {
      const int n_kv = 2, n_head = group * n_kv;
      const int64_t slot = int64_t(n_kv) * hd;
      const auto kd = random_floats(size_t(n_phys * slot), 19 + hd), vd = random_floats(kd.size(), 23 + hd);
      // The dense path: rows 0..base-1, then the rows of `path`.
      const int n_path = base + int(path.size());
      std::vector<float> kp(size_t(n_path * slot)), vp(kp.size());
      for (int j = 0; j < n_path; ++j) {
        const int src = j < base ? j : path[size_t(j - base)];
        std::memcpy(kp.data() + j * slot, kd.data() + src * slot, size_t(slot) * sizeof(float));
        std::memcpy(vp.data() + j * slot, vd.data() + src * slot, size_t(slot) * sizeof(float));
      }
      const auto q = random_floats(3 * size_t(n_head) * hd, 29 + hd, 2.f);  // 3 tokens
      const std::vector<float> q_tree(q.begin() + n_head * hd, q.begin() + 2 * n_head * hd);
      const auto want = attend(Arena(16, n_kv, hd, n_path, kp, vp), n_head, q_tree, {n_path - 1}, 1);
      for (int bs : {3, 16})
        for (int threads : {1, 3}) {
          const Arena arena(bs, n_kv, hd, n_phys, kd, vd);
          // Tokens: ordinary at base + 1, the tree token, ordinary at base + 5 (one table).
          const std::vector<int32_t> positions{base + 1, n_path - 1, base + 5};
          const std::vector<int32_t> tree_base{0, base, 0};
          const std::vector<const int32_t*> tree_slots{nullptr, path.data(), nullptr};
          std::vector<float> out(q.size(), std::nanf(""));
          std::vector<const int32_t*> tables(positions.size(), arena.table.data());
          PagedAttentionArgs args;
          args.kv = {arena.k.data(), arena.v.data(), arena.block_stride, arena.block_size};
          args.n_tokens = 3;
          args.n_head = n_head;
          args.n_head_kv = n_kv;
          args.head_dim = hd;
          args.scale = 1.f / std::sqrt(float(hd));
          args.q = q.data();
          args.block_tables = tables.data();
          args.positions = positions.data();
          args.out = out.data();
          args.tree_slots = tree_slots.data();
          args.tree_base = tree_base.data();
          ThreadPool pool(threads);
          AttentionScratch scratch;
          paged_attention(pool, args, scratch);
          ASSERT_EQ(std::memcmp(out.data() + n_head * hd, want.data(), want.size() * sizeof(float)), 0)
              << "head dim " << hd << " group " << group << " block size " << bs << " threads " << threads;
          const auto plain = attend(arena, n_head, q, {base + 1, base + 2, base + 5}, threads);
          for (int t : {0, 2})
            ASSERT_EQ(std::memcmp(out.data() + t * n_head * hd, plain.data() + t * n_head * hd,
                                  size_t(n_head) * hd * sizeof(float)),
                      0)
                << "ordinary token " << t << " next to the tree token";
          // A sliding window over the path's virtual positions: from below the tree (10) and
          // from inside it (2: the last ancestor and the token itself).
          for (const int window : {10, 2}) {
            args.window = window;
            paged_attention(pool, args, scratch);
            const auto want_w = attend(Arena(16, n_kv, hd, n_path, kp, vp), n_head, q_tree, {n_path - 1}, 1, window);
            ASSERT_EQ(std::memcmp(out.data() + n_head * hd, want_w.data(), want_w.size() * sizeof(float)), 0)
                << "window " << window << " head dim " << hd << " group " << group << " block size " << bs;
          }
        }
    }
}

// A sliding window (PagedAttentionArgs::window): a token at p attends to (p - window, p] only.
// Starting at a multiple of 8 (the softmax lanes are positions mod 8), its output equals, bit for
// bit, that of a token whose context holds only those rows; every token of a run (a prompt chunk
// with first positions in different blocks) agrees with a double-precision reference; a window
// covering the whole context changes nothing.
TEST_P(AttentionTest, SlidingWindowReadsOnlyItsPositions) {
  KernelSetGuard guard(portable());
  const int n_pos = 44;
  for (int hd : {8, 16, 64, 75})
    for (int group : {1, 3}) {
      const int n_kv = 2, n_head = group * n_kv;
      const int64_t slot = int64_t(n_kv) * hd;
      const auto kd = random_floats(size_t(n_pos * slot), 31 + hd), vd = random_floats(kd.size(), 37 + hd);
      const std::vector<int32_t> positions{37, 38, 39, 40, 41, 42, 43};  // one sequence's run
      const auto q = random_floats(positions.size() * size_t(n_head) * hd, 41 + hd, 2.f);
      const int window = 14;  // token 0 reads 24..37
      const std::vector<float> kw(kd.begin() + 24 * slot, kd.begin() + 38 * slot), vw(vd.begin() + 24 * slot, vd.begin() + 38 * slot);
      const std::vector<float> q0(q.begin(), q.begin() + n_head * hd);
      const auto want0 = attend(Arena(16, n_kv, hd, 14, kw, vw), n_head, q0, {13}, 1);
      for (int bs : {3, 16})
        for (int threads : {1, 3}) {
          const Arena arena(bs, n_kv, hd, n_pos, kd, vd);
          const auto got = attend(arena, n_head, q, positions, threads, window);
          ASSERT_EQ(std::memcmp(got.data(), want0.data(), want0.size() * sizeof(float)), 0)
              << "head dim " << hd << " group " << group << " block size " << bs << " threads " << threads;
          for (size_t t = 0; t < positions.size(); ++t)
            for (int h = 0; h < n_head; ++h) {
              const int p = positions[t], lo = p - window + 1, kvh = h / group;
              const float* qh = q.data() + (t * n_head + h) * hd;
              std::vector<double> w;
              double mx = -INFINITY, sum = 0;
              for (int j = lo; j <= p; ++j) {
                double d = 0;
                for (int i = 0; i < hd; ++i) d += double(qh[i]) * kd[j * slot + kvh * hd + i];
                w.push_back(d / std::sqrt(double(hd)));
                mx = std::max(mx, w.back());
              }
              for (double& x : w) sum += (x = std::exp(x - mx));
              for (int i = 0; i < hd; ++i) {
                double o = 0;
                for (int j = lo; j <= p; ++j) o += w[size_t(j - lo)] / sum * vd[j * slot + kvh * hd + i];
                ASSERT_NEAR(got[(t * n_head + h) * hd + i], o, 2e-5) << "token " << t << " head " << h << " dim " << i;
              }
            }
          const auto full = attend(arena, n_head, q, positions, threads);
          ASSERT_EQ(attend(arena, n_head, q, positions, threads, n_pos), full) << "a window of the whole context";
        }
    }
}

INSTANTIATE_TEST_SUITE_P(KernelSets, AttentionTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "portable" : "avx2"; });

}  // namespace
}  // namespace fdl::cpu
