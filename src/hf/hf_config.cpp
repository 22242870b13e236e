// config.json -> llama.* GGUF metadata (see hf_config.h).
#include "hf/hf_config.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "arch/family.h"

namespace fdl::hf {
namespace {

using nlohmann::json;

class ConfigReader {
 public:
  ConfigReader(const json& j, std::string label) : j_(j), label_(std::move(label)) {}
  const std::string& label() const { return label_; }

  [[noreturn]] void fail(const std::string& what) const { throw HfError(label_ + ": " + what); }

  const json* find(const char* key) const {
    const auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  int positive_int(const char* key) const {
    const json* v = find(key);
    if (!v) fail("missing key '" + std::string(key) + "'");
    return positive_int_value(key, *v);
  }
  int positive_int_or(const char* key, int def) const {
    const json* v = find(key);
    return v ? positive_int_value(key, *v) : def;
  }
  double positive_number(const json& v, const std::string& key) const {
    if (!v.is_number()) fail("key '" + key + "' must be a number, got " + std::string(v.type_name()));
    const double d = v.get<double>();
    if (!(d > 0) || !std::isfinite(d)) fail("key '" + key + "' = " + v.dump() + " must be a positive finite number");
    return d;
  }
  double positive_number_or(const char* key, double def) const {
    const json* v = find(key);
    return v ? positive_number(*v, key) : def;
  }
  std::string string_or(const char* key, std::string def) const {
    const json* v = find(key);
    if (!v) return def;
    if (!v->is_string()) fail("key '" + std::string(key) + "' must be a string, got " + std::string(v->type_name()));
    return v->get<std::string>();
  }
  bool bool_or(const char* key, bool def) const {
    const json* v = find(key);
    if (!v) return def;
    if (!v->is_boolean()) fail("key '" + std::string(key) + "' must be true or false, got " + v->dump());
    return v->get<bool>();
  }

 private:
  int positive_int_value(const std::string& key, const json& v) const {
    if (!v.is_number_integer()) fail("key '" + key + "' must be an integer, got " + v.dump());
    // Unsigned values above INT64_MAX must not wrap into negatives in the check or the message.
    const bool in_range = v.is_number_unsigned()
                              ? v.get<uint64_t>() >= 1 && v.get<uint64_t>() <= uint64_t(std::numeric_limits<int>::max())
                              : v.get<int64_t>() >= 1 && v.get<int64_t>() <= std::numeric_limits<int>::max();
    if (!in_range) fail("key '" + key + "' = " + v.dump() + " is out of range (1 .. 2^31-1)");
    return int(v.get<int64_t>());
  }

  const json& j_;
  std::string label_;
};

/// What write_rope needs besides the RoPE keys: the rotated dimensions and the context
/// (max_position_embeddings) for LongRoPE, and where its factors go.
struct RopeTarget {
  std::string arch;  ///< the GGUF key prefix
  int rope_dim = 0;
  int n_ctx = 0;
  HfModelShape* shape = nullptr;
};

/// RoPE parameters: transformers 5 keeps them in `rope_parameters`, 4 in `rope_theta` and
/// `rope_scaling`.
void write_rope(const ConfigReader& r, const RopeTarget& t, double default_theta, GgufWriter& w);

/// Gemma 3: rope_parameters per layer type (transformers 5: {full_attention: {...},
/// sliding_attention: {...}}; 4: rope_theta, rope_scaling and rope_local_base_freq). The global
/// layers' is the model's RoPE; the sliding layers' must be unscaled, its base written as
/// `rope.freq_base_swa`. Returns false for a config without per-layer-type RoPE.
bool write_layer_type_rope(const ConfigReader& r, const json& config, const RopeTarget& t, double default_theta,
                           GgufWriter& w) {
  const std::string& a = t.arch;
  const json* params = r.find("rope_parameters");
  if (params && params->is_object() && params->contains("full_attention")) {
    for (const char* type : {"full_attention", "sliding_attention"})
      if (!params->contains(type) || !params->at(type).is_object())
        r.fail("key 'rope_parameters." + std::string(type) + "' must be an object");
    const json& slide = params->at("sliding_attention");
    for (const char* k : {"rope_type", "type"})
      if (slide.contains(k) && slide.at(k) != "default")
        r.fail("rope_parameters.sliding_attention." + std::string(k) + " = " + slide.at(k).dump() +
               ": the sliding layers' RoPE must be unscaled");
    if (!slide.contains("rope_theta")) r.fail("missing key 'rope_parameters.sliding_attention.rope_theta'");
    w.set_float32(a + ".rope.freq_base_swa", float(r.positive_number(slide.at("rope_theta"), "rope_parameters.sliding_attention.rope_theta")));
    json global = config;
    global["rope_parameters"] = params->at("full_attention");
    write_rope(ConfigReader(global, r.label()), t, default_theta, w);
    return true;
  }
  if (r.find("rope_local_base_freq")) {
    w.set_float32(a + ".rope.freq_base_swa", float(r.positive_number_or("rope_local_base_freq", 10000)));
    write_rope(r, t, default_theta, w);
    return true;
  }
  return false;
}

/// LongRoPE (Phi-3-mini-128k, Phi-3.5-mini, Phi-4-mini) as llama.cpp's converter writes it: the
/// factor lists as tensors (HfModelShape), `rope.scaling.original_context_length` and
/// `rope.scaling.attn_factor`, no scaling type. The values are transformers' (its
/// _compute_longrope_parameters): the original context is the top-level
/// original_max_position_embeddings (Phi3Config's; both spellings must agree), else `s`'s; the
/// attention factor is `s.attention_factor`, else sqrt(1 + ln(f) / ln(original)) for
/// f = `s.factor`, else max_position_embeddings / original, when f > 1, else 1.
void write_longrope(const ConfigReader& r, const json& s, const std::string& where, const RopeTarget& t,
                    GgufWriter& w) {
  const auto factors = [&](const char* k) {
    const std::string key = where + "." + k;
    if (!s.contains(k) || s.at(k).is_null()) r.fail("rope type 'longrope' needs '" + key + "'");
    const json& v = s.at(k);
    const size_t n = size_t(t.rope_dim / 2);
    if (!v.is_array() || v.size() != n)
      r.fail("key '" + key + "' must be a list of " + std::to_string(n) + " numbers (rotated dimensions / 2), got " +
             (v.is_array() ? std::to_string(v.size()) + " entries" : std::string(v.type_name())));
    std::vector<float> out;
    for (size_t i = 0; i < n; ++i) {
      const std::string at = key + "[" + std::to_string(i) + "]";
      const double x = r.positive_number(v[i], at);
      if (x > 1e6) r.fail("key '" + at + "' = " + v[i].dump() + " is out of range (up to 1e6)");
      out.push_back(float(x));
    }
    return out;
  };
  t.shape->rope_factors_long = factors("long_factor");
  t.shape->rope_factors_short = factors("short_factor");

  const auto integer = [&](const json& v, const std::string& key) {
    const double d = r.positive_number(v, key);
    if (d != std::floor(d) || d > std::numeric_limits<int>::max())
      r.fail("key '" + key + "' = " + v.dump() + " must be an integer in 1 .. 2^31-1");
    return int(d);
  };
  const json* top = r.find("original_max_position_embeddings");
  const bool inner = s.contains("original_max_position_embeddings") && !s.at("original_max_position_embeddings").is_null();
  if (!top && !inner) r.fail("rope type 'longrope' needs 'original_max_position_embeddings'");
  const int orig = top ? integer(*top, "original_max_position_embeddings")
                       : integer(s.at("original_max_position_embeddings"), where + ".original_max_position_embeddings");
  if (top && inner && integer(s.at("original_max_position_embeddings"), where + ".original_max_position_embeddings") != orig)
    r.fail("original_max_position_embeddings " + top->dump() + " and '" + where + ".original_max_position_embeddings' " +
           s.at("original_max_position_embeddings").dump() + " disagree: keep one");

  double attn_factor = 1;
  if (s.contains("attention_factor") && !s.at("attention_factor").is_null()) {
    attn_factor = r.positive_number(s.at("attention_factor"), where + ".attention_factor");
  } else {
    const double f = s.contains("factor") && !s.at("factor").is_null() ? r.positive_number(s.at("factor"), where + ".factor")
                                                                        : double(t.n_ctx) / orig;
    if (f > 1) attn_factor = std::sqrt(1 + std::log(f) / std::log(double(orig)));
  }
  if (!std::isfinite(float(attn_factor)) || attn_factor > 1e6)
    r.fail("the LongRoPE attention factor " + std::to_string(attn_factor) + " is out of range (original context " +
           std::to_string(orig) + ")");
  w.set_uint32(t.arch + ".rope.scaling.original_context_length", uint32_t(orig));
  w.set_float32(t.arch + ".rope.scaling.attn_factor", float(attn_factor));
}

void write_rope(const ConfigReader& r, const RopeTarget& t, double default_theta, GgufWriter& w) {
  const std::string& a = t.arch;
  const json* params = r.find("rope_parameters");
  const json* scaling = r.find("rope_scaling");
  if (params && !params->is_object()) r.fail("key 'rope_parameters' must be an object");
  if (scaling && !scaling->is_object()) r.fail("key 'rope_scaling' must be an object");
  double theta = r.positive_number_or("rope_theta", default_theta);
  if (params && params->contains("rope_theta")) theta = r.positive_number(params->at("rope_theta"), "rope_parameters.rope_theta");
  w.set_float32(a + ".rope.freq_base", float(theta));

  // Both present (a config edited by hand, or converted between layouts): they must not
  // disagree silently, so a non-default rope_scaling next to rope_parameters is refused.
  if (params && scaling) {
    std::string t = "default";
    for (const char* k : {"rope_type", "type"})
      if (scaling->contains(k) && scaling->at(k).is_string()) {
        t = scaling->at(k).get<std::string>();
        break;
      }
    if (t != "default") r.fail("both rope_parameters and rope_scaling (type '" + t + "') are set: keep one");
  }
  const json* s = params ? params : scaling;
  const std::string where = params ? "rope_parameters" : "rope_scaling";
  if (!s) return;
  std::string type = "default";
  for (const char* k : {"rope_type", "type"})
    if (s->contains(k)) {
      if (!s->at(k).is_string()) r.fail("key '" + where + "." + k + "' must be a string");
      type = s->at(k).get<std::string>();
      break;
    }
  const auto number = [&](const char* k) {
    if (!s->contains(k)) r.fail("rope type '" + type + "' needs '" + where + "." + k + "'");
    return r.positive_number(s->at(k), where + "." + k);
  };
  if (type == "default") return;
  if (type == "linear") {
    if (number("factor") > 1e6 || number("factor") < 1e-6)
      r.fail("key '" + where + ".factor' = " + s->at("factor").dump() + " is out of range (1e-6 .. 1e6)");
    w.set_string(a + ".rope.scaling.type", "linear");
    w.set_float32(a + ".rope.scaling.factor", float(number("factor")));
    return;
  }
  if (type == "llama3") {
    if (number("factor") > 1e6)
      r.fail("key '" + where + ".factor' = " + s->at("factor").dump() + " is out of range (up to 1e6)");
    w.set_string(a + ".rope.scaling.type", "llama3");
    w.set_float32(a + ".rope.scaling.factor", float(number("factor")));
    w.set_float32(a + ".rope.scaling.low_freq_factor", float(number("low_freq_factor")));
    w.set_float32(a + ".rope.scaling.high_freq_factor", float(number("high_freq_factor")));
    const double orig = number("original_max_position_embeddings");
    if (orig != std::floor(orig) || orig > std::numeric_limits<int>::max())
      r.fail("key '" + where + ".original_max_position_embeddings' must be an integer");
    w.set_uint32(a + ".rope.scaling.original_context_length", uint32_t(orig));
    return;
  }
  if (type == "yarn") {
    if (number("factor") < 1 || number("factor") > 1e6)
      r.fail("key '" + where + ".factor' = " + s->at("factor").dump() + " must be in [1, 1e6] for YaRN");
    // transformers' defaults (beta_fast 32, beta_slow 1, attention factor 0.1 ln(factor) + 1,
    // truncated correction range) are the plan's; other settings scale differently.
    for (const char* k : {"attention_factor", "mscale", "mscale_all_dim"})
      if (s->contains(k) && !s->at(k).is_null()) r.fail("key '" + where + "." + k + "' is set: only YaRN's default scaling is supported");
    if (s->contains("truncate") && s->at("truncate") != json(true))
      r.fail("key '" + where + ".truncate' = " + s->at("truncate").dump() + ": only the truncated YaRN range is supported");
    w.set_string(a + ".rope.scaling.type", "yarn");
    w.set_float32(a + ".rope.scaling.factor", float(number("factor")));
    // transformers falls back to max_position_embeddings.
    const double orig = s->contains("original_max_position_embeddings") ? number("original_max_position_embeddings")
                                                                        : double(r.positive_int("max_position_embeddings"));
    if (orig != std::floor(orig) || orig > std::numeric_limits<int>::max())
      r.fail("key '" + where + ".original_max_position_embeddings' must be an integer");
    w.set_uint32(a + ".rope.scaling.original_context_length", uint32_t(orig));
    for (const auto& [k, key] : {std::pair{"beta_fast", ".rope.scaling.yarn_beta_fast"}, {"beta_slow", ".rope.scaling.yarn_beta_slow"}})
      if (s->contains(k) && !s->at(k).is_null()) w.set_float32(a + key, float(number(k)));
    return;
  }
  if (type == "longrope" || type == "su") {  // "su": the name of Phi-3's first 128k configs
    write_longrope(r, *s, where, t, w);
    return;
  }
  r.fail("unsupported RoPE type '" + type + "' in '" + where + "' (supported: default, linear, llama3, yarn, longrope)");
}

}  // namespace

void write_sampling_defaults(const json& gen, const std::string& label, GgufWriter& w) {
  if (!gen.is_object()) throw HfError(label + ": not a JSON object");
  const ConfigReader r(gen, label);
  const auto in_range = [&](const char* key, double lo, double hi, bool lo_open) -> std::optional<double> {
    const json* v = r.find(key);
    if (!v) return std::nullopt;
    if (!v->is_number()) r.fail("key '" + std::string(key) + "' must be a number, got " + v->dump());
    const double d = v->get<double>();
    if (!std::isfinite(d) || d > hi || d < lo || (lo_open && d == lo))
      r.fail("key '" + std::string(key) + "' = " + v->dump() + " is out of range");
    return d;
  };
  // do_sample = false means greedy decoding in transformers, whatever the temperature says.
  const json* do_sample = r.find("do_sample");
  if (do_sample && !do_sample->is_boolean()) r.fail("key 'do_sample' must be true or false, got " + do_sample->dump());
  const auto t = in_range("temperature", 0, 1e6, false);
  if (do_sample && !do_sample->get<bool>())
    w.set_float32("general.sampling.temp", 0.f);
  else if (t)
    w.set_float32("general.sampling.temp", float(*t));
  if (const json* k = r.find("top_k")) {
    if (!k->is_number_integer() || k->get<int64_t>() < 0 || k->get<int64_t>() > std::numeric_limits<int32_t>::max())
      r.fail("key 'top_k' must be an integer >= 0, got " + k->dump());
    w.set_int32("general.sampling.top_k", int32_t(k->get<int64_t>()));
  }
  if (auto p = in_range("top_p", 0, 1, true)) w.set_float32("general.sampling.top_p", float(*p));
  if (auto p = in_range("min_p", 0, 1, false)) w.set_float32("general.sampling.min_p", float(*p));
  if (auto p = in_range("repetition_penalty", 0, 1e6, true)) w.set_float32("general.sampling.penalty_repeat", float(*p));
}

HfModelShape write_model_metadata(const json& config, const std::string& label, GgufWriter& w) {
  if (!config.is_object()) throw HfError(label + ": not a JSON object");
  const ConfigReader r(config, label);
  if (!r.find("model_type")) r.fail("missing key 'model_type' (the model's family)");
  const std::string model_type = r.string_or("model_type", "");
  const arch::Family* family = arch::find_hf_family(model_type);
  if (!family)
    r.fail("unsupported model_type '" + model_type + "' (supported from a Hugging Face directory: " +
           arch::hf_model_type_names() + ")");
  const std::string a(family->name);

  HfModelShape s;
  s.n_embd = r.positive_int("hidden_size");
  s.n_layer = r.positive_int("num_hidden_layers");
  s.n_head = r.positive_int("num_attention_heads");
  s.n_head_kv = r.positive_int_or("num_key_value_heads", s.n_head);
  s.n_ff = r.positive_int("intermediate_size");
  s.n_vocab = r.positive_int("vocab_size");
  if (r.find("head_dim")) {
    s.head_dim = r.positive_int("head_dim");
  } else {
    if (s.n_embd % s.n_head != 0)
      r.fail("hidden_size " + std::to_string(s.n_embd) + " is not a multiple of num_attention_heads " +
             std::to_string(s.n_head) + " and no head_dim is given");
    s.head_dim = s.n_embd / s.n_head;
  }
  if (s.n_head % s.n_head_kv != 0)
    r.fail("num_attention_heads " + std::to_string(s.n_head) + " is not a multiple of num_key_value_heads " +
           std::to_string(s.n_head_kv));
  if (s.head_dim % 2 != 0) r.fail("head_dim " + std::to_string(s.head_dim) + " must be even (RoPE rotates pairs)");
  s.tied_output = r.bool_or("tie_word_embeddings", false);
  s.family = family;
  const int n_ctx = r.positive_int("max_position_embeddings");

  // Keys that change the math and are not supported: refused, never ignored.
  // Gemma configs name their activation hidden_activation (hidden_act is an older spelling).
  const char* act_key = r.find("hidden_activation") ? "hidden_activation" : "hidden_act";
  const std::string act = r.string_or(act_key, family->ffn_gelu ? "gelu_pytorch_tanh" : "silu");
  const std::string want_act = family->ffn_gelu ? "gelu_pytorch_tanh" : "silu";
  if (act != want_act) r.fail("unsupported " + std::string(act_key) + " '" + act + "' (supported for " + a + ": " + want_act + ")");
  if (r.bool_or("use_bidirectional_attention", false))
    r.fail("use_bidirectional_attention = true: only causal attention is supported");
  // Qwen2's Q/K/V biases are part of its plan (its config has no switch for them); an
  // attention_bias switch elsewhere would add an output bias too, which no plan here reads.
  if (r.bool_or("attention_bias", false))
    r.fail("attention_bias = true: attention biases are not supported for " + a);
  if (r.bool_or("mlp_bias", false)) r.fail("mlp_bias = true: FFN biases are not supported for " + a);
  // Qwen configs carry a sliding_window that only applies with use_sliding_window = true (false
  // by default); for the other families (Mistral, Phi-3) the window always applies.
  const bool window_switch = family->hf_sliding_window_switch;
  int window = 0;
  if (const json* sw = r.find("sliding_window"); sw && (!window_switch || r.bool_or("use_sliding_window", false))) {
    if (!sw->is_number_integer() || sw->get<int64_t>() < 1 || sw->get<int64_t>() > std::numeric_limits<int32_t>::max())
      r.fail("key 'sliding_window' must be a positive integer or null, got " + sw->dump());
    if (sw->get<int64_t>() < n_ctx) window = int(sw->get<int64_t>());
  }
  std::vector<bool> sliding_layers;  // empty: sliding_period says which layers
  int sliding_period = 0;
  if (window > 0) {
    if (const json* types = r.find("layer_types")) {
      if (!types->is_array() || types->size() != size_t(s.n_layer))
        r.fail("key 'layer_types' must be an array of " + std::to_string(s.n_layer) + " strings");
      for (const json& t : *types) {
        if (t != "sliding_attention" && t != "full_attention")
          r.fail("layer_types entry " + t.dump() + " is not supported (sliding_attention, full_attention)");
        sliding_layers.push_back(t == "sliding_attention");
      }
    } else if (window_switch) {
      // Which of Qwen's layers slide (max_window_layers) is spelled out only by layer_types.
      r.fail("use_sliding_window = true without 'layer_types': which layers slide is not said");
    } else {
      // transformers 4: Gemma 3's sliding_window_pattern (n: layers il % n < n - 1 slide), or
      // the family's own pattern (Gemma 2 alternates; 0 = every layer).
      sliding_period = r.find("sliding_window_pattern") ? r.positive_int("sliding_window_pattern")
                                                        : family->gguf_sliding_pattern;
    }
  }
  // Mixtral's experts; other MoE layouts (shared experts, other routers) are refused.
  const bool mixtral = model_type == "mixtral";
  for (const char* key : {"num_experts", "n_routed_experts", "moe_intermediate_size", "shared_expert_intermediate_size"})
    if (r.find(key)) r.fail("key '" + std::string(key) + "' is set: not supported for " + a);
  if (r.find("num_local_experts") && !mixtral) r.fail("key 'num_local_experts' is set: not supported for " + model_type);
  if (mixtral) {
    s.n_expert = r.positive_int("num_local_experts");
    s.n_expert_used = r.positive_int("num_experts_per_tok");
    if (s.n_expert_used > s.n_expert) r.fail("num_experts_per_tok exceeds num_local_experts");
  }
  if (const json* tp = r.find("pretraining_tp"); tp && !tp->is_number_integer())
    r.fail("key 'pretraining_tp' must be an integer");

  w.set_string("general.architecture", a);
  w.set_uint32(a + ".context_length", uint32_t(n_ctx));
  w.set_uint32(a + ".embedding_length", uint32_t(s.n_embd));
  w.set_uint32(a + ".block_count", uint32_t(s.n_layer));
  w.set_uint32(a + ".feed_forward_length", uint32_t(s.n_ff));
  w.set_uint32(a + ".attention.head_count", uint32_t(s.n_head));
  w.set_uint32(a + ".attention.head_count_kv", uint32_t(s.n_head_kv));
  w.set_uint32(a + ".attention.key_length", uint32_t(s.head_dim));
  w.set_uint32(a + ".attention.value_length", uint32_t(s.head_dim));
  if (s.n_expert > 0) {
    w.set_uint32(a + ".expert_count", uint32_t(s.n_expert));
    w.set_uint32(a + ".expert_used_count", uint32_t(s.n_expert_used));
  }
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping"})
    if (const json* cap = r.find(key); cap && !cap->is_null())
      w.set_float32(a + "." + key, float(r.positive_number(*cap, key)));
  if (r.find("query_pre_attn_scalar"))  // Gemma: queries scaled by its inverse square root
    w.set_float32(a + ".attention.scale", float(1 / std::sqrt(r.positive_number_or("query_pre_attn_scalar", 1))));
  if (window > 0) {
    w.set_uint32(a + ".attention.sliding_window", uint32_t(window));
    if (!sliding_layers.empty()) w.set_array_bool(a + ".attention.sliding_window_pattern", sliding_layers);
    else w.set_uint32(a + ".attention.sliding_window_pattern", uint32_t(sliding_period));  // 0: every layer
  }
  // Phi-3 and others rotate only part of each head (transformers 4: top level; 5: rope_parameters).
  double partial = r.positive_number_or("partial_rotary_factor", 1.0);
  if (const json* p = r.find("rope_parameters"); p && p->is_object() && p->contains("partial_rotary_factor"))
    partial = r.positive_number(p->at("partial_rotary_factor"), "rope_parameters.partial_rotary_factor");
  const double rope_dim = s.head_dim * partial;
  if (partial > 1 || rope_dim != std::floor(rope_dim) || int(rope_dim) % 2 != 0)
    r.fail("partial_rotary_factor " + std::to_string(partial) + " of head_dim " + std::to_string(s.head_dim) +
           " is not an even number of dimensions at most head_dim");
  // Interleaved-pair families get HF's rows reordered over the whole head (as llama.cpp's
  // converter does): right only when the whole head rotates.
  if (partial < 1 && family->gguf_rope_pairs == arch::RopePairs::Interleaved)
    r.fail("partial_rotary_factor " + std::to_string(partial) + " is not supported for " + a);
  w.set_uint32(a + ".rope.dimension_count", uint32_t(rope_dim));
  w.set_uint32(a + ".vocab_size", uint32_t(s.n_vocab));
  w.set_float32(a + ".attention.layer_norm_rms_epsilon", float(r.positive_number_or("rms_norm_eps", 1e-6)));
  const RopeTarget rope{.arch = a, .rope_dim = int(rope_dim), .n_ctx = n_ctx, .shape = &s};
  if (!(family->sliding_rope_base > 0 && write_layer_type_rope(r, config, rope, family->hf_default_rope_theta, w)))
    write_rope(r, rope, family->hf_default_rope_theta, w);
  return s;
}

}  // namespace fdl::hf
