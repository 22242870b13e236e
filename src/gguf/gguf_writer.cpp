// GgufWriter: serializes metadata up front, then streams each tensor through its Filler into
// a temporary file that is fsync'ed and renamed over the target (so readers never see a
// half-written model, and a failed write leaves the old file in place).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <random>

#include "flashdllm/gguf.h"
#include "gguf/gguf_wire.h"

namespace fdl {

using gguf_detail::checked_mul;

namespace {

// ggml's GGML_MAX_NAME is 64 including the terminating NUL.
constexpr size_t kMaxTensorNameBytes = 63;

void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + n);
}
template <class T>
void put(std::vector<uint8_t>& out, T v) {
  put_bytes(out, &v, sizeof(T));
}
void put_string(std::vector<uint8_t>& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  put_bytes(out, s.data(), s.size());
}

/// Wire size of the `count` elements of type `elem` starting at `data` (a validated mapping).
uint64_t array_elems_bytes(GgufType elem, uint64_t count, const uint8_t* data) {
  if (elem != GgufType::STRING && elem != GgufType::ARRAY) return count * gguf_detail::scalar_size(elem);
  uint64_t off = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (elem == GgufType::STRING) {
      uint64_t len;
      std::memcpy(&len, data + off, 8);
      off += 8 + len;
    } else {
      uint32_t inner_elem;
      uint64_t inner_count;
      std::memcpy(&inner_elem, data + off, 4);
      std::memcpy(&inner_count, data + off + 4, 8);
      off += 12 + array_elems_bytes(static_cast<GgufType>(inner_elem), inner_count, data + off + 12);
    }
  }
  return off;
}

[[noreturn]] void io_fail(const std::string& path, uint64_t offset, const char* what, int err) {
  throw GgufError(path + ": " + what + " failed at offset " + std::to_string(offset) + ": " +
                  std::strerror(err));
}

/// Where `path` really lives: a symlink (or chain of them) is followed so that the rename
/// replaces the link's target, not the link. Refuses targets that exist but are not regular
/// files (device nodes, FIFOs, directories, sockets): renaming over them would replace them.
/// Errors name `path` as the user gave it.
std::filesystem::path resolve_output(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  const std::string shown = path.string();
  fs::path target = path;
  std::error_code ec;
  for (int hops = 0;; ++hops) {
    const fs::file_status st = fs::symlink_status(target, ec);
    if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory)
      throw GgufError(shown + ": cannot inspect the output path: " + ec.message());
    if (!fs::is_symlink(st)) break;
    if (hops >= 40) throw GgufError(shown + ": too many levels of symbolic links");
    fs::path next = fs::read_symlink(target, ec);
    if (ec) throw GgufError(shown + ": cannot read symbolic link: " + ec.message());
    target = next.is_absolute() ? next : target.parent_path() / next;
  }
  const fs::file_status st = fs::status(target, ec);
  if (fs::exists(st)) {
    if (!fs::is_regular_file(st))
      throw GgufError("refusing to overwrite " + shown + ": not a regular file");
    return target;
  }
  if (!target.has_filename()) throw GgufError(shown + ": the output path names a directory");
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  const fs::file_status dst = fs::status(dir, ec);
  if (!fs::exists(dst))
    throw GgufError(shown + ": directory " + dir.string() + " does not exist");
  if (!fs::is_directory(dst))
    throw GgufError(shown + ": " + dir.string() + " is not a directory");
  return target;
}

/// The temporary output file: removed on destruction unless committed by rename.
class TempFile {
 public:
  /// `shown` is the path as the user gave it (for messages); `target` its resolved location.
  TempFile(const std::string& shown, const std::filesystem::path& target)
      : target_(shown), final_(target.string()) {
    std::random_device rd;
    const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : ".";
    for (int attempt = 0; attempt < 16 && fd_ < 0; ++attempt) {
      // Hidden name beside the target, so the final rename stays within one filesystem.
      std::string name = ".";
      name.append(target.filename().string()).append(".tmp-").append(std::to_string(::getpid()));
      name.append("-").append(std::to_string(rd()));
      path_ = (dir / name).string();
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd_ < 0 && errno != EEXIST) break;
    }
    if (fd_ < 0)
      throw GgufError(target_ + ": cannot create a file in " + dir.string() + ": " +
                      std::strerror(errno));
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }

  uint64_t offset() const { return offset_; }

  void write(const uint8_t* p, uint64_t n) {
    while (n > 0) {
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, 1u << 30));
      const ssize_t w = ::write(fd_, p, chunk);
      if (w < 0) {
        if (errno == EINTR) continue;
        io_fail(target_, offset_, "write", errno);
      }
      if (w == 0) io_fail(target_, offset_, "write", EIO);
      p += w;
      n -= static_cast<uint64_t>(w);
      offset_ += static_cast<uint64_t>(w);
    }
  }
  void pad_to(uint64_t target_offset) {
    static const uint8_t zeros[256] = {};
    while (offset_ < target_offset) write(zeros, std::min<uint64_t>(sizeof zeros, target_offset - offset_));
  }

  void commit() {
    if (::fsync(fd_) != 0) io_fail(target_, offset_, "fsync", errno);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) io_fail(target_, offset_, "close", errno);
    if (::rename(path_.c_str(), final_.c_str()) != 0)
      throw GgufError(target_ + ": cannot move the written file into place: " +
                      std::strerror(errno));
    committed_ = true;
  }

 private:
  std::string target_;  // as given, for messages
  std::string final_;   // resolved location the rename replaces
  std::string path_;
  int fd_ = -1;
  uint64_t offset_ = 0;
  bool committed_ = false;
};

}  // namespace

namespace {
/// Where everything goes in the file: the header, metadata and tensor table bytes, each
/// tensor's offset in the data section, and the sizes.
struct FileLayout {
  std::vector<uint8_t> head;
  std::vector<uint64_t> offsets;
  uint64_t data_start = 0;
  uint64_t data_size = 0;
  uint64_t largest = 0;
};
}  // namespace

struct GgufWriter::Impl {
  struct Kv {
    std::string key;
    GgufType type;
    std::vector<uint8_t> payload;  ///< wire bytes after the type field
  };
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<uint64_t> ne;
    Filler fill;
    uint64_t n_bytes;
  };
  uint64_t alignment;
  std::vector<Kv> kvs;
  std::vector<Tensor> tensors;

  /// The file's layout; `label` names it in errors.
  FileLayout layout(const std::string& label) const;

  void set(std::string key, GgufType type, std::vector<uint8_t> payload) {
    if (key.empty()) throw GgufError("GgufWriter: metadata key is empty");
    if (key.size() > gguf_detail::kMaxKeyBytes)
      throw GgufError("GgufWriter: metadata key of " + std::to_string(key.size()) +
                      " bytes exceeds the GGUF limit of 65535");
    for (Kv& kv : kvs) {
      if (kv.key == key) {
        kv.type = type;
        kv.payload = std::move(payload);
        return;
      }
    }
    kvs.push_back({std::move(key), type, std::move(payload)});
  }
  template <class T>
  void set_scalar(std::string key, GgufType type, T v) {
    std::vector<uint8_t> p;
    put(p, v);
    set(std::move(key), type, std::move(p));
  }
  template <class T>
  void set_array(std::string key, GgufType elem, const std::vector<T>& v) {
    std::vector<uint8_t> p;
    p.reserve(12 + v.size() * sizeof(T));
    put<uint32_t>(p, static_cast<uint32_t>(elem));
    put<uint64_t>(p, v.size());
    if (!v.empty()) put_bytes(p, v.data(), v.size() * sizeof(T));
    set(std::move(key), GgufType::ARRAY, std::move(p));
  }
};

GgufWriter::GgufWriter(uint64_t alignment) : impl_(std::make_shared<Impl>()) {
  if (!gguf_detail::valid_alignment(alignment))
    throw GgufError("GgufWriter: alignment " + std::to_string(alignment) +
                    " must be a power of two and a multiple of 8");
  impl_->alignment = alignment;
}

void GgufWriter::set_uint8(std::string k, uint8_t v) { impl_->set_scalar(std::move(k), GgufType::UINT8, v); }
void GgufWriter::set_int8(std::string k, int8_t v) { impl_->set_scalar(std::move(k), GgufType::INT8, v); }
void GgufWriter::set_uint16(std::string k, uint16_t v) { impl_->set_scalar(std::move(k), GgufType::UINT16, v); }
void GgufWriter::set_int16(std::string k, int16_t v) { impl_->set_scalar(std::move(k), GgufType::INT16, v); }
void GgufWriter::set_uint32(std::string k, uint32_t v) { impl_->set_scalar(std::move(k), GgufType::UINT32, v); }
void GgufWriter::set_int32(std::string k, int32_t v) { impl_->set_scalar(std::move(k), GgufType::INT32, v); }
void GgufWriter::set_uint64(std::string k, uint64_t v) { impl_->set_scalar(std::move(k), GgufType::UINT64, v); }
void GgufWriter::set_int64(std::string k, int64_t v) { impl_->set_scalar(std::move(k), GgufType::INT64, v); }
void GgufWriter::set_float32(std::string k, float v) { impl_->set_scalar(std::move(k), GgufType::FLOAT32, v); }
void GgufWriter::set_float64(std::string k, double v) { impl_->set_scalar(std::move(k), GgufType::FLOAT64, v); }
void GgufWriter::set_bool(std::string k, bool v) {
  impl_->set_scalar(std::move(k), GgufType::BOOL, static_cast<uint8_t>(v ? 1 : 0));
}

void GgufWriter::set_string(std::string key, std::string v) {
  std::vector<uint8_t> p;
  put_string(p, v);
  impl_->set(std::move(key), GgufType::STRING, std::move(p));
}

void GgufWriter::set_array_strings(std::string key, std::vector<std::string> v) {
  std::vector<uint8_t> p;
  size_t total = 12;
  for (const auto& s : v) total += 8 + s.size();
  p.reserve(total);
  put<uint32_t>(p, static_cast<uint32_t>(GgufType::STRING));
  put<uint64_t>(p, v.size());
  for (const auto& s : v) put_string(p, s);
  impl_->set(std::move(key), GgufType::ARRAY, std::move(p));
}

void GgufWriter::set_array_f32(std::string key, std::vector<float> v) {
  impl_->set_array(std::move(key), GgufType::FLOAT32, v);
}
void GgufWriter::set_array_i32(std::string key, std::vector<int32_t> v) {
  impl_->set_array(std::move(key), GgufType::INT32, v);
}
void GgufWriter::set_array_bool(std::string key, const std::vector<bool>& v) {
  std::vector<uint8_t> bytes(v.begin(), v.end());  // one byte per element, 0 or 1 (gguf.md)
  impl_->set_array(std::move(key), GgufType::BOOL, bytes);
}

void GgufWriter::set_value(std::string key, const GgufValue& v) {
  std::vector<uint8_t> p;
  switch (v.type) {
    case GgufType::UINT8: put<uint8_t>(p, static_cast<uint8_t>(v.u64)); break;
    case GgufType::INT8: put<int8_t>(p, static_cast<int8_t>(v.i64)); break;
    case GgufType::UINT16: put<uint16_t>(p, static_cast<uint16_t>(v.u64)); break;
    case GgufType::INT16: put<int16_t>(p, static_cast<int16_t>(v.i64)); break;
    case GgufType::UINT32: put<uint32_t>(p, static_cast<uint32_t>(v.u64)); break;
    case GgufType::INT32: put<int32_t>(p, static_cast<int32_t>(v.i64)); break;
    case GgufType::UINT64: put<uint64_t>(p, v.u64); break;
    case GgufType::INT64: put<int64_t>(p, v.i64); break;
    case GgufType::FLOAT32: put<float>(p, static_cast<float>(v.f64)); break;
    case GgufType::FLOAT64: put<double>(p, v.f64); break;
    case GgufType::BOOL: put<uint8_t>(p, v.u64 ? 1 : 0); break;
    case GgufType::STRING: put_string(p, v.str); break;
    case GgufType::ARRAY: {
      if (static_cast<uint32_t>(v.elem_type) > gguf_detail::kMaxTypeId)
        throw GgufError("GgufWriter: key '" + key + "': unknown array element type " +
                        std::to_string(static_cast<uint32_t>(v.elem_type)));
      put<uint32_t>(p, static_cast<uint32_t>(v.elem_type));
      put<uint64_t>(p, v.count);
      if (v.count > 0) put_bytes(p, v.data, array_elems_bytes(v.elem_type, v.count, v.data));
      break;
    }
    default:
      throw GgufError("GgufWriter: key '" + key + "': unknown value type " +
                      std::to_string(static_cast<uint32_t>(v.type)));
  }
  impl_->set(std::move(key), v.type, std::move(p));
}

bool GgufWriter::has_key(std::string_view key) const {
  return std::any_of(impl_->kvs.begin(), impl_->kvs.end(),
                     [&](const Impl::Kv& kv) { return kv.key == key; });
}

void GgufWriter::add_tensor(std::string name, GgmlType type, std::vector<uint64_t> ne, Filler fill) {
  const std::string where = "GgufWriter: tensor '" + name + "': ";
  if (name.empty()) throw GgufError("GgufWriter: tensor name is empty");
  if (name.size() > kMaxTensorNameBytes)
    throw GgufError(where + "name is " + std::to_string(name.size()) +
                    " bytes; ggml allows at most 63");
  for (const auto& t : impl_->tensors)
    if (t.name == name) throw GgufError(where + "duplicate tensor name");
  if (ne.empty() || ne.size() > 4)
    throw GgufError(where + "has " + std::to_string(ne.size()) + " dims, expected 1..4");
  const auto traits = ggml_type_traits(static_cast<uint32_t>(type));
  if (!traits) throw GgufError(where + "unknown type " + ggml_type_name(static_cast<uint32_t>(type)));
  uint64_t n = 1;
  for (size_t d = 0; d < ne.size(); ++d) {
    if (ne[d] == 0) throw GgufError(where + "dimension ne[" + std::to_string(d) + "] is 0");
    auto prod = checked_mul(n, ne[d]);
    if (!prod || *prod > static_cast<uint64_t>(INT64_MAX))
      throw GgufError(where + "element count overflows");
    n = *prod;
  }
  if (ne[0] % traits->block_size != 0)
    throw GgufError(where + "ne[0] = " + std::to_string(ne[0]) + " is not a multiple of the " +
                    std::string(traits->name) + " block size " + std::to_string(traits->block_size));
  auto bytes = checked_mul(n / traits->block_size, traits->type_size);
  if (!bytes) throw GgufError(where + "byte size overflows");
  if (!fill) throw GgufError(where + "no filler given");
  impl_->tensors.push_back({std::move(name), type, std::move(ne), std::move(fill), *bytes});
}

FileLayout GgufWriter::Impl::layout(const std::string& label) const {
  const Impl& w = *this;
  std::vector<Impl::Kv> kvs = w.kvs;
  bool has_alignment = false;
  for (const auto& kv : kvs) {
    if (kv.key != gguf_detail::kAlignmentKey) continue;
    has_alignment = true;
    uint32_t a = 0;
    if (kv.type == GgufType::UINT32) std::memcpy(&a, kv.payload.data(), 4);
    if (kv.type != GgufType::UINT32 || a != w.alignment)
      throw GgufError(label + ": general.alignment must be the UINT32 " +
                      std::to_string(w.alignment) + " the writer was constructed with");
  }
  if (!has_alignment && w.alignment != gguf_detail::kDefaultAlignment) {
    if (w.alignment > UINT32_MAX)
      throw GgufError(label + ": alignment " + std::to_string(w.alignment) +
                      " does not fit general.alignment (UINT32)");
    std::vector<uint8_t> p;
    put<uint32_t>(p, static_cast<uint32_t>(w.alignment));
    kvs.push_back({std::string(gguf_detail::kAlignmentKey), GgufType::UINT32, std::move(p)});
  }

  // Header, metadata and tensor table are small: build them in memory.
  std::vector<uint8_t> head;
  put<uint32_t>(head, gguf_detail::kMagic);
  put<uint32_t>(head, gguf_detail::kWriteVersion);
  put<uint64_t>(head, w.tensors.size());
  put<uint64_t>(head, kvs.size());
  for (const auto& kv : kvs) {
    put_string(head, kv.key);
    put<uint32_t>(head, static_cast<uint32_t>(kv.type));
    put_bytes(head, kv.payload.data(), kv.payload.size());
  }
  std::vector<uint64_t> offsets;
  uint64_t data_size = 0, largest = 0;
  for (const auto& t : w.tensors) {
    data_size = *gguf_detail::align_up(data_size, w.alignment);
    offsets.push_back(data_size);
    data_size += t.n_bytes;
    largest = std::max(largest, t.n_bytes);
    put_string(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.ne.size()));
    for (uint64_t d : t.ne) put<uint64_t>(head, d);
    put<uint32_t>(head, static_cast<uint32_t>(t.type));
    put<uint64_t>(head, offsets.back());
  }
  const uint64_t data_start = *gguf_detail::align_up(head.size(), w.alignment);
  return {std::move(head), std::move(offsets), data_start, data_size, largest};
}

void GgufWriter::write(const std::filesystem::path& path) const {
  const Impl& w = *impl_;
  const auto [head, offsets, data_start, data_size, largest] = w.layout(path.string());

  const std::filesystem::path resolved = resolve_output(path);
  TempFile out(path.string(), resolved);
  out.write(head.data(), head.size());
  out.pad_to(data_start);
  // One buffer sized for the largest tensor, reused (memory O(largest tensor)).
  std::unique_ptr<uint8_t[]> buf;
  if (largest > 0) buf.reset(new uint8_t[largest]);
  for (size_t i = 0; i < w.tensors.size(); ++i) {
    const auto& t = w.tensors[i];
    out.pad_to(data_start + offsets[i]);
    t.fill(std::span<uint8_t>(buf.get(), t.n_bytes));
    out.write(buf.get(), t.n_bytes);
  }
  out.commit();
}

std::vector<uint8_t> GgufWriter::to_bytes(const std::string& label) const {
  const Impl& w = *impl_;
  const FileLayout l = w.layout(label);
  std::vector<uint8_t> bytes(l.data_start + l.data_size, 0);
  std::memcpy(bytes.data(), l.head.data(), l.head.size());
  for (size_t i = 0; i < w.tensors.size(); ++i) {
    const auto& t = w.tensors[i];
    t.fill(std::span<uint8_t>(bytes.data() + l.data_start + l.offsets[i], t.n_bytes));
  }
  return bytes;
}

}  // namespace fdl
