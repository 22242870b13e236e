// Internal: GGUF wire-format constants and a bounds-checked little-endian cursor shared by the
// reader and the writer. Not part of the public API.
//
// Wire format (ggml docs/gguf.md, v3): header {u32 magic "GGUF", u32 version, u64 n_tensors,
// u64 n_kv}, then n_kv {string key, u32 type, value}, then n_tensors {string name, u32 n_dims,
// u64 ne[n_dims], u32 ggml type, u64 offset}, padding to `general.alignment`, tensor data.
// A string is {u64 length, bytes (no NUL)}; an array is {u32 elem type, u64 count, elems}.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "flashdllm/gguf.h"

namespace fdl::gguf_detail {

static_assert(std::endian::native == std::endian::little,
              "flashdllm reads GGUF by memcpy and needs a little-endian host");

inline constexpr uint32_t kMagic = 0x46554747u;  // bytes 'G' 'G' 'U' 'F' read as LE u32
inline constexpr uint32_t kWriteVersion = 3;
inline constexpr uint64_t kDefaultAlignment = 32;
inline constexpr uint64_t kMaxKeyBytes = 65535;  // gguf.md: keys are at most 2^16-1 bytes
inline constexpr std::string_view kAlignmentKey = "general.alignment";

/// Largest metadata type id (FLOAT64 = 12).
inline constexpr uint32_t kMaxTypeId = 12;

/// Bytes of a fixed-size scalar type; 0 for STRING/ARRAY (variable size). `t` must be known.
constexpr uint64_t scalar_size(GgufType t) {
  switch (t) {
    case GgufType::UINT8: case GgufType::INT8: case GgufType::BOOL: return 1;
    case GgufType::UINT16: case GgufType::INT16: return 2;
    case GgufType::UINT32: case GgufType::INT32: case GgufType::FLOAT32: return 4;
    case GgufType::UINT64: case GgufType::INT64: case GgufType::FLOAT64: return 8;
    case GgufType::STRING: case GgufType::ARRAY: return 0;
  }
  return 0;
}

/// Smallest number of bytes one element of type `t` can occupy on the wire (used to reject
/// counts that cannot possibly fit in the rest of the file before looping over them).
constexpr uint64_t min_wire_size(GgufType t) {
  if (t == GgufType::STRING) return 8;       // u64 length
  if (t == GgufType::ARRAY) return 4 + 8;    // elem type + count
  return scalar_size(t);
}

constexpr bool is_integer(GgufType t) {
  switch (t) {
    case GgufType::UINT8: case GgufType::INT8: case GgufType::UINT16: case GgufType::INT16:
    case GgufType::UINT32: case GgufType::INT32: case GgufType::UINT64: case GgufType::INT64:
      return true;
    default:
      return false;
  }
}

constexpr bool is_signed_integer(GgufType t) {
  return t == GgufType::INT8 || t == GgufType::INT16 || t == GgufType::INT32 ||
         t == GgufType::INT64;
}

/// gguf.md: general.alignment "must be a multiple of 8"; being a power of two as well keeps
/// align_up a mask. Alignment >= 8 also guarantees natural alignment of F16/F32/F64 tensor
/// data (the mapping itself is page-aligned), so typed loads from tensor views are valid.
constexpr bool valid_alignment(uint64_t a) { return a >= 8 && (a & (a - 1)) == 0; }

/// a * b, or nullopt on uint64 overflow.
inline std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}
inline std::optional<uint64_t> checked_add(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}
/// Round `v` up to a multiple of `align` (a power of two), or nullopt on overflow.
inline std::optional<uint64_t> align_up(uint64_t v, uint64_t align) {
  auto sum = checked_add(v, align - 1);
  if (!sum) return std::nullopt;
  return *sum & ~(align - 1);
}

/// Builds "<file>: offset <N>: <message>" — the one error format of the reader.
[[noreturn]] inline void fail(const std::string& file, uint64_t offset, const std::string& msg) {
  throw GgufError(file + ": offset " + std::to_string(offset) + ": " + msg);
}

/// Bounds-checked reader over an immutable byte range. Every read first checks that the bytes
/// exist, so a truncated file throws a message naming the field being read (`context` +
/// field name) instead of reading past the buffer.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size, const std::string& file)
      : base_(base), size_(size), file_(file) {}

  uint64_t pos() const { return pos_; }
  uint64_t size() const { return size_; }
  uint64_t remaining() const { return size_ - pos_; }
  const uint8_t* here() const { return base_ + pos_; }
  const std::string& file() const { return file_; }

  /// What is being parsed, e.g. "metadata key #3 'general.name'", prefixed to messages.
  std::string context;

  [[noreturn]] void fail_at(uint64_t offset, const std::string& msg) const {
    fail(file_, offset, context.empty() ? msg : context + ": " + msg);
  }

  void require(uint64_t n, std::string_view field, std::string_view suffix = {}) const {
    if (n > remaining())
      fail_at(pos_, std::string(field) + std::string(suffix) + " needs " + std::to_string(n) +
                        " bytes but the file ends after " + std::to_string(remaining()) +
                        " (truncated file, size " + std::to_string(size_) + ")");
  }

  template <class T>
  T read(std::string_view field) {
    require(sizeof(T), field);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  void skip(uint64_t n, std::string_view field) {
    require(n, field);
    pos_ += n;
  }

  /// A GGUF string: u64 length then bytes. Rejects lengths above `max_len` before touching
  /// the bytes, and lengths running past the end of the file.
  std::string_view read_string(std::string_view field, uint64_t max_len) {
    const uint64_t at = pos_;
    require(8, field, " length");
    uint64_t len;
    std::memcpy(&len, base_ + pos_, 8);
    pos_ += 8;
    if (len > max_len)
      fail_at(at, std::string(field) + " length " + std::to_string(len) + " exceeds the limit of " +
                      std::to_string(max_len) + " bytes");
    if (len > remaining())
      fail_at(at, std::string(field) + " length " + std::to_string(len) +
                      " runs past end of file (" + std::to_string(remaining()) +
                      " bytes left, file size " + std::to_string(size_) + ")");
    std::string_view s(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return s;
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  const std::string& file_;
};

}  // namespace fdl::gguf_detail
