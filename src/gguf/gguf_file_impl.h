// Internal: the state behind fdl::GgufFile, shared by the parser (gguf_reader.cpp) and the
// typed getters (gguf_getters.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "flashdllm/gguf.h"

namespace fdl {

struct GgufFile::Impl {
  std::string path;  ///< label used in every error message
  // Backing storage: exactly one of `mapping` (mmap'ed file) or `owned` (from_bytes) is used.
  void* mapping = nullptr;
  uint64_t mapping_size = 0;
  bool mapping_is_copy = false;  ///< `mapping` holds a private copy (GgufBacking::HugePageCopy)
  std::vector<uint8_t> owned;
  const uint8_t* base = nullptr;
  uint64_t size = 0;

  uint32_t version = 0;
  uint64_t alignment = 0;
  uint64_t data_offset = 0;

  std::vector<std::pair<std::string, GgufValue>> metadata;
  std::map<std::string, size_t, std::less<>> key_index;  ///< key -> index in `metadata`
  std::vector<GgufTensorInfo> tensors;
  std::map<std::string, size_t, std::less<>> tensor_index;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl();

  /// Parse and validate [base, base+size). Fills every field above; throws GgufError.
  void parse(const GgufLimits& limits);
  class Parser;  ///< the one-pass validating parser (gguf_reader.cpp)

  /// Throws "<path>: metadata key '<key>' ..." errors for the getters.
  [[noreturn]] void key_error(std::string_view key, const std::string& msg) const;
  /// The value of `key`, or throws "required metadata key ... is missing".
  const GgufValue& require_key(std::string_view key) const;
};

}  // namespace fdl
