// ModelConfig::from_gguf and weight binding: values read from the real models, and a clear
// ModelError for each way a file can be wrong (built with GgufWriter).
#include "model/model_test_util.h"
#include "model/tiny_llama_gguf.h"

namespace fdl::test {
namespace {

// Runs `fn`, expecting a ModelError whose message contains every string of `needles`.
template <class Fn>
void expect_model_error(Fn fn, std::initializer_list<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "no ModelError thrown";
  } catch (const ModelError& e) {
    const std::string msg = e.what();
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "message: " << msg;
  }
}

uint64_t file_parameter_count(const GgufFile& f) {
  uint64_t n = 0;
  for (const GgufTensorInfo& t : f.tensors())
    if (t.name != "rope_freqs.weight") n += t.n_elements();
  return n;
}

TEST(ModelConfig, Stories260KFromMetadata) {
  const GgufFile f = GgufFile::open(model_path("stories260K.gguf"));
  const ModelConfig c = ModelConfig::from_gguf(f);
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.n_vocab, 512);
  EXPECT_EQ(c.n_embd, 64);
  EXPECT_EQ(c.n_layer, 5);
  EXPECT_EQ(c.n_head, 8);
  EXPECT_EQ(c.n_head_kv, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.n_ff, 172);
  EXPECT_EQ(c.n_ctx_train, 2048);
  EXPECT_EQ(c.rope_dim, 8);
  EXPECT_FLOAT_EQ(c.rope_freq_base, 10000.f);  // absent in the file: the default
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-5f);
  EXPECT_FALSE(c.rope_llama3);
  EXPECT_FALSE(c.tied_output);
  EXPECT_EQ(c.n_params(), file_parameter_count(f));
}

TEST(ModelConfig, CodeLmFromMetadata) {
  const GgufFile f = GgufFile::open(model_path("codelm-16m-f16.gguf"));
  const ModelConfig c = ModelConfig::from_gguf(f);
  EXPECT_EQ(c.n_vocab, 8192);
  EXPECT_EQ(c.n_embd, 384);
  EXPECT_EQ(c.n_layer, 8);
  EXPECT_EQ(c.n_head, 6);
  EXPECT_EQ(c.n_head_kv, 2);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.n_ff, 1024);
  EXPECT_EQ(c.n_ctx_train, 1024);
  EXPECT_TRUE(c.tied_output);
  EXPECT_EQ(c.n_params(), file_parameter_count(f));
}

TEST(ModelConfig, TinySyntheticModelLoadsAndRuns) {
  const auto path = write_tiny_llama("ok.gguf", {});
  auto m = Model::load(path, {.n_threads = 1});
  EXPECT_EQ(m->config().head_dim, 16);
  EXPECT_EQ(m->config().n_head_kv, 2);
  BlockPool pool(m->kv_shape(4), 4);
  KvCache kv(pool);
  const auto ids = greedy_decode(*m, kv, {1, 2, 3}, 5);
  EXPECT_EQ(ids.size(), 5u);
}

// --kv-cache-dtype: the CPU model keeps fp32 K/V; parse_kv_dtype takes the usual spellings.
TEST(ModelConfig, CpuModelRefusesASixteenBitKvCache) {
  const auto path = write_tiny_llama("kv16.gguf", {});
  for (const KvDtype t : {KvDtype::F16, KvDtype::BF16})
    expect_model_error([&] { Model::load(path, {.n_threads = 1, .kv_dtype = t}); },
                       {"--kv-cache-dtype", kv_dtype_name(t), "f32"});
  auto m = Model::load(path, {.n_threads = 1, .kv_dtype = KvDtype::F32});
  EXPECT_EQ(m->kv_shape(4).dtype, KvDtype::F32);
  // A 16-bit pool handed to the CPU model is refused before anything is written.
  KvShape s16 = m->kv_shape(4);
  s16.dtype = KvDtype::F16;
  BlockPool pool(s16, 4);
  KvCache kv(pool);
  const SeqId seq = kv.create_sequence();
  StepBatch b;
  b.add(1, int32_t(kv.append_slots(seq, 1)), seq, true);
  std::vector<float> logits;
  EXPECT_THROW(m->forward(b, kv, logits), std::invalid_argument);
  EXPECT_EQ(parse_kv_dtype("auto"), std::nullopt);
  EXPECT_EQ(parse_kv_dtype("fp16"), KvDtype::F16);
  EXPECT_EQ(parse_kv_dtype("bfloat16"), KvDtype::BF16);
  EXPECT_EQ(parse_kv_dtype("f32"), KvDtype::F32);
  EXPECT_THROW(parse_kv_dtype("q8_0"), std::invalid_argument);
}

TEST(ModelConfig, MissingRequiredKeysAreNamed) {
  for (const std::string k : {"llama.embedding_length", "llama.block_count", "llama.feed_forward_length",
                              "llama.attention.head_count", "llama.context_length",
                              "llama.attention.layer_norm_rms_epsilon", "general.architecture"}) {
    SCOPED_TRACE(k);
    TinyLlamaSpec s;
    s.omit_keys = {k};
    const auto path = write_tiny_llama("missing.gguf", s);
    expect_model_error([&] { Model::load(path); }, {"missing required metadata key '" + k + "'"});
  }
}

TEST(ModelConfig, OptionalKeysTakeDefaults) {
  TinyLlamaSpec s;
  s.omit_keys = {"llama.attention.head_count_kv", "llama.vocab_size"};
  s.n_head_kv = s.n_head;  // the default when head_count_kv is absent
  const auto path = write_tiny_llama("defaults.gguf", s);
  const GgufFile f = GgufFile::open(path);
  const ModelConfig c = ModelConfig::from_gguf(f);
  EXPECT_EQ(c.n_head_kv, c.n_head);
  EXPECT_EQ(c.n_vocab, 40);  // from token_embd.weight (no vocab_size, no tokenizer)
  EXPECT_EQ(c.rope_dim, c.head_dim);
}

TEST(ModelConfig, UnknownArchitectureIsRejected) {
  TinyLlamaSpec s;
  s.arch = "gpt2";
  const auto path = write_tiny_llama("arch.gguf", s);
  expect_model_error([&] { Model::load(path); }, {"unsupported architecture 'gpt2'", "llama"});
}

TEST(ModelConfig, InconsistentTensorShapeIsNamed) {
  TinyLlamaSpec s;
  s.shape_override["blk.1.attn_k.weight"] = {64, 48};
  const auto path = write_tiny_llama("shape.gguf", s);
  expect_model_error([&] { Model::load(path); }, {"blk.1.attn_k.weight", "[64, 48]", "expected [64, 32]"});
}

TEST(ModelConfig, MissingTensorIsNamed) {
  TinyLlamaSpec s;
  s.omit_tensors = {"blk.1.ffn_down.weight"};
  const auto path = write_tiny_llama("tensor.gguf", s);
  expect_model_error([&] { Model::load(path); }, {"missing tensor 'blk.1.ffn_down.weight'"});
}

TEST(ModelConfig, TensorTheModelDoesNotUseIsRefused) {
  TinyLlamaSpec s;
  s.extra_tensors["blk.0.attn_q.bias"] = {64};  // a Qwen2-style bias in a file labelled llama
  const auto path = write_tiny_llama("extra.gguf", s);
  expect_model_error([&] { Model::load(path); }, {"tensor 'blk.0.attn_q.bias' is not used", "refusing"});
}

// expert_count makes a llama file a mixture of experts: it needs expert_used_count (at most
// expert_count) and the 3-D expert tensors, each named when missing.
TEST(ModelConfig, MixtureOfExpertsNeedsItsKeysAndTensors) {
  TinyLlamaSpec s;
  s.extra_u32_keys["llama.expert_count"] = 8;
  expect_model_error([&] { Model::load(write_tiny_llama("moe.gguf", s)); }, {"llama.expert_used_count"});
  s.extra_u32_keys["llama.expert_used_count"] = 9;
  expect_model_error([&] { Model::load(write_tiny_llama("moe.gguf", s)); }, {"exceeds", "llama.expert_count' = 8"});
  s.extra_u32_keys["llama.expert_used_count"] = 2;
  expect_model_error([&] { Model::load(write_tiny_llama("moe.gguf", s)); }, {"missing tensor 'blk.0.ffn_gate_inp.weight'"});
}

// A window shorter than the context (Mistral 7B v0.1, Phi-3-mini's 2047, Gemma's local layers):
// on every layer by default, on the layers `sliding_window_pattern` names (a BOOL per layer, or
// llama.cpp's period n: layers il % n < n - 1); 0 and a window as long as the context are none.
TEST(ModelConfig, SlidingWindowAndItsLayers) {
  TinyLlamaSpec s;
  s.extra_u32_keys["llama.attention.sliding_window"] = 16;
  auto config = [&](const char* name) { return Model::load(write_tiny_llama(name, s))->config(); };
  ModelConfig c = config("swa.gguf");
  EXPECT_EQ(c.sliding_window, 16);
  for (int il = 0; il < c.n_layer; ++il) EXPECT_EQ(c.attention_window(il), 16) << il;
  s.extra_u32_keys["llama.attention.sliding_window_pattern"] = 2;  // layer 0 slides, layer 1 not
  c = config("swa-period.gguf");
  EXPECT_EQ(c.attention_window(0), 16);
  EXPECT_EQ(c.attention_window(1), 0);
  for (const uint32_t window : {0u, 1u << 20}) {
    s.extra_u32_keys["llama.attention.sliding_window"] = window;
    EXPECT_EQ(config("swa-none.gguf").sliding_window, 0) << window;
  }
}

TEST(ModelConfig, UnsupportedDtypeListsTheSupportedOnes) {
  TinyLlamaSpec s;
  s.type_override["blk.0.ffn_up.weight"] = GgmlType::IQ4_NL;
  const auto path = write_tiny_llama("dtype.gguf", s);
  expect_model_error([&] { Model::load(path); },
                     {"blk.0.ffn_up.weight", "IQ4_NL", "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K"});
}

TEST(ModelConfig, InconsistentHyperparametersAreRejected) {
  {
    TinyLlamaSpec s;
    s.n_head_kv = 3;  // 4 heads cannot be grouped over 3 KV heads
    expect_model_error([&] { Model::load(write_tiny_llama("gqa.gguf", s)); },
                       {"head_count 4", "head_count_kv 3"});
  }
  {
    TinyLlamaSpec s;
    s.extra_u32_keys["llama.rope.dimension_count"] = 17;
    expect_model_error([&] { Model::load(write_tiny_llama("ropedim.gguf", s)); },
                       {"rope.dimension_count 17"});
  }
  {
    TinyLlamaSpec s;
    s.extra_string_keys["llama.rope.scaling.type"] = "dynamic";
    expect_model_error([&] { Model::load(write_tiny_llama("dynamic.gguf", s)); },
                       {"unsupported rope scaling type 'dynamic'", "none, linear, llama3, yarn, longrope"});
    // LongRoPE's factors are tensors (the phi3-longrope fixture covers them).
    s.extra_string_keys["llama.rope.scaling.type"] = "longrope";
    expect_model_error([&] { Model::load(write_tiny_llama("longrope.gguf", s)); },
                       {"LongRoPE ('llama.rope.scaling.type' = longrope) needs the tensors", "'rope_factors_long.weight' is missing"});
  }
  {
    // YaRN needs its factor; DeepSeek's variant (a log multiplier) scales otherwise: refused.
    TinyLlamaSpec s;
    s.extra_string_keys["llama.rope.scaling.type"] = "yarn";
    expect_model_error([&] { Model::load(write_tiny_llama("yarn.gguf", s)); }, {"llama.rope.scaling.factor"});
    s.extra_f32_keys["llama.rope.scaling.factor"] = 0.5f;
    expect_model_error([&] { Model::load(write_tiny_llama("yarn-small.gguf", s)); }, {"YaRN needs a factor >= 1"});
    // The context it extends to: the original context times the factor.
    s.extra_f32_keys["llama.rope.scaling.factor"] = 4.f;
    s.extra_u32_keys["llama.rope.scaling.original_context_length"] = 128;
    EXPECT_EQ(Model::load(write_tiny_llama("yarn-ok.gguf", s))->config().n_ctx_train, 512);
    s.extra_f32_keys["llama.rope.scaling.yarn_log_multiplier"] = 0.1f;
    expect_model_error([&] { Model::load(write_tiny_llama("yarn-log.gguf", s)); },
                       {"yarn_log_multiplier' is set"});
  }
  {
    TinyLlamaSpec s;
    s.omit_keys = {"llama.block_count"};
    s.extra_string_keys["llama.block_count"] = "two";
    expect_model_error([&] { Model::load(write_tiny_llama("type.gguf", s)); }, {"llama.block_count"});
  }
  {
    TinyLlamaSpec s;
    s.omit_keys = {"llama.attention.layer_norm_rms_epsilon"};
    s.extra_f32_keys["llama.attention.layer_norm_rms_epsilon"] = -1.f;
    expect_model_error([&] { Model::load(write_tiny_llama("eps.gguf", s)); },
                       {"layer_norm_rms_epsilon", "positive"});
  }
}

TEST(ModelConfig, KeyLengthOverridesEmbdOverHeads) {
  TinyLlamaSpec s;  // 4 heads of 8 dims in a 64-wide model
  s.extra_u32_keys["llama.attention.key_length"] = 8;
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    s.shape_override[p + "attn_q.weight"] = {64, 32};
    s.shape_override[p + "attn_k.weight"] = {64, 16};
    s.shape_override[p + "attn_v.weight"] = {64, 16};
    s.shape_override[p + "attn_output.weight"] = {32, 64};
  }
  auto m = Model::load(write_tiny_llama("keylen.gguf", s), {.n_threads = 1});
  EXPECT_EQ(m->config().head_dim, 8);
  EXPECT_EQ(m->config().rope_dim, 8);
  EXPECT_EQ(m->kv_shape(16).head_dim, 8);
  BlockPool pool(m->kv_shape(4), 4);
  KvCache kv(pool);
  EXPECT_EQ(greedy_decode(*m, kv, {1, 2, 3}, 4).size(), 4u);
}

TEST(ModelConfig, TiedOutputUsesTokenEmbeddings) {
  TinyLlamaSpec s;
  s.tied_output = true;
  auto m = Model::load(write_tiny_llama("tied.gguf", s), {.n_threads = 1});
  EXPECT_TRUE(m->config().tied_output);
  BlockPool pool(m->kv_shape(4), 4);
  KvCache kv(pool);
  EXPECT_EQ(greedy_decode(*m, kv, {1, 2, 3}, 4).size(), 4u);
}

TEST(ModelConfig, Llama3RopeScalingFromMetadata) {
  TinyLlamaSpec s;
  s.extra_string_keys["llama.rope.scaling.type"] = "llama3";
  s.extra_f32_keys["llama.rope.scaling.factor"] = 8.f;
  s.extra_f32_keys["llama.rope.scaling.low_freq_factor"] = 1.f;
  s.extra_f32_keys["llama.rope.scaling.high_freq_factor"] = 4.f;
  s.extra_u32_keys["llama.rope.scaling.original_context_length"] = 8192;
  const GgufFile f = GgufFile::open(write_tiny_llama("llama3.gguf", s));
  const ModelConfig c = ModelConfig::from_gguf(f);
  EXPECT_TRUE(c.rope_llama3);
  EXPECT_FLOAT_EQ(c.rope_scale_factor, 8.f);
  EXPECT_EQ(c.rope_orig_ctx, 8192);
}

}  // namespace
}  // namespace fdl::test
