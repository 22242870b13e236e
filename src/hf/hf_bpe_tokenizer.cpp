// Byte-level BPE tokenizer.json -> llama.cpp `gpt2` metadata (see hf_bpe_tokenizer.h).
#include "hf/hf_bpe_tokenizer.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace fdl::hf {
namespace {

using nlohmann::json;

// The `Split` patterns of the byte-level BPE families, as their tokenizer.json files spell them,
// and the llama.cpp pre-tokenizer name that runs the same split.
constexpr const char* kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Mistral Nemo / Mistral Small 3 ("tekken"). llama.cpp runs its own rewrite of it, which tells
// upper from lower case only for ASCII letters and leaves combining marks out of words; that is
// the split the converted GGUF gets, so it is the one the engine runs (pre_tokenizer.cpp).
constexpr const char* kTekkenSplit =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

bool is_byte_level(const JsonReader& r, const json& p, bool with_regex) {
  if (!has_type(p, "ByteLevel")) return false;
  if (r.bool_member_or(p, "add_prefix_space", false, "pre_tokenizer"))
    r.fail("pre_tokenizer ByteLevel with add_prefix_space = true is not supported");
  return r.bool_member_or(p, "use_regex", true, "pre_tokenizer") == with_regex;
}

/// The llama.cpp pre-tokenizer name of `pre` (tokenizer.json's "pre_tokenizer").
std::string pre_tokenizer_name(const JsonReader& r, const json& pre) {
  if (is_byte_level(r, pre, true)) return "gpt-2";
  if (has_type(pre, "Sequence") && pre.contains("pretokenizers") && pre.at("pretokenizers").is_array() &&
      pre.at("pretokenizers").size() == 2) {
    const json& split = pre.at("pretokenizers")[0];
    const json& byte_level = pre.at("pretokenizers")[1];
    if (has_type(split, "Split") && split.contains("pattern") && split.at("pattern").is_object() &&
        split.at("pattern").contains("Regex") && split.at("pattern").at("Regex").is_string() &&
        split.value("behavior", "") == "Isolated" && !r.bool_member_or(split, "invert", false, "pre_tokenizer.Split") &&
        is_byte_level(r, byte_level, false)) {
      const std::string pattern = split.at("pattern").at("Regex").get<std::string>();
      if (pattern == kLlama3Split) return "llama-bpe";
      if (pattern == kQwen2Split) return "qwen2";
      if (pattern == kTekkenSplit) return "tekken";
      r.fail("pre_tokenizer Split pattern " + json(pattern).dump() +
             " is not one this build knows (supported: the GPT-2, Llama 3, Qwen2 and Tekken splits)");
    }
  }
  r.fail("unsupported pre_tokenizer " + describe(pre) +
         " (supported: ByteLevel, or Split(Llama 3 / Qwen2 / Tekken pattern) + ByteLevel)");
}

/// GPT-2's byte-to-unicode table: printable Latin-1 bytes stand for themselves, the other 68
/// for U+0100 onwards; returns the UTF-8 symbol of every byte.
std::vector<std::string> byte_symbols() {
  std::vector<std::string> symbols;
  for (uint32_t byte = 0, shifted = 0; byte < 256; ++byte) {
    const bool printable = (byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || byte >= 174;
    const uint32_t cp = printable ? byte : 256 + shifted++;
    std::string symbol;
    if (cp < 0x80) {
      symbol.push_back(char(cp));
    } else {
      symbol.push_back(char(0xC0 | (cp >> 6)));
      symbol.push_back(char(0x80 | (cp & 0x3F)));
    }
    symbols.push_back(std::move(symbol));
  }
  return symbols;
}

}  // namespace

void write_byte_level_bpe(const JsonReader& r, const json& tokenizer, int n_vocab, GgufWriter& w) {
  const json& model = r.member(tokenizer, "model", "tokenizer");
  if (has_value(tokenizer, "decoder") && !has_type(tokenizer.at("decoder"), "ByteLevel"))
    r.fail("unsupported decoder " + describe(tokenizer.at("decoder")) + " (supported: ByteLevel)");
  if (has_value(tokenizer, "normalizer") && !has_type(tokenizer.at("normalizer"), "NFC"))
    r.fail("unsupported normalizer " + describe(tokenizer.at("normalizer")) + " (supported: none, NFC)");
  const std::string pre = pre_tokenizer_name(r, r.member(tokenizer, "pre_tokenizer", "tokenizer"));
  // llama.cpp takes ignore_merges from the pre-tokenizer (Llama 3's and Tekken's set it): they
  // must agree.
  const bool ignore_merges = pre == "llama-bpe" || pre == "tekken";
  if (r.bool_member_or(model, "ignore_merges", false, "model") != ignore_merges)
    r.fail(std::string("model.ignore_merges = ") + (ignore_merges ? "false" : "true") + " does not match the " + pre +
           " pre-tokenizer's (" + (ignore_merges ? "true" : "false") + ")");

  TokenList tokens = read_token_list(r, tokenizer, n_vocab);
  // Without one of the byte symbols some text could not be encoded at all.
  const json& vocab = model.at("vocab");
  const std::vector<std::string> symbols = byte_symbols();
  for (size_t byte = 0; byte < symbols.size(); ++byte)
    if (!vocab.contains(symbols[byte]))
      r.fail("model.vocab lacks the byte symbol " + json(symbols[byte]).dump() + " (byte " + std::to_string(byte) +
             "): a byte-level vocabulary needs all 256");

  std::vector<std::string> merges;
  for (auto& [left, right] : read_merges(r, model)) merges.push_back(left + " " + right);

  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", pre);
  w.set_array_strings("tokenizer.ggml.tokens", std::move(tokens.texts));
  w.set_array_i32("tokenizer.ggml.token_type", std::move(tokens.types));
  w.set_array_strings("tokenizer.ggml.merges", std::move(merges));
}

}  // namespace fdl::hf
