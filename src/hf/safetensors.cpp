// safetensors parsing and validation; see hf/safetensors.h for the rules enforced.
//
// The header is parsed with nlohmann-json behind a callback that caps nesting depth and
// rejects duplicate keys while parsing, so a hostile header can neither build a deep tree nor
// hide an entry behind a later one with the same name. The header size itself is capped and
// checked against the file before any byte of it is read, which keeps memory O(file size).
#include "hf/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/json_error_text.h"

namespace fdl::hf {

namespace {

using nlohmann::json;

// Real headers are a few hundred KiB even for thousand-tensor checkpoints; the cap bounds
// what a corrupt length prefix can make us parse.
constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;
constexpr uint64_t kMaxIndexBytes = uint64_t(100) << 20;
constexpr size_t kMaxDims = 8;
// Root object (0) > entry object (1) > shape/data_offsets array (2) > numbers (3).
constexpr int kMaxContainerDepth = 2;

/// Keeps error messages on one line whatever bytes a name or a JSON error quotes.
std::string one_line(std::string_view s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      out += "\\x";
      out += digits[u >> 4];
      out += digits[u & 0xf];
    } else {
      out += c;
    }
  }
  return out;
}

[[noreturn]] void fail(const std::string& file, const std::string& msg) {
  throw SafetensorsError(one_line(file + ": " + msg));
}

[[noreturn]] void fail_tensor(const std::string& file, const std::string& tensor,
                              const std::string& msg) {
  fail(file, "tensor '" + tensor + "': " + msg);
}

std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

std::string shape_text(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string range_text(uint64_t begin, uint64_t end) {
  std::string s = "[";  // appends, not "literal" + string&&: GCC 12 warns falsely on that
  s += std::to_string(begin);
  s += ", ";
  s += std::to_string(end);
  s += "]";
  return s;
}

/// Why `v` is not a non-negative integer that fits in u64 (empty if it is one).
std::string not_u64_reason(const json& v) {
  if (v.is_number_unsigned()) return {};
  if (v.is_number_integer()) return "is negative (" + v.dump() + ")";
  if (v.is_number_float()) return "is not an integer (" + v.dump() + ")";
  return std::string("is a ") + v.type_name() + ", not an integer";
}

/// Parses a header or index, rejecting duplicate keys in any object and (for headers)
/// containers nested deeper than the format uses.
json parse_json(const char* begin, const char* end, const std::string& file, std::string_view what,
                bool cap_depth) {
  // One key set per open object; the stack depth is bounded by the depth cap for headers and
  // by the input size otherwise.
  std::vector<std::set<std::string>> keys;
  auto callback = [&](int depth, json::parse_event_t event, json& parsed) -> bool {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (cap_depth && depth > kMaxContainerDepth)
          fail(file, std::string(what) + " nests JSON containers " + std::to_string(depth + 1) +
                         " deep; the format needs at most " +
                         std::to_string(kMaxContainerDepth + 1));
        if (event == json::parse_event_t::object_start) keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key: {
        const auto& k = parsed.get_ref<const std::string&>();
        if (!keys.empty() && !keys.back().insert(k).second)
          fail(file, std::string(what) + " has the key '" + k + "' twice in one object");
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(begin, end, callback);
  } catch (const json::exception& e) {
    fail(file, std::string(what) + " is not valid JSON: " + json_error_text(e));
  }
}

/// A read-only mapping of a whole regular file (or nothing, for an empty one).
struct Mapping {
  void* addr = nullptr;
  uint64_t size = 0;
};

Mapping map_file(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(path, std::string("cannot stat: ") + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, std::string("cannot read: ") +
                   (S_ISDIR(st.st_mode) ? std::strerror(EISDIR) : "not a regular file"));
  }
  Mapping m;
  m.size = static_cast<uint64_t>(st.st_size);
  if (m.size > 0) {
    void* p = ::mmap(nullptr, m.size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      fail(path, "cannot mmap " + std::to_string(m.size) + " bytes: " + std::strerror(err));
    }
    m.addr = p;
  }
  ::close(fd);  // the mapping keeps the file alive
  return m;
}

std::string read_small_file(const std::string& path, uint64_t limit) {
  Mapping m = map_file(path);
  if (m.size > limit) {
    ::munmap(m.addr, m.size);
    fail(path, "file is " + std::to_string(m.size) + " bytes, above the limit of " +
                   std::to_string(limit));
  }
  std::string s(static_cast<const char*>(m.addr), m.size);
  if (m.addr) ::munmap(m.addr, m.size);
  return s;
}

/// Plain file names only: an index must not point outside its directory.
bool is_plain_file_name(std::string_view name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string_view::npos && name.find('\0') == std::string_view::npos;
}

}  // namespace

uint32_t safetensors_dtype_bits(std::string_view dtype) {
  static constexpr std::pair<std::string_view, uint32_t> kDtypes[] = {
      {"BOOL", 8},     {"U8", 8},       {"I8", 8},       {"F8_E5M2", 8}, {"F8_E4M3", 8},
      {"F8_E8M0", 8},  {"I16", 16},     {"U16", 16},     {"F16", 16},    {"BF16", 16},
      {"I32", 32},     {"U32", 32},     {"F32", 32},     {"I64", 64},    {"U64", 64},
      {"F64", 64},     {"C64", 64},     {"F4", 4},       {"F6_E2M3", 6}, {"F6_E3M2", 6},
  };
  for (const auto& [name, bits] : kDtypes)
    if (name == dtype) return bits;
  return 0;
}

uint64_t SafetensorsTensor::n_elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;  // validated at parse time not to overflow
  return n;
}

struct SafetensorsFile::Impl {
  std::string path;
  Mapping mapping;             // open(): the mmap'ed file
  std::vector<uint8_t> owned;  // from_bytes(): the caller's bytes
  const uint8_t* base = nullptr;
  uint64_t size = 0;

  std::vector<SafetensorsTensor> tensors;
  std::map<std::string, size_t, std::less<>> index;
  std::map<std::string, std::string> metadata;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  ~Impl() {
    if (mapping.addr) ::munmap(mapping.addr, mapping.size);
  }

  void parse();

 private:
  struct Placed {
    uint64_t begin, end;
    size_t tensor;
  };
  void read_metadata(const json& v);
  void read_entry(const std::string& name, const json& v, uint64_t buffer_size,
                  std::vector<Placed>& placed);
};

void SafetensorsFile::Impl::parse() {
  if (size < 8)
    fail(path, "file is " + std::to_string(size) +
                   " bytes, shorter than the 8-byte header size prefix (truncated or not a "
                   "safetensors file)");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | base[i];
  if (n == 0) fail(path, "header size is 0; even a file without tensors has the header '{}'");
  if (n > kMaxHeaderBytes)
    fail(path, "header size " + std::to_string(n) + " is above the limit of " +
                   std::to_string(kMaxHeaderBytes) + " bytes (100 MiB): corrupt or not a "
                   "safetensors file");
  if (n > size - 8)
    fail(path, "header size " + std::to_string(n) + " runs past the end of the file (" +
                   std::to_string(size - 8) + " bytes after the 8-byte prefix)");
  const char* hdr = reinterpret_cast<const char*>(base + 8);
  if (hdr[0] != '{')
    fail(path, "header is not a JSON object (it does not start with '{'): not a safetensors file");
  const json header = parse_json(hdr, hdr + n, path, "header", /*cap_depth=*/true);
  if (!header.is_object())
    fail(path, std::string("header is a JSON ") + header.type_name() + ", not an object");

  const uint64_t buffer_offset = 8 + n;
  const uint64_t buffer_size = size - buffer_offset;
  std::vector<Placed> placed;
  placed.reserve(header.size());
  tensors.reserve(header.size());
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__")
      read_metadata(v);
    else
      read_entry(name, v, buffer_size, placed);
  }

  // Offset order is both the order tensors() promises and what the coverage walk needs.
  std::sort(placed.begin(), placed.end(), [&](const Placed& a, const Placed& b) {
    return std::tie(a.begin, a.end, tensors[a.tensor].name) <
           std::tie(b.begin, b.end, tensors[b.tensor].name);
  });
  uint64_t covered = 0;  // every byte below this belongs to a tensor seen so far
  const Placed* last = nullptr;
  for (const Placed& p : placed) {
    if (p.begin < covered)
      fail_tensor(path, tensors[p.tensor].name,
                  "data_offsets " + range_text(p.begin, p.end) + " overlap tensor '" +
                      tensors[last->tensor].name + "' " + range_text(last->begin, last->end));
    if (p.begin > covered)
      fail(path, "byte buffer has a hole: bytes [" + std::to_string(covered) + ", " +
                     std::to_string(p.begin) +
                     ") belong to no tensor (the format requires the buffer to be fully "
                     "covered by tensors)");
    if (p.end > p.begin || !last) last = &p;
    covered = p.end;
  }
  if (covered != buffer_size)
    fail(path, "byte buffer has a hole: its last " + std::to_string(buffer_size - covered) +
                   " bytes [" + std::to_string(covered) + ", " + std::to_string(buffer_size) +
                   ") belong to no tensor (the format requires the buffer to be fully covered "
                   "by tensors)");

  std::vector<SafetensorsTensor> sorted;
  sorted.reserve(placed.size());
  for (const Placed& p : placed) {
    SafetensorsTensor& t = tensors[p.tensor];
    t.data = base + buffer_offset + p.begin;
    sorted.push_back(std::move(t));
  }
  tensors = std::move(sorted);
  for (size_t i = 0; i < tensors.size(); ++i) index.emplace(tensors[i].name, i);
}

void SafetensorsFile::Impl::read_metadata(const json& v) {
  if (!v.is_object())
    fail(path, std::string("__metadata__ is a JSON ") + v.type_name() +
                   ", not an object of strings");
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string())
      fail(path, "__metadata__ value of '" + key + "' is a JSON " + value.type_name() +
                     ", not a string");
    metadata.emplace(key, value.get<std::string>());
  }
}

void SafetensorsFile::Impl::read_entry(const std::string& name, const json& v,
                                       uint64_t buffer_size, std::vector<Placed>& placed) {
  if (name.empty()) fail(path, "a tensor has an empty name");
  auto bad = [&](const std::string& msg) { fail_tensor(path, name, msg); };
  if (!v.is_object()) bad(std::string("entry is a JSON ") + v.type_name() + ", not an object");

  auto field = [&](const char* key) -> const json& {
    auto it = v.find(key);
    if (it == v.end()) bad(std::string("missing \"") + key + "\"");
    return *it;
  };
  const json& dtype_v = field("dtype");
  const json& shape_v = field("shape");
  const json& offsets_v = field("data_offsets");

  if (!dtype_v.is_string())
    bad(std::string("dtype is a JSON ") + dtype_v.type_name() + ", not a string");
  SafetensorsTensor t;
  t.name = name;
  t.dtype = dtype_v.get<std::string>();
  const uint32_t bits = safetensors_dtype_bits(t.dtype);
  if (bits == 0) bad("unknown dtype '" + t.dtype + "'");

  if (!shape_v.is_array())
    bad(std::string("shape is a JSON ") + shape_v.type_name() + ", not an array");
  if (shape_v.size() > kMaxDims)
    bad("shape has " + std::to_string(shape_v.size()) + " dims; at most " +
        std::to_string(kMaxDims) + " are supported");
  bool has_zero = false;
  for (size_t i = 0; i < shape_v.size(); ++i) {
    if (std::string why = not_u64_reason(shape_v[i]); !why.empty())
      bad("shape[" + std::to_string(i) + "] " + why);
    t.shape.push_back(shape_v[i].get<uint64_t>());
    has_zero = has_zero || t.shape.back() == 0;
  }
  uint64_t n_elements = has_zero ? 0 : 1;
  if (!has_zero)
    for (uint64_t d : t.shape) {
      auto m = checked_mul(n_elements, d);
      if (!m) bad("element count of shape " + shape_text(t.shape) + " overflows 64 bits");
      n_elements = *m;
    }
  const auto n_bits = checked_mul(n_elements, bits);
  if (!n_bits)
    bad("byte size of " + t.dtype + " " + shape_text(t.shape) + " overflows 64 bits");
  if (*n_bits % 8 != 0)
    bad(t.dtype + " " + shape_text(t.shape) + " is " + std::to_string(*n_bits) +
        " bits, not a whole number of bytes");
  const uint64_t need = *n_bits / 8;

  if (!offsets_v.is_array() || offsets_v.size() != 2)
    bad("data_offsets must be an array of two integers [begin, end], got " +
        (offsets_v.is_array() ? "an array of " + std::to_string(offsets_v.size())
                              : std::string("a JSON ") + offsets_v.type_name()));
  for (size_t i = 0; i < 2; ++i)
    if (std::string why = not_u64_reason(offsets_v[i]); !why.empty())
      bad(std::string("data_offsets ") + (i == 0 ? "begin " : "end ") + why);
  const uint64_t begin = offsets_v[0].get<uint64_t>();
  const uint64_t end = offsets_v[1].get<uint64_t>();
  if (begin > end) bad("data_offsets " + range_text(begin, end) + " have begin > end");
  if (end > buffer_size)
    bad("data_offsets " + range_text(begin, end) + " end past the byte buffer (" +
        std::to_string(buffer_size) + " bytes)");
  if (end - begin != need)
    bad("data_offsets " + range_text(begin, end) + " hold " + std::to_string(end - begin) +
        " bytes, but " + t.dtype + " " + shape_text(t.shape) + " needs " + std::to_string(need));
  t.n_bytes = need;
  placed.push_back({begin, end, tensors.size()});
  tensors.push_back(std::move(t));
}

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path.string();
  impl->mapping = map_file(impl->path);
  impl->base = static_cast<const uint8_t*>(impl->mapping.addr);
  impl->size = impl->mapping.size;
  impl->parse();
  return SafetensorsFile(std::move(impl));
}

SafetensorsFile SafetensorsFile::from_bytes(std::vector<uint8_t> bytes, std::string name) {
  auto impl = std::make_unique<Impl>();
  impl->path = std::move(name);
  impl->owned = std::move(bytes);
  impl->base = impl->owned.data();
  impl->size = impl->owned.size();
  impl->parse();
  return SafetensorsFile(std::move(impl));
}

SafetensorsFile::SafetensorsFile(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;
SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&&) noexcept = default;
SafetensorsFile::~SafetensorsFile() = default;

const std::string& SafetensorsFile::path() const { return impl_->path; }
const std::vector<SafetensorsTensor>& SafetensorsFile::tensors() const { return impl_->tensors; }
const std::map<std::string, std::string>& SafetensorsFile::metadata() const {
  return impl_->metadata;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = impl_->index.find(name);
  return it == impl_->index.end() ? nullptr : &impl_->tensors[it->second];
}

// ---- checkpoint directories ----

SafetensorsCheckpoint SafetensorsCheckpoint::open(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  const std::string dir_s = dir.string();
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0)
    fail(dir_s, std::string("cannot open checkpoint directory: ") + std::strerror(errno));
  if (!S_ISDIR(st.st_mode))
    fail(dir_s, std::string("cannot open checkpoint directory: ") + std::strerror(ENOTDIR));

  SafetensorsCheckpoint ck;
  ck.dir_ = dir;
  std::error_code ec;
  const fs::path index_path = dir / "model.safetensors.index.json";
  const fs::path single_path = dir / "model.safetensors";
  // Tensor name -> shard file name, as the index lists them.
  std::vector<std::pair<std::string, std::string>> listed;

  if (fs::exists(index_path, ec)) {
    const std::string ip = index_path.string();
    const std::string text = read_small_file(ip, kMaxIndexBytes);
    const json index =
        parse_json(text.data(), text.data() + text.size(), ip, "index", /*cap_depth=*/false);
    if (!index.is_object()) fail(ip, std::string("index is a JSON ") + index.type_name() + ", not an object");
    auto wm = index.find("weight_map");
    if (wm == index.end()) fail(ip, "index has no \"weight_map\"");
    if (!wm->is_object())
      fail(ip, std::string("weight_map is a JSON ") + wm->type_name() + ", not an object");
    if (wm->empty()) fail(ip, "weight_map lists no tensors");
    std::map<std::string, size_t> shard_of_file;  // file-name order, each opened once
    for (const auto& [tensor, file] : wm->items()) {
      if (!file.is_string())
        fail(ip, "weight_map entry of tensor '" + tensor + "' is a JSON " + file.type_name() +
                     ", not a file name");
      const auto& name = file.get_ref<const std::string&>();
      if (!is_plain_file_name(name))
        fail(ip, "weight_map entry of tensor '" + tensor + "': shard file name '" + name +
                     "' is not a plain file name inside the directory");
      shard_of_file.emplace(name, 0);
      listed.emplace_back(tensor, name);
    }
    for (auto& [name, idx] : shard_of_file) {
      idx = ck.shards_.size();
      ck.shards_.push_back(SafetensorsFile::open(dir / name));
    }
    for (const auto& [tensor, name] : listed)
      if (!ck.shards_[shard_of_file.at(name)].find(tensor))
        fail(ip, "tensor '" + tensor + "' is listed in shard '" + name +
                     "', but that shard does not contain it");
  } else if (fs::exists(single_path, ec)) {
    ck.shards_.push_back(SafetensorsFile::open(single_path));
  } else {
    fail(dir_s, "no safetensors checkpoint: looked for model.safetensors.index.json and "
                "model.safetensors");
  }

  for (const SafetensorsFile& shard : ck.shards_)
    for (const SafetensorsTensor& t : shard.tensors()) {
      auto [it, fresh] = ck.by_name_.emplace(t.name, &t);
      if (!fresh) {
        // Name the shard that held the first copy for the message.
        std::string first;
        for (const SafetensorsFile& s : ck.shards_)
          if (s.find(t.name) == it->second) first = s.path();
        fail(dir_s, "tensor '" + t.name + "' is in two shards: " + first + " and " +
                        shard.path());
      }
    }
  return ck;
}

SafetensorsCheckpoint::SafetensorsCheckpoint(SafetensorsCheckpoint&&) noexcept = default;
SafetensorsCheckpoint& SafetensorsCheckpoint::operator=(SafetensorsCheckpoint&&) noexcept = default;
SafetensorsCheckpoint::~SafetensorsCheckpoint() = default;

const SafetensorsTensor* SafetensorsCheckpoint::find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::vector<const SafetensorsTensor*> SafetensorsCheckpoint::tensors() const {
  std::vector<const SafetensorsTensor*> out;
  out.reserve(by_name_.size());
  for (const auto& [name, t] : by_name_) out.push_back(t);
  return out;
}

const std::filesystem::path& SafetensorsCheckpoint::dir() const { return dir_; }
const std::vector<SafetensorsFile>& SafetensorsCheckpoint::shards() const { return shards_; }

}  // namespace fdl::hf
