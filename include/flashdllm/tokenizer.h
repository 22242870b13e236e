// flashdllm/tokenizer.h — tokenizers built from GGUF `tokenizer.ggml.*` metadata, matching
// llama.cpp (src/llama-vocab.cpp, 2026-08) token for token.
//
//  - `llama` (LLAMA_VOCAB_TYPE_SPM): SentencePiece-style BPE that merges by piece score,
//    "▁" (U+2581) for spaces, a space prefix per `tokenizer.ggml.add_space_prefix`
//    (default true), byte fallback to `<0xNN>` pieces, then to the unknown token.
//  - `gpt2` (byte-level BPE): GPT-2 byte-to-unicode mapping, merges by rank from
//    `tokenizer.ggml.merges`, and a pre-tokenizer regex list chosen by `tokenizer.ggml.pre`,
//    run with PCRE2 in UTF+UCP mode. Supported pre values: default (also used when the key
//    is absent, as llama.cpp does), gpt-2, phi-2, mpt, olmo, jais, llama3, llama-v3,
//    llama-bpe, falcon3, dbrx, smaug-bpe, qwen2, deepseek-r1-qwen, stablelm2, megrez, falcon,
//    starcoder, refact, command-r, smollm, codeshell, exaone, deepseek-llm, deepseek-coder.
// Special tokens: BOS/EOS added per `add_bos_token`/`add_eos_token` when `add_special`
// (defaults: llama add_bos true; gpt2 add_bos true only for Llama-3 pre-tokenizers; add_eos
// false). Text equal to a special token's text is split out before the model runs:
// USER_DEFINED tokens always, CONTROL/UNKNOWN tokens only with `parse_special` (llama.cpp's
// behaviour); otherwise that text is tokenized as plain text.
// Malformed UTF-8 input never fails: it is tokenized the way llama.cpp does (byte tokens
// for SPM, U+FFFD for the BPE pre-tokenizer).
//
// Errors: an unknown tokenizer model or pre-tokenizer, or missing/inconsistent metadata,
// throws fdl::TokenizerError naming the key; so do ids outside [0, n_vocab).
// Thread-safety: a constructed Tokenizer is immutable; every method is const and safe to
// call concurrently. Load cost: hash maps and the piece table are built once in from_gguf
// (tens of ms for a 128k vocab).
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
  /// Build from a GGUF file's metadata (the file may be vocab-only). Throws TokenizerError.
  static std::unique_ptr<Tokenizer> from_gguf(const GgufFile& f);

  /// Text (UTF-8 bytes) -> ids. `add_special`: prepend BOS / append EOS as the metadata says.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special,
                                      bool parse_special = false) const = 0;
  /// The bytes a token stands for when detokenizing (may be part of a UTF-8 sequence, or
  /// invalid UTF-8 for byte tokens). CONTROL and UNKNOWN tokens give "" unless
  /// `render_special` (then their text); USER_DEFINED tokens give their text; UNUSED and
  /// UNDEFINED tokens give "".
  virtual std::string token_to_piece(int32_t id, bool render_special = false) const = 0;
  /// Concatenate the pieces of `ids` — llama.cpp's llama_detokenize with remove_special =
  /// false: when the vocab adds a space prefix, one leading space is removed from the *first*
  /// piece (whatever token it is: decode({BOS, "▁Once"}) = " Once", decode({"▁Once"}) =
  /// "Once"). llama.cpp's optional clean-up of spaces before punctuation (clean_spaces) is not
  /// applied, so decode(encode(x)) == x for BPE vocabs. Returns raw bytes (not necessarily
  /// valid UTF-8); use StreamingDetokenizer for display text.
  std::string decode(const std::vector<int32_t>& ids, bool render_special = false) const;

  virtual int32_t n_vocab() const = 0;
  virtual std::string_view model_name() const = 0;  ///< "llama" or "gpt2"
  virtual const std::string& token_text(int32_t id) const = 0;  ///< raw vocab entry
  /// Effective type: as stored, except that known end-of-turn tokens ("<|eot_id|>",
  /// "<|im_end|>", "<|endoftext|>", ...) count as Control, as in llama.cpp.
  virtual TokenType token_type(int32_t id) const = 0;
  /// Id of the vocab entry whose raw text is `text` exactly, or -1.
  virtual int32_t token_id(std::string_view text) const = 0;
  virtual int32_t bos_id() const = 0;  ///< -1 if none
  virtual int32_t eos_id() const = 0;  ///< -1 if none
  virtual bool add_bos() const = 0;
  virtual bool add_eos() const = 0;
  /// Whether encoding prefixes text with a space (SPM `add_space_prefix`), which decode()
  /// undoes on the first piece.
  virtual bool add_space_prefix() const = 0;
  /// End-of-generation: EOS, EOT, EOM and tokens whose text is a known end-of-turn marker.
  virtual bool is_eog(int32_t id) const = 0;
};

/// Streaming detokenizer: feed ids one at a time, get text that is always well-formed UTF-8.
/// Bytes of an incomplete UTF-8 sequence are held until the sequence completes; ill-formed
/// bytes come out as U+FFFD (one per maximal ill-formed subpart, Unicode 3.9). By default the
/// first piece loses one leading space like decode(), so the concatenated output equals
/// decode(ids) made well-formed. Pass `continues_text = true` when the ids continue earlier
/// text (e.g. generated tokens after a prompt): then no space is removed.
/// Not thread-safe (one per stream); `tok` must outlive it.
class StreamingDetokenizer {
 public:
  explicit StreamingDetokenizer(const Tokenizer& tok, bool render_special = false,
                                bool continues_text = false);
  /// Returns the newly completed text (possibly empty). Throws TokenizerError for a bad id.
  std::string push(int32_t id);
  /// Returns whatever is held (an incomplete sequence becomes U+FFFD) and resets the holder.
  std::string flush();

 private:
  const Tokenizer& tok_;
  bool render_special_;
  bool first_ = true;
  std::string pending_;
};

}  // namespace fdl
