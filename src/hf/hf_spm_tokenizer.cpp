// SentencePiece-style BPE tokenizer.json -> llama.cpp `llama` metadata (see hf_spm_tokenizer.h).
#include "hf/hf_spm_tokenizer.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "hf/hf_spm_pipeline.h"
#include "tokenizer/space_mark.h"

namespace fdl::hf {
namespace {

using nlohmann::json;

using tok::kSpaceMark;
// Ranks become float scores: beyond 2^24 neighbouring ranks would round to the same score.
constexpr size_t kMaxMerges = size_t(1) << 24;

/// model.vocab: its entries in the JSON object's (text) order, so that checks report the same
/// entry every time, and text -> id. Views into the parsed JSON's keys.
struct VocabIndex {
  std::vector<std::pair<std::string_view, int32_t>> entries;
  std::unordered_map<std::string_view, int32_t> ids;
};

int32_t find(const VocabIndex& index, std::string_view text) {
  const auto it = index.ids.find(text);
  return it == index.ids.end() ? -1 : it->second;
}

std::string as_json(std::string_view s) { return json(std::string(s)).dump(); }

/// Bytes of the UTF-8 character that starts with `lead` (the JSON parser has checked the text).
size_t char_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  return 4;
}

bool is_one_char(std::string_view s) { return !s.empty() && char_length(static_cast<unsigned char>(s[0])) == s.size(); }

/// "<0xNN>": a byte token (hex digits in either case, as llama.cpp's converter accepts them).
bool is_byte_token(std::string_view t) {
  const auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || (c >= 'a' && c <= 'f'); };
  return t.size() == 6 && t.substr(0, 3) == "<0x" && hex(t[3]) && hex(t[4]) && t[5] == '>';
}

/// Added tokens llama.cpp's converter makes control tokens although they are not marked special
/// (some models forget to mark their chat or padding tokens).
bool looks_special(std::string_view t) {
  const auto wraps = [&](std::string_view open, std::string_view close) {
    return t.size() >= open.size() + close.size() && t.substr(0, open.size()) == open &&
           t.substr(t.size() - close.size()) == close;
  };
  return t == "<pad>" || t == "<mask>" || t == "<2mass>" || t == "[@BOS@]" || wraps("<|", "|>") ||
         wraps("<\xEF\xBD\x9C", "\xEF\xBD\x9C>") /* <｜...｜> */ || wraps("<unused", ">");
}

uint64_t pair_key(int32_t left, int32_t right) { return (uint64_t(uint32_t(left)) << 32) | uint32_t(right); }

struct MergeTable {
  std::vector<float> scores;               ///< by id; see hf_spm_tokenizer.h
  std::unordered_set<uint64_t> pairs;      ///< pair_key(left id, right id) of every merge
};

MergeTable read_merge_table(const JsonReader& r, const json& model, const VocabIndex& index, int n_vocab) {
  const auto merges = read_merges(r, model);
  if (merges.size() >= kMaxMerges)
    r.fail("model.merges has " + std::to_string(merges.size()) + " entries, more than " + std::to_string(kMaxMerges) +
           " (scores are their ranks as floats)");
  // Tokens no merge makes are never formed by merging (single characters, byte and added
  // tokens): they score below every merge.
  MergeTable t;
  t.scores.assign(size_t(n_vocab), -float(merges.size()));
  std::vector<bool> made(size_t(n_vocab), false);
  t.pairs.reserve(merges.size());
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const std::string where = "model.merges entry " + as_json(left + " " + right);
    const int32_t l = find(index, left), rt = find(index, right);
    if (l < 0) r.fail(where + ": " + as_json(left) + " is not in model.vocab");
    if (rt < 0) r.fail(where + ": " + as_json(right) + " is not in model.vocab");
    const int32_t joined = find(index, left + right);
    if (joined < 0) r.fail(where + " makes " + as_json(left + right) + ", which is not in model.vocab");
    if (!made[size_t(joined)]) {
      t.scores[size_t(joined)] = -float(rank);
      made[size_t(joined)] = true;
    }
    t.pairs.insert(pair_key(l, rt));
  }
  return t;
}

/// SentencePiece merging joins any two adjacent symbols (characters or tokens) whose text is a
/// token; HF joins only listed pairs. They agree when every such split of a token is a merge.
/// Added tokens are left out: both tokenizers cut them out of the text before merging.
void check_every_split_is_a_merge(const JsonReader& r, const VocabIndex& index, const TokenList& tokens,
                                  const MergeTable& merges) {
  for (const auto& [text, id] : index.entries) {
    if (tokens.added[size_t(id)] || text.empty() || is_one_char(text)) continue;
    for (size_t cut = char_length(static_cast<unsigned char>(text[0])); cut < text.size();
         cut += char_length(static_cast<unsigned char>(text[cut]))) {
      const std::string_view left = text.substr(0, cut), right = text.substr(cut);
      const int32_t l = find(index, left), rt = find(index, right);
      if ((l < 0 && !is_one_char(left)) || (rt < 0 && !is_one_char(right))) continue;  // never adjacent symbols
      if (l < 0 || rt < 0)
        r.fail("model.vocab has " + as_json(text) + " but not its character " + as_json(l < 0 ? left : right) +
               ", which byte fallback would spell as bytes (llama.cpp's SentencePiece merging would still join it)");
      if (!merges.pairs.count(pair_key(l, rt)))
        r.fail("model.merges lacks " + as_json(std::string(left) + " " + std::string(right)) + " although " +
               as_json(text) + " is in model.vocab: llama.cpp's SentencePiece merging joins every such pair, so its ids "
               "would differ from this tokenizer's");
    }
  }
}

/// Byte fallback must never need the unknown token.
void check_byte_tokens(const JsonReader& r, const VocabIndex& index) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    const std::string name = {'<', '0', 'x', kHex[b >> 4], kHex[b & 15], '>'};
    if (find(index, name) >= 0) continue;
    if (b < 0x80 && find(index, std::string(1, char(b))) >= 0) continue;  // the character itself
    r.fail("model.vocab lacks the byte token " + as_json(name) + ": byte_fallback needs one for every byte");
  }
}

}  // namespace

void write_sentencepiece_bpe(const JsonReader& r, const json& tokenizer, const JsonReader& rc,
                             const json& tokenizer_config, int n_vocab, GgufWriter& w) {
  const json& model = r.member(tokenizer, "model", "tokenizer");
  if (r.bool_member_or(model, "ignore_merges", false, "model"))
    r.fail("model.ignore_merges = true is not supported for SentencePiece-style BPE (llama.cpp always merges)");
  const SpmPipeline pipeline = read_spm_pipeline(r, tokenizer);

  TokenList tokens = read_token_list(r, tokenizer, n_vocab);
  VocabIndex index;
  for (const auto& [text, id] : model.at("vocab").get_ref<const json::object_t&>())  // ids checked above
    index.entries.emplace_back(text, id.get<int32_t>());
  index.ids.reserve(index.entries.size());
  for (const auto& [text, id] : index.entries) index.ids.emplace(text, id);
  if (pipeline.splits_at_spaces)
    for (const auto& [text, id] : index.entries)
      if (!tokens.added[size_t(id)] && text.find(kSpaceMark, 1) != std::string_view::npos)
        r.fail("pre_tokenizer Metaspace with split = true cuts the text before every \"\xE2\x96\x81\", but model.vocab has " +
               as_json(text) + ", which llama.cpp's SentencePiece merging can form across such a cut");
  check_byte_tokens(r, index);
  MergeTable merges = read_merge_table(r, model, index, n_vocab);
  check_every_split_is_a_merge(r, index, tokens, merges);

  int32_t unk = -1;
  if (has_value(model, "unk_token")) {
    const std::string text = r.string_member(model, "unk_token", "model");
    unk = find(index, text);
    for (size_t id = 0; unk < 0 && id < tokens.texts.size(); ++id)
      if (tokens.added[id] && tokens.texts[id] == text) unk = int32_t(id);
    if (unk < 0) r.fail("model.unk_token " + as_json(text) + " is not in the vocabulary");
  }
  for (size_t id = 0; id < tokens.texts.size(); ++id) {
    int32_t& type = tokens.types[id];
    if (tokens.added[id]) {
      if (type == kTokenUserDefined && looks_special(tokens.texts[id])) type = kTokenControl;
      if (type == kTokenUserDefined) tokens.texts[id] = tok::unescape_spaces(tokens.texts[id]);
    } else if (int32_t(id) == unk) {
      type = kTokenUnknown;
    } else if (type == kTokenNormal && is_byte_token(tokens.texts[id])) {
      type = kTokenByte;
    }
  }

  bool add_space_prefix = pipeline.add_space_prefix;
  if (tokenizer_config.is_object() && has_value(tokenizer_config, "add_prefix_space"))
    add_space_prefix = rc.bool_member_or(tokenizer_config, "add_prefix_space", add_space_prefix, "tokenizer_config");

  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string("tokenizer.ggml.pre", "default");
  w.set_array_strings("tokenizer.ggml.tokens", std::move(tokens.texts));
  w.set_array_f32("tokenizer.ggml.scores", std::move(merges.scores));
  w.set_array_i32("tokenizer.ggml.token_type", std::move(tokens.types));
  w.set_bool("tokenizer.ggml.add_space_prefix", add_space_prefix);
  if (unk >= 0) w.set_uint32("tokenizer.ggml.unknown_token_id", uint32_t(unk));
}

}  // namespace fdl::hf
