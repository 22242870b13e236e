// GGUF parsing and validation (ggml docs/gguf.md, versions 2 and 3).
//
// The parser walks the file once with a bounds-checked cursor. Counts read from the file are
// compared with GgufLimits and with the bytes left in the file *before* anything is reserved,
// so memory stays O(file size) and the walk ends after at most O(file size) steps: every
// element consumes at least one byte, and nesting depth is capped.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <utility>

#include "gguf/gguf_file_impl.h"
#include "gguf/gguf_wire.h"

namespace fdl {

using gguf_detail::checked_add;
using gguf_detail::checked_mul;
using gguf_detail::Cursor;

namespace {

// Nested arrays (arrays of arrays) are legal GGUF but rare; the cap bounds recursion depth so
// a hostile file of nested headers cannot exhaust the stack.
constexpr uint32_t kMaxArrayNesting = 8;

std::string hex32(uint32_t v) {
  static const char* digits = "0123456789abcdef";
  std::string s = "0x";
  for (int i = 7; i >= 0; --i) s += digits[(v >> (i * 4)) & 0xf];
  return s;
}

std::string printable4(uint32_t v) {
  std::string s;
  for (int i = 0; i < 4; ++i) {
    const char c = static_cast<char>((v >> (i * 8)) & 0xff);
    s += (c >= 0x20 && c < 0x7f) ? c : '.';
  }
  return s;
}

GgufType read_type(Cursor& cur, std::string_view field) {
  const uint64_t at = cur.pos();
  const uint32_t raw = cur.read<uint32_t>(field);
  if (raw > gguf_detail::kMaxTypeId)
    cur.fail_at(at, std::string(field) + " " + std::to_string(raw) +
                        " is not a known GGUF metadata value type (0..12)");
  return static_cast<GgufType>(raw);
}

}  // namespace

class GgufFile::Impl::Parser {
 public:
  Parser(GgufFile::Impl& f, const GgufLimits& limits)
      : f_(f), lim_(limits), cur_(f.base, f.size, f.path) {}

  void run() {
    read_header();
    read_metadata();
    resolve_alignment();
    read_tensor_infos();
    place_tensors();
  }

 private:
  void read_header() {
    if (f_.size < 4)
      cur_.fail_at(0, "file is " + std::to_string(f_.size) +
                          " bytes, too short for the GGUF magic (truncated or not a GGUF file)");
    const uint32_t magic = cur_.read<uint32_t>("magic");
    if (magic != gguf_detail::kMagic)
      cur_.fail_at(0, "bad magic " + hex32(magic) + " ('" + printable4(magic) +
                          "'), expected 'GGUF': not a GGUF file");
    const uint32_t version = cur_.read<uint32_t>("version");
    if (version == 1)
      cur_.fail_at(4, "GGUF version 1 is not supported (it uses 32-bit counts); supported: 2, 3");
    if (version != 2 && version != 3) {
      const uint32_t swapped = __builtin_bswap32(version);
      std::string hint = (swapped >= 1 && swapped <= 3)
                             ? " (this looks like a big-endian GGUF; only little-endian is supported)"
                             : "";
      cur_.fail_at(4, "unsupported GGUF version " + std::to_string(version) +
                          " (supported: 2, 3)" + hint);
    }
    f_.version = version;
    n_tensors_at_ = cur_.pos();
    n_tensors_ = cur_.read<uint64_t>("tensor count");
    n_kv_at_ = cur_.pos();
    n_kv_ = cur_.read<uint64_t>("metadata count");
    if (n_tensors_ > lim_.max_tensors)
      cur_.fail_at(n_tensors_at_, "tensor count " + std::to_string(n_tensors_) +
                                      " exceeds the limit of " + std::to_string(lim_.max_tensors));
    if (n_kv_ > lim_.max_kv)
      cur_.fail_at(n_kv_at_, "metadata count " + std::to_string(n_kv_) + " exceeds the limit of " +
                                 std::to_string(lim_.max_kv));
    // Smallest possible entries: key (8-byte length) + type (4) + 1-byte value; tensor info:
    // name length (8) + n_dims (4) + one dim (8) + type (4) + offset (8).
    check_fits(n_kv_at_, "metadata count", n_kv_, 13);
    check_fits(n_tensors_at_, "tensor count", n_tensors_, 32);
  }

  void check_fits(uint64_t at, std::string_view what, uint64_t count, uint64_t min_each) {
    auto need = checked_mul(count, min_each);
    if (!need || *need > cur_.remaining())
      cur_.fail_at(at, std::string(what) + " " + std::to_string(count) + " cannot fit in the " +
                           std::to_string(cur_.remaining()) + " bytes left in the file (size " +
                           std::to_string(f_.size) + ")");
  }

  void read_metadata() {
    f_.metadata.reserve(n_kv_);  // bounded by check_fits above
    for (uint64_t i = 0; i < n_kv_; ++i) {
      const uint64_t entry_at = cur_.pos();
      cur_.context = "metadata key #" + std::to_string(i);
      std::string key(cur_.read_string("key", gguf_detail::kMaxKeyBytes));
      cur_.context += " '" + key + "'";
      if (auto it = f_.key_index.find(key); it != f_.key_index.end())
        cur_.fail_at(entry_at, "duplicate metadata key (first defined at offset " +
                                   std::to_string(f_.metadata[it->second].second.file_offset) + ")");
      const GgufType type = read_type(cur_, "value type");
      GgufValue v;
      v.type = type;
      v.file_offset = entry_at;
      read_value(v, 0);
      f_.key_index.emplace(key, f_.metadata.size());
      f_.metadata.emplace_back(std::move(key), v);
    }
    cur_.context.clear();
  }

  /// Decode the value of `v.type` at the cursor into `v` (arrays: element type, count, view).
  void read_value(GgufValue& v, uint32_t depth) {
    switch (v.type) {
      case GgufType::UINT8: v.u64 = cur_.read<uint8_t>("UINT8 value"); return;
      case GgufType::INT8: v.i64 = cur_.read<int8_t>("INT8 value"); return;
      case GgufType::UINT16: v.u64 = cur_.read<uint16_t>("UINT16 value"); return;
      case GgufType::INT16: v.i64 = cur_.read<int16_t>("INT16 value"); return;
      case GgufType::UINT32: v.u64 = cur_.read<uint32_t>("UINT32 value"); return;
      case GgufType::INT32: v.i64 = cur_.read<int32_t>("INT32 value"); return;
      case GgufType::UINT64: v.u64 = cur_.read<uint64_t>("UINT64 value"); return;
      case GgufType::INT64: v.i64 = cur_.read<int64_t>("INT64 value"); return;
      case GgufType::FLOAT32: v.f64 = cur_.read<float>("FLOAT32 value"); return;
      case GgufType::FLOAT64: v.f64 = cur_.read<double>("FLOAT64 value"); return;
      case GgufType::BOOL: {
        const uint64_t at = cur_.pos();
        const uint8_t b = cur_.read<uint8_t>("BOOL value");
        if (b > 1) cur_.fail_at(at, "BOOL value " + std::to_string(b) + " is not 0 or 1");
        v.u64 = b;
        return;
      }
      case GgufType::STRING: v.str = cur_.read_string("string value", lim_.max_string_bytes); return;
      case GgufType::ARRAY: read_array(v, depth); return;
    }
  }

  void read_array(GgufValue& v, uint32_t depth) {
    const uint64_t at = cur_.pos();
    v.elem_type = read_type(cur_, "array element type");
    const uint64_t count_at = cur_.pos();
    v.count = cur_.read<uint64_t>("array length");
    if (v.count > lim_.max_array_elems)
      cur_.fail_at(count_at, "array length " + std::to_string(v.count) + " exceeds the limit of " +
                                 std::to_string(lim_.max_array_elems));
    const uint64_t min_each = gguf_detail::min_wire_size(v.elem_type);
    auto min_bytes = checked_mul(v.count, min_each);
    if (!min_bytes || *min_bytes > cur_.remaining())
      cur_.fail_at(count_at, "array of " + std::to_string(v.count) + " " +
                                 std::string(gguf_type_name(v.elem_type)) + " runs past end of file (" +
                                 std::to_string(cur_.remaining()) + " bytes left, file size " +
                                 std::to_string(f_.size) + ")");
    v.data = cur_.here();
    if (v.elem_type == GgufType::STRING) {
      for (uint64_t j = 0; j < v.count; ++j) cur_.read_string("array string", lim_.max_string_bytes);
    } else if (v.elem_type == GgufType::ARRAY) {
      if (depth + 1 >= kMaxArrayNesting)
        cur_.fail_at(at, "arrays nested deeper than " + std::to_string(kMaxArrayNesting) + " levels");
      for (uint64_t j = 0; j < v.count; ++j) {
        GgufValue inner;
        inner.type = GgufType::ARRAY;
        read_array(inner, depth + 1);
      }
    } else {
      cur_.skip(*min_bytes, "array data");  // fixed-size elements: checked above
      if (v.elem_type == GgufType::BOOL) {
        for (uint64_t j = 0; j < v.count; ++j)
          if (v.data[j] > 1)
            cur_.fail_at(count_at + 8 + j, "BOOL array element #" + std::to_string(j) + " is " +
                                               std::to_string(v.data[j]) + ", not 0 or 1");
      }
    }
  }

  void resolve_alignment() {
    f_.alignment = gguf_detail::kDefaultAlignment;
    auto it = f_.key_index.find(gguf_detail::kAlignmentKey);
    if (it == f_.key_index.end()) return;
    const GgufValue& v = f_.metadata[it->second].second;
    const std::string where = "metadata key 'general.alignment'";
    if (!gguf_detail::is_integer(v.type))
      gguf_detail::fail(f_.path, v.file_offset, where + " has type " +
                                                    std::string(gguf_type_name(v.type)) +
                                                    ", expected UINT32");
    if (gguf_detail::is_signed_integer(v.type) && v.i64 <= 0)
      gguf_detail::fail(f_.path, v.file_offset, where + " is " + std::to_string(v.i64) +
                                                    ", must be a power of two and a multiple of 8");
    const uint64_t a = gguf_detail::is_signed_integer(v.type) ? static_cast<uint64_t>(v.i64) : v.u64;
    if (!gguf_detail::valid_alignment(a))
      gguf_detail::fail(f_.path, v.file_offset, where + " is " + std::to_string(a) +
                                                    ", must be a power of two and a multiple of 8");
    f_.alignment = a;
  }

  void read_tensor_infos() {
    check_fits(n_tensors_at_, "tensor count", n_tensors_, 32);  // re-check after metadata
    f_.tensors.reserve(n_tensors_);
    info_offsets_.reserve(n_tensors_);
    for (uint64_t i = 0; i < n_tensors_; ++i) {
      const uint64_t entry_at = cur_.pos();
      cur_.context = "tensor #" + std::to_string(i);
      GgufTensorInfo t;
      t.name = std::string(cur_.read_string("name", lim_.max_string_bytes));
      cur_.context += " '" + t.name + "'";
      if (auto it = f_.tensor_index.find(t.name); it != f_.tensor_index.end())
        cur_.fail_at(entry_at, "duplicate tensor name (first defined at offset " +
                                   std::to_string(info_offsets_[it->second]) + ")");
      const uint64_t dims_at = cur_.pos();
      t.n_dims = cur_.read<uint32_t>("n_dims");
      if (t.n_dims == 0 || t.n_dims > lim_.max_dims || t.n_dims > 4)
        cur_.fail_at(dims_at, "n_dims " + std::to_string(t.n_dims) + " is out of range 1.." +
                                  std::to_string(std::min<uint32_t>(lim_.max_dims, 4)));
      uint64_t n_elements = 1;
      for (uint32_t d = 0; d < t.n_dims; ++d) {
        const uint64_t ne_at = cur_.pos();
        t.ne[d] = cur_.read<uint64_t>("ne[" + std::to_string(d) + "]");
        if (t.ne[d] == 0)
          cur_.fail_at(ne_at, "dimension ne[" + std::to_string(d) + "] is 0");
        auto prod = checked_mul(n_elements, t.ne[d]);
        // ggml counts elements in int64_t, so anything above INT64_MAX is unrepresentable.
        if (!prod || *prod > static_cast<uint64_t>(INT64_MAX))
          cur_.fail_at(ne_at, "element count overflows at ne[" + std::to_string(d) + "] = " +
                                  std::to_string(t.ne[d]));
        n_elements = *prod;
      }
      const uint64_t type_at = cur_.pos();
      t.type_id = cur_.read<uint32_t>("type");
      const auto traits = ggml_type_traits(t.type_id);
      if (!traits)
        cur_.fail_at(type_at, "unknown tensor type id " + std::to_string(t.type_id));
      if (t.ne[0] % traits->block_size != 0)
        cur_.fail_at(dims_at, "ne[0] = " + std::to_string(t.ne[0]) + " is not a multiple of the " +
                                  std::string(traits->name) + " block size " +
                                  std::to_string(traits->block_size));
      auto bytes = checked_mul(n_elements / traits->block_size, traits->type_size);
      if (!bytes)
        cur_.fail_at(dims_at, "byte size of " + std::to_string(n_elements) + " " +
                                  std::string(traits->name) + " elements overflows");
      t.n_bytes = *bytes;
      const uint64_t off_at = cur_.pos();
      t.offset = cur_.read<uint64_t>("data offset");
      if (t.offset % f_.alignment != 0)
        cur_.fail_at(off_at, "data offset " + std::to_string(t.offset) +
                                 " is not a multiple of the alignment " +
                                 std::to_string(f_.alignment));
      f_.tensor_index.emplace(t.name, f_.tensors.size());
      info_offsets_.push_back(entry_at);
      f_.tensors.push_back(std::move(t));
    }
    cur_.context.clear();
  }

  void place_tensors() {
    auto data_offset = gguf_detail::align_up(cur_.pos(), f_.alignment);
    if (!data_offset)
      cur_.fail_at(cur_.pos(), "data section offset overflows with alignment " +
                                   std::to_string(f_.alignment));
    f_.data_offset = *data_offset;
    const uint64_t data_bytes = f_.size >= f_.data_offset ? f_.size - f_.data_offset : 0;
    for (size_t i = 0; i < f_.tensors.size(); ++i) {
      GgufTensorInfo& t = f_.tensors[i];
      auto end = checked_add(t.offset, t.n_bytes);
      if (f_.data_offset > f_.size || !end || *end > data_bytes)
        gguf_detail::fail(f_.path, info_offsets_[i],
                          "tensor #" + std::to_string(i) + " '" + t.name + "': data [" +
                              std::to_string(t.offset) + ", +" + std::to_string(t.n_bytes) +
                              ") runs past end of file (data section starts at " +
                              std::to_string(f_.data_offset) + ", file size " +
                              std::to_string(f_.size) + ")");
      t.data = f_.base + f_.data_offset + t.offset;
    }
    // Overlap: sort by data offset; each tensor must start at or after the previous one ends.
    std::vector<size_t> order(f_.tensors.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return f_.tensors[a].offset < f_.tensors[b].offset;
    });
    for (size_t k = 1; k < order.size(); ++k) {
      const GgufTensorInfo& prev = f_.tensors[order[k - 1]];
      const GgufTensorInfo& cur = f_.tensors[order[k]];
      if (cur.offset < prev.offset + prev.n_bytes)
        gguf_detail::fail(f_.path, info_offsets_[order[k]],
                          "tensor #" + std::to_string(order[k]) + " '" + cur.name + "': data [" +
                              std::to_string(cur.offset) + ", +" + std::to_string(cur.n_bytes) +
                              ") overlaps tensor '" + prev.name + "' [" +
                              std::to_string(prev.offset) + ", +" + std::to_string(prev.n_bytes) +
                              ")");
    }
  }

  GgufFile::Impl& f_;
  const GgufLimits& lim_;
  Cursor cur_;
  uint64_t n_tensors_ = 0, n_kv_ = 0;
  uint64_t n_tensors_at_ = 0, n_kv_at_ = 0;
  std::vector<uint64_t> info_offsets_;  ///< file offset of each tensor-info entry
};

GgufFile::Impl::~Impl() {
  if (mapping) ::munmap(mapping, mapping_size);
}

void GgufFile::Impl::parse(const GgufLimits& limits) { Parser(*this, limits).run(); }

namespace {

// Reads `size` bytes of `fd` into fresh anonymous memory advised for transparent huge pages;
// returns the mapping and its (2 MiB-rounded) length. Throws GgufError naming `path`.
std::pair<void*, uint64_t> read_into_huge_pages(int fd, uint64_t size, const std::string& path) {
  constexpr uint64_t kHugePage = uint64_t(2) << 20;
  const uint64_t length = (size + kHugePage - 1) / kHugePage * kHugePage;
  void* p = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw GgufError(path + ": cannot allocate " + std::to_string(length) +
                    " bytes to load the file: " + std::strerror(errno));
  ::madvise(p, length, MADV_HUGEPAGE);  // advisory: without THP the copy still works
  uint64_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, static_cast<char*>(p) + done, size - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ::munmap(p, length);
      throw GgufError(path + ": read failed at offset " + std::to_string(done) + ": " +
                      (err ? std::strerror(err) : "unexpected end of file"));
    }
    done += static_cast<uint64_t>(n);
  }
  ::mprotect(p, length, PROT_READ);  // read-only except during edit_in_place
  return {p, length};
}

}  // namespace

GgufFile GgufFile::open(const std::filesystem::path& path, const GgufLimits& limits,
                        GgufBacking backing) {
  auto impl = std::make_unique<Impl>();
  impl->path = path.string();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw GgufError(impl->path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw GgufError(impl->path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw GgufError(impl->path + ": not a regular file");
  }
  impl->size = static_cast<uint64_t>(st.st_size);
  if (impl->size > 0 && backing == GgufBacking::HugePageCopy) {
    try {
      auto [p, length] = read_into_huge_pages(fd, impl->size, impl->path);
      impl->mapping = p;
      impl->mapping_size = length;
      impl->mapping_is_copy = true;
      impl->base = static_cast<const uint8_t*>(p);
    } catch (...) {
      ::close(fd);
      throw;
    }
  } else if (impl->size > 0) {
    void* p = ::mmap(nullptr, impl->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw GgufError(impl->path + ": cannot mmap " + std::to_string(impl->size) +
                      " bytes: " + std::strerror(err));
    }
    impl->mapping = p;
    impl->mapping_size = impl->size;
    impl->base = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
  impl->parse(limits);
  return GgufFile(std::move(impl));
}

GgufFile GgufFile::from_bytes(std::vector<uint8_t> bytes, std::string name,
                              const GgufLimits& limits) {
  auto impl = std::make_unique<Impl>();
  impl->path = std::move(name);
  impl->owned = std::move(bytes);
  impl->base = impl->owned.data();
  impl->size = impl->owned.size();
  impl->parse(limits);
  return GgufFile(std::move(impl));
}

GgufFile::GgufFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

uint32_t GgufFile::version() const { return impl_->version; }
uint64_t GgufFile::alignment() const { return impl_->alignment; }
uint64_t GgufFile::data_offset() const { return impl_->data_offset; }
uint64_t GgufFile::file_size() const { return impl_->size; }
const std::string& GgufFile::path() const { return impl_->path; }

bool GgufFile::edit_in_place(const void* p, size_t n, const std::function<void(uint8_t*)>& edit) {
  // Addresses compared as integers: `p` may point anywhere, not only into the file's bytes.
  const auto at = reinterpret_cast<uintptr_t>(p);
  const auto data = reinterpret_cast<uintptr_t>(impl_->base + impl_->data_offset);
  const auto end = reinterpret_cast<uintptr_t>(impl_->base + impl_->size);
  if (at < data || at > end || n > end - at)
    throw std::invalid_argument(impl_->path + ": edit_in_place: the bytes are not within the tensor data");
  auto* bytes = const_cast<uint8_t*>(static_cast<const uint8_t*>(p));  // the held copy is ours (a file mapping is refused below)
  if (!impl_->owned.empty()) {
    edit(bytes);
    return true;
  }
  if (impl_->mapping == nullptr || !impl_->mapping_is_copy) return false;
  // The copy is read-only between edits (read_into_huge_pages). The whole mapping opens for
  // the call: protecting part of it would split it, and with it its huge pages.
  if (::mprotect(impl_->mapping, impl_->mapping_size, PROT_READ | PROT_WRITE) != 0) return false;
  try {
    edit(bytes);
  } catch (...) {
    ::mprotect(impl_->mapping, impl_->mapping_size, PROT_READ);
    throw;
  }
  ::mprotect(impl_->mapping, impl_->mapping_size, PROT_READ);
  return true;
}

const std::vector<std::pair<std::string, GgufValue>>& GgufFile::metadata() const {
  return impl_->metadata;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = impl_->key_index.find(key);
  return it == impl_->key_index.end() ? nullptr : &impl_->metadata[it->second].second;
}

const std::vector<GgufTensorInfo>& GgufFile::tensors() const { return impl_->tensors; }

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = impl_->tensor_index.find(name);
  return it == impl_->tensor_index.end() ? nullptr : &impl_->tensors[it->second];
}

const GgufTensorInfo& GgufFile::tensor(std::string_view name) const {
  if (const GgufTensorInfo* t = find_tensor(name)) return *t;
  throw GgufError(impl_->path + ": tensor '" + std::string(name) + "' not found (file has " +
                  std::to_string(impl_->tensors.size()) + " tensors)");
}

}  // namespace fdl
