// The random-weight model maker: shapes, types, metadata, tokenizer, determinism, statistics,
// and option validation, all checked by reading the written file back with GgufFile.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <set>

#include "flashdllm/gguf.h"
#include "test_support.h"
#include "tools/make_model.h"
#include "tools/make_model_internal.h"

namespace fdl::tools {
namespace {

std::filesystem::path scratch(const std::string& name) { return test::scratch_dir() / name; }

std::vector<char> read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

std::vector<float> dequantized(const GgufTensorInfo& t) {
  std::vector<float> out(t.n_elements());
  dequantize_row(t.type(), t.data, out.data(), out.size());
  return out;
}

void mean_std(const std::vector<float>& v, double& mean, double& std) {
  double s = 0, s2 = 0;
  for (float x : v) s += x;
  mean = s / static_cast<double>(v.size());
  for (float x : v) s2 += (x - mean) * (x - mean);
  std = std::sqrt(s2 / static_cast<double>(v.size()));
}

std::string invalid_message(const MakeModelOptions& opt) {
  try {
    resolve_model_shape(opt);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "<valid>";
}

TEST(MakeModel, PresetsAreListedAndResolve) {
  EXPECT_EQ(model_presets(),
            (std::vector<std::string>{"tiny", "110m", "llama-7b", "llama3-8b", "llama3-70b", "qwen2-7b", "qwen3-8b",
                                      "gemma2-9b", "mixtral-8x7b"}));
  MakeModelOptions opt;
  opt.preset = "llama3-8b";
  const ModelShape s = resolve_model_shape(opt);
  EXPECT_EQ(s.dim, 4096u);
  EXPECT_EQ(s.n_layers, 32u);
  EXPECT_EQ(s.n_heads, 32u);
  EXPECT_EQ(s.n_kv_heads, 8u);
  EXPECT_EQ(s.ffn_dim, 14336u);
  EXPECT_EQ(s.vocab, 128256u);
  EXPECT_EQ(s.context, 8192u);
  EXPECT_EQ(s.rope_theta, 500000.f);
  EXPECT_EQ(s.kv_dim(), 1024u);
  // 8.03e9 parameters: F16 matrices (2 bytes) and 65 F32 norm vectors (4 bytes).
  const uint64_t matrix_params =
      2ull * 4096 * 128256 + 32ull * (2ull * 4096 * 4096 + 2ull * 4096 * 1024 + 3ull * 4096 * 14336);
  EXPECT_EQ(model_tensor_bytes(opt), 2 * matrix_params + 4ull * 4096 * (1 + 2 * 32));
  opt.preset = "110m";
  EXPECT_EQ(resolve_model_shape(opt).dim, 768u);
  opt.preset = "llama-7b";
  EXPECT_EQ(resolve_model_shape(opt).ffn_dim, 11008u);
}

TEST(MakeModel, TinyF16FileHasLlamaLayoutMetadataAndTokenizer) {
  MakeModelOptions opt;
  opt.output = scratch("tiny-f16.gguf");
  make_model(opt);
  GgufFile f = GgufFile::open(opt.output);

  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_string("general.name"), "flashdllm-random-tiny");
  EXPECT_EQ(f.get_uint("general.file_type"), 1u);
  EXPECT_EQ(f.get_uint("llama.embedding_length"), 64u);
  EXPECT_EQ(f.get_uint("llama.block_count"), 2u);
  EXPECT_EQ(f.get_uint("llama.attention.head_count"), 4u);
  EXPECT_EQ(f.get_uint("llama.attention.head_count_kv"), 2u);
  EXPECT_EQ(f.get_uint("llama.feed_forward_length"), 128u);
  EXPECT_EQ(f.get_uint("llama.rope.dimension_count"), 16u);
  EXPECT_EQ(f.get_uint("llama.context_length"), 512u);
  EXPECT_EQ(f.get_uint("llama.vocab_size"), 512u);
  EXPECT_FLOAT_EQ(static_cast<float>(f.get_float("llama.rope.freq_base")), 10000.f);
  EXPECT_FLOAT_EQ(static_cast<float>(f.get_float("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
  EXPECT_EQ(f.find("llama.vocab_size")->type, GgufType::UINT32);

  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
  const auto tokens = f.array_strings("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 512u);
  EXPECT_EQ(f.array_f32("tokenizer.ggml.scores").size(), 512u);
  EXPECT_EQ(f.array_int("tokenizer.ggml.token_type").size(), 512u);
  EXPECT_EQ(f.get_uint("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(f.get_uint("tokenizer.ggml.eos_token_id"), 2u);

  ASSERT_EQ(f.tensors().size(), 3u + 9u * 2u);
  auto expect_tensor = [&](const std::string& name, GgmlType type, std::vector<uint64_t> ne) {
    const GgufTensorInfo* t = f.find_tensor(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->type(), type) << name;
    ASSERT_EQ(t->n_dims, ne.size()) << name;
    for (size_t d = 0; d < ne.size(); ++d) EXPECT_EQ(t->ne[d], ne[d]) << name << " ne[" << d << "]";
  };
  expect_tensor("token_embd.weight", GgmlType::F16, {64, 512});
  expect_tensor("output_norm.weight", GgmlType::F32, {64});
  expect_tensor("output.weight", GgmlType::F16, {64, 512});
  for (int l = 0; l < 2; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    expect_tensor(p + "attn_norm.weight", GgmlType::F32, {64});
    expect_tensor(p + "attn_q.weight", GgmlType::F16, {64, 64});
    expect_tensor(p + "attn_k.weight", GgmlType::F16, {64, 32});
    expect_tensor(p + "attn_v.weight", GgmlType::F16, {64, 32});
    expect_tensor(p + "attn_output.weight", GgmlType::F16, {64, 64});
    expect_tensor(p + "ffn_norm.weight", GgmlType::F32, {64});
    expect_tensor(p + "ffn_gate.weight", GgmlType::F16, {64, 128});
    expect_tensor(p + "ffn_up.weight", GgmlType::F16, {64, 128});
    expect_tensor(p + "ffn_down.weight", GgmlType::F16, {128, 64});
  }
  uint64_t total = 0;
  for (const auto& t : f.tensors()) total += t.n_bytes;
  EXPECT_EQ(total, model_tensor_bytes(opt));
}

// A qwen2 file adds Q/K/V biases, a qwen3 file per-head Q/K norms, under the family's keys;
// test_model loads them (cuda_family_test.cpp on the GPU).
TEST(MakeModel, FamilyFilesCarryTheirOwnTensorsAndKeys) {
  for (const char* arch : {"qwen2", "qwen3"}) {
    MakeModelOptions opt;
    opt.output = test::scratch_dir() / (std::string(arch) + "-tiny.gguf");
    opt.arch = arch;
    make_model(opt);
    const GgufFile f = GgufFile::open(opt.output);
    EXPECT_EQ(f.get_string_or("general.architecture", ""), arch);
    EXPECT_EQ(f.get_uint(std::string(arch) + ".embedding_length"), 64u);
    EXPECT_EQ(f.find("llama.embedding_length"), nullptr);
    const bool qwen2 = std::string(arch) == "qwen2";
    for (const char* t : {"blk.1.attn_q.bias", "blk.1.attn_k.bias", "blk.1.attn_v.bias"})
      EXPECT_EQ(f.find_tensor(t) != nullptr, qwen2) << arch << " " << t;
    for (const char* t : {"blk.1.attn_q_norm.weight", "blk.1.attn_k_norm.weight"}) {
      ASSERT_EQ(f.find_tensor(t) != nullptr, !qwen2) << arch << " " << t;
      if (!qwen2) {
        EXPECT_EQ(f.find_tensor(t)->ne[0], 16u);  // head_dim of the tiny shape
      }
    }
  }
}

// The gemma2-9b preset: Gemma-2-9B's head_dim 256 (not dim / n_heads = 224) through key_length,
// its post-norms, soft-caps and window; a reshaped model (--dim) goes back to dim / n_heads.
TEST(MakeModel, Gemma2PresetCarriesItsHeadDimAndParts) {
  MakeModelOptions opt;
  opt.preset = "gemma2-9b";
  opt.n_layers = 2;
  opt.vocab = 512;
  const ModelShape s = resolve_model_shape(opt);
  EXPECT_EQ(s.head_dim(), 256u);
  EXPECT_EQ(s.q_dim(), 4096u);
  opt.dim = 1024;
  EXPECT_EQ(resolve_model_shape(opt).head_dim(), 64u);
  opt.dim.reset();
  opt.n_layers = 1;
  opt.ffn_dim = 64;
  opt.output = scratch("gemma2.gguf");
  opt.dtype = GgmlType::F32;
  opt.tied_embeddings = true;
  make_model(opt);
  const GgufFile f = GgufFile::open(opt.output);
  EXPECT_EQ(f.get_uint("gemma2.attention.key_length"), 256u);
  EXPECT_EQ(f.get_uint("gemma2.attention.sliding_window"), 4096u);
  EXPECT_EQ(f.get_float("gemma2.attn_logit_softcapping"), 50.0);
  EXPECT_EQ(f.tensor("blk.0.attn_q.weight").ne[1], 4096u);
  EXPECT_NE(f.find_tensor("blk.0.post_ffw_norm.weight"), nullptr);
}

// Experts: llama.cpp's keys and 3-D tensors (an F32 router; the model loads them as a mixture
// of experts: tests/gpu/cuda_family_test.cpp runs one on both backends); the mixtral-8x7b preset carries 8 experts, 2 per token.
TEST(MakeModel, ExpertsAreWrittenInLlamaCppsLayout) {
  MakeModelOptions opt;
  opt.preset = "mixtral-8x7b";
  const ModelShape preset = resolve_model_shape(opt);
  EXPECT_EQ(preset.n_expert, 8u);
  EXPECT_EQ(preset.n_expert_used, 2u);
  opt = {};
  opt.n_expert = 4;  // on the tiny preset: 2 per token by default
  opt.dtype = GgmlType::F32;
  opt.output = scratch("experts.gguf");
  make_model(opt);
  const GgufFile f = GgufFile::open(opt.output);
  EXPECT_EQ(f.get_uint("llama.expert_count"), 4u);
  EXPECT_EQ(f.get_uint("llama.expert_used_count"), 2u);
  const GgufTensorInfo& router = f.tensor("blk.0.ffn_gate_inp.weight");
  EXPECT_EQ(router.type(), GgmlType::F32);
  EXPECT_EQ(router.n_dims, 2u);
  EXPECT_EQ(router.ne[0], 64u);
  EXPECT_EQ(router.ne[1], 4u);
  const GgufTensorInfo& down = f.tensor("blk.1.ffn_down_exps.weight");
  EXPECT_EQ(down.n_dims, 3u);
  EXPECT_EQ(down.ne[0], 128u);
  EXPECT_EQ(down.ne[1], 64u);
  EXPECT_EQ(down.ne[2], 4u);
  EXPECT_EQ(f.find_tensor("blk.0.ffn_gate.weight"), nullptr);
}

TEST(MakeModel, ValuesHaveTheRequestedStatistics) {
  MakeModelOptions opt;
  opt.output = scratch("stats.gguf");
  opt.dtype = GgmlType::F32;
  opt.vocab = 4096;
  make_model(opt);
  GgufFile f = GgufFile::open(opt.output);
  double mean, std;
  mean_std(dequantized(f.tensor("token_embd.weight")), mean, std);  // 262144 values
  EXPECT_NEAR(mean, 0.0, 0.001);
  EXPECT_NEAR(std, 0.02, 0.0005);
  mean_std(dequantized(f.tensor("blk.1.ffn_norm.weight")), mean, std);
  EXPECT_NEAR(mean, 1.0, 0.01);
  EXPECT_GT(std, 0.005);
  EXPECT_LT(std, 0.05);
  // Different tensors get different values.
  const auto a = dequantized(f.tensor("blk.0.attn_q.weight"));
  const auto b = dequantized(f.tensor("blk.0.attn_output.weight"));
  EXPECT_NE(a, b);
}

TEST(MakeModel, EveryDtypeWithFileTypeAndSaneValues) {
  const std::vector<std::pair<GgmlType, uint32_t>> cases = {
      {GgmlType::F32, 0},   {GgmlType::F16, 1},   {GgmlType::Q8_0, 7},  {GgmlType::BF16, 32},
      {GgmlType::Q4_0, 2},  {GgmlType::Q4_1, 3},  {GgmlType::Q5_0, 8},  {GgmlType::Q5_1, 9},
      {GgmlType::Q2_K, 10}, {GgmlType::Q3_K, 11}, {GgmlType::Q4_K, 14}, {GgmlType::Q5_K, 16},
      {GgmlType::Q6_K, 18}};
  for (const auto& [dtype, ftype] : cases) {
    SCOPED_TRACE(ggml_type_name(static_cast<uint32_t>(dtype)));
    MakeModelOptions opt;
    opt.output = scratch("dtype.gguf");
    opt.dtype = dtype;
    if (ggml_type_traits(static_cast<uint32_t>(dtype))->block_size == 256) opt.dim = 256, opt.ffn_dim = 512;
    make_model(opt);
    GgufFile f = GgufFile::open(opt.output);
    EXPECT_EQ(f.get_uint("general.file_type"), ftype);
    EXPECT_EQ(f.find("general.quantization_version") != nullptr, block_dequantizer(dtype) != nullptr);
    EXPECT_EQ(f.tensor("blk.0.ffn_down.weight").type(), dtype);
    EXPECT_EQ(f.tensor("blk.0.ffn_norm.weight").type(), GgmlType::F32);
    double mean, std;
    mean_std(dequantized(f.tensor("token_embd.weight")), mean, std);
    // Rounding adds its own noise: 2-bit levels (Q2_K) ~1.1x the std, the others less.
    EXPECT_NEAR(std, 0.02, dtype == GgmlType::Q2_K ? 0.003 : 0.002);
    EXPECT_NEAR(mean, 0.0, 0.002);
  }
}

TEST(MakeModel, DeterministicInSeedAndIndependentOfThreadCount) {
  MakeModelOptions opt;
  opt.dtype = GgmlType::Q8_0;
  opt.vocab = 2048;  // token_embd spans several fill chunks
  opt.threads = 1;
  opt.output = scratch("det-a.gguf");
  make_model(opt);
  opt.threads = 4;
  opt.output = scratch("det-b.gguf");
  make_model(opt);
  opt.seed = 43;
  opt.output = scratch("det-c.gguf");
  make_model(opt);
  const auto a = read_all(scratch("det-a.gguf"));
  EXPECT_EQ(a, read_all(scratch("det-b.gguf")));
  EXPECT_NE(a, read_all(scratch("det-c.gguf")));
}

TEST(MakeModel, FillConvertsTheSameValuesToEveryType) {
  // Same (seed, stream) => same underlying fp32 values; each type must hold exactly their
  // conversion (this pins the F16C fast path to the portable fp32_to_fp16).
  const uint64_t n = 2 * 65536 + 96;  // two full chunks and a partial one
  std::vector<uint8_t> f32(n * 4), f16(n * 2), bf16(n * 2), q8(n / 32 * 34);
  fill_random(f32, GgmlType::F32, n, 0.f, 0.5f, 7, 3, 2);
  fill_random(f16, GgmlType::F16, n, 0.f, 0.5f, 7, 3, 3);
  fill_random(bf16, GgmlType::BF16, n, 0.f, 0.5f, 7, 3, 1);
  fill_random(q8, GgmlType::Q8_0, n, 0.f, 0.5f, 7, 3, 2);
  std::vector<float> values(n);
  std::memcpy(values.data(), f32.data(), f32.size());
  for (uint64_t i = 0; i < n; ++i) {
    uint16_t h, b;
    std::memcpy(&h, f16.data() + 2 * i, 2);
    std::memcpy(&b, bf16.data() + 2 * i, 2);
    ASSERT_EQ(h, fp32_to_fp16(values[i])) << i;
    ASSERT_EQ(b, fp32_to_bf16(values[i])) << i;
  }
  std::vector<BlockQ8_0> blocks(n / 32);
  quantize_row_q8_0(values.data(), blocks.data(), n);
  EXPECT_EQ(std::memcmp(blocks.data(), q8.data(), q8.size()), 0);
  EXPECT_THROW(fill_random(f32, GgmlType::F16, n, 0.f, 1.f, 0, 0, 1), std::invalid_argument);  // wrong size
}

TEST(MakeModel, ShapeOverridesAndTiedEmbeddings) {
  MakeModelOptions opt;
  opt.output = scratch("override.gguf");
  opt.dtype = GgmlType::BF16;
  opt.dim = 96;
  opt.n_layers = 3;
  opt.n_heads = 6;
  opt.n_kv_heads = 3;
  opt.ffn_dim = 200;
  opt.vocab = 300;
  opt.context = 1024;
  opt.rope_theta = 1e6f;
  opt.rms_eps = 1e-6f;
  opt.tied_embeddings = true;
  opt.name = "custom";
  make_model(opt);
  GgufFile f = GgufFile::open(opt.output);
  EXPECT_EQ(f.get_string("general.name"), "custom");
  EXPECT_EQ(f.get_uint("llama.rope.dimension_count"), 16u);
  EXPECT_EQ(f.get_uint("llama.context_length"), 1024u);
  EXPECT_FLOAT_EQ(static_cast<float>(f.get_float("llama.rope.freq_base")), 1e6f);
  EXPECT_FLOAT_EQ(static_cast<float>(f.get_float("llama.attention.layer_norm_rms_epsilon")), 1e-6f);
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);
  EXPECT_EQ(f.tensors().size(), 2u + 9u * 3u);
  EXPECT_EQ(f.tensor("blk.2.attn_k.weight").ne[1], 48u);
  EXPECT_EQ(f.tensor("blk.2.ffn_down.weight").ne[0], 200u);
  EXPECT_EQ(f.tensor("token_embd.weight").ne[1], 300u);
  EXPECT_EQ(f.array_strings("tokenizer.ggml.tokens").size(), 300u);
}

TEST(MakeModel, SynthesizedVocabIsAValidSentencePieceVocab) {
  for (uint32_t n : {260u, 512u, 32000u, 128256u}) {
    SCOPED_TRACE(n);
    const SyntheticVocab v = synthesize_spm_vocab(n);
    ASSERT_EQ(v.tokens.size(), n);
    ASSERT_EQ(v.scores.size(), n);
    ASSERT_EQ(v.token_types.size(), n);
    EXPECT_EQ(v.tokens[0], "<unk>");
    EXPECT_EQ(v.token_types[0], 2);
    EXPECT_EQ(v.tokens[1], "<s>");
    EXPECT_EQ(v.token_types[1], 3);
    EXPECT_EQ(v.tokens[2], "</s>");
    EXPECT_EQ(v.tokens[3], "<0x00>");
    EXPECT_EQ(v.tokens[3 + 0xAB], "<0xAB>");
    EXPECT_EQ(v.tokens[258], "<0xFF>");
    for (int b = 3; b < 259; ++b) EXPECT_EQ(v.token_types[b], 6);
    EXPECT_EQ(v.tokens[259], "\xe2\x96\x81");
    const std::set<std::string> unique(v.tokens.begin(), v.tokens.end());
    EXPECT_EQ(unique.size(), n);
    for (uint32_t i = 260; i < n; ++i) {
      EXPECT_EQ(v.token_types[i], 1);
      ASSERT_LT(v.scores[i], v.scores[i - 1]);  // strictly decreasing merge priority
    }
  }
  EXPECT_THROW(synthesize_spm_vocab(259), std::invalid_argument);
}

TEST(MakeModel, VocabCopiedFromAnotherFile) {
  const auto vocab = test::shared_dir() / "llama-cpp-vocab-fixtures" / "ggml-vocab-llama-spm.gguf";
  FDL_ASSERT_INPUT(vocab);
  GgufFile src = GgufFile::open(vocab);
  MakeModelOptions opt;
  opt.output = scratch("vocab-from.gguf");
  opt.vocab_from = vocab;
  opt.dim = 32;
  opt.n_layers = 1;
  opt.n_heads = 2;
  opt.n_kv_heads = 1;
  opt.ffn_dim = 32;
  EXPECT_EQ(resolve_model_shape(opt).vocab, 32000u);
  make_model(opt);
  GgufFile f = GgufFile::open(opt.output);
  EXPECT_EQ(f.get_uint("llama.vocab_size"), 32000u);
  EXPECT_EQ(f.tensor("output.weight").ne[1], 32000u);
  size_t copied = 0;
  for (const auto& [key, value] : src.metadata()) {
    if (key.rfind("tokenizer.ggml.", 0) != 0) continue;
    ++copied;
    ASSERT_NE(f.find(key), nullptr) << key;
    EXPECT_EQ(f.find(key)->type, value.type) << key;
  }
  EXPECT_GE(copied, 4u);
  EXPECT_EQ(f.array_strings("tokenizer.ggml.tokens"), src.array_strings("tokenizer.ggml.tokens"));
  EXPECT_EQ(f.array_f32("tokenizer.ggml.scores"), src.array_f32("tokenizer.ggml.scores"));

  opt.vocab = 512;
  EXPECT_NE(invalid_message(opt).find("vocab 512 conflicts with vocab_from, which has 32000 tokens"), std::string::npos);
  opt.vocab.reset();
  opt.vocab_from = test::model_path("missing.gguf");
  EXPECT_THROW(resolve_model_shape(opt), GgufError);
}

TEST(MakeModel, InvalidOptionsNameTheOption) {
  MakeModelOptions opt;
  opt.preset = "gpt-5";
  EXPECT_NE(invalid_message(opt).find(
                "unknown preset 'gpt-5' (available: tiny, 110m, llama-7b, llama3-8b, llama3-70b, qwen2-7b, qwen3-8b, "
                "gemma2-9b, mixtral-8x7b)"),
            std::string::npos);
  opt = {};
  opt.arch = "gemma4";
  EXPECT_NE(invalid_message(opt).find("unknown arch 'gemma4' (available: llama, qwen2, qwen3, gemma2)"), std::string::npos);
  opt = {};
  opt.n_expert_used = 2;
  EXPECT_NE(invalid_message(opt).find("n_expert_used (--n-experts-used) needs n_expert (--n-experts)"), std::string::npos);
  opt.n_expert = 4;
  opt.n_expert_used = 5;
  EXPECT_NE(invalid_message(opt).find("n_expert_used (--n-experts-used) must be 1..4 (n_expert), got 5"),
            std::string::npos);
  opt.n_expert = 513;
  EXPECT_NE(invalid_message(opt).find("n_expert (--n-experts) must be at most 512, got 513"), std::string::npos);
  opt.n_expert = 4;
  opt.n_expert_used = 2;
  opt.arch = "qwen2";
  EXPECT_NE(invalid_message(opt).find("experts (--n-experts) are written for arch llama only"), std::string::npos);
  opt = {};
  opt.dim = 100;
  opt.n_heads = 3;
  EXPECT_NE(invalid_message(opt).find("dim 100 is not divisible by n_heads 3"), std::string::npos);
  opt = {};
  opt.n_kv_heads = 3;
  EXPECT_NE(invalid_message(opt).find("n_heads 4 is not divisible by n_kv_heads 3"), std::string::npos);
  opt = {};
  opt.dim = 36;
  EXPECT_NE(invalid_message(opt).find("head dim 9 (dim / n_heads) must be even"), std::string::npos);
  opt = {};
  opt.dtype = GgmlType::Q8_0;
  opt.ffn_dim = 100;
  EXPECT_NE(invalid_message(opt).find("Q8_0 needs dim, ffn_dim and n_heads x head_dim to be multiples of 32"),
            std::string::npos);
  opt = {};
  opt.dtype = GgmlType::Q4_K;  // the tiny preset's dim 64
  EXPECT_NE(invalid_message(opt).find("Q4_K needs dim, ffn_dim and n_heads x head_dim to be multiples of 256 (got dim 64"),
            std::string::npos);
  opt = {};
  opt.dtype = GgmlType::IQ4_NL;
  EXPECT_NE(invalid_message(opt).find("dtype IQ4_NL is not supported (use f32, f16, bf16, q8_0, q4_0"), std::string::npos);
  opt = {};
  opt.n_layers = 0;
  EXPECT_NE(invalid_message(opt).find("n_layers must be greater than 0"), std::string::npos);
  opt = {};
  opt.vocab = 100;
  EXPECT_NE(invalid_message(opt).find("vocab 100 is too small for a synthesized vocab"), std::string::npos);
  opt = {};
  opt.weight_std = NAN;
  EXPECT_NE(invalid_message(opt).find("weight_std must be a finite number"), std::string::npos);
  opt = {};
  EXPECT_THROW(make_model(opt), std::invalid_argument);  // no output path
}

// q4_k_m / q5_k_m: llama-quantize's per-tensor choices for its "_M" mixes.
TEST(MakeModel, MediumMixFollowsLlamaQuantizesChoices) {
  MakeModelOptions opt;
  opt.output = scratch("mix.gguf");
  opt.dtype = GgmlType::Q4_K;
  opt.medium_mix = true;
  opt.dim = 256, opt.ffn_dim = 512, opt.n_layers = 16;
  make_model(opt);
  GgufFile f = GgufFile::open(opt.output);
  EXPECT_EQ(f.get_uint("general.file_type"), 15u);
  EXPECT_EQ(f.tensor("output.weight").type(), GgmlType::Q6_K);
  EXPECT_EQ(f.tensor("token_embd.weight").type(), GgmlType::Q4_K);
  // More bits in layers i < n/8, i >= 7n/8 and (i - n/8) % 3 == 2: 0, 1, 4, 7, 10, 13, 14, 15 of 16.
  const std::set<uint32_t> more = {0, 1, 4, 7, 10, 13, 14, 15};
  for (uint32_t l = 0; l < 16; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const std::string p = "blk." + std::to_string(l) + ".";
    const GgmlType want = more.count(l) ? GgmlType::Q6_K : GgmlType::Q4_K;
    EXPECT_EQ(f.tensor(p + "attn_v.weight").type(), want);
    EXPECT_EQ(f.tensor(p + "ffn_down.weight").type(), want);
    for (const char* other : {"attn_q.weight", "attn_k.weight", "attn_output.weight", "ffn_gate.weight", "ffn_up.weight"})
      EXPECT_EQ(f.tensor(p + other).type(), GgmlType::Q4_K) << other;
  }
  // 80 layers (llama.cpp's 70B class): Q4_K_M's other attn_v are Q5_K; Q5_K_M's stay Q5_K.
  EXPECT_EQ(matrix_type(opt, "attn_v", 11, 80), GgmlType::Q5_K);
  EXPECT_EQ(matrix_type(opt, "attn_v", 12, 80), GgmlType::Q6_K);
  EXPECT_EQ(matrix_type(opt, "ffn_down", 11, 80), GgmlType::Q4_K);
  opt.dtype = GgmlType::Q5_K;
  EXPECT_EQ(matrix_type(opt, "attn_v", 11, 80), GgmlType::Q5_K);
  EXPECT_EQ(matrix_type(opt, "ffn_gate", 0, 80), GgmlType::Q5_K);
  EXPECT_EQ(llama_file_type(opt), 17u);
  opt.medium_mix = false;
  EXPECT_EQ(matrix_type(opt, "output", 0, 80), GgmlType::Q5_K);
  // Only for K-quants, and only dense.
  opt.medium_mix = true;
  opt.dtype = GgmlType::Q8_0;
  EXPECT_NE(invalid_message(opt).find("the _M mix is written for Q4_K and Q5_K only"), std::string::npos);
  opt.dtype = GgmlType::Q4_K;
  opt.preset = "mixtral-8x7b";
  EXPECT_NE(invalid_message(opt).find("written for dense models"), std::string::npos);
}

TEST(MakeModel, ParseWeightSpec) {
  EXPECT_EQ(parse_weight_spec("Q4_K_M").type, GgmlType::Q4_K);
  EXPECT_TRUE(parse_weight_spec("q4_k_m").medium_mix);
  EXPECT_EQ(parse_weight_spec("q5_k_m").type, GgmlType::Q5_K);
  EXPECT_FALSE(parse_weight_spec("q4_k").medium_mix);
  try {
    parse_weight_spec("q3_k_m");
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown weight type 'q3_k_m' (accepted: f32, f16, bf16, q8_0, q4_0, q4_1, "
                                         "q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, q4_k_m, q5_k_m)"),
              std::string::npos)
        << e.what();
  }
}

TEST(MakeModel, ParseWeightDtype) {
  EXPECT_EQ(parse_weight_dtype("f32"), GgmlType::F32);
  EXPECT_EQ(parse_weight_dtype("F16"), GgmlType::F16);
  EXPECT_EQ(parse_weight_dtype("bf16"), GgmlType::BF16);
  EXPECT_EQ(parse_weight_dtype("Q8_0"), GgmlType::Q8_0);
  EXPECT_EQ(parse_weight_dtype("q4_0"), GgmlType::Q4_0);
  EXPECT_EQ(parse_weight_dtype("Q4_K"), GgmlType::Q4_K);
  EXPECT_EQ(parse_weight_dtype("q6_k"), GgmlType::Q6_K);
  try {
    parse_weight_dtype("q4_k_m");  // a llama-quantize mix, not one type
    ADD_FAILURE();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown weight type 'q4_k_m' (accepted: f32, f16, bf16, q8_0, q4_0, q4_1, "
                                         "q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(llama_file_type(GgmlType::BF16), 32u);
  EXPECT_EQ(llama_file_type(GgmlType::Q4_K), 14u);
  EXPECT_THROW(llama_file_type(GgmlType::IQ4_NL), std::invalid_argument);
}

}  // namespace
}  // namespace fdl::tools
