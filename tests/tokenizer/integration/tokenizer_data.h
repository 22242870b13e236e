// Helpers for the tokenizer integration tests: loading the shared GGUF vocabularies once
// per test binary, and reading the shared reference files.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "flashdllm/gguf.h"
#include "flashdllm/tokenizer.h"
#include "test_support.h"

namespace fdl::test {

inline std::filesystem::path vocab_fixture_path(const std::string& name) {
  return shared_dir() / "llama-cpp-vocab-fixtures" / ("ggml-vocab-" + name + ".gguf");
}

/// Tokenizer of a GGUF file, loaded once per process (loading is the slow part).
inline const Tokenizer& shared_tokenizer(const std::filesystem::path& path) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[path.string()];
  if (!slot) {
    if (!std::filesystem::exists(path)) throw std::runtime_error("missing test data: " + path.string());
    const GgufFile f = GgufFile::open(path);
    slot = Tokenizer::from_gguf(f);
  }
  return *slot;
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// Python-style rendering of bytes decoded as UTF-8 with errors="backslashreplace"
/// (how the reference files spell pieces that are not valid UTF-8).
std::string backslash_replace(const std::string& bytes);

}  // namespace fdl::test
