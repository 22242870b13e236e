// The vocabulary part of GGUF `tokenizer.ggml.*` metadata, shared by both tokenizer models,
// with llama.cpp's defaults and fix-ups applied (llama.cpp src/llama-vocab.cpp, load()):
//  - special ids: `bos/eos/unknown/eot/eom_token_id`; out-of-range values (e.g.
//    0xFFFFFFFF meaning "none") keep the model's default (SPM: bos 1, eos 2, unk 0;
//    BPE: bos 11, eos 11, no unk);
//  - `add_bos_token`, `add_eos_token`, `add_space_prefix` override model/pre defaults;
//  - tokens whose text is a known end-of-turn marker ("<|eot_id|>", "<|im_end|>",
//    "<|endoftext|>", ...) are end-of-generation and are treated as CONTROL;
//  - "special" tokens (CONTROL, USER_DEFINED, UNKNOWN) are kept longest text first for the
//    special-token split; for Phi-3 models (general.name contains "phi-3"/"phi3") they eat the
//    whitespace that follows them (llama.cpp's RSTRIP attribute), except <unk>, <s> and
//    <|endoftext|>.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "flashdllm/tokenizer.h"
#include "tokenizer/string_table.h"

namespace fdl {
class GgufFile;
}

namespace fdl::tok {

enum class VocabModel { Spm, Bpe };

struct Vocab {
  VocabModel model = VocabModel::Spm;
  std::string model_name;  ///< tokenizer.ggml.model
  std::string pre;         ///< tokenizer.ggml.pre ("" when absent)
  std::string general_name;

  std::vector<std::string> texts;  ///< raw vocab entries
  std::vector<float> scores;       ///< 0 when the file has no scores
  std::vector<TokenType> types;    ///< effective types (after the EOG fix-up)
  std::vector<uint8_t> rstrip;     ///< 1: a special token that swallows following whitespace
  std::vector<uint8_t> lstrip;     ///< 1: a special token that swallows preceding whitespace
  std::vector<uint8_t> eog;        ///< 1: end-of-generation token
  StringTable text_index;          ///< text -> id; on duplicates the last id wins (as in llama.cpp)

  int32_t bos = -1, eos = -1, unk = -1, eot = -1, eom = -1;
  bool add_bos = false, add_eos = false, add_space_prefix = false;

  /// CONTROL / USER_DEFINED / UNKNOWN ids, longest text first (the order special text is
  /// split out in).
  std::vector<int32_t> special_tokens;

  int32_t size() const { return static_cast<int32_t>(texts.size()); }
  bool valid_id(int32_t id) const { return id >= 0 && id < size(); }
  int32_t find(std::string_view text) const { return text_index.find(text); }
};

/// Model-specific defaults that must be known before the metadata overrides are applied.
struct VocabDefaults {
  int32_t bos = -1, eos = -1, unk = -1;
  bool add_bos = false, add_eos = false, add_space_prefix = false;
};

/// Read tokens, scores and token types, then apply `defaults`, the metadata overrides and
/// the fix-ups listed above. Throws TokenizerError naming the key on missing or inconsistent
/// metadata.
Vocab load_vocab(const GgufFile& f, VocabModel model, const VocabDefaults& defaults);

}  // namespace fdl::tok
