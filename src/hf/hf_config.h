// hf_config.h — a Hugging Face `config.json` as the GGUF metadata the engine's model reads.
//
// Follows transformers' LlamaConfig (https://huggingface.co/docs/transformers/model_doc/llama),
// in both layouts: transformers 4 (`rope_theta`, `rope_scaling`) and 5 (`rope_parameters`).
// Supported: model_type "llama" (and "mistral" files without a sliding window shorter than the
// context): SiLU gated FFN, RMSNorm, GQA, RoPE with default, linear or llama3 scaling, tied or
// separate output embeddings. Everything that would change the math and is not supported is
// refused by name — another model_type, biases, another activation, other RoPE scaling types,
// a sliding window, soft-capping, experts — so a file never runs with the wrong math.
//
// The GGUF keys written are llama.cpp's (`llama.embedding_length`, ...), the same that
// llama.cpp's convert_hf_to_gguf.py writes, so a directory and its converted GGUF load into the
// same ModelConfig.
// Errors: HfError with one line naming the file and the key. Thread-safety: stateless.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>

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
  bool tied_output = false;
};

/// Checks `config` (parsed config.json; `label` names it in errors) and writes the model's
/// GGUF metadata (general.architecture and llama.*) into `w`. Throws HfError.
HfModelShape write_model_metadata(const nlohmann::json& config, const std::string& label, GgufWriter& w);

}  // namespace fdl::hf
