// hf_tokenizer.h — a Hugging Face `tokenizer.json` (with `tokenizer_config.json`) as the
// tokenizer.ggml.* GGUF metadata the engine's tokenizers read.
//
// Format followed: the `tokenizers` library's serialization
// (https://huggingface.co/docs/tokenizers/api/models, .../pre-tokenizers). Supported: byte-level
// BPE (model "BPE" without byte fallback) with the GPT-2 pre-tokenizer (`ByteLevel` with its
// regex), or a `Split` with the Llama 3 or the Qwen2 pattern followed by `ByteLevel` without a
// regex; merges as "a b" strings or [a, b] pairs; added tokens (special ones become control
// tokens); no normalizer, or NFC (which llama.cpp does not apply either: text is tokenized as
// given, so ids match llama.cpp on the converted GGUF); a ByteLevel decoder. The vocabulary
// must hold all 256 byte symbols (or some text could not be encoded). Everything else
// (WordPiece, Unigram, SentencePiece-style BPE with byte fallback, BPE dropout, subword
// prefixes or suffixes, other normalizers, pre-tokenizers or decoders) is refused by name.
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
