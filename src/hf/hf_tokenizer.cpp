// tokenizer.json -> tokenizer.ggml.* metadata (see hf_tokenizer.h): picks the tokenizer kind,
// then writes what both kinds share (special tokens, add_bos_token, chat templates).
#include "hf/hf_tokenizer.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "hf/hf_bpe_tokenizer.h"
#include "hf/hf_spm_tokenizer.h"
#include "hf/hf_tokenizer_json.h"

namespace fdl::hf {
namespace {

using nlohmann::json;

/// A special token named in tokenizer_config.json: a string, or an object with "content".
std::optional<std::string> special_text(const json& tokenizer_config, const char* key) {
  if (!tokenizer_config.is_object() || !tokenizer_config.contains(key)) return std::nullopt;
  const json& v = tokenizer_config.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) return v.at("content").get<std::string>();
  return std::nullopt;
}

/// BOS / EOS ids: tokenizer_config.json names them; config.json's ids are the fallback.
void write_bos_eos(const JsonReader& r, const JsonReader& rc, const json& tokenizer, const json& tokenizer_config,
                   const json& config, int n_vocab, GgufWriter& w, std::optional<int32_t>& bos) {
  const json& vocab = tokenizer.at("model").at("vocab");
  const auto id_of = [&](const std::string& text) -> std::optional<int32_t> {
    if (vocab.contains(text)) return r.token_id(vocab.at(text), "model.vocab");
    if (has_value(tokenizer, "added_tokens") && tokenizer.at("added_tokens").is_array())
      for (const json& a : tokenizer.at("added_tokens"))
        if (a.value("content", "") == text) return r.token_id(a.at("id"), "added_tokens");
    return std::nullopt;
  };
  const auto special_id = [&](const char* tc_key, const char* config_key) -> std::optional<int32_t> {
    if (has_value(tokenizer_config, tc_key) && !special_text(tokenizer_config, tc_key))
      rc.fail(std::string(tc_key) + " must be a string or an object with \"content\", got " +
              tokenizer_config.at(tc_key).dump());
    if (const auto text = special_text(tokenizer_config, tc_key)) {
      if (const auto id = id_of(*text)) return id;
      rc.fail(std::string(tc_key) + " " + json(*text).dump() + " is not in the vocabulary");
    }
    if (config.is_object() && config.contains(config_key)) {
      const json& v = config.at(config_key);
      if (v.is_number_integer()) return r.token_id(v, std::string("config.json ") + config_key);
      if (v.is_array() && !v.empty() && v[0].is_number_integer())
        return r.token_id(v[0], std::string("config.json ") + config_key);
    }
    return std::nullopt;
  };
  bos = special_id("bos_token", "bos_token_id");
  const std::optional<int32_t> eos = special_id("eos_token", "eos_token_id");
  for (const auto& [key, id] : {std::pair{"tokenizer.ggml.bos_token_id", bos}, std::pair{"tokenizer.ggml.eos_token_id", eos}}) {
    if (!id) continue;
    if (*id >= n_vocab) r.fail(std::string(key) + " " + std::to_string(*id) + " is outside the vocabulary");
    w.set_uint32(key, uint32_t(*id));
  }
}

/// add_bos_token: tokenizer_config.json says it, else a post-processor template that starts
/// with a special token adds one (Llama 3's, Llama 2's).
bool adds_bos(const JsonReader& rc, const json& tokenizer, const json& tokenizer_config) {
  if (has_value(tokenizer_config, "add_bos_token")) {
    if (!tokenizer_config.at("add_bos_token").is_boolean()) rc.fail("add_bos_token must be true or false");
    return tokenizer_config.at("add_bos_token").get<bool>();
  }
  if (!tokenizer.contains("post_processor") || !tokenizer.at("post_processor").is_object()) return false;
  std::vector<const json*> stack{&tokenizer.at("post_processor")};
  while (!stack.empty()) {
    const json* p = stack.back();
    stack.pop_back();
    if (has_type(*p, "Sequence") && p->contains("processors") && p->at("processors").is_array())
      for (const json& q : p->at("processors")) stack.push_back(&q);
    if (has_type(*p, "TemplateProcessing") && p->contains("single") && p->at("single").is_array() &&
        !p->at("single").empty() && p->at("single")[0].is_object() && p->at("single")[0].contains("SpecialToken"))
      return true;
  }
  return false;
}

/// The chat template: one string, or named templates ("default" is the main one).
void write_chat_templates(const JsonReader& rc, const json& tokenizer_config, GgufWriter& w) {
  if (!has_value(tokenizer_config, "chat_template")) return;
  const json& t = tokenizer_config.at("chat_template");
  if (t.is_string()) {
    w.set_string("tokenizer.chat_template", t.get<std::string>());
  } else if (t.is_array()) {
    for (const json& named : t) {
      if (!named.is_object() || !named.contains("name") || !named.at("name").is_string() || !named.contains("template") ||
          !named.at("template").is_string())
        rc.fail("chat_template entries must be objects with string \"name\" and \"template\"");
      const std::string name = named.at("name").get<std::string>();
      w.set_string(name == "default" ? "tokenizer.chat_template" : "tokenizer.chat_template." + name,
                   named.at("template").get<std::string>());
    }
  } else {
    rc.fail("chat_template must be a string or a list of named templates");
  }
}

}  // namespace

void write_tokenizer_metadata(const json& tokenizer, const json& tokenizer_config, const json& config, int n_vocab,
                              const std::string& label, const std::string& config_label, GgufWriter& w) {
  const JsonReader r(label), rc(config_label);
  if (!tokenizer.is_object()) r.fail("not a JSON object");
  if (!tokenizer_config.is_null() && !tokenizer_config.is_object()) rc.fail("not a JSON object");
  const json& model = r.member(tokenizer, "model", "tokenizer");
  const std::string type = r.string_member(model, "type", "model");
  if (type != "BPE")
    r.fail("unsupported tokenizer model '" + type + "' (supported: BPE, byte-level or SentencePiece-style with byte_fallback)");
  check_plain_bpe_options(r, model);
  // Byte fallback is what marks a SentencePiece-style vocabulary ("<0xNN>" tokens, "▁" spaces);
  // byte-level BPE spells bytes as characters instead and never falls back.
  if (r.bool_member_or(model, "byte_fallback", false, "model"))
    write_sentencepiece_bpe(r, tokenizer, rc, tokenizer_config, n_vocab, w);
  else
    write_byte_level_bpe(r, tokenizer, n_vocab, w);

  std::optional<int32_t> bos;
  write_bos_eos(r, rc, tokenizer, tokenizer_config, config, n_vocab, w, bos);
  const bool add_bos = adds_bos(rc, tokenizer, tokenizer_config);
  if (add_bos && !bos) r.fail("the tokenizer adds a BOS token but names none");
  w.set_bool("tokenizer.ggml.add_bos_token", add_bos);
  write_chat_templates(rc, tokenizer_config, w);
}

}  // namespace fdl::hf
