// hf_checkpoint.h — a Hugging Face model directory read as the GGUF file the engine loads.
//
// A directory with config.json, model.safetensors (or shards listed by
// model.safetensors.index.json), tokenizer.json and optionally tokenizer_config.json becomes
// an in-memory GgufFile with llama.cpp's metadata keys (hf_config.h, hf_tokenizer.h) and
// tensor names (token_embd, blk.N.attn_q, ...), so every backend runs it unchanged:
//  - matrices keep their type (F32, F16, BF16) and bytes; HF's [out, in] is ggml's {in, out};
//  - 1-D tensors (norms) become F32, as llama.cpp's converter writes them (exact: widening);
//  - Q and K rows take the layout of the family's GGUF (arch::Family::gguf_rope_pairs): for
//    llama they are reordered from HF's rotate-half layout to interleaved pairs (within each
//    head, row 2i is HF's row i and row 2i+1 HF's row d/2 + i), qwen2/qwen3 keep HF's; that is
//    what convert_hf_to_gguf.py does: the same values in the same places, so a directory and
//    its converted GGUF give the same logits bit for bit;
//  - the family's extra tensors (qwen2's q/k/v_proj.bias, qwen3's q_norm/k_norm) by their
//    llama.cpp names (attn_q.bias, attn_q_norm.weight, ...);
//  - a tied lm_head (tie_word_embeddings) reuses the embedding, as in the GGUF;
//  - LongRoPE's long_factor / short_factor lists (config.json) become the F32 tensors
//    rope_factors_long.weight / rope_factors_short.weight, as the converter writes them.
// Every tensor in the checkpoint must be used (rotary inv_freq buffers aside): a tensor the
// family's plan does not read (an output bias, an expert) is an error naming it, never ignored.
// Cost: the weights are copied once into memory (the safetensors files stay mapped only while
// loading); loading an 8B model needs its size in free RAM.
// Errors: HfError (hf_config.h) or SafetensorsError, one line naming the file.
// Thread-safety: stateless.
#pragma once

#include <filesystem>

#include "flashdllm/gguf.h"

namespace fdl::hf {

/// Whether `path` is a directory holding a config.json (a Hugging Face model directory).
bool is_hf_directory(const std::filesystem::path& path);

/// Reads the model directory `dir` (see above); the GgufFile's path() is `dir`.
GgufFile open_hf_directory(const std::filesystem::path& dir);

}  // namespace fdl::hf
