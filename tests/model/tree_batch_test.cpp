// Token trees in a StepBatch (flashdllm/model.h, tree_parent): every tree node's logits must be
// bit-identical to a plain step at the end of that node's path, whatever the tree shape, the
// block size (trees that cross block boundaries), the thread count or the other sequences in
// the batch; packing an accepted branch with KvCache::move_slot must leave the cache exactly as
// plain decoding along that branch would; malformed trees throw before anything is written.
#include <cstring>

#include "model/model_test_util.h"

namespace fdl::test {
namespace {

bool bit_equal(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

// A tree of 9 nodes over the root x0 (node 0); parents come before children. Branches of
// depth 1..4 that leave slot order at several depths.
//   0 -> 1 -> 2 -> 3 -> 8
//   0 -> 4 -> 5
//   1 -> 6 -> 7
const std::vector<int32_t> kParents = {-1, 0, 1, 2, 0, 4, 1, 6, 3};
const std::vector<int32_t> kTokens = {261, 378, 432, 383, 286, 376, 298, 315, 421};

std::vector<int32_t> path_of(size_t node) {
  std::vector<int32_t> path;
  for (int32_t i = int32_t(node); i >= 0; i = kParents[size_t(i)]) path.insert(path.begin(), kTokens[size_t(i)]);
  return path;
}

struct TreeCase {
  std::string model;
  int block_size;
  int threads;
  size_t prompt_len;
};

class TreeBatch : public ::testing::TestWithParam<TreeCase> {};

TEST_P(TreeBatch, EveryNodeMatchesAPlainStepAlongItsPath) {
  const TreeCase& c = GetParam();
  Model& m = shared_model(c.model, c.threads);
  ASSERT_TRUE(m.supports_tree_verification());
  const int n_vocab = m.config().n_vocab;
  std::vector<int32_t> prompt = {1};
  for (size_t i = 1; i < c.prompt_len; ++i) prompt.push_back(int32_t(260 + (i * 37) % 200));
  auto pool = make_pool(m, 4 * (prompt.size() + 32), c.block_size);
  KvCache kv(*pool);
  const size_t free0 = pool->n_free();

  const SeqId seq = prefill_sequence(m, kv, prompt);
  const SeqId other = prefill_sequence(m, kv, {1, 403, 407});  // a plain sequence in the same batch
  StepBatch b;
  const size_t pos = kv.append_slots(seq, kParents.size());
  const size_t other_pos = kv.append_slots(other, 1);
  b.add(17, int32_t(other_pos), other, true);
  const size_t root = b.size();
  b.add(kTokens[0], int32_t(pos), seq, true);
  for (size_t i = 1; i < kParents.size(); ++i) b.add_child(kTokens[i], root + size_t(kParents[i]), true);
  std::vector<float> tree;
  m.forward(b, kv, tree);
  ASSERT_EQ(tree.size(), (kParents.size() + 1) * size_t(n_vocab));

  for (size_t i = 0; i < kParents.size(); ++i) {
    const std::vector<float> want = plain_path_logits(m, kv, prompt, path_of(i));
    EXPECT_TRUE(bit_equal(tree.data() + (i + 1) * size_t(n_vocab), want.data(), size_t(n_vocab)))
        << "node " << i << " (depth " << path_of(i).size() - 1 << ")";
  }
  EXPECT_TRUE(bit_equal(tree.data(), plain_path_logits(m, kv, {1, 403, 407}, {17}).data(), size_t(n_vocab)))
      << "the plain sequence next to the tree";

  // Accept the branch 0 -> 4 -> 5 (slots pos, pos+4, pos+5): pack it, truncate, go on plainly.
  kv.move_slot(seq, pos + 4, pos + 1);
  kv.move_slot(seq, pos + 5, pos + 2);
  kv.truncate(seq, pos + 3);
  b.clear();
  b.add(395, int32_t(kv.append_slots(seq, 1)), seq, true);
  std::vector<float> next;
  m.forward(b, kv, next);
  const std::vector<float> want = plain_path_logits(m, kv, prompt, {kTokens[0], kTokens[4], kTokens[5], 395});
  EXPECT_TRUE(bit_equal(next.data(), want.data(), size_t(n_vocab))) << "after packing the accepted branch";

  kv.free_sequence(seq);
  kv.free_sequence(other);
  EXPECT_EQ(pool->n_free(), free0);
}

std::string case_name(const ::testing::TestParamInfo<TreeCase>& info) {
  const TreeCase& c = info.param;
  return (c.model.find("stories") == 0 ? std::string("stories260K") : std::string("codelm16m")) + "_bs" +
         std::to_string(c.block_size) + "_t" + std::to_string(c.threads) + "_ctx" + std::to_string(c.prompt_len);
}

INSTANTIATE_TEST_SUITE_P(Models, TreeBatch,
                         ::testing::Values(TreeCase{"stories260K.gguf", 16, 1, 13}, TreeCase{"stories260K.gguf", 3, 2, 29},
                                           TreeCase{"stories260K.gguf", 16, 2, 70},
                                           TreeCase{"codelm-16m-f16.gguf", 16, 1, 14},
                                           TreeCase{"codelm-16m-f16.gguf", 4, 2, 45}),
                         case_name);

// Malformed trees: std::invalid_argument (or out_of_range for an unreserved slot) before any
// K/V is written.
TEST(TreeBatchErrors, MalformedTreesThrowBeforeWriting) {
  Model& m = shared_model("stories260K.gguf");
  auto pool = make_pool(m, 128);
  KvCache kv(*pool);
  const SeqId seq = prefill_sequence(m, kv, {1, 403, 407, 261});
  const SeqId other = prefill_sequence(m, kv, {1, 359});
  const size_t pos = kv.append_slots(seq, 3);
  kv.append_slots(other, 1);
  const size_t kv_floats = pool->shape().elems_per_token_per_layer();
  std::vector<float> before(kv.k_slot(seq, 0, pos), kv.k_slot(seq, 0, pos) + kv_floats);
  StepBatch ok = expect_malformed_trees_refused(m, kv, seq, other, pos, [&](const char* what) {
    EXPECT_TRUE(bit_equal(kv.k_slot(seq, 0, pos), before.data(), kv_floats)) << what << ": K/V written";
  });
  std::vector<float> logits;
  EXPECT_NO_THROW(m.forward(ok, kv, logits));
  EXPECT_EQ(logits.size(), 3 * size_t(m.config().n_vocab));
}

}  // namespace
}  // namespace fdl::test
