// Builds small GGUF vocab-only files for the tokenizer unit tests, written with the
// project's GgufWriter and loaded back through GgufFile + Tokenizer::from_gguf — the same
// path a real model takes.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flashdllm/gguf.h"
#include "flashdllm/tokenizer.h"
#include "test_support.h"
#include "tokenizer/byte_unicode.h"

namespace fdl::test {

struct SyntheticVocab {
  std::string model = "llama";           ///< tokenizer.ggml.model
  std::optional<std::string> pre;        ///< tokenizer.ggml.pre
  std::optional<std::string> name;       ///< general.name
  std::vector<std::string> tokens;
  std::vector<float> scores;             ///< written when with_scores
  bool with_scores = true;
  std::vector<int32_t> types;            ///< written when non-empty
  std::vector<std::string> merges;       ///< written when non-empty (or when write_merges)
  bool write_merges = false;
  std::vector<std::pair<std::string, uint32_t>> uints;  ///< e.g. bos_token_id
  std::vector<std::pair<std::string, bool>> bools;      ///< e.g. add_bos_token

  /// Append a token; returns its id.
  int32_t add(std::string text, TokenType type = TokenType::Normal, float score = 0.0f) {
    tokens.push_back(std::move(text));
    types.push_back(static_cast<int32_t>(type));
    scores.push_back(score);
    return static_cast<int32_t>(tokens.size() - 1);
  }

  /// Add the 256 `<0xNN>` byte tokens (SPM byte fallback).
  void add_byte_tokens() {
    static constexpr char kHex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b)
      add(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">", TokenType::Byte);
  }

  std::filesystem::path write() const {
    static std::atomic<int> counter{0};
    GgufWriter w;
    w.set_string("general.architecture", "llama");
    if (name) w.set_string("general.name", *name);
    w.set_string("tokenizer.ggml.model", model);
    if (pre) w.set_string("tokenizer.ggml.pre", *pre);
    w.set_array_strings("tokenizer.ggml.tokens", tokens);
    if (with_scores) w.set_array_f32("tokenizer.ggml.scores", scores);
    if (!types.empty()) w.set_array_i32("tokenizer.ggml.token_type", types);
    if (!merges.empty() || write_merges) w.set_array_strings("tokenizer.ggml.merges", merges);
    for (const auto& [k, v] : uints) w.set_uint32("tokenizer.ggml." + k, v);
    for (const auto& [k, v] : bools) w.set_bool("tokenizer.ggml." + k, v);
    const auto path = scratch_dir() / ("vocab-" + std::to_string(counter++) + ".gguf");
    w.write(path);
    return path;
  }

  std::unique_ptr<Tokenizer> load() const {
    const GgufFile f = GgufFile::open(write());
    return Tokenizer::from_gguf(f);
  }
};

/// "Ġ"-style spelling of raw text for byte-level BPE vocab entries (space -> U+0120, ...).
inline std::string gpt2_spelling(std::string_view raw) { return tok::bytes_to_mapped(raw); }

/// A byte-level BPE vocab with all 256 single-byte entries (ids 0..255 in byte order).
inline SyntheticVocab byte_level_vocab(std::string pre = "gpt-2") {
  SyntheticVocab v;
  v.model = "gpt2";
  v.pre = std::move(pre);
  for (int b = 0; b < 256; ++b) v.add(gpt2_spelling(std::string(1, static_cast<char>(b))));
  v.with_scores = false;  // BPE vocabs usually carry no scores
  v.write_merges = true;
  return v;
}

}  // namespace fdl::test
