// Paged attention with token trees and sliding windows (kernels.h: AttentionMasks) against a
// double-precision reference: in one launch, trees of 1..64 nodes (random shapes: chains and
// branches that leave slot order) next to plain decode tokens and prefill runs of other
// sequences, over scattered block tables filled with random K/V (the slots of other branches,
// and before a window, hold values that would show up in the output if the mask let them
// through). Every kernel's masked variant: per token (several split counts), fp32 tiles and
// tensor-core tiles of both sizes; with a window, also without trees (the same tokens as
// prefill runs).
#include <algorithm>
#include <bit>
#include <iostream>
#include <numeric>

#include "backend/cuda/kernels.h"
#include "gpu/gpu_test_util.h"

namespace fdl::test {
namespace {

struct TreeShape {
  int n_head, n_head_kv, head_dim, block_size;
  int window = 0;  ///< sliding window (> 64, the deepest tree); 0 = none
};

constexpr int kLayers = 2, kLayer = 1;

/// The batch as the CUDA model uploads it for a step with trees: per token its KV slot (the
/// position the kernels see), the first slot after its tree's root and its ancestor mask
/// (ordinary tokens: slot + 1 and 0); the output computed in double on the host.
struct TreeProblem {
  std::vector<float> arena, q;
  std::vector<int32_t> tables, slots, table_off, token_seq, base, first;
  std::vector<uint32_t> mask;  // two words per token
  std::vector<double> ref;
  int n = 0;
  int64_t block_stride = 0;
  float scale = 1.f;
};

/// `trees` false: the tree sequences' tokens are plain prefill runs over the same slots.
TreeProblem make_tree_problem(const TreeShape& c, bool trees) {
  const int kv_dim = c.n_head_kv * c.head_dim;
  std::uniform_int_distribution<int> ctx_dist(1, 300), width_dist(1, 20), coin(0, 1);
  // Sequences 0..3 hold trees (0: 64 nodes, the masks' limit; 1: one node), 4 a prefill run
  // of 37 tokens, 5 a decode token.
  const int n_seqs = 6;
  TreeProblem pb;
  std::vector<int> lens(n_seqs);
  std::vector<std::vector<int32_t>> parents(n_seqs);  // per tree sequence: node i's parent (0 = root)
  for (int s = 0; s < n_seqs; ++s) {
    const int ctx = ctx_dist(rng());  // committed positions before the step's first token
    if (s < 4) {
      const int w = s == 0 ? 64 : s == 1 ? 1 : width_dist(rng());
      parents[size_t(s)].assign(1, -1);
      for (int i = 1; i <= w; ++i) {  // chains half the time, else any earlier node
        std::uniform_int_distribution<int> any(0, i - 1);
        parents[size_t(s)].push_back(coin(rng()) ? i - 1 : any(rng()));
      }
      lens[size_t(s)] = ctx + w + 1;
    } else {
      lens[size_t(s)] = ctx + (s == 4 ? 37 : 1);
    }
  }
  int total_blocks = 0;
  for (int l : lens) total_blocks += (l + c.block_size - 1) / c.block_size;
  std::vector<int32_t> ids(size_t(total_blocks) + 3);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng());  // scattered physical blocks
  pb.block_stride = int64_t(kLayers) * 2 * c.block_size * kv_dim;
  pb.arena = random_floats(ids.size() * size_t(pb.block_stride), -2.f, 2.f);

  size_t next = 0;
  for (int s = 0; s < n_seqs; ++s) {
    const int off = int(pb.tables.size());
    for (int b = 0; b < (lens[size_t(s)] + c.block_size - 1) / c.block_size; ++b) pb.tables.push_back(ids[next++]);
    const auto add = [&](int32_t slot, int32_t base, uint64_t mask) {
      if (!trees) base = slot + 1, mask = 0;
      // The window over the RoPE position: the root's slot plus the node's depth.
      const int32_t pos = base - 1 + int32_t(std::popcount(mask));
      pb.first.push_back(c.window > 0 ? std::max(0, pos - c.window + 1) : 0);
      pb.slots.push_back(slot);
      pb.table_off.push_back(off);
      pb.token_seq.push_back(s);
      pb.base.push_back(base);
      pb.mask.push_back(uint32_t(mask));
      pb.mask.push_back(uint32_t(mask >> 32));
    };
    if (s < 4) {
      const std::vector<int32_t>& par = parents[size_t(s)];
      const int32_t root = lens[size_t(s)] - int32_t(par.size());
      std::vector<uint64_t> m(par.size(), 0);
      add(root, root + 1, 0);
      for (size_t i = 1; i < par.size(); ++i) {
        m[i] = (par[i] == 0 ? 0 : m[size_t(par[i])]) | uint64_t(1) << (i - 1);
        add(root + int32_t(i), root + 1, m[i]);
      }
    } else {
      const int run = s == 4 ? 37 : 1;
      for (int p = lens[size_t(s)] - run; p < lens[size_t(s)]; ++p) add(p, p + 1, 0);
    }
  }
  pb.n = int(pb.slots.size());
  pb.q = random_floats(size_t(pb.n) * c.n_head * c.head_dim);
  pb.scale = 1.0f / std::sqrt(float(c.head_dim));

  pb.ref.assign(pb.q.size(), 0.0);
  const int group = c.n_head / c.n_head_kv;
  const auto at = [&](int t, int j, bool v) {
    const int64_t blk = pb.tables[size_t(pb.table_off[size_t(t)] + j / c.block_size)];
    return pb.arena.data() + blk * pb.block_stride + int64_t(kLayer) * 2 * c.block_size * kv_dim +
           int64_t((v ? c.block_size : 0) + j % c.block_size) * kv_dim;
  };
  for (int t = 0; t < pb.n; ++t) {
    const uint64_t mask = uint64_t(pb.mask[2 * size_t(t)]) | uint64_t(pb.mask[2 * size_t(t) + 1]) << 32;
    std::vector<int> keys;  // the slots token t reads
    for (int j = pb.first[size_t(t)]; j <= pb.slots[size_t(t)]; ++j)
      if (j < pb.base[size_t(t)] || ((mask >> (j - pb.base[size_t(t)])) & 1)) keys.push_back(j);
    for (int h = 0; h < c.n_head; ++h) {
      const int g = h / group;
      std::vector<double> s(keys.size());
      for (size_t i = 0; i < keys.size(); ++i) {
        const float* k = at(t, keys[i], false) + g * c.head_dim;
        double d = 0;
        for (int x = 0; x < c.head_dim; ++x) d += double(pb.q[(size_t(t) * c.n_head + h) * c.head_dim + x]) * k[x];
        s[i] = d * pb.scale;
      }
      const double mx = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (size_t i = 0; i < keys.size(); ++i) {
        const float* v = at(t, keys[i], true) + g * c.head_dim;
        for (int x = 0; x < c.head_dim; ++x) pb.ref[(size_t(t) * c.n_head + h) * c.head_dim + x] += s[i] / sum * v[x];
      }
    }
  }
  return pb;
}

class PagedAttentionMasks : public ::testing::TestWithParam<TreeShape> {};

TEST_P(PagedAttentionMasks, EveryKernelMatchesDoubleReference) {
  FDL_SKIP_WITHOUT_GPU();
  const TreeShape c = GetParam();
  for (const bool trees : {true, false}) {
    if (!trees && c.window == 0) return;  // nothing masked
    SCOPED_TRACE(trees ? "trees" : "no trees");
    const TreeProblem pb = make_tree_problem(c, trees);
    const int n = pb.n, kv_dim = c.n_head_kv * c.head_dim, group = c.n_head / c.n_head_kv;
    auto arena = to_device(pb.arena);
    auto q = to_device(pb.q);
    auto slots = to_device(pb.slots), off = to_device(pb.table_off), tab = to_device(pb.tables),
         base = to_device(pb.base);
    auto mask = to_device(pb.mask);
    auto first = to_device(pb.first);
    const cuda::AttentionMasks tree{trees ? base.get() : nullptr, trees ? mask.get() : nullptr,
                                    c.window > 0 ? first.get() : nullptr};
    int sm = 0;
    FDL_CUDA_CHECK(cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, 0));
    const int max_ctx = *std::max_element(pb.slots.begin(), pb.slots.end()) + 1;
    // Runs `a` (tiles and splits set by the caller) and returns the error against the reference.
    const auto run = [&](cuda::AttentionArgs a) {
      cuda::DeviceBuffer<float> out(pb.q.size()),
          partial(cuda::attention_partial_floats(n, c.n_head, c.head_dim, a.n_splits));
      poison(out);
      poison(partial);
      a.kv = cuda::KvLayerView{arena.get(), int64_t(kLayer) * 2 * c.block_size * kv_dim, pb.block_stride,
                               c.block_size, c.n_head_kv, c.head_dim};
      a.q = q.get();
      a.out = out.get();
      a.positions = slots.get();
      a.table_off = off.get();
      a.tables = tab.get();
      a.n_tokens = n;
      a.n_head = c.n_head;
      a.scale = pb.scale;
      a.partial = partial.get();
      cuda::paged_attention(a, nullptr, tree);
      return rel_error(to_host(out, pb.q.size()), pb.ref);
    };
    for (int splits : {1, 7, cuda::attention_splits(n, c.n_head, c.n_head_kv, sm, max_ctx)}) {
      cuda::AttentionArgs a;
      a.n_splits = splits;
      EXPECT_LT(run(a), 2e-6) << "per token, splits " << splits;
    }
    if (!cuda::attention_tiles_supported(c.head_dim, c.n_head, c.n_head_kv)) continue;
    // Tiles as the model forms them: runs of consecutive slots, a tree with its root.
    std::vector<int32_t> starts(size_t(n) + 1);
    const int n_tiles = cuda::attention_tiles(pb.token_seq.data(), pb.slots.data(), n, c.n_head, c.n_head_kv, starts.data());
    starts.resize(size_t(n_tiles) + 1);
    const auto tiled = [&](const std::vector<int32_t>& st, int splits, bool tc, bool bf16, int max_rows) {
      auto dstarts = to_device(st);
      cuda::AttentionArgs a;
      a.n_splits = splits;
      a.tile_starts = dstarts.get();
      a.n_tiles = int(st.size()) - 1;
      a.tensor_cores = tc;
      a.tc_bf16 = bf16;
      a.max_tile_rows = max_rows;
      return run(a);
    };
    for (int splits : {1, 3, cuda::attention_tile_splits(n_tiles, c.n_head_kv, sm, max_ctx)}) {
      EXPECT_LT(tiled(starts, splits, false, false, 0), 2e-6) << "fp32 tiles, splits " << splits;
      for (bool bf16 : {false, true}) {
        const double err = tiled(starts, splits, true, bf16, 0);
        std::cout << "  tensor-core tiles (" << (bf16 ? "bf16" : "fp16") << "), splits " << splits << ": rel error "
                  << err << "\n";
        EXPECT_LT(err, bf16 ? 1.5e-2 : 4e-3) << "tensor-core tiles, splits " << splits << " bf16=" << bf16;
      }
    }
    if (group > 16) continue;
    // Tiles of <= 16 rows: the tensor-core kernel that splits each chunk over its warps.
    for (int tile_tokens : {1, 16 / group}) {
      std::vector<int32_t> st;
      for (int t = 0; t < n; ++t)
        if (t == 0 || pb.token_seq[size_t(t)] != pb.token_seq[size_t(t) - 1] ||
            pb.slots[size_t(t)] != pb.slots[size_t(t) - 1] + 1 || t - st.back() == tile_tokens)
          st.push_back(t);
      const int nt = int(st.size());
      st.push_back(n);
      for (bool bf16 : {false, true})
        for (int splits : {1, 3, cuda::attention_tile_splits(nt, c.n_head_kv, sm, max_ctx)}) {
          const double err = tiled(st, splits, true, bf16, tile_tokens * group);
          EXPECT_LT(err, bf16 ? 1.5e-2 : 4e-3)
              << "tensor-core decode tiles of " << tile_tokens << " token(s), splits " << splits << " bf16=" << bf16;
        }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedAttentionMasks,
                         ::testing::Values(TreeShape{32, 8, 128, 16}, TreeShape{8, 8, 128, 16},
                                           TreeShape{6, 2, 64, 16}, TreeShape{6, 2, 64, 5}, TreeShape{8, 4, 8, 7},
                                           TreeShape{3, 1, 4, 1}, TreeShape{32, 8, 128, 16, 100},
                                           TreeShape{6, 2, 64, 5, 65}, TreeShape{8, 4, 8, 7, 90}),
                         [](const auto& info) {
                           const TreeShape& c = info.param;
                           return attention_shape_name(c.n_head, c.n_head_kv, c.head_dim, c.block_size) +
                                  (c.window > 0 ? "_window" + std::to_string(c.window) : "");
                         });

}  // namespace
}  // namespace fdl::test
