// Paged attention against a double-precision reference: many sequences of different lengths
// in one launch, a mix of prefill chunks and single decode tokens, scattered block tables,
// GQA groups smaller and larger than one block's head group, and several split counts;
// the prefill tiles on CUDA cores (fp32) and, in a test of their own, on tensor cores (fp16 mma);
// and every kernel over a 16-bit (fp16 / bf16) cache.
#include <algorithm>
#include <cstring>
#include <iostream>
#include <numeric>

#include "backend/cuda/kernels.h"
#include "gpu/gpu_test_util.h"

namespace fdl::test {
namespace {

struct AttnCase {
  int n_head, n_head_kv, head_dim, block_size;
};

class PagedAttention : public ::testing::TestWithParam<AttnCase> {};

constexpr int kLayers = 2, kLayer = 1;

/// Random sequences, block tables, K/V arena and queries for case `c`, and the attention
/// output computed in double on the host.
struct Problem {
  std::vector<float> arena, q;
  std::vector<int32_t> tables, positions, table_off, token_seq;
  std::vector<double> ref;
  int n = 0, n_seqs = 0;
  int64_t block_stride = 0;
  float scale = 1.f;
};

/// kv_dtype: the arena's values are rounded to it (the reference then sees what a cache of
/// that dtype holds).
Problem make_problem(const AttnCase& c, KvDtype kv_dtype = KvDtype::F32) {
  const int n_layer = kLayers, layer = kLayer, kv_dim = c.n_head_kv * c.head_dim;
  std::uniform_int_distribution<int> len_dist(1, 700);
  const int n_seqs = 9;
  std::vector<int> lens(n_seqs);
  for (int& l : lens) l = len_dist(rng());
  lens[0] = 1;  // a sequence with a single position
  int total_blocks = 0;
  for (int l : lens) total_blocks += (l + c.block_size - 1) / c.block_size;
  std::vector<int32_t> ids(size_t(total_blocks) + 5);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng());  // scattered physical blocks
  const int64_t block_stride = int64_t(n_layer) * 2 * c.block_size * kv_dim;
  std::vector<float> arena = random_floats(ids.size() * size_t(block_stride), -2.f, 2.f);
  for (float& x : arena) x = kv_round(kv_dtype, x);

  // Tables, concatenated; tokens: the last 1..6 positions of each sequence.
  std::vector<int32_t> tables, positions, table_off;
  std::vector<int32_t> token_seq;
  size_t next = 0;
  for (int s = 0; s < n_seqs; ++s) {
    const int off = int(tables.size());
    for (int b = 0; b < (lens[size_t(s)] + c.block_size - 1) / c.block_size; ++b) tables.push_back(ids[next++]);
    // Decode-like single tokens and prefill-like runs of up to 70 positions.
    const int chunk = std::min(lens[size_t(s)], 1 + (s * 29) % 70);
    for (int p = lens[size_t(s)] - chunk; p < lens[size_t(s)]; ++p) {
      positions.push_back(p);
      table_off.push_back(off);
      token_seq.push_back(s);
    }
  }
  const int n = int(positions.size());
  const auto q = random_floats(size_t(n) * c.n_head * c.head_dim);
  const float scale = 1.0f / std::sqrt(float(c.head_dim));

  std::vector<double> ref(q.size());
  const int group = c.n_head / c.n_head_kv;
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < c.n_head; ++h) {
      const int g = h / group;
      std::vector<double> s(size_t(positions[size_t(t)]) + 1);
      for (int j = 0; j <= positions[size_t(t)]; ++j) {
        const int64_t blk = tables[size_t(table_off[size_t(t)] + j / c.block_size)];
        const float* k = arena.data() + blk * block_stride + int64_t(layer) * 2 * c.block_size * kv_dim +
                         int64_t(j % c.block_size) * kv_dim + g * c.head_dim;
        double d = 0;
        for (int i = 0; i < c.head_dim; ++i) d += double(q[(size_t(t) * c.n_head + h) * c.head_dim + i]) * k[i];
        s[size_t(j)] = d * scale;
      }
      const double mx = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double& x : s) sum += (x = std::exp(x - mx));
      for (int j = 0; j <= positions[size_t(t)]; ++j) {
        const int64_t blk = tables[size_t(table_off[size_t(t)] + j / c.block_size)];
        const float* v = arena.data() + blk * block_stride + int64_t(layer) * 2 * c.block_size * kv_dim +
                         int64_t(c.block_size + j % c.block_size) * kv_dim + g * c.head_dim;
        for (int i = 0; i < c.head_dim; ++i) ref[(size_t(t) * c.n_head + h) * c.head_dim + i] += s[size_t(j)] / sum * v[i];
      }
    }

  Problem pb;
  pb.arena = arena;
  pb.q = q;
  pb.tables = tables;
  pb.positions = positions;
  pb.table_off = table_off;
  pb.token_seq = token_seq;
  pb.ref = ref;
  pb.n = n;
  pb.n_seqs = n_seqs;
  pb.block_stride = block_stride;
  pb.scale = scale;
  return pb;
}

/// The problem's inputs on the device (the arena as a cache of `kv_dtype`), and AttentionArgs
/// over them.
struct DeviceProblem {
  explicit DeviceProblem(const Problem& pb, KvDtype kv_dtype = KvDtype::F32)
      : arena(to_device(kv_bytes(kv_dtype, pb.arena))), q(to_device(pb.q)), pos(to_device(pb.positions)),
        off(to_device(pb.table_off)), tab(to_device(pb.tables)), dtype(kv_dtype) {}
  cuda::AttentionArgs args(const AttnCase& c, const Problem& pb, int splits, float* out, float* partial) const {
    const int kv_dim = c.n_head_kv * c.head_dim;
    cuda::AttentionArgs a;
    a.kv = cuda::KvLayerView{arena.get(), int64_t(kLayer) * 2 * c.block_size * kv_dim, pb.block_stride, c.block_size,
                             c.n_head_kv, c.head_dim, dtype};
    a.q = q.get();
    a.out = out;
    a.positions = pos.get();
    a.table_off = off.get();
    a.tables = tab.get();
    a.n_tokens = pb.n;
    a.n_head = c.n_head;
    a.scale = pb.scale;
    a.n_splits = splits;
    a.partial = partial;
    return a;
  }
  cuda::DeviceBuffer<uint8_t> arena;
  cuda::DeviceBuffer<float> q;
  cuda::DeviceBuffer<int32_t> pos, off, tab;
  KvDtype dtype;
};

TEST_P(PagedAttention, ManySequencesMatchDoubleReference) {
  FDL_SKIP_WITHOUT_GPU();
  const AttnCase c = GetParam();
  const Problem pb = make_problem(c);
  const int n = pb.n, n_seqs = pb.n_seqs;
  const std::vector<float>& q = pb.q;
  const std::vector<int32_t>&positions = pb.positions, &token_seq = pb.token_seq;
  const std::vector<double>& ref = pb.ref;
  const DeviceProblem dev(pb);
  int sm = 0;
  FDL_CUDA_CHECK(cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, 0));
  for (int splits : {1, 7, cuda::attention_splits(n, c.n_head, c.n_head_kv, sm, 701)}) {
    cuda::DeviceBuffer<float> out(q.size()), partial(cuda::attention_partial_floats(n, c.n_head, c.head_dim, splits));
    poison(out);
    poison(partial);
    cuda::AttentionArgs a = dev.args(c, pb, splits, out.get(), partial.get());
    cuda::paged_attention(a, nullptr);
    EXPECT_LT(rel_error(to_host(out, q.size()), ref), 2e-6) << "splits=" << splits << " tokens=" << n;
  }
  if (cuda::attention_tiles_supported(c.head_dim, c.n_head, c.n_head_kv)) {
    std::vector<int32_t> starts(size_t(n) + 1);
    const int n_tiles = cuda::attention_tiles(token_seq.data(), positions.data(), n, c.n_head, c.n_head_kv, starts.data());
    EXPECT_GE(n_tiles, n_seqs);
    auto dstarts = to_device(starts);
    for (int splits : {1, 3, cuda::attention_tile_splits(n_tiles, c.n_head_kv, sm, 701)}) {
      cuda::DeviceBuffer<float> out(q.size()), partial(cuda::attention_partial_floats(n, c.n_head, c.head_dim, splits));
      poison(out);
      poison(partial);
      cuda::AttentionArgs a = dev.args(c, pb, splits, out.get(), partial.get());
      a.tile_starts = dstarts.get();
      a.n_tiles = n_tiles;
      cuda::paged_attention(a, nullptr);
      EXPECT_LT(rel_error(to_host(out, q.size()), ref), 2e-6) << "tiled, splits=" << splits << " tokens=" << n;
    }
  }
}

/// Tensor-core tiles (starts on the host, n_tiles + 1 entries) with `splits` context shares
/// and `bf16` or fp16 operands, max_tile_rows as the model passes it (0: unknown); returns
/// the relative error against the double reference.
double tensor_core_error(const DeviceProblem& dev, const AttnCase& c, const Problem& pb,
                         const std::vector<int32_t>& starts, int splits, bool bf16, int max_tile_rows) {
  auto dstarts = to_device(starts);
  cuda::DeviceBuffer<float> out(pb.q.size()), partial(cuda::attention_partial_floats(pb.n, c.n_head, c.head_dim, splits));
  poison(out);
  poison(partial);
  cuda::AttentionArgs a = dev.args(c, pb, splits, out.get(), partial.get());
  a.tile_starts = dstarts.get();
  a.n_tiles = int(starts.size()) - 1;
  a.tensor_cores = true;
  a.tc_bf16 = bf16;
  a.max_tile_rows = max_tile_rows;
  cuda::paged_attention(a, nullptr);
  return rel_error(to_host(out, pb.q.size()), pb.ref);
}

// The tensor-core tiles (attention_mma.cu) on the same problems: fp16 keeps 11 significant
// bits of q, k, p and v, so ~1e-3 relative error is expected instead of ~1e-6.
TEST_P(PagedAttention, TensorCoreTilesCloseToDoubleReference) {
  FDL_SKIP_WITHOUT_GPU();
  const AttnCase c = GetParam();
  if (!cuda::attention_tiles_supported(c.head_dim, c.n_head, c.n_head_kv))
    GTEST_SKIP() << "no tiles for head_dim " << c.head_dim;
  const Problem pb = make_problem(c);
  const int n = pb.n;
  const DeviceProblem dev(pb);
  int sm = 0;
  FDL_CUDA_CHECK(cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, 0));
  std::vector<int32_t> starts(size_t(n) + 1);
  const int n_tiles =
      cuda::attention_tiles(pb.token_seq.data(), pb.positions.data(), n, c.n_head, c.n_head_kv, starts.data());
  starts.resize(size_t(n_tiles) + 1);
  for (bool bf16 : {false, true})
    for (int splits : {1, 3, cuda::attention_tile_splits(n_tiles, c.n_head_kv, sm, 701)}) {
      const double err = tensor_core_error(dev, c, pb, starts, splits, bf16, 0);
      std::cout << "  tensor-core tiles (" << (bf16 ? "bf16" : "fp16") << "), splits " << splits << ": rel error "
                << err << "\n";
      EXPECT_LT(err, bf16 ? 1.5e-2 : 4e-3) << "splits=" << splits << " tokens=" << n << " bf16=" << bf16;
    }
}

// Tiles of at most 16 rows (decode batches) take the kernel that splits each chunk over its
// warps (attn_decode_mma_kernel): single-token tiles, and tiles of 16 / group consecutive
// tokens (causal masking between the rows of one tile).
TEST_P(PagedAttention, TensorCoreDecodeTilesCloseToDoubleReference) {
  FDL_SKIP_WITHOUT_GPU();
  const AttnCase c = GetParam();
  const int group = c.n_head / c.n_head_kv;
  if (!cuda::attention_tiles_supported(c.head_dim, c.n_head, c.n_head_kv) || group > 16)
    GTEST_SKIP() << "no tensor-core decode tiles for head_dim " << c.head_dim << ", group " << group;
  const Problem pb = make_problem(c);
  const int n = pb.n;
  const DeviceProblem dev(pb);
  int sm = 0;
  FDL_CUDA_CHECK(cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, 0));
  for (bool bf16 : {false, true})
  for (int tile_tokens : {1, 16 / group}) {
    std::vector<int32_t> starts;  // runs of consecutive positions of one sequence, <= tile_tokens each
    for (int t = 0; t < n; ++t)
      if (t == 0 || pb.token_seq[size_t(t)] != pb.token_seq[size_t(t) - 1] ||
          pb.positions[size_t(t)] != pb.positions[size_t(t) - 1] + 1 || t - starts.back() == tile_tokens)
        starts.push_back(t);
    const int n_tiles = int(starts.size());
    starts.push_back(n);
    for (int splits : {1, 3, cuda::attention_tile_splits(n_tiles, c.n_head_kv, sm, 701)}) {
      const double err = tensor_core_error(dev, c, pb, starts, splits, bf16, tile_tokens * group);
      std::cout << "  tensor-core decode tiles (" << (bf16 ? "bf16" : "fp16") << ") of " << tile_tokens
                << " token(s), splits " << splits << ": rel error " << err << "\n";
      EXPECT_LT(err, bf16 ? 1.5e-2 : 4e-3) << "tile tokens " << tile_tokens << ", splits " << splits << " bf16=" << bf16;
    }
  }
}

// A 16-bit cache (fp16 or bf16 elements, CudaModel's choice for 16-bit models) holds values
// that widen exactly to fp32, so every kernel must give, bit for bit, what it gives over an
// fp32 cache holding the same rounded values: the per-token kernel (which then also matches
// the double reference to fp32 rounding), and the tensor-core tiles, prefill and decode, whose
// operands are then the cache's bytes (the fp32 cache's values, rounded to the operand type
// in registers, are the same values).
TEST_P(PagedAttention, SixteenBitCacheEqualsFp32CacheOfTheSameValues) {
  FDL_SKIP_WITHOUT_GPU();
  const AttnCase c = GetParam();
  const int group = c.n_head / c.n_head_kv;
  int sm = 0;
  FDL_CUDA_CHECK(cudaDeviceGetAttribute(&sm, cudaDevAttrMultiProcessorCount, 0));
  for (const KvDtype t : {KvDtype::F16, KvDtype::BF16}) {
    const Problem pb = make_problem(c, t);
    const DeviceProblem dev16(pb, t), dev32(pb, KvDtype::F32);
    auto run = [&](const DeviceProblem& dev, int splits, const std::vector<int32_t>* starts, int max_rows) {
      cuda::DeviceBuffer<float> out(pb.q.size()),
          partial(cuda::attention_partial_floats(pb.n, c.n_head, c.head_dim, splits));
      poison(out);
      poison(partial);
      cuda::AttentionArgs a = dev.args(c, pb, splits, out.get(), partial.get());
      cuda::DeviceBuffer<int32_t> dstarts(1);
      if (starts) {
        dstarts = to_device(*starts);
        a.tile_starts = dstarts.get();
        a.n_tiles = int(starts->size()) - 1;
        a.tensor_cores = true;
        a.tc_bf16 = t == KvDtype::BF16;  // the operand type of the fp32 run; the 16-bit run's is its dtype
        a.max_tile_rows = max_rows;
      }
      cuda::paged_attention(a, nullptr);
      return to_host(out, pb.q.size());
    };
    const char* name = kv_dtype_name(t);
    for (int splits : {1, 7, cuda::attention_splits(pb.n, c.n_head, c.n_head_kv, sm, 701)}) {
      const std::vector<float> o16 = run(dev16, splits, nullptr, 0);
      EXPECT_EQ(o16, run(dev32, splits, nullptr, 0)) << name << " per-token kernel, splits " << splits;
      EXPECT_LT(rel_error(o16, pb.ref), 2e-6) << name << " per-token kernel, splits " << splits;
    }
    if (!cuda::attention_tiles_supported(c.head_dim, c.n_head, c.n_head_kv)) continue;
    std::vector<int32_t> starts(size_t(pb.n) + 1);
    const int n_tiles =
        cuda::attention_tiles(pb.token_seq.data(), pb.positions.data(), pb.n, c.n_head, c.n_head_kv, starts.data());
    starts.resize(size_t(n_tiles) + 1);
    for (int splits : {1, 3}) {
      const std::vector<float> o16 = run(dev16, splits, &starts, 0);
      EXPECT_EQ(o16, run(dev32, splits, &starts, 0)) << name << " tensor-core tiles, splits " << splits;
      EXPECT_LT(rel_error(o16, pb.ref), t == KvDtype::BF16 ? 1.5e-2 : 4e-3) << name << " tiles, splits " << splits;
    }
    if (group > 16) continue;
    std::vector<int32_t> single(size_t(pb.n) + 1);  // one token per tile: the decode kernel
    std::iota(single.begin(), single.end(), 0);
    for (int splits : {1, 3}) {
      const std::vector<float> o16 = run(dev16, splits, &single, group);
      EXPECT_EQ(o16, run(dev32, splits, &single, group)) << name << " decode tiles, splits " << splits;
      EXPECT_LT(rel_error(o16, pb.ref), t == KvDtype::BF16 ? 1.5e-2 : 4e-3) << name << " decode, splits " << splits;
    }
  }
}

// Batch-invariant steps (AttentionArgs::share_chunks): every row of a mixed batch (prefill
// runs, single tokens, contexts across the 256-position shares) gets, bit for bit, what it gets
// as the only token of its step; with the batch's tiles (the 8-warp kernel) and with one token
// per tile (the one-warp kernel), over fp16 and bf16 caches.
TEST_P(PagedAttention, InvariantSharesGiveEachRowItsAloneBits) {
  FDL_SKIP_WITHOUT_GPU();
  const AttnCase c = GetParam();
  const int group = c.n_head / c.n_head_kv;
  if (!cuda::attention_tiles_supported(c.head_dim, c.n_head, c.n_head_kv) || group > 16)
    GTEST_SKIP() << "no invariant tiles for head_dim " << c.head_dim << ", group " << group;
  for (const KvDtype t : {KvDtype::F16, KvDtype::BF16, KvDtype::F32}) {  // F32: fewer chunks per round
    const Problem pb = make_problem(c, t);
    const DeviceProblem dev(pb, t);
    const size_t row = size_t(c.n_head) * c.head_dim;
    int max_ctx = 0;
    for (int p : pb.positions) max_ctx = std::max(max_ctx, p + 1);
    // Tokens [first, first + n) with tile starts relative to `first`.
    auto run = [&](int first, int n, std::vector<int32_t> starts, int ctx) {
      int max_rows = 0;
      for (size_t i = 0; i + 1 < starts.size(); ++i) max_rows = std::max(max_rows, (starts[i + 1] - starts[i]) * group);
      const int splits = cuda::attention_invariant_splits(ctx);
      cuda::DeviceBuffer<float> out(size_t(n) * row),
          partial(cuda::attention_partial_floats(n, c.n_head, c.head_dim, splits * (cuda::kInvariantShareChunks + 1)));
      poison(out);
      poison(partial);
      cuda::AttentionArgs a = dev.args(c, pb, splits, out.get(), partial.get());
      a.q += size_t(first) * row, a.positions += first, a.table_off += first, a.n_tokens = n;
      auto dstarts = to_device(starts);
      a.tile_starts = dstarts.get();
      a.n_tiles = int(starts.size()) - 1;
      a.tensor_cores = true;
      a.max_tile_rows = max_rows;
      a.share_chunks = cuda::kInvariantShareChunks;
      cuda::paged_attention(a, nullptr);
      return to_host(out, size_t(n) * row);
    };
    std::vector<int32_t> tiles(size_t(pb.n) + 1), single(size_t(pb.n) + 1);
    const int n_tiles = cuda::attention_tiles(pb.token_seq.data(), pb.positions.data(), pb.n, c.n_head, c.n_head_kv,
                                              tiles.data());
    tiles.resize(size_t(n_tiles) + 1);
    std::iota(single.begin(), single.end(), 0);
    const std::vector<float> batched = run(0, pb.n, tiles, max_ctx), one_per_tile = run(0, pb.n, single, max_ctx);
    EXPECT_LT(rel_error(batched, pb.ref), t == KvDtype::BF16 ? 1.5e-2 : 4e-3) << kv_dtype_name(t);
    size_t differ_batched = 0, differ_single = 0;
    for (int i = 0; i < pb.n; ++i) {
      const std::vector<float> alone = run(i, 1, {0, 1}, pb.positions[size_t(i)] + 1);
      differ_batched += std::memcmp(alone.data(), batched.data() + size_t(i) * row, row * sizeof(float)) != 0;
      differ_single += std::memcmp(alone.data(), one_per_tile.data() + size_t(i) * row, row * sizeof(float)) != 0;
    }
    EXPECT_EQ(differ_batched, 0u) << kv_dtype_name(t) << ": rows of the batch's tiles unlike alone, of " << pb.n;
    EXPECT_EQ(differ_single, 0u) << kv_dtype_name(t) << ": rows of one-token tiles unlike alone, of " << pb.n;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, PagedAttention,
                         ::testing::Values(AttnCase{32, 8, 128, 16}, AttnCase{8, 8, 128, 16}, AttnCase{8, 4, 128, 16},
                                           AttnCase{64, 8, 128, 16}, AttnCase{6, 2, 64, 16}, AttnCase{8, 4, 8, 7},
                                           AttnCase{12, 1, 16, 5}, AttnCase{4, 4, 256, 16}, AttnCase{3, 1, 4, 1}),
                         [](const auto& info) {
                           const AttnCase& c = info.param;
                           return attention_shape_name(c.n_head, c.n_head_kv, c.head_dim, c.block_size);
                         });

}  // namespace
}  // namespace fdl::test
