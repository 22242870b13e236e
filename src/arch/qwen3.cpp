// Qwen3 (dense): an RMSNorm over each Q and K head before RoPE, no biases, RoPE on half-split
// pairs.
#include "arch/families.h"

namespace fdl::arch {

extern const Family kQwen3{
    .name = "qwen3",
    .hf_model_types = {"qwen3"},
    .gguf_rope_pairs = RopePairs::Halves,
    .qk_norm = true,
    .hf_default_rope_theta = 1000000.f,
    .hf_sliding_window_switch = true,
};

}  // namespace fdl::arch
