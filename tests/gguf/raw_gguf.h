// Test helper: assemble GGUF bytes field by field, so tests can build files that are valid
// except for one deliberate defect (something GgufWriter refuses to produce).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "flashdllm/gguf.h"

namespace fdl::test {

class RawGguf {
 public:
  std::vector<uint8_t> bytes;

  RawGguf& raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + n);
    return *this;
  }
  RawGguf& u8(uint8_t v) { return raw(&v, 1); }
  RawGguf& u32(uint32_t v) { return raw(&v, 4); }
  RawGguf& u64(uint64_t v) { return raw(&v, 8); }
  RawGguf& f32(float v) { return raw(&v, 4); }
  RawGguf& str(std::string_view s) { return u64(s.size()).raw(s.data(), s.size()); }
  RawGguf& type(GgufType t) { return u32(static_cast<uint32_t>(t)); }
  RawGguf& zeros(size_t n) {
    bytes.resize(bytes.size() + n, 0);
    return *this;
  }
  RawGguf& pad_to(uint64_t alignment) {
    while (bytes.size() % alignment) bytes.push_back(0);
    return *this;
  }

  /// Magic, version and the two counts.
  RawGguf& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return u32(0x46554747u).u32(version).u64(n_tensors).u64(n_kv);
  }
  RawGguf& kv_u32(std::string_view key, uint32_t v) { return str(key).type(GgufType::UINT32).u32(v); }
  RawGguf& kv_str(std::string_view key, std::string_view v) {
    return str(key).type(GgufType::STRING).str(v);
  }
  /// A tensor-info entry.
  RawGguf& tensor(std::string_view name, const std::vector<uint64_t>& ne, GgmlType t, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) u64(d);
    return u32(static_cast<uint32_t>(t)).u64(offset);
  }

  size_t size() const { return bytes.size(); }
};

/// The GgufError message from parsing `bytes` (labelled "t.gguf"), or "<parsed>" if it parsed.
inline std::string parse_error(const std::vector<uint8_t>& bytes, const GgufLimits& limits = {}) {
  try {
    GgufFile::from_bytes(bytes, "t.gguf", limits);
  } catch (const GgufError& e) {
    return e.what();
  }
  return "<parsed>";
}

}  // namespace fdl::test
