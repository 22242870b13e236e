// hf_tokenizer.h — a Hugging Face `tokenizer.json` (with `tokenizer_config.json`) as the
// tokenizer.ggml.* GGUF metadata the engine's tokenizers read.
//
// Format followed: the `tokenizers` library's serialization
// (https://huggingface.co/docs/tokenizers/api/models, .../pre-tokenizers). Model "BPE" of two
// kinds, mapped onto the GGUF llama.cpp's convert_hf_to_gguf.py writes for it:
//  - byte-level BPE (no byte fallback: GPT-2, Llama 3, Qwen2, Mistral Nemo) as tokenizer.ggml.model
//    "gpt2" with the pre-tokenizer named after its split (hf_bpe_tokenizer.h);
//  - SentencePiece-style BPE (byte_fallback, "<0xNN>" tokens, spaces as "▁": Llama 2,
//    Mistral 7B, TinyLlama, Phi-3, Gemma) as "llama", with scores taken from the merges' order
//    (hf_spm_tokenizer.h, hf_spm_pipeline.h).
// Added tokens: special ones become control tokens. BOS/EOS come from tokenizer_config.json
// (config.json's ids as fallback); add_bos_token from tokenizer_config.json, else from a
// post-processor template that starts with a special token. Everything else (WordPiece,
// Unigram, BPE dropout, subword prefixes or suffixes, normalizers, pre-tokenizers or decoders
// neither kind uses) is refused by name.
// Ids above the tokenizer's vocabulary up to config.json's vocab_size become "[PAD<id>]"
// tokens of type unused, as llama.cpp's converter writes them.
// Errors: HfError (hf_config.h), one line naming the file. Thread-safety: stateless.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <string>

#include "flashdllm/gguf.h"

namespace fdl::hf {

/// `tokenizer` is tokenizer.json (`label` names it in errors); `tokenizer_config`
/// tokenizer_config.json (null: absent; `config_label` names it): BOS/EOS, add_bos_token and
/// the chat template (tokenizer.ggml.chat_template; named templates as
/// tokenizer.chat_template.<name>, as llama.cpp's converter writes them); `config` config.json
/// (fallback bos/eos ids); `n_vocab` the model's vocabulary size.
void write_tokenizer_metadata(const nlohmann::json& tokenizer, const nlohmann::json& tokenizer_config,
                              const nlohmann::json& config, int n_vocab, const std::string& label,
                              const std::string& config_label, GgufWriter& w);

}  // namespace fdl::hf
