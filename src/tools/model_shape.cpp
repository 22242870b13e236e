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
// llama-7b; Meta-Llama-3-8B for llama3-8b; Qwen2.5-7B for qwen2-7b; Qwen3-8B for qwen3-8b; Gemma-2-9B
// for gemma2-9b; Mixtral-8x7B for mixtral-8x7b).
const std::array<Preset, 8> kPresets{{
    {"tiny", {64, 2, 4, 2, 128, 512, 512, 10000.f, 1e-5f}},
    {"110m", {768, 12, 12, 12, 2048, 32000, 2048, 10000.f, 1e-5f}},
    {"llama-7b", {4096, 32, 32, 32, 11008, 32000, 4096, 10000.f, 1e-5f}},
    {"llama3-8b", {4096, 32, 32, 8, 14336, 128256, 8192, 500000.f, 1e-5f}},
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
  // The types make-model can write (its random weights are quantized to Q8_0 only).
  const GgmlType d = opt.dtype;
  if (d != GgmlType::F32 && d != GgmlType::F16 && d != GgmlType::BF16 && d != GgmlType::Q8_0)
    bad("dtype " + ggml_type_name(static_cast<uint32_t>(d)) + " is not supported (use F32, F16, BF16, Q8_0)");
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
  if (opt.dtype == GgmlType::Q8_0 && (s.dim % 32 != 0 || s.ffn_dim % 32 != 0))
    bad("Q8_0 needs dim and ffn_dim to be multiples of 32 (got dim " + std::to_string(s.dim) +
        ", ffn_dim " + std::to_string(s.ffn_dim) + ")");
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

GgmlType parse_weight_dtype(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "f32") return GgmlType::F32;
  if (lower == "f16") return GgmlType::F16;
  if (lower == "bf16") return GgmlType::BF16;
  if (lower == "q8_0") return GgmlType::Q8_0;
  throw std::invalid_argument("unknown weight type '" + std::string(name) +
                              "' (accepted: f32, f16, bf16, q8_0)");
}

uint32_t llama_file_type(GgmlType dtype) {
  switch (dtype) {
    case GgmlType::F32: return 0;   // LLAMA_FTYPE_ALL_F32
    case GgmlType::F16: return 1;   // LLAMA_FTYPE_MOSTLY_F16
    case GgmlType::Q8_0: return 7;  // LLAMA_FTYPE_MOSTLY_Q8_0
    case GgmlType::BF16: return 32; // LLAMA_FTYPE_MOSTLY_BF16
    default:
      throw std::invalid_argument("llama_file_type: no LLAMA_FTYPE for " +
                                  ggml_type_name(static_cast<uint32_t>(dtype)));
  }
}

}  // namespace fdl::tools
