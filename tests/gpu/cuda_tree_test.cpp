// Token trees on the CUDA model (StepBatch::tree_parent, docs/SPECULATIVE.md "Tree
// verification"): every tree node's logits match the CPU model's tree logits and a plain CUDA
// step at the end of that node's path (same argmax); packing an accepted branch with
// KvCache::move_slot moves the K/V on the device too, so decoding goes on as on a cache that
// only saw that branch; a tree next to plain tokens and a prefill chunk in one forward; the
// ancestor masks' 64-node limit (the high mask word at the limit, refusal past it); malformed
// trees throw before anything is written; the engine with tree verification gives exactly the
// plain greedy ids. Between them the attention kernels' tree variants all run: per token
// (stories260K, head dim 8, and steps of <= 16 tokens), tensor-core tiles of both sizes and
// fp32 tiles (codelm). The first tests check the host-side pieces (ancestor masks, the slot-move
// observer) and run without a GPU.
#include <iostream>
#include <tuple>

#include "engine/spec_test_support.h"
#include "gpu/gpu_test_util.h"
#include "model/model_test_util.h"
#include "model/token_tree.h"

namespace fdl::test {
namespace {

// The CPU tree test's tree (tests/model/tree_batch_test.cpp): 9 nodes over the root (node 0),
// branches of depth 1..4, three of them leaving slot order.
//   0 -> 1 -> 2 -> 3 -> 8
//   0 -> 4 -> 5
//   1 -> 6 -> 7
const std::vector<int32_t> kParents = {-1, 0, 1, 2, 0, 4, 1, 6, 3};
const std::vector<int32_t> kTokens = {261, 378, 432, 383, 286, 376, 298, 315, 421};
const std::vector<int32_t> kOther = {1, 403, 407};  // a plain sequence's prompt

std::vector<int32_t> path_of(const std::vector<int32_t>& parents, const std::vector<int32_t>& tokens, size_t node) {
  std::vector<int32_t> path;
  for (int32_t i = int32_t(node); i >= 0; i = parents[size_t(i)]) path.insert(path.begin(), tokens[size_t(i)]);
  return path;
}
std::vector<int32_t> path_of(size_t node) { return path_of(kParents, kTokens, node); }

std::vector<int32_t> make_prompt(size_t len) {
  std::vector<int32_t> prompt = {1};
  for (size_t i = 1; i < len; ++i) prompt.push_back(int32_t(260 + (i * 37) % 200));
  return prompt;
}

// Appends a tree (root first, every node wanting logits) for `seq` with its root at slot `pos`.
void add_tree(StepBatch& b, SeqId seq, size_t pos, const std::vector<int32_t>& parents,
              const std::vector<int32_t>& tokens) {
  const size_t root = b.size();
  b.add(tokens[0], int32_t(pos), seq, true);
  for (size_t i = 1; i < parents.size(); ++i) b.add_child(tokens[i], root + size_t(parents[i]), true);
}

std::vector<float> row(const std::vector<float>& logits, size_t r, int n_vocab) {
  return std::vector<float>(logits.begin() + int64_t(r) * n_vocab, logits.begin() + int64_t(r + 1) * n_vocab);
}

double rel(const std::vector<float>& got, const std::vector<float>& want) {
  return rel_error(got, std::vector<double>(want.begin(), want.end()));
}

/// The tree's logits on the CPU model: its prompt, then the tree in one forward.
std::vector<float> cpu_tree_logits(const std::string& file, const std::vector<int32_t>& prompt,
                                   const std::vector<int32_t>& parents, const std::vector<int32_t>& tokens) {
  Model& cpu = shared_model(file, 2);
  auto pool = make_pool(cpu, prompt.size() + parents.size() + 16);
  KvCache kv(*pool);
  const SeqId seq = prefill_sequence(cpu, kv, prompt);
  StepBatch b;
  add_tree(b, seq, kv.append_slots(seq, parents.size()), parents, tokens);
  std::vector<float> logits;
  cpu.forward(b, kv, logits);
  return logits;
}

bool is_codelm(const std::string& file) { return file.find("codelm") == 0; }

// ---- host side (no GPU needed) ----

TEST(CudaTreeHost, AncestorMasksAndWindowOfTheLayout) {
  StepBatch b;
  b.add(5, 3, 0, true);  // an ordinary token of another sequence
  add_tree(b, 1, 40, kParents, kTokens);
  TokenTreeLayout t;
  t.resolve(b);
  EXPECT_TRUE(t.has_tree());
  EXPECT_EQ(t.window(), 8);
  // Bit k: slot 41 + k (node k + 1) is on the path, the node itself included.
  const std::vector<uint64_t> want = {0, 0, 0b1, 0b11, 0b111, 0b1000, 0b11000, 0b100001, 0b1100001, 0b10000111};
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(t.ancestor_mask(i), want[i]) << "batch token " << i;
  for (size_t i = 2; i < b.size(); ++i) {
    EXPECT_EQ(t.slot(i), int32_t(40 + i - 1)) << "batch token " << i;
    EXPECT_EQ(t.tree_base()[i], 41) << "batch token " << i;
  }

  // A chain of 70 nodes: the window counts nodes below the root; bit 63 is the 64th node's.
  StepBatch c;
  c.add(1, 0, 0, true);
  for (size_t i = 1; i <= 70; ++i) c.add_child(2, i - 1, true);
  t.resolve(c);
  EXPECT_EQ(t.window(), 70);
  EXPECT_EQ(t.ancestor_mask(64), ~uint64_t(0));
  EXPECT_EQ(t.ancestor_mask(32), (uint64_t(1) << 32) - 1);

  StepBatch plain;
  plain.add(1, 0, 0, true);
  plain.add(2, 1, 0, true);
  plain.tree_parent = {-1, -1};  // no tree
  t.resolve(plain);
  EXPECT_FALSE(t.has_tree());
  EXPECT_EQ(t.window(), 0);
}

// ---- on the GPU ----

struct TreeCase {
  std::string model;
  int block_size;
  size_t prompt_len;
};

class CudaTree : public ::testing::TestWithParam<TreeCase> {};

TEST_P(CudaTree, EveryNodeMatchesTheCpuTreeAndAPlainCudaStepAlongItsPath) {
  FDL_SKIP_WITHOUT_GPU();
  const TreeCase& c = GetParam();
  Model& m = cuda_model(c.model, KvDtype::F32);
  ASSERT_TRUE(m.supports_tree_verification());
  const int V = m.config().n_vocab;
  const std::vector<int32_t> prompt = make_prompt(c.prompt_len);
  // A codelm prompt above 16 tokens is prefilled through 16-bit GEMMs on the GPU (docs/GPU.md):
  // its K/V, so every later logit, differs from the CPU's by that rounding. The CUDA plain
  // path saw the same prefill: fp32 differences only.
  const double tol_cpu = is_codelm(c.model) && prompt.size() > size_t(cuda::kGemvMaxTokens) ? 3e-3 : 1e-5;
  auto pool = make_pool(m, 4 * (prompt.size() + 32), c.block_size);
  KvCache kv(*pool);
  const size_t free0 = pool->n_free();

  const SeqId seq = prefill_sequence(m, kv, prompt);
  const SeqId other = prefill_sequence(m, kv, kOther);
  StepBatch b;
  const size_t pos = kv.append_slots(seq, kParents.size());
  b.add(17, int32_t(kv.append_slots(other, 1)), other, true);
  add_tree(b, seq, pos, kParents, kTokens);
  std::vector<float> tree;
  m.forward(b, kv, tree);
  ASSERT_EQ(tree.size(), (kParents.size() + 1) * size_t(V));
  const std::vector<float> cpu = cpu_tree_logits(c.model, prompt, kParents, kTokens);

  double worst_cpu = 0, worst_plain = 0;
  for (size_t i = 0; i < kParents.size(); ++i) {
    SCOPED_TRACE("node " + std::to_string(i) + " (depth " + std::to_string(path_of(i).size() - 1) + ")");
    const std::vector<float> got = row(tree, i + 1, V), want_cpu = row(cpu, i, V);
    const std::vector<float> plain = plain_path_logits(m, kv, prompt, path_of(i));
    const double e_cpu = rel(got, want_cpu), e_plain = rel(got, plain);
    worst_cpu = std::max(worst_cpu, e_cpu);
    worst_plain = std::max(worst_plain, e_plain);
    EXPECT_LT(e_cpu, tol_cpu);
    EXPECT_LT(e_plain, 1e-5);
    EXPECT_EQ(argmax(got.data(), V), argmax(plain.data(), V));
    if (tol_cpu <= 1e-5) {
      EXPECT_EQ(argmax(got.data(), V), argmax(want_cpu.data(), V));
    }
  }
  std::cout << "  tree nodes: worst rel error vs CPU tree " << worst_cpu << ", vs CUDA plain path " << worst_plain
            << "\n";
  EXPECT_LT(rel(row(tree, 0, V), plain_path_logits(m, kv, kOther, {17})), 1e-5) << "the plain sequence next to the tree";
  kv.free_sequence(seq);
  kv.free_sequence(other);
  EXPECT_EQ(pool->n_free(), free0);
}

// After the tree step, the engine's rollback: the accepted branch's slots packed right after
// the root by move_slot (on the device too), the rest truncated. Greedy decoding then goes on
// exactly as on a sequence that only ever saw the accepted path.
void check_packed_branch(Model& m, const TreeCase& c, double tol) {
  const int V = m.config().n_vocab;
  const std::vector<int32_t> prompt = make_prompt(c.prompt_len);
  const int steps = 6;
  // Accepted branches, as tree nodes from the root: in slot order, leaving it at depth 1 and
  // at depth 2 (node 6 sits 4 slots right of its depth).
  const std::vector<std::vector<int32_t>> branches = {{0, 1, 2, 3, 8}, {0, 4, 5}, {0, 1, 6, 7}};
  for (const std::vector<int32_t>& branch : branches) {
    SCOPED_TRACE("branch ending at node " + std::to_string(branch.back()));
    auto pool = make_pool(m, 4 * (prompt.size() + 32), c.block_size);
    KvCache kv(*pool);
    const size_t free0 = pool->n_free();
    const SeqId seq = prefill_sequence(m, kv, prompt);
    StepBatch b;
    const size_t pos = kv.append_slots(seq, kParents.size());
    add_tree(b, seq, pos, kParents, kTokens);
    std::vector<float> tree;
    m.forward(b, kv, tree);
    for (size_t d = 1; d < branch.size(); ++d)
      kv.move_slot(seq, pos + size_t(branch[d]), pos + d);
    kv.truncate(seq, pos + branch.size());

    // The reference sequence, in the same cache: the prompt, then the branch plainly.
    const SeqId ref = prefill_sequence(m, kv, prompt);
    std::vector<float> want;
    for (int32_t node : branch) {
      b.clear();
      b.add(kTokens[size_t(node)], int32_t(kv.append_slots(ref, 1)), ref, true);
      m.forward(b, kv, want);
    }
    std::vector<float> got = row(tree, size_t(branch.back()), V);
    EXPECT_LT(rel(got, want), tol) << "the branch's last node";
    for (int s = 0; s < steps; ++s) {
      const int32_t next = argmax(got.data(), V);
      if (tol <= 1e-5) {  // else a near-tie may flip
        ASSERT_EQ(next, argmax(want.data(), V)) << "step " << s;
      }
      b.clear();
      b.add(next, int32_t(kv.append_slots(seq, 1)), seq, true);
      m.forward(b, kv, got);
      b.clear();
      b.add(next, int32_t(kv.append_slots(ref, 1)), ref, true);
      m.forward(b, kv, want);
      EXPECT_LT(rel(got, want), tol) << "step " << s;
    }
    kv.free_sequence(seq);
    kv.free_sequence(ref);
    EXPECT_EQ(pool->n_free(), free0);
  }
}

TEST_P(CudaTree, AcceptedBranchPackedByMoveSlotDecodesAsThePlainPath) {
  FDL_SKIP_WITHOUT_GPU();
  check_packed_branch(cuda_model(GetParam().model, KvDtype::F32), GetParam(), 1e-5);
}

// The same over codelm's default fp16 cache: the packed slots move as 2-byte elements (the
// device replays one 2-D copy of the slot's K and V rows per layer). The tree step and the
// plain steps compute K/V to fp32 rounding apart, which fp16 rounds one step (2^-11) apart
// now and then, so the bound is ~1e-3 instead of 1e-5; a misplaced slot would be off by ~1.
TEST(CudaTreeF16Cache, AcceptedBranchPackedByMoveSlotDecodesAsThePlainPath) {
  FDL_SKIP_WITHOUT_GPU();
  Model& m = cuda_model("codelm-16m-f16.gguf");
  ASSERT_EQ(m.kv_shape(16).dtype, KvDtype::F16);
  for (const TreeCase& c : {TreeCase{"codelm-16m-f16.gguf", 16, 14}, TreeCase{"codelm-16m-f16.gguf", 3, 29}}) {
    SCOPED_TRACE("block size " + std::to_string(c.block_size));
    check_packed_branch(m, c, 2e-3);
  }
}

// Two caches on one pool: the block a cache frees after packing its accepted branch
// (move_slot, then truncate) is the next block the other cache writes (the free list is
// LIFO). The moves must reach the device before the other cache's kernels overwrite their
// source, whichever cache runs the next forward, and a cache destroyed with moves pending
// must not replay them later over blocks the other cache owns by then (a tier copy of a block
// replays what is pending first). Found by review: the log was per cache.
TEST(CudaTreeOrdering, MovesReachTheDeviceBeforeAnotherCacheOfThePoolReusesTheirBlocks) {
  FDL_SKIP_WITHOUT_GPU();
  Model& m = cuda_model("stories260K.gguf");
  const std::vector<int32_t> prompt = make_prompt(8), prompt_b = make_prompt(11);
  std::vector<float> want_a, want_b;
  {  // references on a pool of their own, before the pool under test is on the device
    auto ref_pool = make_pool(m, 256, 4);
    KvCache ref(*ref_pool);
    want_a = plain_path_logits(m, ref, prompt, {kTokens[0], kTokens[4], kTokens[5], 17});
    want_b = plain_path_logits(m, ref, prompt_b, {17});
  }
  for (const bool destroy_a : {false, true}) {
    SCOPED_TRACE(destroy_a ? "cache a destroyed after its moves" : "both caches live");
    auto pool = make_pool(m, 256, 4);
    auto a = std::make_unique<KvCache>(*pool);
    KvCache b(*pool);
    const SeqId sa = prefill_sequence(m, *a, prompt);      // slots 0..7
    const size_t pos = a->append_slots(sa, kParents.size());  // 8..16: the tree
    StepBatch batch;
    add_tree(batch, sa, pos, kParents, kTokens);
    std::vector<float> logits;
    m.forward(batch, *a, logits);
    a->move_slot(sa, pos + 4, pos + 1);  // accept 0 -> 4 -> 5: slots 12, 13 -> 9, 10
    a->move_slot(sa, pos + 5, pos + 2);
    a->truncate(sa, pos + 3);  // frees the blocks of slots 12..16, the moves' sources
    if (destroy_a) a.reset();
    const SeqId sb = prefill_sequence(m, b, prompt_b);  // takes the freed blocks and writes them
    if (destroy_a) {
      pool->pull_from_mirror(b.block_table(sb).back());  // a tier copy: replays what is pending
    } else {
      batch.clear();
      batch.add(17, int32_t(a->append_slots(sa, 1)), sa, true);
      m.forward(batch, *a, logits);
      EXPECT_LT(rel(logits, want_a), 1e-5) << "cache a read its moved slots";
    }
    batch.clear();
    batch.add(17, int32_t(b.append_slots(sb, 1)), sb, true);
    m.forward(batch, b, logits);
    EXPECT_LT(rel(logits, want_b), 1e-5) << "cache b's blocks were left alone";
  }
}

// One forward of three sequences: a plain decode token, a prefill chunk of 20 tokens and the
// tree (above the GEMV size: cuBLAS GEMMs; for codelm attention tiles, the tree one run of
// consecutive slots with its root). Twice, so the second run of the shape replays a CUDA
// graph. Every row is checked against separate runs on `m` (the chunk alone, the plain token
// alone) or, for the tree's nodes, the CPU tree.
void check_mixed_batch(Model& m, const TreeCase& c) {
  const int V = m.config().n_vocab;
  // F16 weights: a step above 16 tokens rounds activations to 16 bits (docs/GPU.md).
  const double tol = is_codelm(c.model) ? 3e-3 : 1e-5;
  const std::vector<int32_t> prompt = make_prompt(c.prompt_len);
  std::vector<int32_t> chunk;
  for (int i = 0; i < 20; ++i) chunk.push_back(int32_t(300 + (i * 53) % 150));
  const std::vector<float> cpu = cpu_tree_logits(c.model, prompt, kParents, kTokens);
  auto pool = make_pool(m, 8 * (prompt.size() + 64), c.block_size);
  KvCache kv(*pool);
  // The chunk's reference: its last token's logits from a prefill of the chunk alone.
  std::vector<float> chunk_alone;
  {
    const SeqId s = kv.create_sequence();
    StepBatch b;
    const size_t f = kv.append_slots(s, chunk.size());
    for (size_t i = 0; i < chunk.size(); ++i) b.add(chunk[i], int32_t(f + i), s, i + 1 == chunk.size());
    m.forward(b, kv, chunk_alone);
    kv.free_sequence(s);
  }
  const std::vector<float> other_alone = plain_path_logits(m, kv, kOther, {17});
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const SeqId seq = prefill_sequence(m, kv, prompt);
    const SeqId other = prefill_sequence(m, kv, kOther);
    const SeqId fresh = kv.create_sequence();
    StepBatch b;
    b.add(17, int32_t(kv.append_slots(other, 1)), other, true);
    const size_t f = kv.append_slots(fresh, chunk.size());
    for (size_t i = 0; i < chunk.size(); ++i) b.add(chunk[i], int32_t(f + i), fresh, i + 1 == chunk.size());
    add_tree(b, seq, kv.append_slots(seq, kParents.size()), kParents, kTokens);
    ASSERT_GT(b.size(), size_t(cuda::kGemvMaxTokens));
    std::vector<float> mixed;
    m.forward(b, kv, mixed);
    ASSERT_EQ(mixed.size(), (2 + kParents.size()) * size_t(V));
    EXPECT_LT(rel(row(mixed, 0, V), other_alone), tol) << "the plain decode token";
    EXPECT_LT(rel(row(mixed, 1, V), chunk_alone), tol) << "the prefill chunk's last token";
    for (size_t i = 0; i < kParents.size(); ++i)
      EXPECT_LT(rel(row(mixed, 2 + i, V), row(cpu, i, V)), tol) << "node " << i;
    kv.free_sequence(seq);
    kv.free_sequence(other);
    kv.free_sequence(fresh);
  }
}

TEST_P(CudaTree, TreeNextToPlainTokensAndAPrefillChunkInOneForward) {
  FDL_SKIP_WITHOUT_GPU();
  check_mixed_batch(cuda_model(GetParam().model, KvDtype::F32), GetParam());
}

// The same on fp32 attention tiles (FLASHDLLM_ATTN_TC=0, read by the constructor; codelm's
// head dim 64 tiles, stories260K's 8 does not).
TEST(CudaTreeTiles, MixedBatchOnFp32Tiles) {
  FDL_SKIP_WITHOUT_GPU();
  ::setenv("FLASHDLLM_ATTN_TC", "0", 1);
  std::unique_ptr<Model> fp32 = Model::load(model_path("codelm-16m-f16.gguf"),
                                            ModelOptions{.device = Device::Cuda, .kv_dtype = KvDtype::F32, .batch_invariant = false});
  ::unsetenv("FLASHDLLM_ATTN_TC");
  for (const TreeCase& c : {TreeCase{"codelm-16m-f16.gguf", 16, 14}, TreeCase{"codelm-16m-f16.gguf", 4, 45}}) {
    SCOPED_TRACE("block size " + std::to_string(c.block_size));
    check_mixed_batch(*fp32, c);
  }
}

// Four sequences with a small tree each (root + 4 nodes, two leaving slot order): a step of
// 20 tokens whose tiles are one tree of 5 tokens each (codelm: 15 rows, so the tensor-core
// kernel for tiles of <= 16 rows).
TEST_P(CudaTree, SeveralSmallTreesInOneStep) {
  FDL_SKIP_WITHOUT_GPU();
  const TreeCase& c = GetParam();
  Model& m = cuda_model(c.model, KvDtype::F32);
  const int V = m.config().n_vocab;
  const double tol = is_codelm(c.model) ? 3e-3 : 1e-5;  // 20 tokens: 16-bit GEMMs for F16 weights
  const std::vector<int32_t> parents = {-1, 0, 0, 2, 1};
  const std::vector<int32_t> tokens = {261, 378, 286, 376, 298};
  auto pool = make_pool(m, 4 * (c.prompt_len + 32), c.block_size);
  KvCache kv(*pool);
  std::vector<std::vector<int32_t>> prompts;
  std::vector<SeqId> seqs;
  StepBatch b;
  for (size_t s = 0; s < 4; ++s) {
    prompts.push_back(make_prompt(c.prompt_len + s));
    prompts.back()[1] = int32_t(270 + s);  // distinct contexts
    seqs.push_back(prefill_sequence(m, kv, prompts.back()));
  }
  for (size_t s = 0; s < 4; ++s) add_tree(b, seqs[s], kv.append_slots(seqs[s], parents.size()), parents, tokens);
  std::vector<float> logits;
  m.forward(b, kv, logits);
  ASSERT_EQ(logits.size(), 4 * parents.size() * size_t(V));
  for (size_t s = 0; s < 4; ++s) {
    const std::vector<float> cpu = cpu_tree_logits(c.model, prompts[s], parents, tokens);
    for (size_t i = 0; i < parents.size(); ++i)
      EXPECT_LT(rel(row(logits, s * parents.size() + i, V), row(cpu, i, V)), tol) << "sequence " << s << " node " << i;
  }
}

// 64 nodes below the root (the ancestor masks' limit): two interleaved chains, so the deepest
// nodes' masks have every other bit set across both 32-bit words; 65 are refused.
TEST_P(CudaTree, SixtyFourNodesAreTheLimit) {
  FDL_SKIP_WITHOUT_GPU();
  const TreeCase& c = GetParam();
  Model& m = cuda_model(c.model, KvDtype::F32);
  const int V = m.config().n_vocab;
  const std::vector<int32_t> prompt = make_prompt(c.prompt_len);
  std::vector<int32_t> parents = {-1, 0, 0}, tokens = {261, 300, 301};
  for (int32_t i = 3; i <= 64; ++i) {
    parents.push_back(i - 2);
    tokens.push_back(int32_t(262 + (i * 29) % 190));
  }
  const std::vector<float> cpu = cpu_tree_logits(c.model, prompt, parents, tokens);
  auto pool = make_pool(m, 2 * (prompt.size() + 160), c.block_size);
  KvCache kv(*pool);
  const SeqId seq = prefill_sequence(m, kv, prompt);
  const size_t pos = kv.append_slots(seq, parents.size() + 1);
  StepBatch b;
  add_tree(b, seq, pos, parents, tokens);
  std::vector<float> logits;
  m.forward(b, kv, logits);
  ASSERT_EQ(logits.size(), parents.size() * size_t(V));
  const double tol = is_codelm(c.model) ? 3e-3 : 1e-5;  // 65 tokens: 16-bit GEMMs for F16 weights
  for (size_t i = 0; i < parents.size(); ++i) EXPECT_LT(rel(row(logits, i, V), row(cpu, i, V)), tol) << "node " << i;
  // Nodes 63 and 64 (mask bits 62, 63) against plain steps along their paths.
  for (size_t i : {size_t(63), size_t(64)})
    EXPECT_LT(rel(row(logits, i, V), plain_path_logits(m, kv, prompt, path_of(parents, tokens, i))), tol) << "node " << i;

  parents.push_back(63);
  tokens.push_back(270);
  b.clear();
  add_tree(b, seq, pos, parents, tokens);
  const size_t free_before = pool->n_free();
  EXPECT_THROW(m.forward(b, kv, logits), std::invalid_argument);
  EXPECT_EQ(pool->n_free(), free_before);
}

std::string case_name(const ::testing::TestParamInfo<TreeCase>& info) {
  const TreeCase& c = info.param;
  return (is_codelm(c.model) ? std::string("codelm16m") : std::string("stories260K")) + "_bs" +
         std::to_string(c.block_size) + "_ctx" + std::to_string(c.prompt_len);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaTree,
                         ::testing::Values(TreeCase{"stories260K.gguf", 16, 13}, TreeCase{"stories260K.gguf", 3, 29},
                                           TreeCase{"codelm-16m-f16.gguf", 16, 14},
                                           TreeCase{"codelm-16m-f16.gguf", 4, 45}),
                         case_name);

// Malformed and oversized trees: std::invalid_argument (std::out_of_range for an unreserved
// slot) before anything is written — the pool's counts and the device bytes of the tree's
// slots unchanged (read back through the pool's mirror, which the CUDA model is).
TEST(CudaTreeErrors, MalformedTreesThrowBeforeWriting) {
  FDL_SKIP_WITHOUT_GPU();
  Model& m = cuda_model("stories260K.gguf");
  auto pool = make_pool(m, 256);
  KvCache kv(*pool);
  const SeqId seq = prefill_sequence(m, kv, {1, 403, 407, 261});
  const SeqId other = prefill_sequence(m, kv, {1, 359});
  const size_t pos = kv.append_slots(seq, 3);
  kv.append_slots(other, 1);
  const BlockId block = kv.block_table(seq)[pos / 16];
  const auto device_bytes = [&] {
    pool->pull_from_mirror(block);  // the device's copy of the block into the host arena
    const std::span<uint8_t> bytes = pool->block_bytes(block);
    return std::vector<uint8_t>(bytes.begin(), bytes.end());
  };
  const std::vector<uint8_t> before = device_bytes();
  const size_t free0 = pool->n_free();
  const StepBatch ok = expect_malformed_trees_refused(m, kv, seq, other, pos, [&](const char* what) {
    EXPECT_EQ(pool->n_free(), free0) << what;
    EXPECT_TRUE(device_bytes() == before) << what << ": K/V written";
  });
  std::vector<float> logits;
  {
    // 65 nodes below the root, every slot reserved: refused for its size alone.
    const size_t big = kv.append_slots(seq, 63);  // pos .. pos + 65 now reserved
    ASSERT_EQ(big, pos + 3);
    StepBatch b;
    b.add(5, int32_t(pos), seq, true);
    for (size_t i = 1; i <= 65; ++i) b.add_child(int32_t(6 + i % 50), i - 1, i == 65);
    const size_t free_big = pool->n_free();
    EXPECT_THROW(m.forward(b, kv, logits), std::invalid_argument) << "a tree of 65 nodes";
    EXPECT_EQ(pool->n_free(), free_big);
    EXPECT_TRUE(device_bytes() == before) << "a tree of 65 nodes: K/V written";
    kv.truncate(seq, pos + 3);
  }
  EXPECT_NO_THROW(m.forward(ok, kv, logits));
  EXPECT_EQ(logits.size(), 3 * size_t(m.config().n_vocab));
  EXPECT_FALSE(device_bytes() == before) << "the valid tree wrote its K/V";
}

// A slot move the model never heard of (its observer replaced) would leave the device K/V
// stale: the next forward refuses instead of reading it.
TEST(CudaTreeErrors, ReplacedSlotMoveObserverIsDetected) {
  FDL_SKIP_WITHOUT_GPU();
  Model& m = cuda_model("stories260K.gguf");
  auto pool = make_pool(m, 64);
  KvCache kv(*pool);
  const SeqId seq = prefill_sequence(m, kv, {1, 403, 407, 261});
  StepBatch b;
  const size_t pos = kv.append_slots(seq, 3);
  b.add(5, int32_t(pos), seq, false);
  b.add_child(6, 0, false);
  b.add_child(7, 0, true);
  std::vector<float> logits;
  m.forward(b, kv, logits);
  kv.set_slot_move_observer({});  // someone else takes the hook
  kv.move_slot(seq, pos + 2, pos + 1);
  kv.truncate(seq, pos + 2);
  b.clear();
  b.add(8, int32_t(kv.append_slots(seq, 1)), seq, true);
  EXPECT_THROW(m.forward(b, kv, logits), std::logic_error);
}

// The engine end to end (Generator, as the CLI's --spec-tree on): tree verification on the
// CUDA model gives exactly the plain greedy results, accepts branches off the first one,
// and returns every block. Requests run one at a time, so every verification step stays at
// most 16 tokens (fp32 GEMVs, as the plain decode): a larger step's 16-bit rounding could
// turn a near-tie of the F16 model.
TEST(CudaTreeEngine, TreeVerificationEqualsPlainGreedy) {
  FDL_SKIP_WITHOUT_GPU();
  for (const std::string file : {"stories260K.gguf", "codelm-16m-f16.gguf"}) {
    SCOPED_TRACE(file);
    // An fp32 cache: a 16-bit one rounds K/V that the tree step and a plain step compute to
    // fp32 rounding apart one 16-bit step apart now and then (~1e-4 in the logits), which can
    // resolve a near-tie differently; the tree logic is what this compares.
    const LoadedModel m = load_model(model_path(file), ModelOptions{.device = Device::Cuda, .kv_dtype = KvDtype::F32, .batch_invariant = false});
    std::vector<GenerationRequest> reqs;
    if (is_codelm(file)) {
      reqs = reference_requests("codelm_greedy.json");
    } else {
      for (const char* text : {"Lily had a red ball. Lily had a blue hat. Lily had a red",
                               "Tom saw a cat. Tom saw a bird. Tom saw a dog. Tom saw a",
                               "The dog ran to the park. The dog ran to the tree. The dog ran to the"})
        reqs.push_back(greedy_request(encode_prompt(*m.tokenizer, text), 60));
    }
    int64_t tree_steps = 0;
    for (const int block_size : {16, 1}) {  // 1: every packed branch crosses blocks
      SCOPED_TRACE("block size " + std::to_string(block_size));
      GeneratorOptions po;
      po.block_size = block_size;
      auto plain = make_generator(m, po);
      std::vector<GenerationResult> want;
      for (const auto& r : reqs) want.push_back(plain.generate({r}).at(0));
      for (const SpecMode mode : {SpecMode::Lookup, SpecMode::Auto}) {
        SCOPED_TRACE(spec_mode_name(mode));
        GeneratorOptions o = spec_options(mode, 8);
        o.spec.tree = true;
        o.block_size = block_size;
        auto gen = make_generator(m, o);
        std::vector<GenerationResult> got;
        for (const auto& r : reqs) got.push_back(gen.generate({r}).at(0));
        expect_same_results(got, want);
        expect_pool_full(gen);
        const SpecMetrics& sm = gen.spec_metrics();
        std::cout << "  " << file << " " << spec_mode_name(mode) << " block " << block_size << ": tree steps "
                  << sm.tree_steps << " of " << sm.spec_seq_steps << ", accepted " << sm.accepted
                  << " (off the first branch " << sm.tree_alt_accepted << ")\n";
        tree_steps += sm.tree_steps;
      }
    }
    EXPECT_GT(tree_steps, 0) << "no tree was verified";
  }
}

}  // namespace
}  // namespace fdl::test
