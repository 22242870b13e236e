// flashdllm/gguf.h — strict, zero-copy reader and a writer for GGUF v2/v3 files.
//
// Spec followed: ggml docs/gguf.md (GGUF v3; v2 differs only in that it is identical on the
// wire for 64-bit counts — v1 with 32-bit counts is rejected). Little-endian files only.
//
// Reader: the file is mmap'ed read-only; tensor data and string values are views into the
// mapping (no copies) and stay valid while the GgufFile lives. Every length, count and offset
// is validated against the file size *before* it is used, so a hostile file can make the
// reader throw but never crash, hang, or allocate more than O(file size) memory.
//
// Validation (all before use): magic; version 2 or 3 (v1 and big-endian files are named as
// such); counts against GgufLimits and against the bytes left in the file; keys of at most
// 65535 bytes (gguf.md) and unique; known value types; BOOL bytes 0/1; arrays nested at most
// 8 deep; general.alignment an integer that is a power of two and a multiple of 8; tensor
// names unique; n_dims 1..4; dims non-zero; element count and byte size free of overflow
// (checked multiplication, element count <= INT64_MAX as ggml uses int64); known ggml type
// with ne[0] a multiple of its block size; data offset a multiple of the alignment; data
// inside the file; no two tensors' data overlapping.
//
// Errors: every failure throws fdl::GgufError whose what() names the file, the byte offset
// and the field, e.g.
//   "model.gguf: offset 530: metadata key #3 'general.name': string value length 5000 runs
//    past end of file (120 bytes left, file size 1024)"
// Getter errors name the key: "model.gguf: metadata key 'llama.block_count' has type STRING,
// expected an unsigned integer".
//
// Thread-safety: concurrent const access is safe. The only mutation is edit_in_place, by which a
// backend rearranges tensor bytes for its kernels at load (the CPU model's weight panels:
// after such a load, those tensors' `data` no longer holds GGUF rows); it must not run
// concurrently with any other access.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "flashdllm/dtype.h"

namespace fdl {

class GgufError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Metadata value types (values are part of the file format).
enum class GgufType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};
std::string_view gguf_type_name(GgufType t);

/// One metadata value. Scalars are decoded; strings and arrays are views into the mapping.
/// For an array, `elem_type` is the element type, `count` the number of elements and
/// `data` points at the first element (for string arrays, at the first length prefix; use
/// GgufFile::array_strings to decode them).
struct GgufValue {
  GgufType type{};
  // scalar payloads (the one matching `type` is set; integers are widened)
  uint64_t u64 = 0;   ///< UINT8/16/32/64 and BOOL
  int64_t i64 = 0;    ///< INT8/16/32/64
  double f64 = 0;     ///< FLOAT32/FLOAT64
  std::string_view str;  ///< STRING
  // ARRAY
  GgufType elem_type{};
  uint64_t count = 0;
  const uint8_t* data = nullptr;
  /// Byte offset of the value in the file (for error messages).
  uint64_t file_offset = 0;
};

/// One entry of the tensor table. Dimensions use ggml order: ne[0] is the innermost
/// (contiguous) dimension; a 2-D weight of ne = {n_in, n_out} has n_out rows of n_in.
struct GgufTensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  uint64_t ne[4] = {1, 1, 1, 1};
  uint32_t type_id = 0;        ///< raw ggml type id (validated as known)
  uint64_t offset = 0;         ///< relative to the start of the data section
  uint64_t n_bytes = 0;        ///< size of the data
  const uint8_t* data = nullptr;  ///< view into the mapping
  GgmlType type() const { return static_cast<GgmlType>(type_id); }
  uint64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
};

/// Sanity limits. Counts above these are rejected as absurd before any allocation (counts
/// that cannot fit in the rest of the file are rejected as well, whatever the limits).
struct GgufLimits {
  uint64_t max_tensors = 1u << 20;
  uint64_t max_kv = 1u << 20;
  uint64_t max_string_bytes = 1ull << 30;  ///< string values, array strings, tensor names
  uint64_t max_array_elems = 1ull << 32;
  uint32_t max_dims = 4;  ///< values above 4 are treated as 4 (ggml's GGML_MAX_DIMS)
};

/// How an opened file's bytes are held in memory.
enum class GgufBacking {
  /// mmap the file read-only: zero copies, pages load lazily and are shared with the page
  /// cache (4 KiB pages).
  Mmap,
  /// Read the whole file into anonymous memory advised for transparent huge pages
  /// (MADV_HUGEPAGE). Costs one read of the file at load time and its size in private
  /// memory, but streaming the weights once per decoded token then takes ~500x fewer TLB
  /// misses: decode of a 134M-parameter F16 model measured ~9% faster on the 2-core CPU
  /// machine (docs/BENCHMARKS.md). Falls back to normal pages where THP is unavailable.
  HugePageCopy,
};

class GgufFile {
 public:
  /// Open and validate `path`, holding its bytes as `backing` says. Throws GgufError (also
  /// for open/stat/mmap/read failures, naming the path and the OS error).
  static GgufFile open(const std::filesystem::path& path, const GgufLimits& limits = {},
                       GgufBacking backing = GgufBacking::Mmap);
  /// Parse an in-memory copy (used by the fuzzer and tests). `name` labels errors.
  static GgufFile from_bytes(std::vector<uint8_t> bytes, std::string name = "<memory>",
                             const GgufLimits& limits = {});

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  ~GgufFile();

  uint32_t version() const;
  /// general.alignment or 32. Files whose general.alignment is not a power of two and a
  /// multiple of 8 (gguf.md) are rejected, so tensor data is at least 8-byte aligned.
  uint64_t alignment() const;
  uint64_t data_offset() const;         ///< file offset of the tensor data section
  uint64_t file_size() const;
  const std::string& path() const;

  /// All metadata keys in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const;
  const GgufValue* find(std::string_view key) const;

  // Typed getters. The `*_or` forms return the default when the key is absent; all forms
  // throw GgufError naming the key when it is present with an incompatible type, or when a
  // required key is missing. Integer getters accept any integer type that fits.
  std::string get_string(std::string_view key) const;
  std::string get_string_or(std::string_view key, std::string def) const;
  uint64_t get_uint(std::string_view key) const;
  uint64_t get_uint_or(std::string_view key, uint64_t def) const;
  int64_t get_int_or(std::string_view key, int64_t def) const;
  double get_float(std::string_view key) const;          ///< FLOAT32/64 (integers accepted)
  double get_float_or(std::string_view key, double def) const;
  bool get_bool_or(std::string_view key, bool def) const;

  /// Decode an array value. Throws GgufError if `key` is missing, not an array, or of
  /// another element type (integer arrays convert between integer widths).
  std::vector<std::string_view> array_strings(std::string_view key) const;
  std::vector<float> array_f32(std::string_view key) const;
  std::vector<int64_t> array_int(std::string_view key) const;
  /// A BOOL array (GgufError also for an element other than 0 or 1).
  std::vector<bool> array_bool(std::string_view key) const;

  const std::vector<GgufTensorInfo>& tensors() const;
  const GgufTensorInfo* find_tensor(std::string_view name) const;  ///< nullptr if absent

  /// Runs `edit` on the `n` held bytes at `p` (within the tensor data) made writable for the
  /// call, for a backend that rearranges a tensor in place into its kernels' layout. Returns
  /// false without running it where the bytes are a zero-copy mapping of the file
  /// (GgufBacking::Mmap: the pages stay shared with the page cache) or cannot be made
  /// writable; the file on disk is never written. Throws std::invalid_argument if
  /// [p, p + n) is not within the tensor data; an exception from `edit` propagates with the
  /// bytes as `edit` left them (read-only again). Not thread-safe: no other thread may access
  /// the file during the call.
  bool edit_in_place(const void* p, size_t n, const std::function<void(uint8_t*)>& edit);
  const GgufTensorInfo& tensor(std::string_view name) const;       ///< throws if absent

 private:
  struct Impl;
  explicit GgufFile(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Writes GGUF v3 files: metadata in insertion order, tensors aligned to `alignment`.
/// Tensor data is streamed to the file; memory use is O(metadata + largest tensor).
/// Throws GgufError on I/O errors (full disk included) and removes the partial file.
/// Keys must be 1..65535 bytes. Copies of a GgufWriter share their state.
/// Thread-safety: none; use one writer from one thread.
class GgufWriter {
 public:
  /// `alignment` must be a power of two and a multiple of 8 (GgufError otherwise).
  explicit GgufWriter(uint64_t alignment = 32);

  void set_uint8(std::string key, uint8_t v);
  void set_int8(std::string key, int8_t v);
  void set_uint16(std::string key, uint16_t v);
  void set_int16(std::string key, int16_t v);
  void set_uint32(std::string key, uint32_t v);
  void set_int32(std::string key, int32_t v);
  void set_uint64(std::string key, uint64_t v);
  void set_int64(std::string key, int64_t v);
  void set_float32(std::string key, float v);
  void set_float64(std::string key, double v);
  void set_bool(std::string key, bool v);
  void set_string(std::string key, std::string v);
  void set_array_strings(std::string key, std::vector<std::string> v);
  void set_array_f32(std::string key, std::vector<float> v);
  void set_array_i32(std::string key, std::vector<int32_t> v);
  void set_array_bool(std::string key, const std::vector<bool>& v);
  /// Copy any value (scalar, string, or array of any element type, nested arrays included)
  /// read by a GgufFile — e.g. to carry tokenizer.ggml.* keys into a new file. `v` must come
  /// from a GgufFile that is still alive (arrays are copied from its mapping right here).
  void set_value(std::string key, const GgufValue& v);
  /// True if `key` has been set (setting it again replaces the value in place).
  bool has_key(std::string_view key) const;

  /// Declare a tensor of ggml type `type` with dims `ne` (ggml order). `fill` is called once
  /// at write time with a buffer of exactly the tensor's byte size to fill; it must write
  /// every byte (the buffer is reused between tensors, so its initial contents are
  /// unspecified). Tensors are written in declaration order.
  /// Throws GgufError for an empty or duplicate name, a name of 64+ bytes (ggml's limit),
  /// 0 or more than 4 dims, a zero dim, an unknown type, ne[0] not a multiple of the type's
  /// block size, or a byte size that overflows.
  using Filler = std::function<void(std::span<uint8_t>)>;
  void add_tensor(std::string name, GgmlType type, std::vector<uint64_t> ne, Filler fill);

  /// Write everything to `path` atomically: a temporary file in the same directory is
  /// written, fsync'ed and renamed over `path`. On any failure (open, write — full disk
  /// included —, fsync, rename) throws GgufError naming the path, the byte offset reached and
  /// the OS error, and removes the temporary file; `path` is then left untouched. An
  /// exception thrown by a Filler is propagated after the same cleanup.
  /// When the writer's alignment is not 32, `general.alignment` is added automatically.
  void write(const std::filesystem::path& path) const;
  /// The same file as bytes in memory (GgufFile::from_bytes reads them), the tensors filled
  /// in place; `label` names the file in error messages. Throws as write() does, except for
  /// I/O (std::bad_alloc when the file does not fit in memory).
  std::vector<uint8_t> to_bytes(const std::string& label = "<memory>") const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace fdl
