// Shared tokenizer.json reading (see hf_tokenizer_json.h).
#include "hf/hf_tokenizer_json.h"

#include <nlohmann/json.hpp>

#include <limits>

#include "hf/hf_config.h"

namespace fdl::hf {

using nlohmann::json;

void JsonReader::fail(const std::string& what) const { throw HfError(label_ + ": " + what); }

const json& JsonReader::member(const json& obj, const char* key, const std::string& where) const {
  if (!obj.is_object() || !obj.contains(key)) fail(where + ": missing '" + key + "'");
  return obj.at(key);
}

std::string JsonReader::string_member(const json& obj, const char* key, const std::string& where) const {
  const json& v = member(obj, key, where);
  if (!v.is_string()) fail(where + "." + key + " must be a string");
  return v.get<std::string>();
}

bool JsonReader::bool_member_or(const json& obj, const char* key, bool def, const std::string& where) const {
  if (!has_value(obj, key)) return def;
  if (!obj.at(key).is_boolean()) fail(where + "." + key + " must be true or false");
  return obj.at(key).get<bool>();
}

int32_t JsonReader::token_id(const json& v, const std::string& where) const {
  if (!v.is_number_integer()) fail(where + ": id " + v.dump() + " is not an integer");
  const auto id = v.get<int64_t>();
  if (id < 0 || id >= std::numeric_limits<int32_t>::max()) fail(where + ": id " + std::to_string(id) + " is out of range");
  return int32_t(id);
}

bool has_value(const json& obj, const char* key) { return obj.is_object() && obj.contains(key) && !obj.at(key).is_null(); }

bool has_type(const json& component, std::string_view type) {
  return component.is_object() && component.contains("type") && component.at("type").is_string() &&
         component.at("type").get<std::string>() == type;
}

std::string describe(const json& component) {
  if (component.is_object() && component.contains("type") && component.at("type").is_string())
    return json(component.at("type")).dump();
  return component.dump();
}

TokenList read_token_list(const JsonReader& r, const json& tokenizer, int n_vocab) {
  TokenList list;
  std::vector<bool> seen;
  const auto put = [&](int32_t id, const std::string& text, int32_t type, bool added, const std::string& where) {
    // Checked before anything is sized by it: config.json's vocab_size is the bound.
    if (id >= n_vocab)
      r.fail(where + ": id " + std::to_string(id) + " is outside the vocabulary, whose config.json vocab_size is " +
             std::to_string(n_vocab));
    if (size_t(id) >= list.texts.size()) {
      list.texts.resize(size_t(id) + 1);
      list.types.resize(size_t(id) + 1, kTokenUnused);
      list.added.resize(size_t(id) + 1, false);
      seen.resize(size_t(id) + 1, false);
    }
    if (seen[size_t(id)] && list.texts[size_t(id)] != text)
      r.fail(where + ": id " + std::to_string(id) + " is given to both " + json(list.texts[size_t(id)]).dump() + " and " +
             json(text).dump());
    list.texts[size_t(id)] = text;
    list.types[size_t(id)] = type;
    list.added[size_t(id)] = list.added[size_t(id)] || added;
    seen[size_t(id)] = true;
  };
  const json& vocab = r.member(r.member(tokenizer, "model", "tokenizer"), "vocab", "model");
  if (!vocab.is_object() || vocab.empty()) r.fail("model.vocab must be a non-empty object");
  for (const auto& [text, id] : vocab.items())
    put(r.token_id(id, "model.vocab " + json(text).dump()), text, kTokenNormal, false, "model.vocab");
  if (has_value(tokenizer, "added_tokens")) {
    const json& added = tokenizer.at("added_tokens");
    if (!added.is_array()) r.fail("added_tokens must be an array");
    for (const json& a : added) {
      const std::string text = r.string_member(a, "content", "added_tokens");
      const bool special = r.bool_member_or(a, "special", false, "added_tokens");
      put(r.token_id(r.member(a, "id", "added_tokens"), "added_tokens " + json(text).dump()), text,
          special ? kTokenControl : kTokenUserDefined, true, "added_tokens");
    }
  }
  list.texts.resize(size_t(n_vocab));
  list.types.resize(size_t(n_vocab), kTokenUnused);
  list.added.resize(size_t(n_vocab), false);
  seen.resize(size_t(n_vocab), false);
  for (size_t id = 0; id < list.texts.size(); ++id)
    if (!seen[id]) list.texts[id] = "[PAD" + std::to_string(id) + "]";
  return list;
}

std::vector<std::pair<std::string, std::string>> read_merges(const JsonReader& r, const json& model) {
  const json& m = r.member(model, "merges", "model");
  if (!m.is_array()) r.fail("model.merges must be an array");
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(m.size());
  for (const json& e : m) {
    if (e.is_string()) {
      // The `tokenizers` library splits this form at its space and wants exactly two parts.
      const std::string s = e.get<std::string>();
      const size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos || space == 0 || space + 1 == s.size())
        r.fail("model.merges entry " + e.dump() + " is not two tokens separated by one space");
      merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      r.fail("model.merges entry " + e.dump() + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
  }
  return merges;
}

void check_plain_bpe_options(const JsonReader& r, const json& model) {
  if (has_value(model, "dropout") && !(model.at("dropout").is_number() && model.at("dropout").get<double>() == 0.0))
    r.fail("model.dropout = " + model.at("dropout").dump() + ": BPE dropout is not supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (has_value(model, key) && !(model.at(key).is_string() && model.at(key).get<std::string>().empty()))
      r.fail("model." + std::string(key) + " = " + model.at(key).dump() + " is not supported");
}

}  // namespace fdl::hf
