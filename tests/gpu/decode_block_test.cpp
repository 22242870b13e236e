// The persistent batch-1 decode kernels against the kernel chains they replace (each tested
// against CPU references elsewhere), on random weights of every type:
//  - decode_attention_block vs gemv_norm_rope_qkv, paged_attention, gemv(wo): GQA groups of 1,
//    2 and 4 (and a group of 3), contexts from one position to several blocks, scattered block
//    tables, several blocks-per-group counts (the context splits depend on the GPU's
//    multiprocessor count; smaller counts are forced by passing fewer SMs);
//  - decode_ffn_block vs gemv_norm_swiglu, gemv(down): Llama-3-8B's shape, odd sizes, more
//    blocks than gate/up pairs, and y written over its own residual input (as the model does).
//  - decode_attention_block_k16 vs the batch-invariant path's kernels (add_rms_norm, gemm_k16,
//    rope_qkv_store, the chunk attention and its fold, the cast, gemm_k16), bit for bit;
//  - decode_ffn_block_k16 vs the batch-invariant path's kernels (add_rms_norm, gemm_k16,
//    silu_mul, gemm_k16), bit for bit.
//  - decode_output_block vs add_rms_norm, gemv (the output head); decode_output_block_k16 vs
//    add_rms_norm, gemm_k16, bit for bit.
// Each kernel runs four times, every output and hand-off buffer reset to garbage (or the
// initial cache) before each run; the fourth run is the traced kernel (bench_gpu --trace),
// which must give the same bits and stamp every phase edge of every block in order.
#include <algorithm>
#include <numeric>

#include "backend/cpu/ops.h"
#include "backend/cuda/gemm_k16.h"
#include "backend/cuda/kernels.h"
#include "flashdllm/dtype.h"
#include "gpu/gpu_test_util.h"

namespace fdl::test {
namespace {

using cuda::DeviceBuffer;
using cuda::WType;

struct Shape {
  int n_head, n_kv, hd, rope_dim, cols, wo_rows, block_size;
};

class AttentionBlock : public ::testing::TestWithParam<WType> {};

/// The runs of a persistent kernel's check: the one with index 2 is untraced (its outputs are
/// kept in `untraced`), the one with index 3 traced. The traced outputs equal the untraced bit for bit, and
/// every block must have stamped every event (non-zero) in program order (`trace`:
/// [events][blocks] globaltimer ns).
void compare_traced_run(int run, std::vector<std::vector<float>> outs, std::vector<std::vector<float>>& untraced,
                        const DeviceBuffer<uint64_t>& trace, int events, int blocks, const std::string& where) {
  if (run == 2) untraced = std::move(outs);
  if (run != 3) return;
  for (size_t o = 0; o < outs.size(); ++o)
    EXPECT_EQ(0, std::memcmp(outs[o].data(), untraced[o].data(), outs[o].size() * sizeof(float)))
        << where << ": output " << o << " of the traced kernel differs from the untraced one";
  const std::vector<uint64_t> t = to_host(trace, trace.size());
  for (int b = 0; b < blocks; ++b)
    for (int e = 0; e < events; ++e) {
      const uint64_t v = t[size_t(e) * size_t(blocks) + size_t(b)];
      EXPECT_NE(v, 0u) << where << ": block " << b << " did not stamp event " << e;
      if (e > 0) {
        EXPECT_LE(t[size_t(e - 1) * size_t(blocks) + size_t(b)], v) << where << ": block " << b << " event " << e;
      }
    }
}

/// Gemma's additions to a layer: a post-norm of the norm's addend (random weights), scores
/// soft-capped at `softcap` (0: none).
struct Gemma {
  bool post_norm = false;
  float softcap = 0.f;
};

/// Runs both paths for one shape and context on fresh random inputs and compares every output;
/// `kv_t` is the cache's element type (both paths read and write it).
void check(WType type, const Shape& s, int ctx, int n_sm, KvDtype kv_t = KvDtype::F32, Gemma gemma = {}) {
  const int q_dim = s.n_head * s.hd, kv_dim = s.n_kv * s.hd, rows = q_dim + 2 * kv_dim;
  const float eps = 1e-5f;
  auto dWqkv = to_device(random_weights(type, size_t(rows) * s.cols));
  auto dWo = to_device(random_weights(type, size_t(s.wo_rows) * q_dim));
  const cuda::DeviceMatrix Wqkv{type, dWqkv.get(), rows, s.cols}, Wo{type, dWo.get(), s.wo_rows, q_dim};

  // Scattered block table: the sequence's blocks are a random subset of the arena's.
  const int n_layer = 2, layer = 1, n_blocks_seq = (ctx + s.block_size - 1) / s.block_size;
  const int arena_blocks = n_blocks_seq + 5;
  std::vector<int32_t> ids(static_cast<size_t>(arena_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng());
  const std::vector<int32_t> table(ids.begin(), ids.begin() + n_blocks_seq);
  const int pos = ctx - 1;
  const std::vector<int32_t> positions = {pos}, dst = {table[size_t(pos / s.block_size)]}, off = {0};
  const int64_t stride = int64_t(n_layer) * 2 * s.block_size * kv_dim;
  const std::vector<uint8_t> arena_init = kv_bytes(kv_t, random_floats(size_t(stride) * arena_blocks));
  cpu::RopeParams rp{.head_dim = s.hd, .rope_dim = s.rope_dim, .freq_base = 10000.f, .freq_scale = 1.f, .freq_factors = {}};
  std::vector<float> cs(size_t(s.rope_dim));
  cpu::rope_cos_sin(rp, pos, cs.data());
  const auto x = random_floats(size_t(s.cols), -3.f, 3.f), add = random_floats(size_t(s.cols));
  const auto w = random_floats(size_t(s.cols), 0.5f, 1.5f);
  auto dx = to_device(x), dadd = to_device(add), dw = to_device(w), dcs = to_device(cs);
  auto dpos = to_device(positions), ddst = to_device(dst), doff = to_device(off), dtab = to_device(table);
  auto dadd_w = to_device(random_floats(size_t(s.cols), 0.5f, 1.5f));
  const float* add_w = gemma.post_norm ? dadd_w.get() : nullptr;
  const float scale = 1.0f / std::sqrt(float(s.hd));

  // The kernel chain.
  auto arena_ref = to_device(arena_init);
  DeviceBuffer<float> q_ref{size_t(q_dim)}, attn_ref{size_t(q_dim)}, y_ref{size_t(s.wo_rows)}, x_ref{size_t(s.cols)};
  cuda::KvLayerView kv_ref{arena_ref.get(), int64_t(layer) * 2 * s.block_size * kv_dim, stride, s.block_size, s.n_kv,
                           s.hd, kv_t};
  const cuda::NormIn in_ref{dx.get(), dadd.get(), dw.get(), x_ref.get(), eps, add_w};
  cuda::gemv_norm_rope_qkv(Wqkv, in_ref, dcs.get(), dpos.get(), ddst.get(), s.n_head, s.rope_dim, kv_ref, q_ref.get(),
                           nullptr);
  const int splits = cuda::attention_splits(1, s.n_head, s.n_kv, n_sm, ctx);
  DeviceBuffer<float> partial_ref{cuda::attention_partial_floats(1, s.n_head, s.hd, splits)};
  cuda::AttentionArgs att;
  att.kv = kv_ref;
  att.q = q_ref.get();
  att.out = attn_ref.get();
  att.positions = dpos.get();
  att.table_off = doff.get();
  att.tables = dtab.get();
  att.n_tokens = 1;
  att.n_head = s.n_head;
  att.scale = scale;
  att.n_splits = splits;
  att.partial = partial_ref.get();
  cuda::paged_attention(att, nullptr, cuda::AttentionMasks{nullptr, nullptr, nullptr, gemma.softcap});
  cuda::gemv(Wo, attn_ref.get(), 1, y_ref.get(), nullptr);

  // The one kernel, run four times (the counters are zeroed before each launch, as the model
  // does).
  auto arena = to_device(arena_init);
  cuda::KvLayerView kv = kv_ref;
  kv.base = arena.get();
  const int bpg = cuda::attention_block_groups(Wqkv, Wo, s.n_head, kv, n_sm,
                                               cuda::AttentionBlockFeatures{false, gemma.post_norm, gemma.softcap > 0});
  ASSERT_GT(bpg, 0) << "shape not supported";
  DeviceBuffer<float> q{size_t(q_dim)}, attn{size_t(q_dim)}, y{size_t(s.wo_rows)}, x_out{size_t(s.cols)};
  DeviceBuffer<float> partial{cuda::attention_block_partial_floats(s.n_head, s.hd, bpg)};
  DeviceBuffer<unsigned> sync{size_t(s.n_kv + 1)};
  cuda::AttentionBlockArgs b;
  b.type = type;
  b.wqkv = Wqkv.data;
  b.wo = Wo.data;
  b.wo_rows = s.wo_rows;
  b.cols = s.cols;
  b.in = cuda::NormIn{dx.get(), dadd.get(), dw.get(), x_out.get(), eps, add_w};
  b.cos_sin = dcs.get();
  b.positions = dpos.get();
  b.dst_block = ddst.get();
  b.tables = dtab.get();
  b.table_off = doff.get();
  b.n_head = s.n_head;
  b.rope_dim = s.rope_dim;
  b.scale = scale;
  b.softcap = gemma.softcap;
  b.kv = kv;
  b.q_out = q.get();
  b.attn_out = attn.get();
  b.partial = partial.get();
  b.y = y.get();
  b.sync = sync.get();
  b.blocks_per_group = bpg;
  // The last run launches the traced kernel (a separately compiled instantiation): its outputs
  // must equal the untraced run before it bit for bit, and every block must stamp every phase
  // edge in order.
  const int blocks = bpg * s.n_kv * cuda::attention_subgroups(s.n_head, s.n_kv);
  DeviceBuffer<uint64_t> trace{size_t(cuda::kAttnTraceEvents) * size_t(blocks)};
  FDL_CUDA_CHECK(cudaMemset(trace.get(), 0, trace.bytes()));
  std::vector<std::vector<float>> untraced;
  for (int run = 0; run < 4; ++run) {
    b.trace = run == 3 ? trace.get() : nullptr;
    // Every output and every hand-off buffer starts from garbage or the initial cache, so a
    // phase that reads before its producer finished shows in any run.
    FDL_CUDA_CHECK(cudaMemcpy(arena.get(), arena_init.data(), arena_init.size(), cudaMemcpyHostToDevice));
    poison(partial);
    poison(q);
    poison(attn);
    poison(y);
    poison(x_out);
    FDL_CUDA_CHECK(cudaMemset(sync.get(), 0, sync.bytes()));
    cuda::decode_attention_block(b, nullptr);
    FDL_CUDA_CHECK(cudaDeviceSynchronize());
    const std::string where = std::string(cuda::wtype_name(type)) + " KV " + kv_dtype_name(kv_t) + " heads " +
                              std::to_string(s.n_head) + "/" +
                              std::to_string(s.n_kv) + " hd " + std::to_string(s.hd) + " ctx " + std::to_string(ctx) +
                              " blocks/group " + std::to_string(bpg) + (gemma.post_norm ? " post-norm" : "") +
                              " softcap " + std::to_string(gemma.softcap) + " run " + std::to_string(run);
    EXPECT_EQ(to_host(x_out, size_t(s.cols)), to_host(x_ref, size_t(s.cols))) << where;
    EXPECT_LT(rel_error(to_host(q, size_t(q_dim)), widen(to_host(q_ref, size_t(q_dim)))), 1e-6) << where;
    // The new slot's K/V: the two paths' fp32 values agree to ~1e-7 relative, so a 16-bit
    // cache may hold one rounding step (2^-11 / 2^-8 relative) apart in a few elements.
    const std::vector<float> got = kv_values(kv_t, to_host(arena, arena_init.size())),
                             want = kv_values(kv_t, to_host(arena_ref, arena_init.size()));
    EXPECT_LT(rel_error(got, widen(want)), kv_t == KvDtype::F32 ? 1e-6 : 1e-3) << where;
    // The two paths sum each score's 128 products in different orders. With these random
    // weights (uniform in [-1, 1] over 4096 columns) q and the new k have elements of ~40, so
    // scores reach ~10^3 and their fp32 rounding (~10^-4 absolute) moves the softmax weights
    // by up to ~10^-4 relative: a bound of 1e-5 failed once on the H200 (2.3e-5, BF16, context 2).
    EXPECT_LT(rel_error(to_host(attn, size_t(q_dim)), widen(to_host(attn_ref, size_t(q_dim)))), 1e-4) << where;
    EXPECT_LT(rel_error(to_host(y, size_t(s.wo_rows)), widen(to_host(y_ref, size_t(s.wo_rows)))), 1e-4) << where;
    compare_traced_run(run, {to_host(x_out, size_t(s.cols)), to_host(q, size_t(q_dim)), to_host(attn, size_t(q_dim)),
                             to_host(y, size_t(s.wo_rows))},
                       untraced, trace, cuda::kAttnTraceEvents, blocks, where);
  }
}

int device_sms() {
  int n = 0;
  FDL_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0));
  return n;
}

TEST_P(AttentionBlock, MatchesTheKernelChainItReplaces) {
  FDL_SKIP_WITHOUT_GPU();
  const WType type = GetParam();
  const int sms = device_sms();
  // Llama-3-8B's attention half (GQA 4, head_dim 128), at several contexts.
  const Shape llama3{32, 8, 128, 128, 4096, 4096, 16};
  for (const int ctx : {1, 2, 17, 700}) check(type, llama3, ctx, sms);
  // A cache in the weights' 16-bit type (CudaModel's default for 16-bit models).
  if (type != WType::F32) {
    const KvDtype kv16 = type == WType::F16 ? KvDtype::F16 : KvDtype::BF16;
    for (const int ctx : {1, 17, 700}) check(type, llama3, ctx, sms, kv16);
    check(type, Shape{8, 4, 64, 64, 520, 333, 16}, 300, 4, kv16);
    check(type, Shape{12, 12, 32, 16, 264, 200, 5}, 129, sms, kv16);  // group 1, partial RoPE, odd block size
  }
  // Fewer blocks per group than context positions and than the default (other split points).
  check(type, llama3, 300, 3 * 8);
  check(type, llama3, 33, 8);  // one block per KV head: no context split
  // Multi-head (group 1), small head_dim, partial RoPE, odd block size, odd column count.
  check(type, Shape{12, 12, 32, 16, 264, 200, 5}, 129, sms);
  // Group 2 and group 3 (registers sized for 4), wo with a row count no block divides.
  check(type, Shape{8, 4, 64, 64, 520, 333, 16}, 64, sms);
  check(type, Shape{6, 2, 20, 12, 264, 130, 3}, 41, sms);
  // One block per KV head and long splits: every group size also runs the attention steps
  // after the first (the first is separate code: its K rows are loaded before the hand-off).
  check(type, Shape{12, 12, 32, 16, 264, 200, 5}, 200, 12);
  check(type, Shape{8, 4, 64, 64, 520, 333, 16}, 300, 4);
  check(type, Shape{6, 2, 20, 12, 264, 130, 3}, 300, 2);
  // Query heads per KV head above 4, in sub-groups: Qwen2.5-7B's attention half (28 heads on
  // 4 KV heads: 4 + 3 per KV head), 5 (3 + 2), 8 (4 + 4), with a 16-bit cache too.
  const Shape qwen2_7b{28, 4, 128, 128, 3584, 3584, 16};
  for (const int ctx : {1, 17, 700}) check(type, qwen2_7b, ctx, sms);
  check(type, qwen2_7b, 300, 2 * 4 * 3);  // 3 blocks per sub-group
  check(type, Shape{10, 2, 32, 32, 264, 200, 5}, 129, sms);
  check(type, Shape{16, 2, 64, 64, 520, 333, 16}, 300, 4);  // one block per sub-group
  if (type != WType::F32)
    check(type, qwen2_7b, 700, sms, type == WType::F16 ? KvDtype::F16 : KvDtype::BF16);
  // The wide variant: Gemma 2 9B's attention half (head_dim 256, GQA 2, post-norms, scores
  // soft-capped at 50), at several contexts and splits, with its 16-bit cache too; then
  // head_dim 256 alone, group 1, and Gemma's options on small heads (a capped score near the
  // cap: small soft-caps bend most scores).
  const Shape gemma2_9b{16, 8, 256, 256, 3584, 3584, 16};
  const Gemma g2{true, 50.f};
  for (const int ctx : {1, 17, 700}) check(type, gemma2_9b, ctx, sms, KvDtype::F32, g2);
  check(type, gemma2_9b, 300, 8 * 3, KvDtype::F32, g2);
  if (type != WType::F32)
    for (const int ctx : {2, 700}) check(type, gemma2_9b, ctx, sms, type == WType::F16 ? KvDtype::F16 : KvDtype::BF16, g2);
  check(type, Shape{4, 4, 256, 128, 520, 333, 16}, 129, sms);
  check(type, Shape{8, 4, 64, 64, 520, 333, 16}, 300, 4, KvDtype::F32, Gemma{true, 0.f});
  check(type, Shape{4, 2, 200, 200, 264, 130, 5}, 129, sms, KvDtype::F32, Gemma{false, 5.f});
}

TEST(AttentionBlockShapes, UnsupportedShapesAreRefused) {
  FDL_SKIP_WITHOUT_GPU();
  auto d = to_device(random_weights(WType::F16, size_t(96) * 64));
  const cuda::KvLayerView kv8{nullptr, 0, 0, 16, 1, 8};
  // 8 query heads per KV head run in two sub-groups; above 16, not taken.
  const cuda::DeviceMatrix qkv8{WType::F16, d.get(), (8 + 2) * 8, 64}, wo8{WType::F16, d.get(), 64, 64};
  EXPECT_GT(cuda::attention_block_groups(qkv8, wo8, 8, kv8, device_sms()), 0);
  auto d17 = to_device(random_weights(WType::F16, size_t(19 * 8) * 64 + size_t(64) * 17 * 8));
  const cuda::DeviceMatrix qkv17{WType::F16, d17.get(), (17 + 2) * 8, 64}, wo17{WType::F16, d17.get(), 64, 17 * 8};
  EXPECT_EQ(cuda::attention_block_groups(qkv17, wo17, 17, kv8, device_sms()), 0);
  // Mismatched types.
  const cuda::KvLayerView kv4{nullptr, 0, 0, 16, 2, 8};
  const cuda::DeviceMatrix qkv{WType::F16, d.get(), (4 + 4) * 8, 64}, wo_f32{WType::F32, d.get(), 64, 32};
  EXPECT_EQ(cuda::attention_block_groups(qkv, wo_f32, 4, kv4, device_sms()), 0);
  // A 16-bit cache of another type than the weights (no such instantiation).
  cuda::KvLayerView kv4_bf16 = kv4;
  kv4_bf16.dtype = KvDtype::BF16;
  const cuda::DeviceMatrix wo16{WType::F16, d.get(), 64, 32};
  EXPECT_EQ(cuda::attention_block_groups(qkv, wo16, 4, kv4_bf16, device_sms()), 0);
  cuda::KvLayerView kv4_f16 = kv4;
  kv4_f16.dtype = KvDtype::F16;
  EXPECT_GT(cuda::attention_block_groups(qkv, wo16, 4, kv4_f16, device_sms()), 0);
  // A 16-bit cache with head_dim 4 (not a multiple of 8: the K/V rows' bulk L2 prefetch needs
  // 16-byte rows).
  const cuda::KvLayerView kv_hd4{nullptr, 0, 0, 16, 2, 4, KvDtype::F16};
  const cuda::DeviceMatrix qkv_hd4{WType::F16, d.get(), (4 + 4) * 4, 64}, wo_hd4{WType::F16, d.get(), 64, 16};
  EXPECT_EQ(cuda::attention_block_groups(qkv_hd4, wo_hd4, 4, kv_hd4, device_sms()), 0);
  cuda::KvLayerView kv_hd4_f32 = kv_hd4;
  kv_hd4_f32.dtype = KvDtype::F32;
  EXPECT_GT(cuda::attention_block_groups(qkv_hd4, wo_hd4, 4, kv_hd4_f32, device_sms()), 0);
  // Too few multiprocessors for one block per KV head.
  const cuda::DeviceMatrix wo{WType::F16, d.get(), 64, 32};
  EXPECT_GT(cuda::attention_block_groups(qkv, wo, 4, kv4, device_sms()), 0);
  EXPECT_EQ(cuda::attention_block_groups(qkv, wo, 4, kv4, 1), 0);
}

class FfnBlock : public ::testing::TestWithParam<WType> {};

void check_ffn(WType type, int cols, int n_ff, int down_rows, int n_sm, bool gemma = false) {
  const float eps = 1e-5f;
  auto dWgu = to_device(random_weights(type, size_t(2 * n_ff) * cols));
  auto dWd = to_device(random_weights(type, size_t(down_rows) * n_ff));
  const cuda::DeviceMatrix Wgu{type, dWgu.get(), 2 * n_ff, cols}, Wd{type, dWd.get(), down_rows, n_ff};
  const auto x = random_floats(size_t(cols), -3.f, 3.f), add = random_floats(size_t(cols));
  const auto w = random_floats(size_t(cols), 0.5f, 1.5f);
  auto dx = to_device(x), dadd = to_device(add), dw = to_device(w);
  // Gemma: the post-attention norm of the addend and GeGLU.
  auto dadd_w = to_device(random_floats(size_t(cols), 0.5f, 1.5f));
  const float* add_w = gemma ? dadd_w.get() : nullptr;
  DeviceBuffer<float> x_ref{size_t(cols)}, h_ref{size_t(n_ff)}, y_ref{size_t(down_rows)};
  cuda::gemv_norm_swiglu(Wgu, cuda::NormIn{dx.get(), dadd.get(), dw.get(), x_ref.get(), eps, add_w}, h_ref.get(),
                         nullptr, gemma);
  cuda::gemv(Wd, h_ref.get(), 1, y_ref.get(), nullptr);

  const int blocks = cuda::ffn_block_blocks(Wgu, Wd, n_sm);
  ASSERT_GT(blocks, 0) << "shape not supported";
  DeviceBuffer<float> x_out{size_t(cols)}, h{size_t(n_ff)};
  DeviceBuffer<unsigned> sync{1};
  DeviceBuffer<uint64_t> trace{size_t(cuda::kFfnTraceEvents) * size_t(blocks)};  // the last run is traced
  FDL_CUDA_CHECK(cudaMemset(trace.get(), 0, trace.bytes()));
  std::vector<std::vector<float>> untraced;
  for (int run = 0; run < 4; ++run) {
    // y overwrites the residual input it adds, as in the model (the wo output buffer).
    std::vector<float> io(size_t(std::max(cols, down_rows)), 0.f);
    std::copy(add.begin(), add.end(), io.begin());
    auto io_buf = to_device(io);
    poison(x_out);
    poison(h);
    FDL_CUDA_CHECK(cudaMemset(sync.get(), 0, sync.bytes()));
    cuda::FfnBlockArgs f;
    f.type = type;
    f.w_gate_up = Wgu.data;
    f.w_down = Wd.data;
    f.down_rows = down_rows;
    f.cols = cols;
    f.n_ff = n_ff;
    f.in = cuda::NormIn{dx.get(), io_buf.get(), dw.get(), x_out.get(), eps, add_w};
    f.gelu = gemma;
    f.h = h.get();
    f.y = io_buf.get();
    f.sync = sync.get();
    f.blocks = blocks;
    f.trace = run == 3 ? trace.get() : nullptr;
    cuda::decode_ffn_block(f, nullptr);
    FDL_CUDA_CHECK(cudaDeviceSynchronize());
    const std::string where = std::string(cuda::wtype_name(type)) + " cols " + std::to_string(cols) + " n_ff " +
                              std::to_string(n_ff) + " blocks " + std::to_string(blocks) + (gemma ? " gemma" : "") +
                              " run " + std::to_string(run);
    EXPECT_EQ(to_host(x_out, size_t(cols)), to_host(x_ref, size_t(cols))) << where;
    EXPECT_LT(rel_error(to_host(h, size_t(n_ff)), widen(to_host(h_ref, size_t(n_ff)))), 1e-6) << where;
    EXPECT_LT(rel_error(to_host(io_buf, size_t(down_rows)), widen(to_host(y_ref, size_t(down_rows)))), 1e-5) << where;
    compare_traced_run(run, {to_host(x_out, size_t(cols)), to_host(h, size_t(n_ff)), to_host(io_buf, size_t(down_rows))},
                       untraced, trace, cuda::kFfnTraceEvents, blocks, where);
  }
}

TEST_P(FfnBlock, MatchesTheKernelChainItReplaces) {
  FDL_SKIP_WITHOUT_GPU();
  const WType type = GetParam();
  const int sms = device_sms();
  check_ffn(type, 4096, 14336, 4096, sms);  // Llama-3-8B
  check_ffn(type, 264, 344, 200, 7);        // uneven shares over a few blocks
  check_ffn(type, 64, 40, 72, sms);         // more blocks than pairs and than down rows
  check_ffn(type, 264, 344, 200, 1);        // one block: the hand-off to itself
  check_ffn(type, 3584, 14336, 3584, sms, true);  // Gemma 2 9B: post-norm of the addend, GeGLU
  check_ffn(type, 264, 344, 200, 7, true);
}

TEST(FfnBlockShapes, UnsupportedShapesAreRefused) {
  FDL_SKIP_WITHOUT_GPU();
  auto d = to_device(random_weights(WType::F16, size_t(128) * 64));
  const cuda::DeviceMatrix gu{WType::F16, d.get(), 64, 64}, down{WType::F16, d.get(), 64, 32};
  EXPECT_GT(cuda::ffn_block_blocks(gu, down, device_sms()), 0);
  const cuda::DeviceMatrix down_f32{WType::F32, d.get(), 64, 32}, down_wide{WType::F16, d.get(), 32, 64};
  EXPECT_EQ(cuda::ffn_block_blocks(gu, down_f32, device_sms()), 0);   // mismatched types
  EXPECT_EQ(cuda::ffn_block_blocks(gu, down_wide, device_sms()), 0);  // down's columns != n_ff
}

// decode_attention_block_k16 against the invariant path's separate kernels for one token
// (add_rms_norm, gemm_k16, rope_qkv_store, the chunk attention and its fold, the cast,
// gemm_k16): the same bits for the residual, q, the whole cache, the attention output and y,
// three times over garbage outputs and counters.
class AttentionBlockK16 : public ::testing::TestWithParam<WType> {};

/// `bias`: the family's QKV bias (Qwen2), added before RoPE by both paths.
void check_attention_k16(WType type, const Shape& s, int ctx, int n_sm, bool bias = false) {
  const int q_dim = s.n_head * s.hd, kv_dim = s.n_kv * s.hd, rows = q_dim + 2 * kv_dim;
  const float eps = 1e-5f;
  const KvDtype kv_t = type == WType::BF16 ? KvDtype::BF16 : KvDtype::F16;
  auto dWqkv = to_device(random_weights(type, size_t(rows) * s.cols));
  auto dWo = to_device(random_weights(type, size_t(s.wo_rows) * q_dim));
  const cuda::DeviceMatrix Wqkv{type, dWqkv.get(), rows, s.cols}, Wo{type, dWo.get(), s.wo_rows, q_dim};
  const int n_layer = 2, layer = 1, n_blocks_seq = (ctx + s.block_size - 1) / s.block_size;
  const int arena_blocks = n_blocks_seq + 5;
  std::vector<int32_t> ids(static_cast<size_t>(arena_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng());
  const std::vector<int32_t> table(ids.begin(), ids.begin() + n_blocks_seq);
  const int pos = ctx - 1;
  const std::vector<int32_t> positions = {pos}, dst = {table[size_t(pos / s.block_size)]}, off = {0}, tiles = {0, 1};
  const int64_t stride = int64_t(n_layer) * 2 * s.block_size * kv_dim;
  // Cache values of the size the model's K/V have (the random weights make q and k ~40).
  const std::vector<uint8_t> arena_init = kv_bytes(kv_t, random_floats(size_t(stride) * arena_blocks, -40.f, 40.f));
  cpu::RopeParams rp{.head_dim = s.hd, .rope_dim = s.rope_dim, .freq_base = 10000.f, .freq_scale = 1.f, .freq_factors = {}};
  std::vector<float> cs(size_t(s.rope_dim));
  cpu::rope_cos_sin(rp, pos, cs.data());
  const auto x = random_floats(size_t(s.cols), -3.f, 3.f), add = random_floats(size_t(s.cols));
  const auto w = random_floats(size_t(s.cols), 0.5f, 1.5f);
  auto dadd = to_device(add), dw = to_device(w), dcs = to_device(cs);
  auto dpos = to_device(positions), ddst = to_device(dst), doff = to_device(off), dtab = to_device(table);
  auto dtiles = to_device(tiles);
  auto dbias = to_device(random_floats(size_t(rows), -2.f, 2.f));
  const float* qkv_bias = bias ? dbias.get() : nullptr;
  const int splits = cuda::attention_invariant_splits(ctx);
  const size_t partial_floats = cuda::attention_partial_floats(1, s.n_head, s.hd, splits * (cuda::kInvariantShareChunks + 1));

  auto arena_ref = to_device(arena_init);
  const cuda::KvLayerView kv_ref{arena_ref.get(), int64_t(layer) * 2 * s.block_size * kv_dim, stride, s.block_size,
                                 s.n_kv, s.hd, kv_t};
  cuda::AttentionArgs att;
  att.positions = dpos.get();
  att.table_off = doff.get();
  att.tables = dtab.get();
  att.n_tokens = 1;
  att.n_head = s.n_head;
  att.scale = 1.0f / std::sqrt(float(s.hd));
  att.n_splits = splits;
  att.tile_starts = dtiles.get();
  att.n_tiles = 1;
  att.tensor_cores = true;
  att.tc_bf16 = type == WType::BF16;
  att.max_tile_rows = s.n_head / s.n_kv;
  att.share_chunks = cuda::kInvariantShareChunks;

  // The separate kernels.
  auto x_ref = to_device(x);
  DeviceBuffer<uint16_t> xn{size_t(s.cols)}, attn16_ref{size_t(q_dim)};
  DeviceBuffer<float> qkv{size_t(rows)}, q_ref{size_t(q_dim)}, attn_ref{size_t(q_dim)}, y_ref{size_t(s.wo_rows)};
  DeviceBuffer<float> partial_ref{partial_floats};
  cuda::add_rms_norm(x_ref.get(), dadd.get(), dw.get(), xn.get(), nullptr, 1, s.cols, eps, true, nullptr, type);
  cuda::gemm_k16(Wqkv, xn.get(), 1, qkv.get(), nullptr);
  cuda::rope_qkv_store(qkv.get(), dcs.get(), dpos.get(), ddst.get(), 1, s.n_head, s.rope_dim, kv_ref, q_ref.get(),
                       nullptr, cuda::QkvExtras{qkv_bias, nullptr, nullptr, 0.f});
  cuda::AttentionArgs att_ref = att;
  att_ref.kv = kv_ref;
  att_ref.q = q_ref.get();
  att_ref.out = attn_ref.get();
  att_ref.partial = partial_ref.get();
  ASSERT_TRUE(cuda::attention_invariant_chunk_partials(att_ref));
  cuda::paged_attention(att_ref, nullptr);
  cuda::cast_f32(attn_ref.get(), size_t(q_dim), type, attn16_ref.get(), nullptr);
  cuda::gemm_k16(Wo, attn16_ref.get(), 1, y_ref.get(), nullptr);

  auto arena = to_device(arena_init);
  cuda::KvLayerView kv = kv_ref;
  kv.base = arena.get();
  const int blocks = cuda::attention_block_k16_blocks(Wqkv, Wo, s.n_head, kv, n_sm);
  ASSERT_GT(blocks, 0) << "shape not supported";
  auto dx = to_device(x);
  DeviceBuffer<float> q{size_t(q_dim)}, x_out{size_t(s.cols)}, partial{partial_floats};
  DeviceBuffer<uint16_t> attn16{size_t(q_dim)};
  DeviceBuffer<unsigned> sync{3};
  for (int run = 0; run < 3; ++run) {
    // y overwrites the residual input it adds, as in the model (the previous FFN's output).
    std::vector<float> io(size_t(std::max(s.cols, s.wo_rows)), 0.f);
    std::copy(add.begin(), add.end(), io.begin());
    auto io_buf = to_device(io);
    FDL_CUDA_CHECK(cudaMemcpy(arena.get(), arena_init.data(), arena_init.size(), cudaMemcpyHostToDevice));
    poison(q);
    poison(x_out);
    poison(partial);
    poison(attn16);
    FDL_CUDA_CHECK(cudaMemset(sync.get(), 0, sync.bytes()));
    cuda::AttentionBlockK16Args b;
    b.type = type;
    b.wqkv = Wqkv.data;
    b.wo = Wo.data;
    b.wo_rows = s.wo_rows;
    b.cols = s.cols;
    b.in = cuda::NormIn{dx.get(), io_buf.get(), dw.get(), x_out.get(), eps, nullptr};
    b.att = att;
    b.att.kv = kv;
    b.att.q = q.get();
    b.att.partial = partial.get();
    b.cos_sin = dcs.get();
    b.dst_block = ddst.get();
    b.rope_dim = s.rope_dim;
    b.bias = qkv_bias;
    b.q_out = q.get();
    b.attn16 = attn16.get();
    b.y = io_buf.get();
    b.sync = sync.get();
    b.blocks = blocks;
    cuda::decode_attention_block_k16(b, nullptr);
    FDL_CUDA_CHECK(cudaDeviceSynchronize());
    const std::string where = std::string(cuda::wtype_name(type)) + " heads " + std::to_string(s.n_head) + "/" +
                              std::to_string(s.n_kv) + " hd " + std::to_string(s.hd) + " ctx " + std::to_string(ctx) +
                              " blocks " + std::to_string(blocks) + (bias ? " bias" : "") + " run " +
                              std::to_string(run);
    EXPECT_EQ(to_host(x_out, size_t(s.cols)), to_host(x_ref, size_t(s.cols))) << where;
    EXPECT_EQ(to_host(q, size_t(q_dim)), to_host(q_ref, size_t(q_dim))) << where;
    EXPECT_TRUE(to_host(arena, arena_init.size()) == to_host(arena_ref, arena_init.size())) << where << ": the caches differ";
    EXPECT_EQ(to_host(attn16, size_t(q_dim)), to_host(attn16_ref, size_t(q_dim))) << where;
    EXPECT_EQ(to_host(io_buf, size_t(s.wo_rows)), to_host(y_ref, size_t(s.wo_rows))) << where;
  }
}

TEST_P(AttentionBlockK16, GivesTheInvariantKernelsBits) {
  FDL_SKIP_WITHOUT_GPU();
  const WType type = GetParam();
  const int sms = device_sms();
  const Shape llama3{32, 8, 128, 128, 4096, 4096, 16};
  for (int ctx : {1, 63, 64, 65, 300, 1500}) check_attention_k16(type, llama3, ctx, sms);
  check_attention_k16(type, llama3, 1500, 7);  // several chunks per group of warps, several heads per block
  check_attention_k16(type, llama3, 300, 1);   // one block: every hand-off to itself
  check_attention_k16(type, Shape{16, 4, 64, 64, 1024, 1024, 16}, 700, sms);  // head_dim 64
  check_attention_k16(type, Shape{8, 8, 128, 64, 1024, 2048, 32}, 200, sms);  // no GQA, partial RoPE
  check_attention_k16(type, Shape{16, 1, 128, 128, 2048, 2048, 16}, 9000, sms);  // 16 query heads per KV head; 36 splits
  check_attention_k16(type, Shape{28, 4, 128, 128, 3584, 3584, 16}, 300, sms, true);  // Qwen2-7B: QKV bias, groups of 7
}

TEST(AttentionBlockK16Shapes, UnsupportedShapesAreRefused) {
  FDL_SKIP_WITHOUT_GPU();
  auto d = to_device(random_weights(WType::F16, size_t(2048) * 1024));
  const cuda::DeviceMatrix qkv{WType::F16, d.get(), 1536, 1024}, wo{WType::F16, d.get(), 1024, 1024};
  const cuda::KvLayerView kv{nullptr, 0, 0, 16, 2, 128, KvDtype::F16};
  EXPECT_GT(cuda::attention_block_k16_blocks(qkv, wo, 8, kv, device_sms()), 0);
  cuda::KvLayerView kv32 = kv;
  kv32.dtype = KvDtype::F32;
  EXPECT_EQ(cuda::attention_block_k16_blocks(qkv, wo, 8, kv32, device_sms()), 0);  // cache not the weights' type
  const cuda::DeviceMatrix qkv_bad{WType::F16, d.get(), 1544, 1024};
  EXPECT_EQ(cuda::attention_block_k16_blocks(qkv_bad, wo, 8, kv, device_sms()), 0);  // rows != the heads'
  cuda::KvLayerView kv96 = kv;
  kv96.head_dim = 96;
  EXPECT_EQ(cuda::attention_block_k16_blocks(qkv, wo, 8, kv96, device_sms()), 0);  // head_dim
}

// decode_ffn_block_k16 against the invariant path's separate kernels for one token: the same
// bits for the residual, h and y, three times over garbage outputs and hand-off counters.
class FfnBlockK16 : public ::testing::TestWithParam<WType> {};

void check_ffn_k16(WType type, int cols, int n_ff, int down_rows, int n_sm, bool gelu = false) {
  const float eps = 1e-5f;
  auto dWgu = to_device(random_weights(type, size_t(2 * n_ff) * cols));
  auto dWd = to_device(random_weights(type, size_t(down_rows) * n_ff));
  const cuda::DeviceMatrix Wgu{type, dWgu.get(), 2 * n_ff, cols}, Wd{type, dWd.get(), down_rows, n_ff};
  const auto x = random_floats(size_t(cols), -3.f, 3.f), add = random_floats(size_t(cols));
  const auto w = random_floats(size_t(cols), 0.5f, 1.5f);
  auto dw = to_device(w), dadd = to_device(add);
  // The invariant path: the norm in place on x, 16-bit activations between the kernels.
  auto x_ref = to_device(x);
  DeviceBuffer<uint16_t> xn{size_t(cols)}, h_ref{size_t(n_ff)};
  DeviceBuffer<float> gu{size_t(2 * n_ff)}, y_ref{size_t(down_rows)};
  cuda::add_rms_norm(x_ref.get(), dadd.get(), dw.get(), xn.get(), nullptr, 1, cols, eps, true, nullptr, type);
  cuda::gemm_k16(Wgu, xn.get(), 1, gu.get(), nullptr);
  cuda::silu_mul(gu.get(), h_ref.get(), 1, n_ff, nullptr, type, gelu);
  cuda::gemm_k16(Wd, h_ref.get(), 1, y_ref.get(), nullptr);

  const int blocks = cuda::ffn_block_k16_blocks(Wgu, Wd, n_sm);
  ASSERT_GT(blocks, 0) << "shape not supported";
  auto dx = to_device(x);
  DeviceBuffer<float> x_out{size_t(cols)};
  DeviceBuffer<float> h{size_t(n_ff)};  // n_ff floats of scratch, as for decode_ffn_block
  DeviceBuffer<unsigned> sync{1};
  for (int run = 0; run < 3; ++run) {
    // y overwrites the residual input it adds, as in the model (the wo output buffer).
    std::vector<float> io(size_t(std::max(cols, down_rows)), 0.f);
    std::copy(add.begin(), add.end(), io.begin());
    auto io_buf = to_device(io);
    poison(x_out);
    poison(h);
    FDL_CUDA_CHECK(cudaMemset(sync.get(), 0, sync.bytes()));
    cuda::FfnBlockArgs f;
    f.type = type;
    f.w_gate_up = Wgu.data;
    f.w_down = Wd.data;
    f.down_rows = down_rows;
    f.cols = cols;
    f.n_ff = n_ff;
    f.gelu = gelu;
    f.in = cuda::NormIn{dx.get(), io_buf.get(), dw.get(), x_out.get(), eps, nullptr};
    f.h = h.get();
    f.y = io_buf.get();
    f.sync = sync.get();
    f.blocks = blocks;
    cuda::decode_ffn_block_k16(f, nullptr);
    FDL_CUDA_CHECK(cudaDeviceSynchronize());
    const std::string where = std::string(cuda::wtype_name(type)) + " cols " + std::to_string(cols) + " n_ff " +
                              std::to_string(n_ff) + " down " + std::to_string(down_rows) + " blocks " +
                              std::to_string(blocks) + (gelu ? " gelu" : "") + " run " + std::to_string(run);
    EXPECT_EQ(to_host(x_out, size_t(cols)), to_host(x_ref, size_t(cols))) << where;
    std::vector<uint16_t> h16(static_cast<size_t>(n_ff));
    FDL_CUDA_CHECK(cudaMemcpy(h16.data(), h.get(), h16.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    EXPECT_EQ(h16, to_host(h_ref, size_t(n_ff))) << where;
    EXPECT_EQ(to_host(io_buf, size_t(down_rows)), to_host(y_ref, size_t(down_rows))) << where;
  }
}

TEST_P(FfnBlockK16, GivesTheInvariantKernelsBits) {
  FDL_SKIP_WITHOUT_GPU();
  const WType type = GetParam();
  const int sms = device_sms();
  check_ffn_k16(type, 4096, 14336, 4096, sms);  // Llama-3-8B
  check_ffn_k16(type, 1280, 2304, 136, 7);      // short last segments, uneven shares
  check_ffn_k16(type, 256, 768, 200, sms);      // more blocks than row groups
  check_ffn_k16(type, 1280, 2304, 136, 1);      // one block: the hand-off to itself
  check_ffn_k16(type, 2304, 9216, 2304, sms, true);  // Gemma 2 2B's shape, GeGLU
}

TEST(FfnBlockK16Shapes, UnsupportedShapesAreRefused) {
  FDL_SKIP_WITHOUT_GPU();
  auto d = to_device(random_weights(WType::F16, size_t(1024) * 512));
  const cuda::DeviceMatrix gu{WType::F16, d.get(), 512, 256}, down{WType::F16, d.get(), 64, 256};
  EXPECT_GT(cuda::ffn_block_k16_blocks(gu, down, device_sms()), 0);
  const cuda::DeviceMatrix gu_f32{WType::F32, d.get(), 512, 256}, gu_odd{WType::F16, d.get(), 512, 264};
  const cuda::DeviceMatrix down_odd_rows{WType::F16, d.get(), 60, 256}, down_wide{WType::F16, d.get(), 64, 512};
  EXPECT_EQ(cuda::ffn_block_k16_blocks(gu_f32, down, device_sms()), 0);         // F32 weights
  EXPECT_EQ(cuda::ffn_block_k16_blocks(gu_odd, down, device_sms()), 0);         // K not whole batches
  EXPECT_EQ(cuda::ffn_block_k16_blocks(gu, down_odd_rows, device_sms()), 0);    // rows not groups of 8
  EXPECT_EQ(cuda::ffn_block_k16_blocks(gu, down_wide, device_sms()), 0);        // down's columns != n_ff
}

// decode_output_block_k16 against the invariant path's add_rms_norm + gemm_k16 for one row:
// the same logits, bit for bit, twice over garbage.
class OutputBlockK16 : public ::testing::TestWithParam<WType> {};

void check_output_k16(WType type, int64_t rows, int cols, int blocks) {
  const float eps = 1e-5f;
  auto dW = to_device(random_weights(type, size_t(rows) * size_t(cols)));
  const cuda::DeviceMatrix W{type, dW.get(), rows, cols};
  ASSERT_TRUE(cuda::output_block_k16_supported(W));
  const auto x = random_floats(size_t(cols), -3.f, 3.f), add = random_floats(size_t(cols));
  auto dadd = to_device(add), dw = to_device(random_floats(size_t(cols), 0.5f, 1.5f));
  auto x_ref = to_device(x);
  DeviceBuffer<uint16_t> xn{size_t(cols)};
  DeviceBuffer<float> y_ref{size_t(rows)};
  cuda::add_rms_norm(x_ref.get(), dadd.get(), dw.get(), xn.get(), nullptr, 1, cols, eps, false, nullptr, type);
  cuda::gemm_k16(W, xn.get(), 1, y_ref.get(), nullptr);
  auto dx = to_device(x);
  DeviceBuffer<float> y{size_t(rows)};
  for (int run = 0; run < 2; ++run) {
    poison(y);
    cuda::OutputBlockArgs o;
    o.type = type;
    o.w = W.data;
    o.rows = rows;
    o.cols = cols;
    o.in = cuda::NormIn{dx.get(), dadd.get(), dw.get(), nullptr, eps, nullptr};
    o.y = y.get();
    o.blocks = blocks;
    cuda::decode_output_block_k16(o, nullptr);
    FDL_CUDA_CHECK(cudaDeviceSynchronize());
    EXPECT_EQ(to_host(y, size_t(rows)), to_host(y_ref, size_t(rows)))
        << cuda::wtype_name(type) << " rows " << rows << " cols " << cols << " blocks " << blocks << " run " << run;
  }
}

TEST_P(OutputBlockK16, GivesTheInvariantKernelsBits) {
  FDL_SKIP_WITHOUT_GPU();
  const WType type = GetParam();
  check_output_k16(type, 128256, 4096, device_sms());  // Llama 3: one round per block
  check_output_k16(type, 32000, 1280, 7);              // several rounds, a short last segment
  check_output_k16(type, 48, 256, device_sms());       // blocks without rows
}

// decode_output_block against add_rms_norm + gemv (what it replaces): the residual written
// by block 0 when asked, the logits to fp32 rounding; twice per shape, over garbage outputs.
class OutputBlock : public ::testing::TestWithParam<WType> {};

/// `gemma`: the last layer's post-FFN norm on the addend and logits soft-capped at 30.
void check_output(WType type, int64_t rows, int cols, int blocks, bool gemma = false) {
  const float eps = 1e-5f;
  auto dW = to_device(random_weights(type, size_t(rows) * size_t(cols)));
  const cuda::DeviceMatrix W{type, dW.get(), rows, cols};
  ASSERT_TRUE(cuda::output_block_supported(W));
  const auto x = random_floats(size_t(cols), -3.f, 3.f), add = random_floats(size_t(cols));
  const auto w = random_floats(size_t(cols), 0.5f, 1.5f);
  auto dw = to_device(w), dadd = to_device(add);
  auto dadd_w = to_device(random_floats(size_t(cols), 0.5f, 1.5f));
  const float* add_w = gemma ? dadd_w.get() : nullptr;
  const float cap = gemma ? 30.f : 0.f;
  // x itself comes from the kernel right before (x0 + add, written back by add_rms_norm), as
  // in the model: reading it before the PDL wait would read x0.
  DeviceBuffer<float> xn{size_t(cols)}, y_ref{size_t(rows)};
  std::vector<float> sum(static_cast<size_t>(cols));  // what the kernel must normalize
  for (int i = 0; i < cols; ++i) sum[size_t(i)] = (x[size_t(i)] + add[size_t(i)]) + add[size_t(i)];
  {
    auto dx = to_device(x);
    cuda::add_rms_norm(dx.get(), dadd.get(), dw.get(), xn.get(), nullptr, 1, cols, eps, true, nullptr);
    cuda::add_rms_norm(dx.get(), dadd.get(), dw.get(), xn.get(), nullptr, 1, cols, eps, false, nullptr,
                       WType::F32, add_w);
    cuda::gemv(W, xn.get(), 1, y_ref.get(), nullptr);
    if (gemma) cuda::softcap(y_ref.get(), size_t(rows), cap, nullptr);
  }
  const std::vector<float> want = to_host(y_ref, size_t(rows));
  for (const bool write_x : {false, true}) {
    auto dx = to_device(x);
    DeviceBuffer<float> y{size_t(rows)}, x_out{size_t(cols)}, scratch{size_t(cols)};
    poison(y);
    poison(x_out);
    cuda::add_rms_norm(dx.get(), dadd.get(), dw.get(), scratch.get(), nullptr, 1, cols, eps, true, nullptr);
    cuda::OutputBlockArgs o;
    o.type = type;
    o.w = W.data;
    o.rows = rows;
    o.cols = cols;
    o.in = cuda::NormIn{dx.get(), dadd.get(), dw.get(), write_x ? x_out.get() : nullptr, eps, add_w};
    o.y = y.get();
    o.blocks = blocks;
    o.softcap = cap;
    cuda::decode_output_block(o, nullptr);
    const std::string where = std::string(cuda::wtype_name(type)) + " " + std::to_string(rows) + " x " +
                              std::to_string(cols) + " on " + std::to_string(blocks) + " blocks" +
                              (gemma ? " gemma" : "");
    EXPECT_LT(rel_error(to_host(y, size_t(rows)), widen(want)), 1e-6) << where;
    if (write_x && !gemma) {
      EXPECT_EQ(to_host(x_out, size_t(cols)), sum) << where;
    }
  }
}

TEST_P(OutputBlock, MatchesNormThenGemv) {
  FDL_SKIP_WITHOUT_GPU();
  const WType type = GetParam();
  const int sms = device_sms();
  check_output(type, 32003, 4096, sms);  // rows no block count divides, Llama-3's width
  check_output(type, 1003, 264, 7);      // few blocks, long shares, odd sizes
  check_output(type, 40, 64, sms);       // more warps than rows: idle blocks and warps
  check_output(type, 301, 264, 1);       // one block streams every row
  // Shared memory of 2 x cols floats: exactly 48 KiB of dynamic memory (plus the norm's
  // static array: past the default limit, so the launch must opt in), and 64 KiB (the widest
  // output_block_supported takes).
  check_output(type, 301, 6144, sms);
  check_output(type, 129, 8192, sms);
  check_output(type, 25600, 3584, sms, true);  // Gemma 2 9B's width: post-FFN norm, logits soft-capped
}

TEST(OutputBlockShapes, UnsupportedShapesAreRefused) {
  FDL_SKIP_WITHOUT_GPU();
  auto d = to_device(random_weights(WType::F16, size_t(64) * 64));
  EXPECT_TRUE(cuda::output_block_supported(cuda::DeviceMatrix{WType::F16, d.get(), 64, 64}));
  EXPECT_FALSE(cuda::output_block_supported(cuda::DeviceMatrix{WType::F16, d.get(), 64, 6}));  // 12-byte rows
  EXPECT_FALSE(cuda::output_block_supported(cuda::DeviceMatrix{WType::F32, d.get(), 1, 8196}));  // > 8192 cols
  cuda::OutputBlockArgs o;
  o.type = WType::F16;
  o.w = d.get();
  o.rows = 64;
  o.cols = 6;
  o.blocks = 1;
  EXPECT_THROW(cuda::decode_output_block(o, nullptr), cuda::CudaError);
}

INSTANTIATE_TEST_SUITE_P(Types, OutputBlock, ::testing::Values(WType::F32, WType::F16, WType::BF16),
                         [](const auto& info) { return std::string(cuda::wtype_name(info.param)); });

INSTANTIATE_TEST_SUITE_P(Types, FfnBlock, ::testing::Values(WType::F32, WType::F16, WType::BF16),
                         [](const auto& info) { return std::string(cuda::wtype_name(info.param)); });

INSTANTIATE_TEST_SUITE_P(Types, OutputBlockK16, ::testing::Values(WType::F16, WType::BF16),
                         [](const auto& info) { return std::string(cuda::wtype_name(info.param)); });

INSTANTIATE_TEST_SUITE_P(Types, AttentionBlockK16, ::testing::Values(WType::F16, WType::BF16),
                         [](const auto& info) { return std::string(cuda::wtype_name(info.param)); });

INSTANTIATE_TEST_SUITE_P(Types, FfnBlockK16, ::testing::Values(WType::F16, WType::BF16),
                         [](const auto& info) { return std::string(cuda::wtype_name(info.param)); });

INSTANTIATE_TEST_SUITE_P(Types, AttentionBlock, ::testing::Values(WType::F32, WType::F16, WType::BF16),
                         [](const auto& info) { return std::string(cuda::wtype_name(info.param)); });

}  // namespace
}  // namespace fdl::test
