// Pre-tokenizers of byte-level BPE vocabularies, selected by GGUF `tokenizer.ggml.pre`.
//
// A pre-tokenizer is a list of regexes applied in turn, each one cutting every chunk left by
// the previous ones into its matches *and* the text between matches (so nothing is dropped);
// BPE then runs on each final chunk separately. Regexes come from the models' Hugging Face
// `tokenizer.json` files, as llama.cpp uses them (src/llama-vocab.cpp, llm_tokenizer_bpe);
// they run on PCRE2 in UTF+UCP mode with two adjustments that make PCRE2 see the text the
// way llama.cpp does:
//  - `\s` means Unicode White_Space (U+0009-000D, 0020, 0085, 00A0, 1680, 2000-200A,
//    2028, 2029, 202F, 205F, 3000), llama.cpp's whitespace set;
//  - explicit code-point ranges exclude those whitespace characters (llama.cpp replaces
//    non-ASCII whitespace with U+000B before matching such ranges).
// Invalid UTF-8 is decoded leniently like llama.cpp (bad bytes become U+FFFD).
//
// Supported `tokenizer.ggml.pre` values are listed by supported_pre_tokenizers().
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/regex.h"

namespace fdl::tok {

enum class PreTokenizerKind { Default, Gpt2, Llama3, Qwen2, Falcon, Starcoder, DeepseekLlm, DeepseekCoder, Tekken };

/// What a `tokenizer.ggml.pre` value implies for a BPE vocab.
struct PreTokenizerConfig {
  PreTokenizerKind kind = PreTokenizerKind::Default;
  bool ignore_merges = false;  ///< a chunk that is a whole vocab entry becomes that token
  bool add_bos = false;        ///< default for add_bos_token
};

/// Resolve a `tokenizer.ggml.pre` value ("" = absent, which llama.cpp treats as "default").
/// Throws TokenizerError listing the supported values for anything else.
PreTokenizerConfig resolve_pre_tokenizer(std::string_view pre);

/// Comma-separated supported values, for messages and docs.
std::string supported_pre_tokenizers();

class PreTokenizer {
 public:
  explicit PreTokenizer(PreTokenizerKind kind);

  /// Cut `text` into chunks; each chunk is appended to `words` as UTF-8 bytes (re-encoded
  /// from the leniently decoded code points, so malformed input comes out normalised).
  void split(std::string_view text, std::vector<std::string>& words) const;

 private:
  struct Step {
    std::unique_ptr<Regex> regex;  ///< null: split off the trailing whitespace run (`\s+$`)
  };
  std::vector<Step> steps_;
};

}  // namespace fdl::tok
