// Phi-3 / Phi-3.5 / Phi-4 (dense): Q, K and V in one matrix, gate and up in one matrix, RoPE on
// half-split pairs (often on part of each head: partial_rotary_factor, rope.dimension_count).
// Phi-3-mini's sliding window (2047 of 4096) on every layer, as Transformers runs it (llama.cpp
// ignores it). LongRoPE (Phi-3-mini-128k, Phi-3.5-mini, Phi-4-mini: rope_factors_long/short
// tensors, or rope_scaling "longrope" in config.json) is the shared RoPE's: per-pair divisors
// chosen by the context the model is loaded for, and cos/sin times rope.scaling.attn_factor
// (ModelConfig::rope_longrope).
#include "arch/families.h"

namespace fdl::arch {

extern const Family kPhi3{
    .name = "phi3",
    .hf_model_types = {"phi3"},
    .gguf_rope_pairs = RopePairs::Halves,
    .fused_qkv = true,
    .fused_gate_up = true,
};

}  // namespace fdl::arch
