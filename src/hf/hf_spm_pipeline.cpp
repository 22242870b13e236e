// SentencePiece-style normalizer / pre-tokenizer / decoder recognition (see hf_spm_pipeline.h).
#include "hf/hf_spm_pipeline.h"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace fdl::hf {
namespace {

using nlohmann::json;

constexpr const char* kSpaceMark = "\xE2\x96\x81";  // U+2581, SentencePiece's space

/// `pattern` is {"String": s}: the literal s; anything else (a Regex) is refused.
std::string string_pattern(const JsonReader& r, const json& component, const std::string& where) {
  const json& pattern = r.member(component, "pattern", where);
  if (!pattern.is_object() || !pattern.contains("String") || !pattern.at("String").is_string())
    r.fail(where + " pattern " + pattern.dump() + " is not supported (only a plain string)");
  return pattern.at("String").get<std::string>();
}

struct Normalizer {
  bool replaces_spaces = false;
  bool prepends = false;
};

Normalizer read_normalizer(const JsonReader& r, const json& tokenizer) {
  Normalizer n;
  if (!has_value(tokenizer, "normalizer")) return n;
  const json& top = tokenizer.at("normalizer");
  std::vector<const json*> steps{&top};
  if (has_type(top, "Sequence")) {
    const json& list = r.member(top, "normalizers", "normalizer");
    if (!list.is_array()) r.fail("normalizer.normalizers must be an array");
    steps.clear();
    for (const json& s : list) steps.push_back(&s);
  }
  constexpr const char* kSupported =
      " (supported for SentencePiece-style BPE: Replace(\" \", \"\xE2\x96\x81\") and Prepend(\"\xE2\x96\x81\"), alone or "
      "in a Sequence)";
  for (const json* s : steps) {
    // Prepend and Replace commute here (the prepended mark is not a space), so order is free.
    if ((has_type(*s, "Replace") && n.replaces_spaces) || (has_type(*s, "Prepend") && n.prepends))
      r.fail("normalizer " + describe(*s) + " appears twice" + kSupported);
    if (has_type(*s, "Replace")) {
      const std::string from = string_pattern(r, *s, "normalizer Replace");
      const std::string to = r.string_member(*s, "content", "normalizer Replace");
      if (from != " " || to != kSpaceMark)
        r.fail("normalizer Replace(" + json(from).dump() + ", " + json(to).dump() + ") is not supported" + kSupported);
      n.replaces_spaces = true;
    } else if (has_type(*s, "Prepend")) {
      const std::string prefix = r.string_member(*s, "prepend", "normalizer Prepend");
      if (prefix != kSpaceMark) r.fail("normalizer Prepend(" + json(prefix).dump() + ") is not supported" + kSupported);
      n.prepends = true;
    } else {
      r.fail("unsupported normalizer " + describe(*s) + kSupported);
    }
  }
  return n;
}

/// Metaspace: whether it prefixes a "▁" (prepend_scheme, or the older add_prefix_space) and
/// whether it splits. Absent settings take the `tokenizers` library's defaults (always, split).
void read_metaspace(const JsonReader& r, const json& m, const char* where, SpmPipeline& p) {
  const std::string replacement = r.string_member(m, "replacement", where);
  if (replacement != kSpaceMark)
    r.fail(std::string(where) + " replacement " + json(replacement).dump() + " is not supported (only \"\xE2\x96\x81\")");
  bool prefix = true;
  if (has_value(m, "prepend_scheme")) {
    const std::string scheme = r.string_member(m, "prepend_scheme", where);
    if (scheme != "always" && scheme != "first" && scheme != "never")
      r.fail(std::string(where) + " prepend_scheme " + json(scheme).dump() + " is not always, first or never");
    prefix = scheme != "never";
    if (has_value(m, "add_prefix_space") && r.bool_member_or(m, "add_prefix_space", prefix, where) != prefix)
      r.fail(std::string(where) + " add_prefix_space contradicts its prepend_scheme " + json(scheme).dump());
  } else {
    prefix = r.bool_member_or(m, "add_prefix_space", true, where);
  }
  p.add_space_prefix = p.add_space_prefix || prefix;
  p.splits_at_spaces = r.bool_member_or(m, "split", true, where);
}

void check_decoder(const JsonReader& r, const json& tokenizer) {
  if (!has_value(tokenizer, "decoder")) return;
  const json& d = tokenizer.at("decoder");
  if (has_type(d, "Metaspace")) {
    if (r.string_member(d, "replacement", "decoder Metaspace") != kSpaceMark)
      r.fail("decoder Metaspace replacement must be \"\xE2\x96\x81\"");
    return;
  }
  constexpr const char* kSupported =
      " (supported for SentencePiece-style BPE: Metaspace, or a Sequence of Replace(\"\xE2\x96\x81\", \" \"), "
      "ByteFallback, Fuse and Strip(\" \"))";
  if (!has_type(d, "Sequence")) r.fail("unsupported decoder " + describe(d) + kSupported);
  const json& list = r.member(d, "decoders", "decoder");
  if (!list.is_array()) r.fail("decoder.decoders must be an array");
  for (const json& s : list) {
    if (has_type(s, "ByteFallback") || has_type(s, "Fuse")) continue;
    if (has_type(s, "Replace")) {
      if (string_pattern(r, s, "decoder Replace") != kSpaceMark || r.string_member(s, "content", "decoder Replace") != " ")
        r.fail("decoder Replace must turn \"\xE2\x96\x81\" into \" \"");
      continue;
    }
    if (has_type(s, "Strip")) {
      if (r.string_member(s, "content", "decoder Strip") != " ") r.fail("decoder Strip must strip \" \"");
      continue;
    }
    r.fail("unsupported decoder " + describe(s) + " in decoder.decoders" + kSupported);
  }
}

}  // namespace

SpmPipeline read_spm_pipeline(const JsonReader& r, const json& tokenizer) {
  const Normalizer n = read_normalizer(r, tokenizer);
  SpmPipeline p;
  p.add_space_prefix = n.prepends;
  bool escapes_spaces = n.replaces_spaces;
  if (has_value(tokenizer, "pre_tokenizer")) {
    const json& pre = tokenizer.at("pre_tokenizer");
    if (has_type(pre, "Metaspace")) {
      read_metaspace(r, pre, "pre_tokenizer Metaspace", p);
      escapes_spaces = true;
    } else if (has_type(pre, "Split") && n.replaces_spaces) {
      // Gemma's: after the normalizer no space is left for it to split at.
      if (string_pattern(r, pre, "pre_tokenizer Split") != " " || r.bool_member_or(pre, "invert", false, "pre_tokenizer Split"))
        r.fail("pre_tokenizer Split is only supported on \" \" (which the normalizer has already replaced)");
    } else {
      r.fail("unsupported pre_tokenizer " + describe(pre) +
             " for SentencePiece-style BPE (supported: none, Metaspace, or Split(\" \") after a Replace normalizer)");
    }
  }
  if (!escapes_spaces)
    r.fail("neither the normalizer nor the pre_tokenizer turns spaces into \"\xE2\x96\x81\", which SentencePiece-style "
           "BPE (llama.cpp's) always does");
  check_decoder(r, tokenizer);
  return p;
}

}  // namespace fdl::hf
