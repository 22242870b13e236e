// make_model: assembles a family's metadata, a tokenizer and random tensors into a GgufWriter.
#include "tools/make_model.h"

#include <stdexcept>
#include <utility>

#include "flashdllm/gguf.h"
#include "tools/make_model_internal.h"

namespace fdl::tools {

uint32_t vocab_size_of(const GgufFile& vocab_file) {
  const GgufValue* tokens = vocab_file.find("tokenizer.ggml.tokens");
  if (!tokens || tokens->type != GgufType::ARRAY || tokens->elem_type != GgufType::STRING)
    throw GgufError(vocab_file.path() + ": no tokenizer.ggml.tokens string array to copy a vocab from");
  if (tokens->count == 0 || tokens->count > UINT32_MAX)
    throw GgufError(vocab_file.path() + ": tokenizer.ggml.tokens has " +
                    std::to_string(tokens->count) + " entries");
  return static_cast<uint32_t>(tokens->count);
}

uint64_t tensor_bytes(const TensorPlan& t) {
  const auto traits = ggml_type_traits(static_cast<uint32_t>(t.type));
  uint64_t n = 1;
  for (uint64_t d : t.ne) n *= d;
  return n / traits->block_size * traits->type_size;
}

std::vector<TensorPlan> llama_tensor_list(const ModelShape& s, const MakeModelOptions& opt) {
  const GgmlType w = opt.dtype;
  const float wstd = opt.weight_std;
  constexpr float kNormStd = 0.02f;
  std::vector<TensorPlan> list;
  list.push_back({"token_embd.weight", w, {s.dim, s.vocab}, 0.f, wstd});
  list.push_back({"output_norm.weight", GgmlType::F32, {s.dim}, 1.f, kNormStd});
  if (!opt.tied_embeddings)
    list.push_back({"output.weight", matrix_type(opt, "output", 0, s.n_layers), {s.dim, s.vocab}, 0.f, wstd});
  for (uint32_t l = 0; l < s.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    list.push_back({p + "attn_norm.weight", GgmlType::F32, {s.dim}, 1.f, kNormStd});
    list.push_back({p + "attn_q.weight", w, {s.dim, s.q_dim()}, 0.f, wstd});
    list.push_back({p + "attn_k.weight", w, {s.dim, s.kv_dim()}, 0.f, wstd});
    list.push_back({p + "attn_v.weight", matrix_type(opt, "attn_v", l, s.n_layers), {s.dim, s.kv_dim()}, 0.f, wstd});
    if (s.arch == "qwen2")
      for (const auto& [name, len] : {std::pair{"attn_q.bias", s.q_dim()}, {"attn_k.bias", s.kv_dim()}, {"attn_v.bias", s.kv_dim()}})
        list.push_back({p + name, GgmlType::F32, {len}, 0.f, kNormStd});
    if (s.arch == "qwen3") {
      list.push_back({p + "attn_q_norm.weight", GgmlType::F32, {s.head_dim()}, 1.f, kNormStd});
      list.push_back({p + "attn_k_norm.weight", GgmlType::F32, {s.head_dim()}, 1.f, kNormStd});
    }
    list.push_back({p + "attn_output.weight", w, {s.q_dim(), s.dim}, 0.f, wstd});
    if (s.arch == "gemma2") {
      list.push_back({p + "post_attention_norm.weight", GgmlType::F32, {s.dim}, 1.f, kNormStd});
      list.push_back({p + "post_ffw_norm.weight", GgmlType::F32, {s.dim}, 1.f, kNormStd});
    }
    list.push_back({p + "ffn_norm.weight", GgmlType::F32, {s.dim}, 1.f, kNormStd});
    if (s.n_expert > 0) {  // llama.cpp's layout: an F32 router, 3-D expert tensors
      list.push_back({p + "ffn_gate_inp.weight", GgmlType::F32, {s.dim, s.n_expert}, 0.f, wstd});
      list.push_back({p + "ffn_gate_exps.weight", w, {s.dim, s.ffn_dim, s.n_expert}, 0.f, wstd});
      list.push_back({p + "ffn_up_exps.weight", w, {s.dim, s.ffn_dim, s.n_expert}, 0.f, wstd});
      list.push_back({p + "ffn_down_exps.weight", w, {s.ffn_dim, s.dim, s.n_expert}, 0.f, wstd});
      continue;
    }
    list.push_back({p + "ffn_gate.weight", w, {s.dim, s.ffn_dim}, 0.f, wstd});
    list.push_back({p + "ffn_up.weight", w, {s.dim, s.ffn_dim}, 0.f, wstd});
    list.push_back({p + "ffn_down.weight", matrix_type(opt, "ffn_down", l, s.n_layers), {s.ffn_dim, s.dim}, 0.f, wstd});
  }
  return list;
}

void make_model(const MakeModelOptions& opt) {
  if (opt.output.empty()) throw std::invalid_argument("make_model: output path is empty");
  std::optional<GgufFile> vocab_file;
  if (opt.vocab_from) vocab_file = GgufFile::open(*opt.vocab_from);
  const ModelShape s =
      resolve_shape(opt, vocab_file ? std::optional<uint32_t>(vocab_size_of(*vocab_file)) : std::nullopt);

  GgufWriter w;
  const std::string& a = s.arch;
  w.set_string("general.architecture", a);
  w.set_string("general.name", opt.name.empty() ? "flashdllm-random-" + opt.preset : opt.name);
  w.set_uint32("general.file_type", llama_file_type(opt));
  if (has_quantizer(opt.dtype)) w.set_uint32("general.quantization_version", 2);
  w.set_uint32(a + ".context_length", s.context);
  w.set_uint32(a + ".embedding_length", s.dim);
  w.set_uint32(a + ".block_count", s.n_layers);
  w.set_uint32(a + ".feed_forward_length", s.ffn_dim);
  w.set_uint32(a + ".attention.head_count", s.n_heads);
  w.set_uint32(a + ".attention.head_count_kv", s.n_kv_heads);
  w.set_uint32(a + ".rope.dimension_count", s.head_dim());
  if (s.head_dim_set) {
    w.set_uint32(a + ".attention.key_length", s.head_dim());
    w.set_uint32(a + ".attention.value_length", s.head_dim());
  }
  if (a == "gemma2") {  // Gemma-2-9B's: soft-caps, a 4096-position window on layers 0, 2, ...
    w.set_float32(a + ".attn_logit_softcapping", 50.f);
    w.set_float32(a + ".final_logit_softcapping", 30.f);
    w.set_uint32(a + ".attention.sliding_window", 4096);
  }
  if (s.n_expert > 0) {
    w.set_uint32(a + ".expert_count", s.n_expert);
    w.set_uint32(a + ".expert_used_count", s.n_expert_used);
  }
  w.set_float32(a + ".rope.freq_base", s.rope_theta);
  w.set_float32(a + ".attention.layer_norm_rms_epsilon", s.rms_eps);
  w.set_uint32(a + ".vocab_size", s.vocab);

  if (vocab_file) {
    for (const auto& [key, value] : vocab_file->metadata())
      if (key.rfind("tokenizer.ggml.", 0) == 0) w.set_value(key, value);
  } else {
    SyntheticVocab v = synthesize_spm_vocab(s.vocab);
    w.set_string("tokenizer.ggml.model", "llama");
    w.set_array_strings("tokenizer.ggml.tokens", std::move(v.tokens));
    w.set_array_f32("tokenizer.ggml.scores", std::move(v.scores));
    w.set_array_i32("tokenizer.ggml.token_type", std::move(v.token_types));
    w.set_uint32("tokenizer.ggml.unknown_token_id", 0);
    w.set_uint32("tokenizer.ggml.bos_token_id", 1);
    w.set_uint32("tokenizer.ggml.eos_token_id", 2);
    w.set_bool("tokenizer.ggml.add_bos_token", true);
    w.set_bool("tokenizer.ggml.add_eos_token", false);
  }

  const auto plan = llama_tensor_list(s, opt);
  for (size_t i = 0; i < plan.size(); ++i) {
    const TensorPlan& t = plan[i];
    uint64_t n = 1;
    for (uint64_t d : t.ne) n *= d;
    // The stream id is the tensor's position, so each tensor gets independent values.
    w.add_tensor(t.name, t.type, t.ne, [t, n, i, &opt](std::span<uint8_t> out) {
      fill_random(out, t.type, n, t.mean, t.std, opt.seed, i, opt.threads);
    });
  }
  w.write(opt.output);
}

}  // namespace fdl::tools
