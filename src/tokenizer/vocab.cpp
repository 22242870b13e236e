#include "tokenizer/vocab.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <climits>

#include "flashdllm/gguf.h"

namespace fdl::tok {
namespace {

constexpr std::string_view kTokensKey = "tokenizer.ggml.tokens";

// Texts that llama.cpp recognises as end-of-turn / end-of-generation markers (it marks
// them CONTROL even when the converter did not).
constexpr std::array<std::string_view, 9> kEotTexts = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<EOT>", "_<EOT>", "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>",
    "<end_of_utterance>"};
constexpr std::array<std::string_view, 12> kEogTexts = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>"};

TokenType type_from_raw(int64_t raw) {
  if (raw >= 0 && raw <= static_cast<int64_t>(TokenType::Byte)) return static_cast<TokenType>(raw);
  return TokenType::Undefined;  // unknown values are treated like llama.cpp does
}

bool is_special_type(TokenType t) {
  return t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown;
}

/// Read an optional token-id key; absent or out-of-range values keep `id` unchanged.
void read_special_id(const GgufFile& f, std::string_view key, int32_t n_vocab, int32_t& id) {
  const GgufValue* v = f.find(key);
  if (!v) return;
  int64_t raw;
  switch (v->type) {
    case GgufType::UINT8: case GgufType::UINT16: case GgufType::UINT32: case GgufType::UINT64:
      raw = v->u64 > static_cast<uint64_t>(INT32_MAX) ? -1 : static_cast<int64_t>(v->u64);
      break;
    case GgufType::INT8: case GgufType::INT16: case GgufType::INT32: case GgufType::INT64:
      raw = v->i64;
      break;
    default:
      throw TokenizerError(f.path() + ": metadata key '" + std::string(key) +
                           "' has type " + std::string(gguf_type_name(v->type)) +
                           ", expected an integer token id");
  }
  if (raw >= 0 && raw < n_vocab) id = static_cast<int32_t>(raw);
}

bool read_bool(const GgufFile& f, std::string_view key, bool def) {
  try {
    return f.get_bool_or(key, def);
  } catch (const GgufError& e) {
    throw TokenizerError(e.what());
  }
}

std::string to_lower_ascii(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

void apply_eog_fixups(Vocab& v, const GgufFile& f) {
  const auto mark_control = [&](int32_t id) { v.types[id] = TokenType::Control; };
  // EOT: from metadata, else the lowest id whose text is a known end-of-turn marker.
  read_special_id(f, "tokenizer.ggml.eot_token_id", v.size(), v.eot);
  read_special_id(f, "tokenizer.ggml.eom_token_id", v.size(), v.eom);
  if (v.eot < 0) {
    for (std::string_view t : kEotTexts) {
      const int32_t id = v.find(t);
      if (id >= 0 && (v.eot < 0 || id < v.eot)) v.eot = id;
    }
    if (v.eot >= 0) mark_control(v.eot);
  }
  if (v.eom < 0) {
    v.eom = v.find("<|eom_id|>");
    if (v.eom >= 0) mark_control(v.eom);
  }
  v.eog.assign(v.texts.size(), 0);
  for (std::string_view t : kEogTexts) {
    const int32_t id = v.find(t);
    if (id >= 0) {
      v.eog[id] = 1;
      mark_control(id);
    }
  }
  for (int32_t id : {v.eos, v.eot, v.eom})
    if (v.valid_id(id)) v.eog[id] = 1;
}

void build_special_list(Vocab& v) {
  for (int32_t id = 0; id < v.size(); ++id)
    if (is_special_type(v.types[id])) v.special_tokens.push_back(id);
  // llama.cpp orders these with std::sort (not stable) on ids in increasing order; calling
  // the same algorithm on the same input reproduces its order among equal lengths too.
  std::sort(v.special_tokens.begin(), v.special_tokens.end(), [&](int32_t a, int32_t b) {
    return v.texts[a].size() > v.texts[b].size();
  });
}

void apply_strip_attributes(Vocab& v) {
  v.rstrip.assign(v.texts.size(), 0);
  v.lstrip.assign(v.texts.size(), 0);
  const std::string name = to_lower_ascii(v.general_name);
  if (name.find("phi-3") == std::string::npos && name.find("phi3") == std::string::npos) return;
  // Phi-3's HF tokenizer strips whitespace to the right of its added tokens.
  for (int32_t id : v.special_tokens) v.rstrip[id] = 1;
  if (int32_t id = v.find("</s>"); id >= 0) v.rstrip[id] = 1;
  for (std::string_view t : {"<unk>", "<s>", "<|endoftext|>"})
    if (int32_t id = v.find(t); id >= 0) v.rstrip[id] = 0;
}

}  // namespace

Vocab load_vocab(const GgufFile& f, VocabModel model, const VocabDefaults& defaults) {
  Vocab v;
  v.model = model;
  try {
    v.model_name = f.get_string("tokenizer.ggml.model");
    v.pre = f.get_string_or("tokenizer.ggml.pre", "");
    v.general_name = f.get_string_or("general.name", "");
    if (!f.find(kTokensKey))
      throw TokenizerError(f.path() + ": metadata key '" + std::string(kTokensKey) +
                           "' is required but missing");
    const std::vector<std::string_view> tokens = f.array_strings(kTokensKey);
    if (tokens.empty())
      throw TokenizerError(f.path() + ": metadata key '" + std::string(kTokensKey) + "' is empty");
    if (tokens.size() > static_cast<size_t>(INT32_MAX))
      throw TokenizerError(f.path() + ": metadata key '" + std::string(kTokensKey) +
                           "' has too many entries");
    const size_t n = tokens.size();
    v.texts.reserve(n);
    for (std::string_view t : tokens) v.texts.emplace_back(t);

    if (f.find("tokenizer.ggml.scores")) {
      v.scores = f.array_f32("tokenizer.ggml.scores");
      if (v.scores.size() != n)
        throw TokenizerError(f.path() + ": metadata key 'tokenizer.ggml.scores' has " +
                             std::to_string(v.scores.size()) + " entries but there are " +
                             std::to_string(n) + " tokens");
    } else {
      v.scores.assign(n, 0.0f);
    }

    v.types.assign(n, TokenType::Normal);
    if (f.find("tokenizer.ggml.token_type")) {
      const std::vector<int64_t> raw = f.array_int("tokenizer.ggml.token_type");
      if (raw.size() != n)
        throw TokenizerError(f.path() + ": metadata key 'tokenizer.ggml.token_type' has " +
                             std::to_string(raw.size()) + " entries but there are " +
                             std::to_string(n) + " tokens");
      for (size_t i = 0; i < n; ++i) v.types[i] = type_from_raw(raw[i]);
    }
  } catch (const GgufError& e) {
    throw TokenizerError(e.what());
  }

  {
    size_t n_bytes = 0;
    for (const std::string& t : v.texts) n_bytes += t.size();
    StringArena arena;
    arena.reserve(v.texts.size(), n_bytes);
    for (const std::string& t : v.texts) arena.push_back(t);
    v.text_index = StringTable(std::move(arena));
  }

  v.bos = v.valid_id(defaults.bos) ? defaults.bos : -1;
  v.eos = v.valid_id(defaults.eos) ? defaults.eos : -1;
  v.unk = v.valid_id(defaults.unk) ? defaults.unk : -1;
  read_special_id(f, "tokenizer.ggml.bos_token_id", v.size(), v.bos);
  read_special_id(f, "tokenizer.ggml.eos_token_id", v.size(), v.eos);
  read_special_id(f, "tokenizer.ggml.unknown_token_id", v.size(), v.unk);

  v.add_bos = read_bool(f, "tokenizer.ggml.add_bos_token", defaults.add_bos);
  v.add_eos = read_bool(f, "tokenizer.ggml.add_eos_token", defaults.add_eos);
  v.add_space_prefix = read_bool(f, "tokenizer.ggml.add_space_prefix", defaults.add_space_prefix);
  if (v.add_bos && v.bos < 0)
    throw TokenizerError(f.path() + ": 'tokenizer.ggml.add_bos_token' is true but the vocab has "
                         "no valid 'tokenizer.ggml.bos_token_id'");
  if (v.add_eos && v.eos < 0)
    throw TokenizerError(f.path() + ": 'tokenizer.ggml.add_eos_token' is true but the vocab has "
                         "no valid 'tokenizer.ggml.eos_token_id'");

  apply_eog_fixups(v, f);
  build_special_list(v);
  apply_strip_attributes(v);
  return v;
}

}  // namespace fdl::tok
