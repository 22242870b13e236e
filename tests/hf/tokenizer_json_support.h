// Helpers for the tokenizer.json tests: the fixtures of tests/data/tokenizers (made by
// scripts/make_tokenizer_fixtures.py) and tokenizer.json -> GGUF metadata -> Tokenizer.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "flashdllm/gguf.h"
#include "flashdllm/tokenizer.h"
#include "hf/hf_tokenizer.h"
#include "test_support.h"

namespace fdl::test {

inline std::filesystem::path tokenizer_fixture_dir(const std::string& name) {
  return test_data_dir() / "tokenizers" / name;
}

inline nlohmann::json read_json_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  std::stringstream s;
  s << in.rdbuf();
  return nlohmann::json::parse(s.str());
}

/// The GGUF metadata src/hf writes for `tokenizer` (tokenizer_config may be null), as a file
/// the tokenizers read; `label` names tokenizer.json in errors (tokenizer_config.json is its
/// sibling).
inline GgufFile convert_tokenizer_json(const nlohmann::json& tokenizer, const nlohmann::json& tokenizer_config, int n_vocab,
                                       const std::filesystem::path& label = "dir/tokenizer.json") {
  GgufWriter w;
  hf::write_tokenizer_metadata(tokenizer, tokenizer_config, nlohmann::json::object(), n_vocab, label.string(),
                               (label.parent_path() / "tokenizer_config.json").string(), w);
  return GgufFile::from_bytes(w.to_bytes(label.string()), label.string());
}

}  // namespace fdl::test
