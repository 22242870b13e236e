// hf_spm_pipeline.h — what the normalizer, pre-tokenizer and decoder of a SentencePiece-style
// `tokenizer.json` (BPE with byte fallback: Llama 2, Mistral 7B, TinyLlama, Phi-3, Gemma) mean
// for llama.cpp's SentencePiece tokenizer, which writes every space as U+2581 ("▁"), may put
// one "▁" before the text (tokenizer.ggml.add_space_prefix) and merges the whole text at once.
//
// Format followed: the `tokenizers` library's normalizers, pre-tokenizers and decoders
// (https://huggingface.co/docs/tokenizers/components). Supported, as transformers' converters
// write them:
//  - normalizer: Replace(" " -> "▁") alone (Gemma: no prefix) or in a Sequence with
//    Prepend("▁") (Llama 2 "legacy": prefix), or none;
//  - pre_tokenizer: none; Metaspace(replacement "▁") with prepend_scheme always / first
//    (prefix) or never, or the older add_prefix_space; Split(" ") after a normalizer that
//    already replaced every space (Gemma: it can match nothing);
//  - decoder: none, Metaspace, or a Sequence of Replace("▁" -> " "), ByteFallback, Fuse and
//    Strip(" ") (decoders do not change ids; other ones are refused as a sign of a tokenizer
//    this reading does not understand).
// Spaces must become "▁" (by the Replace normalizer or by Metaspace). Everything else
// (other normalizers such as NFKC or a Replace with a regex, other pre-tokenizers) is refused
// by name.
//
// Where HF's `tokenizers` and llama.cpp disagree, the engine does what llama.cpp does on the
// converted GGUF: with a Metaspace pre-tokenizer, HF adds no "▁" to a text that already starts
// with a space (llama.cpp adds one: " Hi" is "▁▁Hi"), and prepend_scheme "first" adds none
// after a special token (llama.cpp does). The Prepend normalizer form has neither difference.
// Errors: HfError, one line naming the file. Thread-safety: stateless.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "hf/hf_tokenizer_json.h"

namespace fdl::hf {

struct SpmPipeline {
  bool add_space_prefix = false;  ///< a "▁" goes before the text
  /// Metaspace with split = true: HF cuts the text before every "▁" and merges each piece on
  /// its own, which equals merging the whole text only if no token has a "▁" after its start.
  bool splits_at_spaces = false;
};

/// Reads tokenizer.json's "normalizer", "pre_tokenizer" and "decoder" (absent or null: none).
SpmPipeline read_spm_pipeline(const JsonReader& r, const nlohmann::json& tokenizer);

}  // namespace fdl::hf
