// The CUDA model with --batch-invariant on: a sequence's logits are the same bits
// whatever else is in its steps, however its prompt is chunked, and whether its tokens ran as
// decode steps or as a prompt. Random F16 weights (near-ties everywhere: any rounding
// difference would show), GQA 2, head_dim 64, prompts across the fixed context splits (256
// positions) and the KV blocks.
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "gpu/gpu_test_util.h"
#include "backend/cuda/cuda_model.h"
#include "backend/cuda/kernels.h"
#include "model/model_test_util.h"
#include "tools/make_model.h"

namespace fdl::test {
namespace {

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Decoded {
  std::vector<SeqId> seqs;
  std::vector<std::vector<std::vector<float>>> logits;  // [prompt][step]
  std::vector<std::vector<int32_t>> ids;                // [prompt][step]
};

// Feeds every prompt in chunks of `chunk` tokens (0: whole), `together`: the chunks of all
// prompts in one forward each round, else one prompt after another; then `steps` greedy steps
// of all sequences in one forward each (`together`) or one sequence at a time.
Decoded run(Model& m, KvCache& kv, const std::vector<std::vector<int32_t>>& prompts, size_t chunk, bool together,
        int steps) {
  const int n_vocab = m.config().n_vocab;
  Decoded r;
  r.logits.resize(prompts.size());
  r.ids.resize(prompts.size());
  for (size_t p = 0; p < prompts.size(); ++p) r.seqs.push_back(kv.create_sequence());
  std::vector<size_t> fed(prompts.size(), 0);
  StepBatch b;
  std::vector<float> logits;
  auto forward = [&](const std::vector<size_t>& rows_of) {  // rows_of: the prompt of each logits row
    m.forward(b, kv, logits);
    for (size_t i = 0; i < rows_of.size(); ++i) {
      const size_t p = rows_of[i];
      r.logits[p].emplace_back(logits.begin() + i * n_vocab, logits.begin() + (i + 1) * n_vocab);
      r.ids[p].push_back(argmax(r.logits[p].back().data(), n_vocab));
    }
  };
  for (bool left = true; left;) {
    left = false;
    b.clear();
    std::vector<size_t> rows_of;
    for (size_t p = 0; p < prompts.size(); ++p) {
      if (fed[p] == prompts[p].size()) continue;
      const size_t n = chunk == 0 ? prompts[p].size() - fed[p] : std::min(chunk, prompts[p].size() - fed[p]);
      const size_t first = kv.append_slots(r.seqs[p], n);
      for (size_t i = 0; i < n; ++i) {
        const bool last = fed[p] + i + 1 == prompts[p].size();
        b.add(prompts[p][fed[p] + i], int32_t(first + i), r.seqs[p], last);
        if (last) rows_of.push_back(p);
      }
      fed[p] += n;
      left |= fed[p] < prompts[p].size();
      if (!together) {
        forward(rows_of);
        b.clear();
        rows_of.clear();
      }
    }
    if (together && !b.tokens.empty()) forward(rows_of);
  }
  for (int s = 1; s < steps; ++s) {
    b.clear();
    std::vector<size_t> rows_of;
    for (size_t p = 0; p < prompts.size(); ++p) {
      b.add(r.ids[p].back(), int32_t(kv.append_slots(r.seqs[p], 1)), r.seqs[p], true);
      rows_of.push_back(p);
      if (!together) {
        forward(rows_of);
        b.clear();
        rows_of.clear();
      }
    }
    if (together) forward(rows_of);
  }
  for (SeqId s : r.seqs) kv.free_sequence(s);
  return r;
}

// The test model: random F16 weights whose shapes the invariant batch-1 kernels take.
std::filesystem::path invariance_model() {
  tools::MakeModelOptions o;
  o.output = scratch_dir() / "invariance-f16.gguf";
  o.arch = "llama";
  o.dim = 256, o.n_layers = 2, o.n_heads = 4, o.n_kv_heads = 2, o.ffn_dim = 512, o.vocab = 1000;
  o.weight_std = 0.05f;
  tools::make_model(o);
  return o.output;
}

TEST(CudaBatchInvariance, SameBitsAloneBatchedChunkedAndDecoded) {
  FDL_SKIP_WITHOUT_GPU();
  auto m = Model::load(invariance_model(), ModelOptions{.device = Device::Cuda, .batch_invariant = true});
  ASSERT_TRUE(m->batch_invariant());
  std::vector<std::vector<int32_t>> prompts;
  std::uniform_int_distribution<int32_t> tok(3, 999);
  for (size_t len : {1, 5, 17, 40, 130, 255, 300, 600}) {
    prompts.emplace_back();
    for (size_t i = 0; i < len; ++i) prompts.back().push_back(tok(rng()));
  }
  const int steps = 12;
  auto pool = make_pool(*m, prompts.size() * (600 + steps + 32));
  KvCache kv(*pool);
  const Decoded alone = run(*m, kv, prompts, 0, false, steps);
  struct Variant {
    const char* name;
    size_t chunk;
    bool together;
  };
  for (const Variant& v : {Variant{"all prompts in one step, decoded together", 0, true},
                           Variant{"chunks of 64, together", 64, true}, Variant{"chunks of 7, alone", 7, false},
                           Variant{"token by token, together", 1, true}}) {
    const Decoded other = run(*m, kv, prompts, v.chunk, v.together, steps);
    for (size_t p = 0; p < prompts.size(); ++p) {
      EXPECT_EQ(other.ids[p], alone.ids[p]) << v.name << ", prompt of " << prompts[p].size();
      // Token by token, the prompt's last logits come from a decode-sized step: compared too.
      size_t differ = 0;
      for (int s = 0; s < steps; ++s) differ += !bit_equal(other.logits[p][size_t(s)], alone.logits[p][size_t(s)]);
      EXPECT_EQ(differ, 0u) << v.name << ": steps whose logits differ, prompt of " << prompts[p].size();
    }
  }
  // A decoded token's K/V equal the K/V the same token gets as part of a prompt: the
  // continuation after re-feeding prompt + output as one prompt is the alone run's.
  for (size_t p : {size_t(2), size_t(6)}) {
    std::vector<int32_t> extended = prompts[p];
    extended.insert(extended.end(), alone.ids[p].begin(), alone.ids[p].end() - 1);
    const Decoded again = run(*m, kv, {extended}, 0, false, 1);
    EXPECT_TRUE(bit_equal(again.logits[0][0], alone.logits[p].back())) << "prompt of " << prompts[p].size();
  }
}

// FLASHDLLM_DECODE_TRACE=1 stamps the invariant batch-1 kernels' phases too (bench_gpu --trace
// reads them), in order in every block, and changes no result.
TEST(CudaBatchInvariance, BatchOneKernelsStampEveryPhaseInOrder) {
  FDL_SKIP_WITHOUT_GPU();
  const std::filesystem::path path = invariance_model();
  const char* before = std::getenv("FLASHDLLM_DECODE_TRACE");
  const std::string saved = before ? before : "";
  ::setenv("FLASHDLLM_DECODE_TRACE", "1", 1);
  const ModelOptions on{.device = Device::Cuda, .batch_invariant = true};
  std::unique_ptr<Model> traced = Model::load(path, on);
  ::unsetenv("FLASHDLLM_DECODE_TRACE");
  std::unique_ptr<Model> plain = Model::load(path, on);
  if (before) ::setenv("FLASHDLLM_DECODE_TRACE", saved.c_str(), 1);
  const std::vector<int32_t> prompt{5, 17, 300, 42, 7, 999, 64, 128, 3, 250, 251, 252, 600, 601, 602, 603, 604};
  auto pool = make_pool(*traced, 64), pool_plain = make_pool(*plain, 64);
  KvCache kv(*pool), kv_plain(*pool_plain);
  const Decoded a = run(*traced, kv, {prompt}, 0, false, 6);
  const Decoded b = run(*plain, kv_plain, {prompt}, 0, false, 6);
  EXPECT_EQ(a.ids, b.ids);
  for (size_t s = 0; s < a.logits[0].size(); ++s) EXPECT_TRUE(bit_equal(a.logits[0][s], b.logits[0][s])) << "step " << s;
  // The stamps hold the last decode step's.
  const auto t = dynamic_cast<cuda::CudaModel&>(*traced).decode_trace();
  ASSERT_EQ(t.n_layer, traced->config().n_layer);
  ASSERT_GT(t.attn_blocks, 0) << "the invariant attention block did not run";
  ASSERT_GT(t.ffn_blocks, 0) << "the invariant FFN block did not run";
  auto check = [](const std::vector<uint64_t>& v, int n_layer, int events, int blocks, const char* kernel) {
    for (int l = 0; l < n_layer; ++l)
      for (int blk = 0; blk < blocks; ++blk)
        for (int e = 0; e < events; ++e) {
          const uint64_t at = v[(size_t(l) * size_t(events) + size_t(e)) * size_t(blocks) + size_t(blk)];
          ASSERT_NE(at, 0u) << kernel << " layer " << l << " block " << blk << " event " << e;
          if (e > 0) {
            ASSERT_GE(at, v[(size_t(l) * size_t(events) + size_t(e - 1)) * size_t(blocks) + size_t(blk)])
                << kernel << " layer " << l << " block " << blk << " event " << e;
          }
        }
  };
  check(t.attn, t.n_layer, t.attn_events, t.attn_blocks, "attention");
  check(t.ffn, t.n_layer, t.ffn_events, t.ffn_blocks, "FFN");
}

}  // namespace
}  // namespace fdl::test
