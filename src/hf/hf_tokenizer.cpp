// tokenizer.json -> tokenizer.ggml.* metadata (see hf_tokenizer.h).
#include "hf/hf_tokenizer.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "hf/hf_config.h"

namespace fdl::hf {
namespace {

using nlohmann::json;

// The `Split` patterns of the byte-level BPE families, as their tokenizer.json files spell them,
// and the llama.cpp pre-tokenizer name that runs the same split.
constexpr const char* kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// llama.cpp's token types (tokenizer.ggml.token_type).
constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;

class Reader {
 public:
  explicit Reader(std::string label) : label_(std::move(label)) {}
  [[noreturn]] void fail(const std::string& what) const { throw HfError(label_ + ": " + what); }
  const json& member(const json& obj, const char* key, const std::string& where) const {
    if (!obj.is_object() || !obj.contains(key)) fail(where + ": missing '" + key + "'");
    return obj.at(key);
  }
  std::string string_member(const json& obj, const char* key, const std::string& where) const {
    const json& v = member(obj, key, where);
    if (!v.is_string()) fail(where + "." + key + " must be a string");
    return v.get<std::string>();
  }
  bool bool_member_or(const json& obj, const char* key, bool def, const std::string& where) const {
    if (!obj.is_object() || !obj.contains(key) || obj.at(key).is_null()) return def;
    if (!obj.at(key).is_boolean()) fail(where + "." + key + " must be true or false");
    return obj.at(key).get<bool>();
  }

 private:
  std::string label_;
};

bool is_byte_level(const Reader& r, const json& p, bool with_regex) {
  if (!p.is_object() || !p.contains("type") || p.at("type") != "ByteLevel") return false;
  if (r.bool_member_or(p, "add_prefix_space", false, "pre_tokenizer"))
    r.fail("pre_tokenizer ByteLevel with add_prefix_space = true is not supported");
  return r.bool_member_or(p, "use_regex", true, "pre_tokenizer") == with_regex;
}

/// The llama.cpp pre-tokenizer name of `pre` (tokenizer.json's "pre_tokenizer").
std::string pre_tokenizer_name(const Reader& r, const json& pre) {
  if (is_byte_level(r, pre, true)) return "gpt-2";
  if (pre.is_object() && pre.value("type", "") == "Sequence" && pre.contains("pretokenizers") &&
      pre.at("pretokenizers").is_array() && pre.at("pretokenizers").size() == 2) {
    const json& split = pre.at("pretokenizers")[0];
    const json& byte_level = pre.at("pretokenizers")[1];
    if (split.is_object() && split.value("type", "") == "Split" && split.contains("pattern") &&
        split.at("pattern").is_object() && split.at("pattern").contains("Regex") &&
        split.at("pattern").at("Regex").is_string() && split.value("behavior", "") == "Isolated" &&
        !r.bool_member_or(split, "invert", false, "pre_tokenizer.Split") && is_byte_level(r, byte_level, false)) {
      const std::string pattern = split.at("pattern").at("Regex").get<std::string>();
      if (pattern == kLlama3Split) return "llama-bpe";
      if (pattern == kQwen2Split) return "qwen2";
      r.fail("pre_tokenizer Split pattern " + json(pattern).dump() +
             " is not one this build knows (supported: the GPT-2, Llama 3 and Qwen2 splits)");
    }
  }
  r.fail("unsupported pre_tokenizer " + (pre.is_object() ? json(pre.value("type", "?")).dump() : pre.dump()) +
         " (supported: ByteLevel, or Split(Llama 3 / Qwen2 pattern) + ByteLevel)");
}

int32_t token_id(const Reader& r, const json& v, const std::string& where) {
  if (!v.is_number_integer()) r.fail(where + ": id " + v.dump() + " is not an integer");
  const auto id = v.get<int64_t>();
  if (id < 0 || id >= std::numeric_limits<int32_t>::max()) r.fail(where + ": id " + std::to_string(id) + " is out of range");
  return int32_t(id);
}

/// A special token named in tokenizer_config.json: a string, or an object with "content".
std::optional<std::string> special_text(const json& tokenizer_config, const char* key) {
  if (!tokenizer_config.is_object() || !tokenizer_config.contains(key)) return std::nullopt;
  const json& v = tokenizer_config.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) return v.at("content").get<std::string>();
  return std::nullopt;
}

}  // namespace

void write_tokenizer_metadata(const json& tokenizer, const json& tokenizer_config, const json& config, int n_vocab,
                              const std::string& label, const std::string& config_label, GgufWriter& w) {
  const Reader r(label), rc(config_label);
  if (!tokenizer.is_object()) r.fail("not a JSON object");
  if (!tokenizer_config.is_null() && !tokenizer_config.is_object()) rc.fail("not a JSON object");
  const json& model = r.member(tokenizer, "model", "tokenizer");
  const std::string type = r.string_member(model, "type", "model");
  if (type != "BPE") r.fail("unsupported tokenizer model '" + type + "' (supported: byte-level BPE)");
  if (r.bool_member_or(model, "byte_fallback", false, "model"))
    r.fail("BPE with byte_fallback (SentencePiece-style) is not supported from tokenizer.json yet; use the GGUF");
  // Settings that change the segmentation and have no llama.cpp equivalent.
  if (model.contains("dropout") && !model.at("dropout").is_null() &&
      !(model.at("dropout").is_number() && model.at("dropout").get<double>() == 0.0))
    r.fail("model.dropout = " + model.at("dropout").dump() + ": BPE dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(key) && !model.at(key).is_null() && !(model.at(key).is_string() && model.at(key).get<std::string>().empty()))
      r.fail("model." + std::string(key) + " = " + model.at(key).dump() + " is not supported for byte-level BPE");
  if (tokenizer.contains("decoder") && !tokenizer.at("decoder").is_null() &&
      !(tokenizer.at("decoder").is_object() && tokenizer.at("decoder").value("type", "") == "ByteLevel"))
    r.fail("unsupported decoder " +
           (tokenizer.at("decoder").is_object() ? json(tokenizer.at("decoder").value("type", "?")).dump()
                                                : tokenizer.at("decoder").dump()) +
           " (supported: ByteLevel)");
  if (tokenizer.contains("normalizer") && !tokenizer.at("normalizer").is_null()) {
    const json& n = tokenizer.at("normalizer");
    if (!n.is_object() || n.value("type", "") != "NFC")
      r.fail("unsupported normalizer " + (n.is_object() ? json(n.value("type", "?")).dump() : n.dump()) +
             " (supported: none, NFC)");
  }
  const std::string pre = pre_tokenizer_name(r, r.member(tokenizer, "pre_tokenizer", "tokenizer"));
  // llama.cpp takes ignore_merges from the pre-tokenizer (Llama 3's sets it): they must agree.
  const bool ignore_merges = pre == "llama-bpe";
  if (r.bool_member_or(model, "ignore_merges", false, "model") != ignore_merges)
    r.fail(std::string("model.ignore_merges = ") + (ignore_merges ? "false" : "true") + " does not match the " + pre +
           " pre-tokenizer's (" + (ignore_merges ? "true" : "false") + ")");

  // Tokens by id: the BPE vocabulary, then the added tokens (which may extend it).
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<bool> seen;
  const auto put = [&](int32_t id, const std::string& text, int32_t t, const std::string& where) {
    if (size_t(id) >= tokens.size()) {
      if (size_t(id) >= (size_t(1) << 24)) r.fail(where + ": id " + std::to_string(id) + " is implausibly large");
      tokens.resize(size_t(id) + 1);
      types.resize(size_t(id) + 1, kUnused);
      seen.resize(size_t(id) + 1, false);
    }
    if (seen[size_t(id)] && tokens[size_t(id)] != text)
      r.fail(where + ": id " + std::to_string(id) + " is given to both " + json(tokens[size_t(id)]).dump() + " and " +
             json(text).dump());
    tokens[size_t(id)] = text;
    types[size_t(id)] = t;
    seen[size_t(id)] = true;
  };
  const json& vocab = r.member(model, "vocab", "model");
  if (!vocab.is_object() || vocab.empty()) r.fail("model.vocab must be a non-empty object");
  for (const auto& [text, id] : vocab.items()) put(token_id(r, id, "model.vocab " + json(text).dump()), text, kNormal, "model.vocab");
  if (tokenizer.contains("added_tokens") && !tokenizer.at("added_tokens").is_null()) {
    const json& added = tokenizer.at("added_tokens");
    if (!added.is_array()) r.fail("added_tokens must be an array");
    for (const json& a : added) {
      const std::string text = r.string_member(a, "content", "added_tokens");
      const bool special = r.bool_member_or(a, "special", false, "added_tokens");
      put(token_id(r, r.member(a, "id", "added_tokens"), "added_tokens " + json(text).dump()), text,
          special ? kControl : kUserDefined, "added_tokens");
    }
  }
  // Byte-level BPE spells every byte as one symbol (GPT-2's byte-to-unicode table: printable
  // Latin-1 bytes as themselves, the other 68 as U+0100 onwards); without one of them some
  // text could not be encoded at all.
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
    if (!vocab.contains(symbol))
      r.fail("model.vocab lacks the byte symbol " + json(symbol).dump() + " (byte " + std::to_string(byte) +
             "): a byte-level vocabulary needs all 256");
  }
  if (tokens.size() > size_t(n_vocab))
    r.fail("the tokenizer has ids up to " + std::to_string(tokens.size() - 1) + " but config.json's vocab_size is " +
           std::to_string(n_vocab));
  tokens.resize(size_t(n_vocab));
  types.resize(size_t(n_vocab), kUnused);
  seen.resize(size_t(n_vocab), false);
  for (size_t id = 0; id < tokens.size(); ++id)
    if (!seen[id]) tokens[id] = "[PAD" + std::to_string(id) + "]";

  std::vector<std::string> merges;
  const json& m = r.member(model, "merges", "model");
  if (!m.is_array()) r.fail("model.merges must be an array");
  merges.reserve(m.size());
  for (const json& e : m) {
    if (e.is_string()) {
      merges.push_back(e.get<std::string>());
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      merges.push_back(e[0].get<std::string>() + " " + e[1].get<std::string>());
    } else {
      r.fail("model.merges entry " + e.dump() + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }

  w.set_string("tokenizer.ggml.model", "gpt2");
  w.set_string("tokenizer.ggml.pre", pre);
  w.set_array_strings("tokenizer.ggml.tokens", std::move(tokens));
  w.set_array_i32("tokenizer.ggml.token_type", std::move(types));
  w.set_array_strings("tokenizer.ggml.merges", std::move(merges));

  // BOS / EOS: tokenizer_config.json names them; config.json's ids are the fallback.
  const auto id_of = [&](const std::string& text) -> std::optional<int32_t> {
    if (vocab.contains(text)) return token_id(r, vocab.at(text), "model.vocab");
    if (tokenizer.contains("added_tokens") && tokenizer.at("added_tokens").is_array())
      for (const json& a : tokenizer.at("added_tokens"))
        if (a.value("content", "") == text) return token_id(r, a.at("id"), "added_tokens");
    return std::nullopt;
  };
  const auto special_id = [&](const char* tc_key, const char* config_key) -> std::optional<int32_t> {
    if (tokenizer_config.is_object() && tokenizer_config.contains(tc_key) && !tokenizer_config.at(tc_key).is_null() &&
        !special_text(tokenizer_config, tc_key))
      rc.fail(std::string(tc_key) + " must be a string or an object with \"content\", got " +
              tokenizer_config.at(tc_key).dump());
    if (const auto text = special_text(tokenizer_config, tc_key)) {
      if (const auto id = id_of(*text)) return id;
      rc.fail(std::string(tc_key) + " " + json(*text).dump() + " is not in the vocabulary");
    }
    if (config.is_object() && config.contains(config_key)) {
      const json& v = config.at(config_key);
      if (v.is_number_integer()) return token_id(r, v, std::string("config.json ") + config_key);
      if (v.is_array() && !v.empty() && v[0].is_number_integer())
        return token_id(r, v[0], std::string("config.json ") + config_key);
    }
    return std::nullopt;
  };
  std::optional<int32_t> bos = special_id("bos_token", "bos_token_id"), eos = special_id("eos_token", "eos_token_id");
  for (const auto& [key, id] : {std::pair{"tokenizer.ggml.bos_token_id", bos}, std::pair{"tokenizer.ggml.eos_token_id", eos}}) {
    if (!id) continue;
    if (*id >= n_vocab) r.fail(std::string(key) + " " + std::to_string(*id) + " is outside the vocabulary");
    w.set_uint32(key, uint32_t(*id));
  }
  // add_bos_token: tokenizer_config.json says it, else a post-processor template that starts
  // with a special token adds one (Llama 3's).
  bool add_bos = false;
  if (tokenizer_config.is_object() && tokenizer_config.contains("add_bos_token") &&
      !tokenizer_config.at("add_bos_token").is_null()) {
    if (!tokenizer_config.at("add_bos_token").is_boolean()) rc.fail("add_bos_token must be true or false");
    add_bos = tokenizer_config.at("add_bos_token").get<bool>();
  } else if (tokenizer.contains("post_processor") && tokenizer.at("post_processor").is_object()) {
    std::vector<const json*> stack{&tokenizer.at("post_processor")};
    while (!stack.empty()) {
      const json* p = stack.back();
      stack.pop_back();
      if (p->value("type", "") == "Sequence" && p->contains("processors") && p->at("processors").is_array())
        for (const json& q : p->at("processors")) stack.push_back(&q);
      if (p->value("type", "") == "TemplateProcessing" && p->contains("single") && p->at("single").is_array() &&
          !p->at("single").empty() && p->at("single")[0].is_object() && p->at("single")[0].contains("SpecialToken"))
        add_bos = true;
    }
  }
  if (add_bos && !bos) r.fail("the tokenizer adds a BOS token but names none");
  w.set_bool("tokenizer.ggml.add_bos_token", add_bos);

  // The chat template: one string, or named templates ("default" is the main one).
  if (tokenizer_config.is_object() && tokenizer_config.contains("chat_template") &&
      !tokenizer_config.at("chat_template").is_null()) {
    const json& t = tokenizer_config.at("chat_template");
    if (t.is_string()) {
      w.set_string("tokenizer.chat_template", t.get<std::string>());
    } else if (t.is_array()) {
      for (const json& named : t) {
        if (!named.is_object() || !named.contains("name") || !named.at("name").is_string() ||
            !named.contains("template") || !named.at("template").is_string())
          rc.fail("chat_template entries must be objects with string \"name\" and \"template\"");
        const std::string name = named.at("name").get<std::string>();
        w.set_string(name == "default" ? "tokenizer.chat_template" : "tokenizer.chat_template." + name,
                     named.at("template").get<std::string>());
      }
    } else {
      rc.fail("chat_template must be a string or a list of named templates");
    }
  }
}

}  // namespace fdl::hf
