// hf_tokenizer_json.h — the parts of a Hugging Face `tokenizer.json` that every tokenizer kind
// reads the same way: checked member access with one-line errors, the token list by id, the
// merges, and llama.cpp's token types.
//
// Format followed: the `tokenizers` library's serialization
// (https://huggingface.co/docs/tokenizers/api/models). Internal to src/hf (hf_tokenizer.cpp,
// hf_bpe_tokenizer.cpp, hf_spm_tokenizer.cpp).
// Errors: HfError (hf_config.h), "<file>: <what>" on one line. Thread-safety: stateless.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fdl::hf {

// llama.cpp's token types (tokenizer.ggml.token_type).
inline constexpr int32_t kTokenNormal = 1, kTokenUnknown = 2, kTokenControl = 3, kTokenUserDefined = 4,
                         kTokenUnused = 5, kTokenByte = 6;

/// Checked access to one JSON file; every error names the file (`label`).
class JsonReader {
 public:
  explicit JsonReader(std::string label) : label_(std::move(label)) {}

  [[noreturn]] void fail(const std::string& what) const;
  /// `obj[key]`; fails when `obj` is not an object or lacks `key`. `where` names `obj`.
  const nlohmann::json& member(const nlohmann::json& obj, const char* key, const std::string& where) const;
  std::string string_member(const nlohmann::json& obj, const char* key, const std::string& where) const;
  /// `def` when the key is absent or null; fails on a non-boolean.
  bool bool_member_or(const nlohmann::json& obj, const char* key, bool def, const std::string& where) const;
  /// A token id: an integer in [0, 2^31 - 1).
  int32_t token_id(const nlohmann::json& v, const std::string& where) const;

 private:
  std::string label_;
};

/// Whether `obj` has `key` with a non-null value.
bool has_value(const nlohmann::json& obj, const char* key);
/// Whether `component` is an object whose "type" is `type`.
bool has_type(const nlohmann::json& component, std::string_view type);
/// A component for messages: its quoted "type", else its JSON.
std::string describe(const nlohmann::json& component);

/// The tokens by id: model.vocab (type kTokenNormal), then added_tokens (kTokenControl when
/// "special", else kTokenUserDefined; they may reuse a vocab id with the same text or extend
/// the vocabulary), padded to `n_vocab` with "[PAD<id>]" tokens of type kTokenUnused, as
/// llama.cpp's converter writes them. Fails on an id given to two texts, on ids at or above
/// `n_vocab` (config.json's vocab_size) and on malformed entries.
struct TokenList {
  std::vector<std::string> texts;
  std::vector<int32_t> types;
  std::vector<bool> added;  ///< listed in added_tokens
};
TokenList read_token_list(const JsonReader& r, const nlohmann::json& tokenizer, int n_vocab);

/// model.merges in order, as (left, right): entries "a b" (split at their only space) or
/// ["a", "b"].
std::vector<std::pair<std::string, std::string>> read_merges(const JsonReader& r, const nlohmann::json& model);

/// Refuses the BPE options llama.cpp has no equivalent for (dropout, continuing_subword_prefix,
/// end_of_word_suffix), whatever the tokenizer kind.
void check_plain_bpe_options(const JsonReader& r, const nlohmann::json& model);

}  // namespace fdl::hf
