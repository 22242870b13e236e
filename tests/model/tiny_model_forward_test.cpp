// Forward-pass behaviour on small synthetic models: every weight dtype computes the same
// function as F32 weights holding the same values, Llama-3 rope factors take effect (and the
// metadata and tensor forms agree), and bad batches are rejected before anything changes.
#include <cmath>
#include <cstring>

#include "model/llama_weights.h"
#include "model/model_test_util.h"
#include "model/tiny_llama_gguf.h"

namespace fdl::test {
namespace {

// Logits of `n_steps` greedy steps after a 6-token prompt.
std::vector<std::vector<float>> run_logits(const std::filesystem::path& path, int n_steps = 4) {
  auto m = Model::load(path, {.n_threads = 1});
  BlockPool pool(m->kv_shape(4), 8);
  KvCache kv(pool);
  std::vector<std::vector<float>> logits;
  greedy_decode(*m, kv, {1, 5, 9, 13, 17, 21}, n_steps, false, &logits);
  return logits;
}

double max_rel_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < a[k].size(); ++i) {
      diff = std::max(diff, std::fabs(double(a[k][i]) - b[k][i]));
      scale = std::max(scale, std::fabs(double(b[k][i])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

class WeightDtype : public ::testing::TestWithParam<GgmlType> {};

TEST_P(WeightDtype, MatchesF32WeightsHoldingTheSameValues) {
  TinyLlamaSpec s;
  s.matrix_type = GetParam();
  const std::string name = ggml_type_name(uint32_t(GetParam()));
  const auto quantized = run_logits(write_tiny_llama("q_" + name + ".gguf", s));
  s.f32_holding_matrix_type_values = true;
  const auto reference = run_logits(write_tiny_llama("f_" + name + ".gguf", s));
  // Widening is exact, so only the kernels' lane/FMA rounding can differ.
  EXPECT_LE(max_rel_diff(quantized, reference), 1e-5) << name;
  // And the values really differ from plain F32 weights (the dtype path was exercised).
  const auto plain = run_logits(write_tiny_llama("p.gguf", TinyLlamaSpec{}));
  EXPECT_GT(max_rel_diff(quantized, plain), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(Types, WeightDtype,
                         ::testing::Values(GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0),
                         [](const auto& info) { return ggml_type_name(uint32_t(info.param)); });

TEST(RopeFreqs, UnitFactorsChangeNothingOtherFactorsDo) {
  const auto plain = run_logits(write_tiny_llama("rope_plain.gguf", {}));
  TinyLlamaSpec ones;
  ones.rope_freqs = std::vector<float>(8, 1.f);  // rope_dim 16 -> 8 pairs
  const auto with_ones = run_logits(write_tiny_llama("rope_ones.gguf", ones));
  for (size_t k = 0; k < plain.size(); ++k)
    EXPECT_EQ(std::memcmp(plain[k].data(), with_ones[k].data(), plain[k].size() * 4), 0);
  TinyLlamaSpec scaled;
  scaled.rope_freqs = std::vector<float>{1, 1, 2, 4, 8, 8, 8, 8};
  EXPECT_GT(max_rel_diff(run_logits(write_tiny_llama("rope_scaled.gguf", scaled)), plain), 1e-4);
}

TEST(RopeFreqs, Llama3MetadataEqualsTheConvertersTensor) {
  TinyLlamaSpec meta;
  meta.extra_string_keys["llama.rope.scaling.type"] = "llama3";
  meta.extra_f32_keys["llama.rope.scaling.factor"] = 8.f;
  meta.extra_f32_keys["llama.rope.scaling.low_freq_factor"] = 1.f;
  meta.extra_f32_keys["llama.rope.scaling.high_freq_factor"] = 4.f;
  meta.extra_u32_keys["llama.rope.scaling.original_context_length"] = 8192;
  const auto meta_path = write_tiny_llama("llama3_meta.gguf", meta);
  const GgufFile f = GgufFile::open(meta_path);
  const std::vector<float> factors = llama3_rope_factors(ModelConfig::from_gguf(f));
  // head_dim 16, base 1e4: wavelengths 2*pi*1e4^(i/8). Below 8192/4 the pair is untouched,
  // above 8192/1 it is divided by the full factor, in between it is interpolated.
  ASSERT_EQ(factors.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    const double wavelen = 2 * M_PI * std::pow(1e4, i / 8.0);
    if (wavelen < 2048) {
      EXPECT_FLOAT_EQ(factors[size_t(i)], 1.f) << i;
    } else if (wavelen > 8192) {
      EXPECT_FLOAT_EQ(factors[size_t(i)], 8.f) << i;
    } else {
      EXPECT_TRUE(factors[size_t(i)] > 1.f && factors[size_t(i)] < 8.f) << i;
    }
  }
  TinyLlamaSpec tensor;
  tensor.rope_freqs = factors;
  const auto a = run_logits(meta_path), b = run_logits(write_tiny_llama("llama3_tensor.gguf", tensor));
  for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(std::memcmp(a[k].data(), b[k].data(), a[k].size() * 4), 0);
  EXPECT_GT(max_rel_diff(a, run_logits(write_tiny_llama("llama3_none.gguf", {}))), 1e-5);
}

TEST(Forward, BadBatchesThrowBeforeWritingAnything) {
  auto m = Model::load(write_tiny_llama("bad_batch.gguf", {}), {.n_threads = 1});
  BlockPool pool(m->kv_shape(4), 4);
  KvCache kv(pool);
  const SeqId s = kv.create_sequence();
  kv.append_slots(s, 2);
  std::vector<uint8_t> before(pool.block_bytes(0).begin(), pool.block_bytes(0).end());
  std::vector<float> logits{1.f};
  StepBatch b;
  b.add(1, 0, s, true);
  b.positions.push_back(1);  // ragged vectors
  EXPECT_THROW(m->forward(b, kv, logits), std::invalid_argument);
  b.clear();
  b.add(40, 0, s, true);  // id == n_vocab
  EXPECT_THROW(m->forward(b, kv, logits), std::out_of_range);
  b.clear();
  b.add(1, 0, s, true);
  b.add(2, 2, s, true);  // position not reserved
  EXPECT_THROW(m->forward(b, kv, logits), std::out_of_range);
  b.clear();
  b.add(1, -1, s, true);
  EXPECT_THROW(m->forward(b, kv, logits), std::out_of_range);
  b.clear();
  b.add(1, 0, s + 1, true);  // no such sequence
  EXPECT_THROW(m->forward(b, kv, logits), std::out_of_range);
  const SeqId fork = kv.fork_sequence(s);  // block 0 now shared: rewriting it is refused
  b.clear();
  b.add(1, 1, fork, true);
  EXPECT_THROW(m->forward(b, kv, logits), std::invalid_argument);
  kv.free_sequence(fork);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), pool.block_bytes(0).begin()));
  EXPECT_EQ(logits, std::vector<float>{1.f});  // untouched too
  BlockPool other(KvShape{.n_layer = 1, .n_kv_head = 2, .head_dim = 16, .block_size = 4}, 1);
  KvCache wrong(other);
  const SeqId w = wrong.create_sequence();
  wrong.append_slots(w, 1);
  b.clear();
  b.add(1, 0, w, true);
  EXPECT_THROW(m->forward(b, wrong, logits), std::invalid_argument);
}

TEST(Forward, LogitsOnlyForTokensThatWantThem) {
  auto m = Model::load(write_tiny_llama("want.gguf", {}), {.n_threads = 1});
  BlockPool pool(m->kv_shape(4), 4);
  KvCache kv(pool);
  const SeqId s = kv.create_sequence();
  kv.append_slots(s, 3);
  StepBatch b;
  std::vector<float> logits(7, 1.f);
  m->forward(b, kv, logits);  // empty batch: nothing to do
  EXPECT_TRUE(logits.empty());
  b.add(1, 0, s, false);
  b.add(2, 1, s, true);
  b.add(3, 2, s, false);
  m->forward(b, kv, logits);
  ASSERT_EQ(logits.size(), size_t(m->config().n_vocab));
  const std::vector<float> middle = logits;
  // The same token alone (its prefix already in the cache) gives the same row.
  b.clear();
  b.add(2, 1, s, true);
  m->forward(b, kv, logits);
  EXPECT_EQ(logits, middle);
  b.clear();
  b.add(1, 0, s, false);
  m->forward(b, kv, logits);
  EXPECT_TRUE(logits.empty());
}

}  // namespace
}  // namespace fdl::test
