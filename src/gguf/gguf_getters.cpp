// Typed metadata getters of fdl::GgufFile. Values were bounds-checked by the parser, so the
// array decoders below can walk the mapping without re-checking lengths.
#include <cstring>
#include <limits>

#include "gguf/gguf_file_impl.h"
#include "gguf/gguf_wire.h"

namespace fdl {

using gguf_detail::is_integer;
using gguf_detail::is_signed_integer;

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::UINT8: return "UINT8";
    case GgufType::INT8: return "INT8";
    case GgufType::UINT16: return "UINT16";
    case GgufType::INT16: return "INT16";
    case GgufType::UINT32: return "UINT32";
    case GgufType::INT32: return "INT32";
    case GgufType::FLOAT32: return "FLOAT32";
    case GgufType::BOOL: return "BOOL";
    case GgufType::STRING: return "STRING";
    case GgufType::ARRAY: return "ARRAY";
    case GgufType::UINT64: return "UINT64";
    case GgufType::INT64: return "INT64";
    case GgufType::FLOAT64: return "FLOAT64";
  }
  return "UNKNOWN";
}

void GgufFile::Impl::key_error(std::string_view key, const std::string& msg) const {
  throw GgufError(path + ": metadata key '" + std::string(key) + "' " + msg);
}

const GgufValue& GgufFile::Impl::require_key(std::string_view key) const {
  auto it = key_index.find(key);
  if (it == key_index.end()) key_error(key, "is required but missing");
  return metadata[it->second].second;
}

namespace {

std::string type_desc(const GgufValue& v) {
  std::string s(gguf_type_name(v.type));
  if (v.type == GgufType::ARRAY) s += " of " + std::string(gguf_type_name(v.elem_type));
  return s;
}

/// Read element `i` of an integer array of element type `t` (validated, fixed-size).
/// Signed values come back in `i64`, unsigned in `u64`.
void read_int_elem(GgufType t, const uint8_t* data, uint64_t i, int64_t& i64, uint64_t& u64) {
  const uint64_t sz = gguf_detail::scalar_size(t);
  const uint8_t* p = data + i * sz;
  switch (t) {
    case GgufType::UINT8: u64 = *p; return;
    case GgufType::INT8: { int8_t x; std::memcpy(&x, p, 1); i64 = x; return; }
    case GgufType::UINT16: { uint16_t x; std::memcpy(&x, p, 2); u64 = x; return; }
    case GgufType::INT16: { int16_t x; std::memcpy(&x, p, 2); i64 = x; return; }
    case GgufType::UINT32: { uint32_t x; std::memcpy(&x, p, 4); u64 = x; return; }
    case GgufType::INT32: { int32_t x; std::memcpy(&x, p, 4); i64 = x; return; }
    case GgufType::UINT64: std::memcpy(&u64, p, 8); return;
    case GgufType::INT64: std::memcpy(&i64, p, 8); return;
    default: return;
  }
}

}  // namespace

std::string GgufFile::get_string(std::string_view key) const {
  const GgufValue& v = impl_->require_key(key);
  if (v.type != GgufType::STRING) impl_->key_error(key, "has type " + type_desc(v) + ", expected STRING");
  return std::string(v.str);
}

std::string GgufFile::get_string_or(std::string_view key, std::string def) const {
  return find(key) ? get_string(key) : std::move(def);
}

uint64_t GgufFile::get_uint(std::string_view key) const {
  const GgufValue& v = impl_->require_key(key);
  if (!is_integer(v.type))
    impl_->key_error(key, "has type " + type_desc(v) + ", expected an unsigned integer");
  if (is_signed_integer(v.type)) {
    if (v.i64 < 0) impl_->key_error(key, "is " + std::to_string(v.i64) + ", expected a non-negative integer");
    return static_cast<uint64_t>(v.i64);
  }
  return v.u64;
}

uint64_t GgufFile::get_uint_or(std::string_view key, uint64_t def) const {
  return find(key) ? get_uint(key) : def;
}

int64_t GgufFile::get_int_or(std::string_view key, int64_t def) const {
  const GgufValue* v = find(key);
  if (!v) return def;
  if (!is_integer(v->type)) impl_->key_error(key, "has type " + type_desc(*v) + ", expected an integer");
  if (is_signed_integer(v->type)) return v->i64;
  if (v->u64 > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
    impl_->key_error(key, "is " + std::to_string(v->u64) + ", too large for a signed 64-bit integer");
  return static_cast<int64_t>(v->u64);
}

double GgufFile::get_float(std::string_view key) const {
  const GgufValue& v = impl_->require_key(key);
  if (v.type == GgufType::FLOAT32 || v.type == GgufType::FLOAT64) return v.f64;
  if (is_signed_integer(v.type)) return static_cast<double>(v.i64);
  if (is_integer(v.type)) return static_cast<double>(v.u64);
  impl_->key_error(key, "has type " + type_desc(v) + ", expected a number");
}

double GgufFile::get_float_or(std::string_view key, double def) const {
  return find(key) ? get_float(key) : def;
}

bool GgufFile::get_bool_or(std::string_view key, bool def) const {
  const GgufValue* v = find(key);
  if (!v) return def;
  if (v->type != GgufType::BOOL) impl_->key_error(key, "has type " + type_desc(*v) + ", expected BOOL");
  return v->u64 != 0;
}

std::vector<std::string_view> GgufFile::array_strings(std::string_view key) const {
  const GgufValue& v = impl_->require_key(key);
  if (v.type != GgufType::ARRAY || v.elem_type != GgufType::STRING)
    impl_->key_error(key, "has type " + type_desc(v) + ", expected ARRAY of STRING");
  std::vector<std::string_view> out;
  out.reserve(v.count);
  const uint8_t* p = v.data;
  for (uint64_t i = 0; i < v.count; ++i) {
    uint64_t len;
    std::memcpy(&len, p, 8);
    out.emplace_back(reinterpret_cast<const char*>(p + 8), len);
    p += 8 + len;
  }
  return out;
}

std::vector<float> GgufFile::array_f32(std::string_view key) const {
  const GgufValue& v = impl_->require_key(key);
  if (v.type != GgufType::ARRAY || (v.elem_type != GgufType::FLOAT32 && v.elem_type != GgufType::FLOAT64))
    impl_->key_error(key, "has type " + type_desc(v) + ", expected ARRAY of FLOAT32");
  std::vector<float> out(v.count);
  if (v.elem_type == GgufType::FLOAT32) {
    if (v.count) std::memcpy(out.data(), v.data, v.count * 4);
  } else {
    for (uint64_t i = 0; i < v.count; ++i) {
      double d;
      std::memcpy(&d, v.data + i * 8, 8);
      out[i] = static_cast<float>(d);
    }
  }
  return out;
}

std::vector<int64_t> GgufFile::array_int(std::string_view key) const {
  const GgufValue& v = impl_->require_key(key);
  if (v.type != GgufType::ARRAY || !is_integer(v.elem_type))
    impl_->key_error(key, "has type " + type_desc(v) + ", expected ARRAY of integers");
  std::vector<int64_t> out(v.count);
  for (uint64_t i = 0; i < v.count; ++i) {
    int64_t s = 0;
    uint64_t u = 0;
    read_int_elem(v.elem_type, v.data, i, s, u);
    if (is_signed_integer(v.elem_type)) {
      out[i] = s;
    } else {
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        impl_->key_error(key, "element #" + std::to_string(i) + " is " + std::to_string(u) +
                                  ", too large for a signed 64-bit integer");
      out[i] = static_cast<int64_t>(u);
    }
  }
  return out;
}

std::vector<bool> GgufFile::array_bool(std::string_view key) const {
  const GgufValue& v = impl_->require_key(key);
  if (v.type != GgufType::ARRAY || v.elem_type != GgufType::BOOL)
    impl_->key_error(key, "has type " + type_desc(v) + ", expected ARRAY of BOOL");
  std::vector<bool> out(v.count);
  for (uint64_t i = 0; i < v.count; ++i) {
    if (v.data[i] > 1)
      impl_->key_error(key, "element #" + std::to_string(i) + " is " + std::to_string(v.data[i]) + ", not a bool (0 or 1)");
    out[i] = v.data[i] == 1;
  }
  return out;
}

}  // namespace fdl
