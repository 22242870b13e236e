// ModelConfig::from_gguf: hyperparameters of a Llama-family model from GGUF metadata, with
// the defaults llama.cpp applies and a ModelError naming the key for anything missing or
// inconsistent.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "arch/family.h"
#include "flashdllm/model.h"

namespace fdl {
namespace {

// Reads `<arch>.*` keys, turning every failure into a ModelError that names file and key.
class MetaReader {
 public:
  MetaReader(const GgufFile& f, std::string arch) : f_(f), arch_(std::move(arch)) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw ModelError(f_.path() + ": " + what);
  }
  std::string key(std::string_view suffix) const { return arch_ + "." + std::string(suffix); }
  bool has(std::string_view suffix) const { return f_.find(key(suffix)) != nullptr; }

  int positive_int(std::string_view suffix) const {
    const std::string k = key(suffix);
    if (!f_.find(k)) fail("missing required metadata key '" + k + "'");
    return to_positive_int(k, read_uint(k));
  }
  int positive_int_or(std::string_view suffix, int def) const {
    const std::string k = key(suffix);
    return f_.find(k) ? to_positive_int(k, read_uint(k)) : def;
  }
  uint64_t uint_or(std::string_view suffix, uint64_t def) const {
    const std::string k = key(suffix);
    return f_.find(k) ? read_uint(k) : def;
  }
  float positive_float(std::string_view suffix) const {
    const std::string k = key(suffix);
    if (!f_.find(k)) fail("missing required metadata key '" + k + "'");
    return to_positive_float(k, read_float(k));
  }
  float positive_float_or(std::string_view suffix, float def) const {
    const std::string k = key(suffix);
    return f_.find(k) ? to_positive_float(k, read_float(k)) : def;
  }
  /// A finite value >= 0 (0 meaning "none" for switches such as soft-capping), or `def`.
  float nonnegative_float_or(std::string_view suffix, float def) const {
    const std::string k = key(suffix);
    if (!f_.find(k)) return def;
    const double v = read_float(k);
    if (!(v >= 0) || !std::isfinite(v)) fail("metadata key '" + k + "' = " + std::to_string(v) + " must be a finite number >= 0");
    return float(v);
  }
  std::string string_or(std::string_view full_key, std::string def) const {
    try {
      return f_.get_string_or(full_key, std::move(def));
    } catch (const GgufError& e) {
      fail("metadata key '" + std::string(full_key) + "': " + e.what());
    }
  }

 private:
  uint64_t read_uint(const std::string& k) const {
    try {
      return f_.get_uint(k);
    } catch (const GgufError& e) {
      fail("metadata key '" + k + "' must be a non-negative integer: " + e.what());
    }
  }
  double read_float(const std::string& k) const {
    try {
      return f_.get_float(k);
    } catch (const GgufError& e) {
      fail("metadata key '" + k + "' must be a number: " + e.what());
    }
  }
  int to_positive_int(const std::string& k, uint64_t v) const {
    if (v == 0 || v > uint64_t(std::numeric_limits<int>::max()))
      fail("metadata key '" + k + "' = " + std::to_string(v) + " is out of range (1 .. 2^31-1)");
    return int(v);
  }
  float to_positive_float(const std::string& k, double v) const {
    if (!(v > 0) || !std::isfinite(v))
      fail("metadata key '" + k + "' = " + std::to_string(v) + " must be a positive finite number");
    return float(v);
  }

  const GgufFile& f_;
  std::string arch_;
};

int vocab_size(const GgufFile& f, const MetaReader& m) {
  if (m.has("vocab_size")) return m.positive_int("vocab_size");
  if (const GgufValue* tokens = f.find("tokenizer.ggml.tokens"); tokens && tokens->count > 0 &&
                                                                 tokens->count < (1u << 31))
    return int(tokens->count);
  if (const GgufTensorInfo* embd = f.find_tensor("token_embd.weight"); embd && embd->n_dims == 2 &&
                                                                       embd->ne[1] < (1u << 31))
    return int(embd->ne[1]);
  m.fail("cannot determine the vocabulary size: no '" + m.key("vocab_size") +
         "', no tokenizer.ggml.tokens and no 2-D token_embd.weight");
}

void read_rope_scaling(const GgufFile& f, const MetaReader& m, ModelConfig& c) {
  const std::string type = m.string_or(m.key("rope.scaling.type"), "none");
  if (type == "linear") {
    c.rope_freq_scale = 1.f / m.positive_float("rope.scaling.factor");
  } else if (type == "llama3") {
    c.rope_llama3 = true;
  } else if (type == "yarn") {
    c.rope_yarn = true;
    const float factor = m.positive_float("rope.scaling.factor");
    if (factor < 1.f)
      m.fail("'" + m.key("rope.scaling.factor") + "' = " + std::to_string(factor) + ": YaRN needs a factor >= 1");
    c.rope_freq_scale = 1.f / factor;
    c.rope_orig_ctx = m.positive_int_or("rope.scaling.original_context_length", c.n_ctx_train);
    // The context YaRN extends to (Qwen's recipe leaves context_length at the original).
    c.n_ctx_train = int(std::min<double>(std::numeric_limits<int>::max(),
                                         std::max<double>(c.n_ctx_train, double(c.rope_orig_ctx) * factor)));
    c.yarn_beta_fast = m.positive_float_or("rope.scaling.yarn_beta_fast", c.yarn_beta_fast);
    c.yarn_beta_slow = m.positive_float_or("rope.scaling.yarn_beta_slow", c.yarn_beta_slow);
    // Other YaRN variants (DeepSeek's log multiplier, an explicit attention factor) scale
    // differently: refused rather than run with this plan's scale.
    for (const char* k : {"rope.scaling.yarn_log_multiplier", "rope.scaling.yarn_attn_factor", "rope.scaling.yarn_ext_factor"})
      if (m.has(k)) m.fail("'" + m.key(k) + "' is set: only YaRN's default scaling is supported");
  } else if (type != "none" && type != "longrope") {  // longrope: read_longrope
    m.fail("unsupported rope scaling type '" + type + "' in '" + m.key("rope.scaling.type") +
           "' (supported: none, linear, llama3, yarn, longrope)");
  }
  // Older converters wrote linear scaling as a bare factor.
  if (type == "none" && m.has("rope.scale_linear"))
    c.rope_freq_scale = 1.f / m.positive_float("rope.scale_linear");
  // llama.cpp's converters store Llama-3 scaling as per-pair factors in this tensor.
  if (f.find_tensor("rope_freqs.weight")) c.rope_llama3 = true;
  if (c.rope_llama3) {
    c.rope_scale_factor = m.positive_float_or("rope.scaling.factor", c.rope_scale_factor);
    c.rope_low_freq_factor = m.positive_float_or("rope.scaling.low_freq_factor", c.rope_low_freq_factor);
    c.rope_high_freq_factor = m.positive_float_or("rope.scaling.high_freq_factor", c.rope_high_freq_factor);
    c.rope_orig_ctx = m.positive_int_or("rope.scaling.original_context_length", c.rope_orig_ctx);
    if (!(c.rope_high_freq_factor > c.rope_low_freq_factor))
      m.fail("llama3 rope scaling needs high_freq_factor > low_freq_factor (got " +
             std::to_string(c.rope_high_freq_factor) + " <= " + std::to_string(c.rope_low_freq_factor) + ")");
  }
}

// LongRoPE: llama.cpp's converter writes its two factor sets as tensors (bound and checked in
// bind_llama_weights), the original context and the attention factor, and no scaling type.
void read_longrope(const GgufFile& f, const MetaReader& m, ModelConfig& c) {
  const char* names[2] = {"rope_factors_long.weight", "rope_factors_short.weight"};
  const bool has[2] = {f.find_tensor(names[0]) != nullptr, f.find_tensor(names[1]) != nullptr};
  const bool typed = m.string_or(m.key("rope.scaling.type"), "none") == "longrope";
  if (!typed && !has[0] && !has[1]) return;
  for (int i = 0; i < 2; ++i)
    if (!has[i])
      m.fail(std::string("LongRoPE") + (typed ? " ('" + m.key("rope.scaling.type") + "' = longrope)" : "") +
             " needs the tensors 'rope_factors_long.weight' and 'rope_factors_short.weight'; '" + names[i] +
             "' is missing");
  if (c.rope_llama3 || c.rope_yarn)
    m.fail(std::string("LongRoPE factors together with ") + (c.rope_yarn ? "YaRN" : "llama3") +
           " rope scaling are not supported");
  c.rope_longrope = true;
  c.rope_orig_ctx = m.positive_int_or("rope.scaling.original_context_length", c.n_ctx_train);
}

// `<arch>.attention.sliding_window` (0 or at least the context: none) and which layers it
// applies to: `<arch>.attention.sliding_window_pattern`, a BOOL per layer or llama.cpp's period
// n (layers il % n < n - 1 slide; 0 = all), else the family's default period.
void read_sliding_window(const GgufFile& f, const MetaReader& m, ModelConfig& c) {
  const uint64_t window = m.uint_or("attention.sliding_window", 0);
  if (window == 0 || window >= uint64_t(c.n_ctx_train)) return;
  c.sliding_window = int(window);
  c.layer_sliding.assign(size_t(c.n_layer), 1);
  const std::string key = m.key("attention.sliding_window_pattern");
  const GgufValue* pattern = f.find(key);
  if (pattern != nullptr && pattern->type == GgufType::ARRAY) {
    std::vector<bool> per_layer;
    try {
      per_layer = f.array_bool(key);
    } catch (const GgufError& e) {
      m.fail(e.what());
    }
    if (per_layer.size() != size_t(c.n_layer))
      m.fail("'" + key + "' has " + std::to_string(per_layer.size()) + " entries for " + std::to_string(c.n_layer) +
             " layers");
    for (size_t il = 0; il < per_layer.size(); ++il) c.layer_sliding[il] = per_layer[il] ? 1 : 0;
    return;
  }
  const uint64_t period = pattern != nullptr ? m.uint_or("attention.sliding_window_pattern", 0)
                                             : uint64_t(arch::find_family(c.arch)->gguf_sliding_pattern);
  if (period > 0)
    for (int il = 0; il < c.n_layer; ++il) c.layer_sliding[size_t(il)] = uint64_t(il) % period < period - 1 ? 1 : 0;
}

// The family's Gemma parts, the soft-caps and the query scale (llama.cpp's keys and defaults).
void read_gemma_parts(const arch::Family& family, const MetaReader& m, ModelConfig& c) {
  c.post_norms = family.post_norms;
  c.ffn_gelu = family.ffn_gelu;
  if (family.embed_scale) c.embed_scale = std::sqrt(float(c.n_embd));
  c.attn_softcap = m.nonnegative_float_or("attn_logit_softcapping", 0.f);
  c.final_softcap = m.nonnegative_float_or("final_logit_softcapping", 0.f);
  if (m.has("attention.scale"))
    c.attn_scale = m.positive_float("attention.scale");
  else if (family.gguf_embd_query_scale_layers > 0 && c.n_layer == family.gguf_embd_query_scale_layers)
    c.attn_scale = 1.f / std::sqrt(float(c.n_embd / c.n_head));
  if (family.sliding_rope_base > 0 && c.sliding_window > 0)
    c.rope_freq_base_swa = m.positive_float_or("rope.freq_base_swa", family.sliding_rope_base);
}

}  // namespace

ModelConfig ModelConfig::from_gguf(const GgufFile& f) {
  const GgufValue* arch = f.find("general.architecture");
  if (!arch) throw ModelError(f.path() + ": missing required metadata key 'general.architecture'");
  if (arch->type != GgufType::STRING)
    throw ModelError(f.path() + ": metadata key 'general.architecture' must be a string");
  const arch::Family* family = arch::find_family(arch->str);
  if (!family)
    throw ModelError(f.path() + ": unsupported architecture '" + std::string(arch->str) +
                     "' (supported: " + arch::family_names() + ")");

  ModelConfig c;
  c.arch = std::string(arch->str);
  c.qkv_bias = family->qkv_bias;
  c.qk_norm = family->qk_norm;
  c.rope_halves = family->gguf_rope_pairs == arch::RopePairs::Halves;
  c.fused_qkv = family->fused_qkv;
  c.fused_gate_up = family->fused_gate_up;
  MetaReader m(f, c.arch);
  c.name = m.string_or("general.name", "");
  c.n_embd = m.positive_int("embedding_length");
  c.n_layer = m.positive_int("block_count");
  c.n_ff = m.positive_int("feed_forward_length");
  c.n_head = m.positive_int("attention.head_count");
  c.n_head_kv = m.positive_int_or("attention.head_count_kv", c.n_head);
  c.n_ctx_train = m.positive_int("context_length");
  c.rms_eps = m.positive_float("attention.layer_norm_rms_epsilon");
  c.rope_freq_base = m.positive_float_or("rope.freq_base", 10000.f);
  c.n_vocab = vocab_size(f, m);

  if (m.has("attention.key_length")) {
    c.head_dim = m.positive_int("attention.key_length");
    const int v_len = m.positive_int_or("attention.value_length", c.head_dim);
    if (v_len != c.head_dim)
      m.fail("attention.value_length " + std::to_string(v_len) + " differs from key_length " +
             std::to_string(c.head_dim) + " (not supported)");
  } else {
    if (c.n_embd % c.n_head != 0)
      m.fail("embedding_length " + std::to_string(c.n_embd) + " is not a multiple of head_count " +
             std::to_string(c.n_head) + " (and no attention.key_length is given)");
    c.head_dim = c.n_embd / c.n_head;
  }
  if (c.n_head % c.n_head_kv != 0)
    m.fail("attention.head_count " + std::to_string(c.n_head) +
           " is not a multiple of attention.head_count_kv " + std::to_string(c.n_head_kv));
  c.rope_dim = m.positive_int_or("rope.dimension_count", c.head_dim);
  if (c.rope_dim % 2 != 0 || c.rope_dim > c.head_dim)
    m.fail("rope.dimension_count " + std::to_string(c.rope_dim) +
           " must be even and at most the head dimension " + std::to_string(c.head_dim));
  read_rope_scaling(f, m, c);
  read_longrope(f, m, c);
  // llama.cpp multiplies every rotation by it, whatever the scaling type.
  c.rope_attn_factor = m.positive_float_or("rope.scaling.attn_factor", 1.f);
  read_sliding_window(f, m, c);
  read_gemma_parts(*family, m, c);
  // Mixtral-style files are labelled llama: experts where expert_count says so.
  if (const uint64_t experts = m.uint_or("expert_count", 0); experts > 0) {
    c.n_expert = m.positive_int("expert_count");
    c.n_expert_used = m.positive_int("expert_used_count");
    if (c.n_expert_used > c.n_expert)
      m.fail("'" + m.key("expert_used_count") + "' = " + std::to_string(c.n_expert_used) + " exceeds '" +
             m.key("expert_count") + "' = " + std::to_string(c.n_expert));
  }
  c.tied_output = f.find_tensor("output.weight") == nullptr;
  return c;
}

bool ModelConfig::rope_long_factors(int n_ctx) const {
  const int ctx = n_ctx > 0 ? std::min(n_ctx, n_ctx_train) : n_ctx_train;
  return rope_longrope && ctx > rope_orig_ctx;
}

uint64_t ModelConfig::n_params() const {
  const uint64_t d = uint64_t(n_embd), q = uint64_t(n_head) * head_dim,
                 kv = uint64_t(n_head_kv) * head_dim;
  const uint64_t per_layer = (post_norms ? 4 : 2) * d  // attention and FFN norms
                             + d * q + 2 * d * kv + q * d  // Q, K, V, output
                             + 3 * d * uint64_t(n_ff) * uint64_t(n_expert > 0 ? n_expert : 1)  // gate, up, down
                             + uint64_t(n_expert) * d      // router
                             + (qkv_bias ? q + 2 * kv : 0)  // Q/K/V biases
                             + (qk_norm ? 2 * uint64_t(head_dim) : 0);
  const uint64_t embeddings = uint64_t(n_vocab) * d * (tied_output ? 1 : 2);
  return embeddings + uint64_t(n_layer) * per_layer + d;  // + final norm
}

}  // namespace fdl
