// Llama 2/3 and files labelled llama (Mistral 7B without a sliding window, TinyLlama, ...):
// the base plan with no optional parts.
#include "arch/families.h"

namespace fdl::arch {

extern const Family kLlama{
    .name = "llama",
    .hf_model_types = {"llama", "mistral"},
    .gguf_rope_pairs = RopePairs::Interleaved,
};

}  // namespace fdl::arch
