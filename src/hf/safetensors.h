// hf/safetensors.h — strict, zero-copy reader for safetensors files and checkpoint directories.
//
// Format followed: https://github.com/huggingface/safetensors (README, "Format"). A file is
//   8 bytes   N, a little-endian u64: the size of the header
//   N bytes   a UTF-8 JSON object (may be padded at the end with spaces)
//   rest      the byte buffer holding every tensor's data
// Each header entry except "__metadata__" is
//   "<name>": {"dtype": "F16", "shape": [8192, 384], "data_offsets": [begin, end]}
// with begin/end byte offsets relative to the start of the byte buffer (end exclusive).
// "__metadata__", if present, is an object of string -> string.
//
// Units: `shape` is row-major with the outermost dimension first, exactly as in the file (the
// reverse of ggml's ne order); an empty shape is a scalar (one element); a zero dimension is a
// tensor of no elements and no bytes. `dtype` is the header's string; known dtypes and their
// widths in bits: BOOL U8 I8 F8_E5M2 F8_E4M3 F8_E8M0 (8), I16 U16 F16 BF16 (16), I32 U32 F32
// (32), I64 U64 F64 C64 (64), F4 (4), F6_E2M3 F6_E3M2 (6). Sub-byte dtypes must fill whole
// bytes. Tensor data is little-endian, a view into the mapping (no copies), valid while the
// SafetensorsFile lives. Data pointers carry no alignment guarantee beyond what the writer
// chose (the reference writer pads the header so that offsets keep 8-byte alignment).
//
// Validation (all before any tensor is exposed): file of at least 8 bytes; 0 < N <= 100 MiB
// and N within the file; the header valid UTF-8 JSON, an object, nested at most as deep as the
// format needs, without duplicate keys; every entry an object with a string dtype from the
// list above, a shape of at most 8 non-negative integers, and data_offsets of exactly two
// non-negative integers with begin <= end <= buffer size; element count and byte size free of
// overflow (checked multiplication); end - begin equal to the dtype x shape byte size; no two
// tensors overlapping; the byte buffer fully covered by tensors (the spec forbids holes and
// trailing bytes, which would let a file carry a second, hidden payload); "__metadata__" an
// object of strings; no empty tensor name. Unknown keys inside an entry are ignored, as the
// reference implementation does. A hostile file makes the reader throw, never crash, hang, or
// allocate more than O(file size) memory.
//
// Errors: every failure throws fdl::hf::SafetensorsError with a one-line what() naming the
// file, the tensor (where there is one) and the problem, e.g.
//   "model.safetensors: tensor 'model.embed_tokens.weight': data_offsets [0, 100] hold 100
//    bytes, but F16 [8192, 384] needs 6291456"
// Open failures (missing file, a directory, permissions, mmap) name the path and OS error.
//
// Checkpoint directories (SafetensorsCheckpoint): `model.safetensors.index.json` with a
// "weight_map" of tensor name -> shard file name, else a single `model.safetensors`. Shard
// names must be plain file names inside the directory; every tensor the index lists must be in
// the shard it names, and no tensor name may appear in two shards.
//
// Thread-safety: SafetensorsFile and SafetensorsCheckpoint are immutable after construction;
// concurrent const access is safe.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace fdl::hf {

class SafetensorsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One tensor of a safetensors file.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;               ///< as in the header: "F16", "BF16", "F32", ...
  std::vector<uint64_t> shape;     ///< row-major, outermost first (as in the file)
  const uint8_t* data = nullptr;   ///< view into the mapping (n_bytes long)
  uint64_t n_bytes = 0;
  /// Product of `shape` (1 for a scalar); validated not to overflow.
  uint64_t n_elements() const;
};

/// Width in bits of a safetensors dtype string, or 0 if the dtype is unknown.
uint32_t safetensors_dtype_bits(std::string_view dtype);

class SafetensorsFile {
 public:
  /// mmap `path` read-only and validate it. Throws SafetensorsError.
  static SafetensorsFile open(const std::filesystem::path& path);
  /// Validate an in-memory copy (tests, fuzzing). `name` labels errors.
  static SafetensorsFile from_bytes(std::vector<uint8_t> bytes, std::string name = "<memory>");

  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  /// The path given to open(), or the name given to from_bytes().
  const std::string& path() const;
  /// Every tensor, sorted by data offset (JSON objects do not preserve the writer's order;
  /// offset order is the order of the bytes in the file).
  const std::vector<SafetensorsTensor>& tensors() const;
  /// The tensor called `name`, or nullptr if absent.
  const SafetensorsTensor* find(std::string_view name) const;
  /// The "__metadata__" object (empty if the file has none).
  const std::map<std::string, std::string>& metadata() const;

 private:
  struct Impl;
  explicit SafetensorsFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// A checkpoint directory: `model.safetensors`, or the shards listed by
/// `model.safetensors.index.json` ("weight_map": tensor name -> file name). Tensors listed
/// nowhere in the index but present in a listed shard are still found.
class SafetensorsCheckpoint {
 public:
  /// Open every shard of `dir` once. Throws SafetensorsError naming the offending path.
  static SafetensorsCheckpoint open(const std::filesystem::path& dir);

  SafetensorsCheckpoint(SafetensorsCheckpoint&&) noexcept;
  SafetensorsCheckpoint& operator=(SafetensorsCheckpoint&&) noexcept;
  SafetensorsCheckpoint(const SafetensorsCheckpoint&) = delete;
  SafetensorsCheckpoint& operator=(const SafetensorsCheckpoint&) = delete;
  ~SafetensorsCheckpoint();

  /// The tensor called `name` in whichever shard holds it, or nullptr if absent.
  const SafetensorsTensor* find(std::string_view name) const;
  /// Every tensor of every shard, sorted by name.
  std::vector<const SafetensorsTensor*> tensors() const;
  const std::filesystem::path& dir() const;
  /// The opened shards, in file-name order.
  const std::vector<SafetensorsFile>& shards() const;

 private:
  SafetensorsCheckpoint() = default;
  std::filesystem::path dir_;
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, const SafetensorsTensor*, std::less<>> by_name_;
};

}  // namespace fdl::hf
