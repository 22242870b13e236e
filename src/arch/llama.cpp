// Llama 2/3 and files labelled llama (Mistral 7B, TinyLlama, ...): the base plan with no optional
// parts; Mistral's sliding window, where the file sets one, on every layer; Mixtral's experts
// (expert_count) in place of the FFN.
#include "arch/families.h"

namespace fdl::arch {

extern const Family kLlama{
    .name = "llama",
    .hf_model_types = {"llama", "mistral", "mixtral"},
    .gguf_rope_pairs = RopePairs::Interleaved,
};

}  // namespace fdl::arch
