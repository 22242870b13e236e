// Gemma 2: embeddings scaled by sqrt(n_embd), GeGLU, RMSNorms after attention and after the FFN
// as well as before, attention and final logit soft-capping, queries scaled by
// query_pre_attn_scalar, sliding-window attention on every other layer (0, 2, ...), RoPE on
// half-split pairs. HF checkpoints store norm weights as scale - 1.
#include "arch/families.h"

namespace fdl::arch {

extern const Family kGemma2{
    .name = "gemma2",
    .hf_model_types = {"gemma2"},
    .gguf_rope_pairs = RopePairs::Halves,
    .gguf_sliding_pattern = 2,
    .embed_scale = true,
    .post_norms = true,
    .ffn_gelu = true,
    .hf_norm_minus_one = true,
    .gguf_embd_query_scale_layers = 46,
};

}  // namespace fdl::arch
