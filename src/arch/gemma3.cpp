// Gemma 3 (text): Gemma 2's plan with per-head Q/K RMSNorms and no soft-capping; five sliding
// layers to one global, the sliding ones with a RoPE of their own (base 10000, unscaled).
#include "arch/families.h"

namespace fdl::arch {

extern const Family kGemma3{
    .name = "gemma3",
    .hf_model_types = {"gemma3_text"},
    .gguf_rope_pairs = RopePairs::Halves,
    .qk_norm = true,
    .hf_default_rope_theta = 1000000.f,
    .gguf_sliding_pattern = 6,
    .embed_scale = true,
    .post_norms = true,
    .ffn_gelu = true,
    .hf_norm_minus_one = true,
    .sliding_rope_base = 10000.f,
    .gguf_embd_query_scale_layers = 62,
};

}  // namespace fdl::arch
