// Qwen2 / Qwen2.5 (and the DeepSeek-R1 Qwen distills): biases on the Q, K and V projections,
// RoPE on half-split pairs.
#include "arch/families.h"

namespace fdl::arch {

extern const Family kQwen2{
    .name = "qwen2",
    .hf_model_types = {"qwen2"},
    .gguf_rope_pairs = RopePairs::Halves,
    .qkv_bias = true,
    .hf_default_rope_theta = 1000000.f,
    .hf_sliding_window_switch = true,
};

}  // namespace fdl::arch
