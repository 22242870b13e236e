// flashdllm/tokenizer.h — tokenizers built from GGUF `tokenizer.ggml.*` metadata, matching
// llama.cpp token for token.
//
//  - `llama` (LLAMA_VOCAB_TYPE_SPM): SentencePiece-style BPE that merges by piece score,
//    "▁" (U+2581) for spaces, a space prefix per `tokenizer.ggml.add_space_prefix`
//    (default true), byte fallback to `<0xNN>` pieces.
//  - `gpt2` (byte-level BPE): GPT-2 byte-to-unicode mapping, merges by rank from
//    `tokenizer.ggml.merges`, and a pre-tokenizer regex chosen by `tokenizer.ggml.pre`
//    (gpt-2, llama-bpe/llama3, qwen2, and others listed in the implementation), run with
//    PCRE2 in UTF mode for the Unicode classes.
// Special tokens: BOS/EOS added per `add_bos_token`/`add_eos_token` when `add_special`;
// with `parse_special`, text equal to a control/user-defined token's text becomes that token,
// otherwise it stays plain text (llama.cpp's `parse_special`).
//
// Errors: an unknown tokenizer model or pre-tokenizer, or inconsistent metadata, throws
// fdl::TokenizerError naming the key.
// Thread-safety: encode/decode are const and thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace fdl {

class GgufFile;

class TokenizerError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// GGUF `tokenizer.ggml.token_type` values (llama.cpp's llama_token_type).
enum class TokenType : int32_t {
  Undefined = 0, Normal = 1, Unknown = 2, Control = 3, UserDefined = 4, Unused = 5, Byte = 6,
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  /// Build from a GGUF file's metadata. Throws TokenizerError.
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& f);

  /// Text -> ids. `add_special`: prepend BOS / append EOS as the metadata says.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special,
                                      bool parse_special = false) const = 0;
  /// The bytes a token stands for when detokenizing (may be part of a UTF-8 sequence).
  /// Control tokens give "" unless `render_special`.
  virtual std::string token_to_piece(int32_t id, bool render_special = false) const = 0;
  /// Concatenate the pieces of `ids` (llama.cpp's detokenize: for SPM the space prefix of
  /// the first piece is dropped when the vocab adds one).
  std::string decode(const std::vector<int32_t>& ids, bool render_special = false) const;

  virtual int32_t n_vocab() const = 0;
  virtual std::string_view model_name() const = 0;  ///< "llama" or "gpt2"
  virtual const std::string& token_text(int32_t id) const = 0;  ///< raw vocab entry
  virtual TokenType token_type(int32_t id) const = 0;
  virtual int32_t bos_id() const = 0;  ///< -1 if none
  virtual int32_t eos_id() const = 0;  ///< -1 if none
  virtual bool add_bos() const = 0;
  virtual bool add_eos() const = 0;
  /// End-of-generation: EOS, EOT and similar tokens.
  virtual bool is_eog(int32_t id) const = 0;
};

/// Streaming detokenizer: feed ids one at a time, get text that is always whole UTF-8.
/// Bytes of an incomplete UTF-8 sequence are held until the sequence completes; invalid
/// bytes come out as U+FFFD. Not thread-safe (one per stream).
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tok, bool render_special = false);
  /// Returns the newly completed text (possibly empty).
  std::string push(int32_t id);
  /// Returns whatever is held (incomplete bytes become U+FFFD).
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool render_special_;
  bool first_ = true;
  std::string pending_;
};

}  // namespace fdl
