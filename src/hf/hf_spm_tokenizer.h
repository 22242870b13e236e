// hf_spm_tokenizer.h — a SentencePiece-style BPE `tokenizer.json` (model "BPE" with
// byte_fallback: Llama 2, Mistral 7B, TinyLlama, Phi-3, Gemma) as llama.cpp's `llama`
// (SentencePiece) tokenizer metadata, the GGUF llama.cpp's converter writes for such a model.
//
// Tokens and types as llama.cpp's converter gives them: model.vocab entries are normal, "<0xNN>"
// entries byte tokens, the unk_token unknown; added tokens are control tokens when "special"
// (or when they look special to llama.cpp: "<|...|>", "<unused...>", "<pad>", "<mask>", ...),
// otherwise user-defined with their "▁" written as spaces (llama.cpp matches user-defined tokens
// in the raw text). Ids up to config.json's vocab_size that no token has become "[PAD<id>]".
// tokenizer.ggml.add_space_prefix follows the pipeline (hf_spm_pipeline.h), overridden by
// tokenizer_config.json's add_prefix_space as llama.cpp's converter does.
//
// Scores: llama.cpp's SentencePiece tokenizer repeatedly merges the adjacent pair whose joined
// text is the vocabulary entry of highest score (leftmost on ties); HF's BPE merges the adjacent
// pair that comes first in model.merges. Each token that a merge makes scores minus the rank of
// the first merge that makes it, so both pick the same pair. That is exact when model.merges
// lists every split of a token into two tokens, as the merges transformers' converters derive
// from a SentencePiece model do; a vocabulary where some split is missing (say, merges learned
// by `tokenizers`' own trainer) would merge differently here and is refused, naming the split.
// Every byte needs a "<0xNN>" token (an ASCII byte may instead have its one-character token),
// so that byte fallback never falls back to the unknown token (fuse_unk then never applies).
// Refused by name: ignore_merges (whole-word lookups llama.cpp does not make), dropout,
// subword prefixes and suffixes, merges of tokens outside model.vocab, and a Metaspace that
// splits at "▁" when some token holds a "▁" after its start (llama.cpp merges across it).
// Errors: HfError, one line naming the file. Thread-safety: stateless.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include "flashdllm/gguf.h"
#include "hf/hf_tokenizer_json.h"

namespace fdl::hf {

/// `tokenizer` is tokenizer.json (its model is BPE with byte_fallback); `tokenizer_config`
/// tokenizer_config.json (null: absent; `rc` names it); `n_vocab` config.json's vocab_size.
/// Writes tokenizer.ggml.model "llama", .pre "default", .tokens, .scores, .token_type,
/// .add_space_prefix and, when the model names one, .unknown_token_id.
void write_sentencepiece_bpe(const JsonReader& r, const nlohmann::json& tokenizer, const JsonReader& rc,
                             const nlohmann::json& tokenizer_config, int n_vocab, GgufWriter& w);

}  // namespace fdl::hf
