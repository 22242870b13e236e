// hf_bpe_tokenizer.h — a byte-level BPE `tokenizer.json` (GPT-2 style, no byte fallback) as
// llama.cpp's `gpt2` tokenizer metadata.
//
// Supported: the GPT-2 pre-tokenizer (`ByteLevel` with its regex), or a `Split` (behavior
// Isolated) with the Llama 3, Qwen2 or Tekken (Mistral Nemo) pattern followed by `ByteLevel`
// without a regex; model.ignore_merges must equal what llama.cpp's pre-tokenizer of that name
// implies (true for Llama 3 and Tekken); no normalizer, or NFC (which llama.cpp does not apply
// either: text is tokenized as given, so ids match llama.cpp on the converted GGUF); a
// ByteLevel decoder or none. The vocabulary must hold all 256 byte symbols (or some text could
// not be encoded). Other pre-tokenizers, patterns, normalizers and decoders are refused by name.
// Writes tokenizer.ggml.model "gpt2", .pre, .tokens, .token_type and .merges.
// Errors: HfError, one line naming the file. Thread-safety: stateless.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "flashdllm/gguf.h"
#include "hf/hf_tokenizer_json.h"

namespace fdl::hf {

/// `tokenizer` is tokenizer.json (its model has no byte fallback); `n_vocab` config.json's
/// vocab_size.
void write_byte_level_bpe(const JsonReader& r, const nlohmann::json& tokenizer, int n_vocab, GgufWriter& w);

}  // namespace fdl::hf
