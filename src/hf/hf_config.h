// hf_config.h — a Hugging Face `config.json` as the GGUF metadata the engine's model reads.
//
// Follows transformers' LlamaConfig, Qwen2Config, Qwen3Config and Phi3Config
// (https://huggingface.co/docs/transformers/model_doc/llama, .../qwen2, .../qwen3, .../phi3), in both
// layouts: transformers 4 (`rope_theta`, `rope_scaling`) and 5 (`rope_parameters`).
// Supported: the model_types of src/arch's families (llama and mistral, qwen2, qwen3, phi3): SiLU
// gated FFN, RMSNorm, GQA, sliding-window attention (on every layer, or per `layer_types`), RoPE with
// default, linear, llama3, YaRN or LongRoPE scaling on all or part of each head (partial_rotary_factor), tied
// or separate output embeddings, and the family's own parts (qwen2's Q/K/V biases, qwen3's Q/K
// norms, phi3's fused QKV and gate/up). Everything that would change the math and is
// not supported is refused by name — another model_type, other biases, another activation,
// other RoPE scaling types, other expert layouts — so a file never
// runs with the wrong math.
//
// The GGUF keys written are llama.cpp's (`<arch>.embedding_length`, ...), the same that
// llama.cpp's convert_hf_to_gguf.py writes, so a directory and its converted GGUF load into the
// same ModelConfig.
// Errors: HfError with one line naming the file and the key. Thread-safety: stateless.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "arch/family.h"
#include "flashdllm/gguf.h"

namespace fdl::hf {

/// A Hugging Face checkpoint that cannot be loaded; what() is one line naming the file.
class HfError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// What the tensor mapping needs from config.json.
struct HfModelShape {
  int n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0, n_vocab = 0;
  int n_expert = 0, n_expert_used = 0;  ///< Mixtral's experts; 0 = a dense FFN
  bool tied_output = false;
  const arch::Family* family = nullptr;  ///< the family model_type names (never null on return)
  /// LongRoPE's per-pair divisors (rope type "longrope"; rope dimensions / 2 each, positive and
  /// finite), written as the F32 tensors rope_factors_long.weight / rope_factors_short.weight as
  /// llama.cpp's converter writes them; empty for other RoPE types.
  std::vector<float> rope_factors_long, rope_factors_short;
};

/// Checks `config` (parsed config.json; `label` names it in errors) and writes the model's
/// GGUF metadata (general.architecture and <arch>.*) into `w`. Throws HfError.
HfModelShape write_model_metadata(const nlohmann::json& config, const std::string& label, GgufWriter& w);

/// generation_config.json's sampling settings (temperature, top_k, top_p, min_p,
/// repetition_penalty) as llama.cpp's general.sampling.* keys (temp, top_k, top_p, min_p,
/// penalty_repeat), the engine's defaults for requests that leave them out (as vLLM and
/// llama.cpp's converter read them); an explicit do_sample = false makes the default greedy
/// (temperature 0). An absent do_sample is not read as greedy.
/// A key of the wrong type or out of range: HfError naming it. Other keys are not read.
void write_sampling_defaults(const nlohmann::json& generation_config, const std::string& label, GgufWriter& w);

}  // namespace fdl::hf
