// Built-in model presets and the option checks shared by make_model and its callers.
#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <stdexcept>
#include <string>

#include "flashdllm/gguf.h"
#include "tools/make_model.h"
#include "tools/make_model_internal.h"

namespace fdl::tools {
namespace {

struct Preset {
  std::string_view name;
  ModelShape shape;
};

// Shapes of the published models each preset imitates (Llama-2-7B's context and epsilon for
// llama-7b; Meta-Llama-3-8B for llama3-8b; Meta-Llama-3-70B for llama3-70b; Qwen2.5-7B for qwen2-7b; Qwen3-8B for qwen3-8b; Gemma-2-9B
// for gemma2-9b; Mixtral-8x7B for mixtral-8x7b).
const std::array<Preset, 9> kPresets{{
    {"tiny", {64, 2, 4, 2, 128, 512, 512, 10000.f, 1e-5f}},
    {"110m", {768, 12, 12, 12, 2048, 32000, 2048, 10000.f, 1e-5f}},
    {"llama-7b", {4096, 32, 32, 32, 11008, 32000, 4096, 10000.f, 1e-5f}},
    {"llama3-8b", {4096, 32, 32, 8, 14336, 128256, 8192, 500000.f, 1e-5f}},
    {"llama3-70b", {8192, 80, 64, 8, 28672, 128256, 8192, 500000.f, 1e-5f}},
    {"qwen2-7b", {3584, 28, 28, 4, 18944, 152064, 32768, 1000000.f, 1e-6f, "qwen2"}},
    {"qwen3-8b", {4096, 36, 32, 8, 12288, 151936, 40960, 1000000.f, 1e-6f, "qwen3"}},
    {"gemma2-9b", {3584, 42, 16, 8, 14336, 256000, 8192, 10000.f, 1e-6f, "gemma2", 256}},
    {"mixtral-8x7b", {4096, 32, 32, 8, 14336, 32000, 32768, 1000000.f, 1e-5f, "llama", 0, 8, 2}},
}};

// llama.cpp's largest expert count (LLAMA_MAX_EXPERTS).
constexpr uint32_t kMaxExperts = 512;

[[noreturn]] void bad(const std::string& msg) { throw std::invalid_argument("make_model: " + msg); }

void require_positive(uint32_t v, const char* what) {
  if (v == 0) bad(std::string(what) + " must be greater than 0");
}

}  // namespace

std::vector<std::string> model_presets() {
  std::vector<std::string> names;
  for (const auto& p : kPresets) names.emplace_back(p.name);
  return names;
}

ModelShape resolve_shape(const MakeModelOptions& opt, std::optional<uint32_t> file_vocab) {
  const auto it = std::find_if(kPresets.begin(), kPresets.end(),
                               [&](const Preset& p) { return p.name == opt.preset; });
  if (it == kPresets.end()) {
    std::string names;
    for (const auto& p : kPresets) names += (names.empty() ? "" : ", ") + std::string(p.name);
    bad("unknown preset '" + opt.preset + "' (available: " + names + ")");
  }
  // The types make-model can write: the 16/32-bit floats and every type with a quantizer.
  const GgmlType d = opt.dtype;
  if (d != GgmlType::F32 && d != GgmlType::F16 && d != GgmlType::BF16 && !has_quantizer(d))
    bad("dtype " + ggml_type_name(static_cast<uint32_t>(d)) + " is not supported (use " + writable_dtype_names() + ")");
  if (opt.medium_mix && d != GgmlType::Q4_K && d != GgmlType::Q5_K)
    bad("the _M mix is written for Q4_K and Q5_K only, not " + ggml_type_name(static_cast<uint32_t>(d)));
  ModelShape s = it->shape;
  s.dim = opt.dim.value_or(s.dim);
  s.n_layers = opt.n_layers.value_or(s.n_layers);
  s.n_heads = opt.n_heads.value_or(s.n_heads);
  s.n_kv_heads = opt.n_kv_heads.value_or(s.n_kv_heads);
  s.ffn_dim = opt.ffn_dim.value_or(s.ffn_dim);
  s.context = opt.context.value_or(s.context);
  s.rope_theta = opt.rope_theta.value_or(s.rope_theta);
  s.rms_eps = opt.rms_eps.value_or(s.rms_eps);
  s.arch = opt.arch.value_or(s.arch);
  if (s.arch != "llama" && s.arch != "qwen2" && s.arch != "qwen3" && s.arch != "gemma2")
    bad("unknown arch '" + s.arch + "' (available: llama, qwen2, qwen3, gemma2)");
  if (opt.dim || opt.n_heads) s.head_dim_set = 0;  // a reshaped model: dim / n_heads
  s.n_expert = opt.n_expert.value_or(s.n_expert);
  // Experts per token: as given; else 2 (at most n_expert) when n_expert is given; else the preset's.
  s.n_expert_used = opt.n_expert_used.value_or(opt.n_expert ? std::min(2u, s.n_expert) : s.n_expert_used);
  if (s.n_expert == 0 && s.n_expert_used > 0)
    bad("n_expert_used (--n-experts-used) needs n_expert (--n-experts): a mixture of experts");
  if (s.n_expert > kMaxExperts)
    bad("n_expert (--n-experts) must be at most " + std::to_string(kMaxExperts) + ", got " + std::to_string(s.n_expert));
  if (s.n_expert > 0 && opt.medium_mix) bad("the _M mixes (q4_k_m, q5_k_m) are written for dense models, not experts");
  if (s.n_expert > 0 && (s.n_expert_used == 0 || s.n_expert_used > s.n_expert))
    bad("n_expert_used (--n-experts-used) must be 1.." + std::to_string(s.n_expert) + " (n_expert), got " +
        std::to_string(s.n_expert_used));
  if (s.n_expert > 0 && s.arch != "llama")
    bad("experts (--n-experts) are written for arch llama only (Mixtral), not " + s.arch + " (--arch or the preset)");
  if (file_vocab) {
    if (opt.vocab && *opt.vocab != *file_vocab)
      bad("vocab " + std::to_string(*opt.vocab) + " conflicts with vocab_from, which has " +
          std::to_string(*file_vocab) + " tokens");
    s.vocab = *file_vocab;
  } else {
    s.vocab = opt.vocab.value_or(s.vocab);
    if (s.vocab < kMinSyntheticVocab)
      bad("vocab " + std::to_string(s.vocab) + " is too small for a synthesized vocab (needs >= " +
          std::to_string(kMinSyntheticVocab) + ": 3 specials, 256 bytes, 1 piece)");
  }

  require_positive(s.dim, "dim");
  require_positive(s.n_layers, "n_layers");
  require_positive(s.n_heads, "n_heads");
  require_positive(s.n_kv_heads, "n_kv_heads");
  require_positive(s.ffn_dim, "ffn_dim");
  require_positive(s.vocab, "vocab");
  require_positive(s.context, "context");
  if (s.head_dim_set == 0 && s.dim % s.n_heads != 0)
    bad("dim " + std::to_string(s.dim) + " is not divisible by n_heads " + std::to_string(s.n_heads));
  if (s.n_heads % s.n_kv_heads != 0)
    bad("n_heads " + std::to_string(s.n_heads) + " is not divisible by n_kv_heads " +
        std::to_string(s.n_kv_heads));
  if (s.head_dim() % 2 != 0)
    bad("head dim " + std::to_string(s.head_dim()) + (s.head_dim_set ? "" : " (dim / n_heads)") + " must be even for RoPE");
  // Every matrix row (its cols: dim, the attention output's q_dim, down's ffn_dim) holds whole blocks.
  if (const uint32_t block = ggml_type_traits(static_cast<uint32_t>(opt.dtype))->block_size;
      s.dim % block != 0 || s.ffn_dim % block != 0 || s.q_dim() % block != 0)
    bad(std::string(ggml_type_traits(static_cast<uint32_t>(opt.dtype))->name) + " needs dim, ffn_dim and n_heads x head_dim to be multiples of " +
        std::to_string(block) + " (got dim " + std::to_string(s.dim) + ", ffn_dim " + std::to_string(s.ffn_dim) +
        ", n_heads x head_dim " + std::to_string(s.q_dim()) + ")");
  if (!(s.rope_theta > 0.f) || !std::isfinite(s.rope_theta)) bad("rope_theta must be a positive number");
  if (!(s.rms_eps > 0.f) || !std::isfinite(s.rms_eps)) bad("rms_eps must be a positive number");
  if (!(opt.weight_std >= 0.f) || !std::isfinite(opt.weight_std))
    bad("weight_std must be a finite number >= 0");
  return s;
}

ModelShape resolve_model_shape(const MakeModelOptions& opt) {
  std::optional<uint32_t> file_vocab;
  if (opt.vocab_from) file_vocab = vocab_size_of(GgufFile::open(*opt.vocab_from));
  return resolve_shape(opt, file_vocab);
}

uint64_t model_tensor_bytes(const MakeModelOptions& opt) {
  const ModelShape s = resolve_model_shape(opt);
  uint64_t total = 0;
  for (const auto& t : llama_tensor_list(s, opt)) total += tensor_bytes(t);
  return total;
}

namespace {

// What make-model writes, and the general.file_type (llama.cpp's LLAMA_FTYPE) of a file whose
// matrices are all of that type; for the K-quants the "_S" numbers, whose mixes are the
// closest to a single type.
struct WritableType {
  GgmlType type;
  const char* name;  // as typed on a command line
  uint32_t file_type;
};
constexpr WritableType kWritable[] = {
    {GgmlType::F32, "f32", 0},     {GgmlType::F16, "f16", 1},     {GgmlType::BF16, "bf16", 32},
    {GgmlType::Q8_0, "q8_0", 7},   {GgmlType::Q4_0, "q4_0", 2},   {GgmlType::Q4_1, "q4_1", 3},
    {GgmlType::Q5_0, "q5_0", 8},   {GgmlType::Q5_1, "q5_1", 9},   {GgmlType::Q2_K, "q2_k", 10},
    {GgmlType::Q3_K, "q3_k", 11},  {GgmlType::Q4_K, "q4_k", 14},  {GgmlType::Q5_K, "q5_k", 16},
    {GgmlType::Q6_K, "q6_k", 18},
};

}  // namespace

std::string writable_dtype_names() {
  std::string out;
  for (const WritableType& w : kWritable) out += (out.empty() ? "" : ", ") + std::string(w.name);
  return out;
}

GgmlType parse_weight_dtype(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const WritableType& w : kWritable)
    if (lower == w.name) return w.type;
  throw std::invalid_argument("unknown weight type '" + std::string(name) + "' (accepted: " + writable_dtype_names() +
                              ")");
}

WeightSpec parse_weight_spec(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "q4_k_m") return {GgmlType::Q4_K, true};
  if (lower == "q5_k_m") return {GgmlType::Q5_K, true};
  try {
    return {parse_weight_dtype(name), false};
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument("unknown weight type '" + std::string(name) + "' (accepted: " + writable_dtype_names() +
                                ", q4_k_m, q5_k_m)");
  }
}

GgmlType matrix_type(const MakeModelOptions& opt, std::string_view role, uint32_t layer, uint32_t n_layers) {
  if (!opt.medium_mix) return opt.dtype;
  if (role == "output") return GgmlType::Q6_K;
  // llama-quantize's choice of the layers that get more bits.
  const int i = int(layer), n = int(n_layers);
  const bool more_bits = i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
  if (role == "ffn_down") return more_bits ? GgmlType::Q6_K : opt.dtype;
  if (role == "attn_v") {
    if (more_bits) return GgmlType::Q6_K;
    // Its 70B class shares each V among 8 query heads: a small tensor worth more bits.
    return opt.dtype == GgmlType::Q4_K && n_layers == 80 ? GgmlType::Q5_K : opt.dtype;
  }
  return opt.dtype;
}

uint32_t llama_file_type(const MakeModelOptions& opt) {
  if (opt.medium_mix) return opt.dtype == GgmlType::Q4_K ? 15 : 17;
  return llama_file_type(opt.dtype);
}

uint32_t llama_file_type(GgmlType dtype) {
  for (const WritableType& w : kWritable)
    if (w.type == dtype) return w.file_type;
  throw std::invalid_argument("llama_file_type: no LLAMA_FTYPE for " + ggml_type_name(static_cast<uint32_t>(dtype)));
}

}  // namespace fdl::tools
