// A token's logits must not depend on what else is in the batch, on how its prompt was fed
// (one forward or token by token) or on the thread count. Checked on both models: stories260K
// (F32 weights) and codelm-16m (F16 weights, GQA 6/2, head dim 64).
#include <cstring>

#include "model/model_test_util.h"

namespace fdl::test {
namespace {

// Prompts of different lengths (ids valid in both vocabularies), so sequences in a batch sit
// at different positions and cross block boundaries at different steps.
std::vector<std::vector<int32_t>> eight_prompts() {
  return {{1, 403, 407, 261, 378},
          {1},
          {1, 317, 269, 274, 287, 263, 377, 267, 265},
          {1, 385, 328, 432, 261},
          {1, 392, 417, 412, 336, 432, 313, 440, 485, 306, 410, 403, 407},
          {1, 359},
          {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401},
          {403, 407, 261, 378}};
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Decoded {
  std::vector<int32_t> ids;
  std::vector<std::vector<float>> logits;  // behind each id
};

// Decodes several prompts together: each prompt prefilled in its own forward, then every
// decode step is ONE forward holding the next token of every sequence.
std::vector<Decoded> decode_together(Model& m, KvCache& kv,
                                     const std::vector<std::vector<int32_t>>& prompts, int n_predict) {
  const int n_vocab = m.config().n_vocab;
  std::vector<SeqId> seqs;
  std::vector<Decoded> out(prompts.size());
  StepBatch batch;
  std::vector<float> logits;
  for (size_t p = 0; p < prompts.size(); ++p) {
    const SeqId s = kv.create_sequence();
    seqs.push_back(s);
    const size_t first = kv.append_slots(s, prompts[p].size());
    batch.clear();
    for (size_t i = 0; i < prompts[p].size(); ++i)
      batch.add(prompts[p][i], int32_t(first + i), s, i + 1 == prompts[p].size());
    m.forward(batch, kv, logits);
    out[p].logits.push_back(logits);
    out[p].ids.push_back(argmax(logits.data(), n_vocab));
  }
  for (int step = 1; step < n_predict; ++step) {
    batch.clear();
    for (size_t p = 0; p < prompts.size(); ++p)
      batch.add(out[p].ids.back(), int32_t(kv.append_slots(seqs[p], 1)), seqs[p], true);
    m.forward(batch, kv, logits);
    for (size_t p = 0; p < prompts.size(); ++p) {
      out[p].logits.emplace_back(logits.begin() + p * n_vocab, logits.begin() + (p + 1) * n_vocab);
      out[p].ids.push_back(argmax(out[p].logits.back().data(), n_vocab));
    }
  }
  for (SeqId s : seqs) kv.free_sequence(s);
  return out;
}

class BatchInvariance : public ::testing::TestWithParam<std::string> {};

TEST_P(BatchInvariance, EightPromptsInOneBatchGiveTheirSoloResults) {
  Model& m = shared_model(GetParam());
  const auto prompts = eight_prompts();
  const int n_predict = 24;
  auto pool = make_pool(m, 8 * (18 + n_predict + 16));
  KvCache kv(*pool);
  const std::vector<Decoded> together = decode_together(m, kv, prompts, n_predict);
  for (size_t p = 0; p < prompts.size(); ++p) {
    std::vector<std::vector<float>> solo_logits;
    const auto solo = greedy_decode(m, kv, prompts[p], n_predict, false, &solo_logits);
    EXPECT_EQ(together[p].ids, solo) << "prompt " << p;
    for (int k = 0; k < n_predict; ++k)
      ASSERT_TRUE(bit_equal(together[p].logits[size_t(k)], solo_logits[size_t(k)]))
          << "prompt " << p << " step " << k << ": logits differ in batch vs alone";
  }
  EXPECT_EQ(pool->n_free(), pool->capacity());
}

TEST_P(BatchInvariance, FourCopiesOfOnePromptInOneForwardStayIdentical) {
  Model& m = shared_model(GetParam());
  const std::vector<int32_t> prompt = eight_prompts()[2];
  const int n_vocab = m.config().n_vocab, n_predict = 24;
  auto pool = make_pool(m, 4 * (prompt.size() + n_predict + 16));
  KvCache kv(*pool);
  std::vector<SeqId> seqs;
  StepBatch batch;
  // All four prompts prefilled in a single forward of 4 * |prompt| tokens.
  for (int c = 0; c < 4; ++c) {
    const SeqId s = kv.create_sequence();
    seqs.push_back(s);
    const size_t first = kv.append_slots(s, prompt.size());
    for (size_t i = 0; i < prompt.size(); ++i) batch.add(prompt[i], int32_t(first + i), s, i + 1 == prompt.size());
  }
  std::vector<float> logits;
  std::vector<std::vector<int32_t>> ids(4);
  for (int step = 0; step < n_predict; ++step) {
    m.forward(batch, kv, logits);
    ASSERT_EQ(logits.size(), size_t(4 * n_vocab));
    for (int c = 1; c < 4; ++c)
      ASSERT_EQ(std::memcmp(logits.data(), logits.data() + c * n_vocab, n_vocab * sizeof(float)), 0)
          << "copy " << c << " differs at step " << step;
    batch.clear();
    for (int c = 0; c < 4; ++c) {
      ids[size_t(c)].push_back(argmax(logits.data() + c * n_vocab, n_vocab));
      batch.add(ids[size_t(c)].back(), int32_t(kv.append_slots(seqs[size_t(c)], 1)), seqs[size_t(c)], true);
    }
  }
  for (int c = 1; c < 4; ++c) EXPECT_EQ(ids[size_t(c)], ids[0]);
  for (SeqId s : seqs) kv.free_sequence(s);
  EXPECT_EQ(ids[0], greedy_decode(m, kv, prompt, n_predict));
}

TEST_P(BatchInvariance, PrefillInOneForwardEqualsTokenByToken) {
  Model& m = shared_model(GetParam());
  const std::vector<int32_t> prompt = eight_prompts()[6];  // 18 tokens: crosses a block boundary
  auto pool = make_pool(m, 2 * (prompt.size() + 32));
  KvCache kv(*pool);
  std::vector<std::vector<float>> one_logits, step_logits;
  const auto one = greedy_decode(m, kv, prompt, 32, false, &one_logits);
  const auto stepped = greedy_decode(m, kv, prompt, 32, true, &step_logits);
  EXPECT_EQ(one, stepped);
  for (size_t k = 0; k < one_logits.size(); ++k)
    EXPECT_TRUE(bit_equal(one_logits[k], step_logits[k])) << "step " << k;
}

TEST_P(BatchInvariance, ThreadCountDoesNotChangeLogits) {
  Model& one = shared_model(GetParam(), 1);
  Model& two = shared_model(GetParam(), 2);
  const std::vector<int32_t> prompt = eight_prompts()[4];
  auto pool = make_pool(one, prompt.size() + 8);
  KvCache kv(*pool);
  std::vector<std::vector<float>> a, b;
  const auto ids_one = greedy_decode(one, kv, prompt, 6, false, &a);
  const auto ids_two = greedy_decode(two, kv, prompt, 6, false, &b);
  EXPECT_EQ(ids_one, ids_two);
  for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(bit_equal(a[k], b[k])) << "step " << k;
}

INSTANTIATE_TEST_SUITE_P(Models, BatchInvariance,
                         ::testing::Values("stories260K.gguf", "codelm-16m-f16.gguf"),
                         [](const auto& info) {
                           return info.param.find("stories") == 0 ? std::string("stories260K")
                                                                   : std::string("codelm16m");
                         });

}  // namespace
}  // namespace fdl::test
