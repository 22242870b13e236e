// libFuzzer target for the GGUF reader: parse arbitrary bytes with GgufFile::from_bytes, then
// touch everything a model loader would (typed getters, array decoders, tensor views,
// dequantization of a row, copying values through GgufWriter::set_value). Any GgufError is an
// expected rejection; a crash, sanitizer report, leak or hang is a bug.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "flashdllm/gguf.h"

namespace {

volatile uint64_t g_sink;  // keeps reads of views from being optimized away

void exercise_value(const fdl::GgufFile& f, const std::string& key, const fdl::GgufValue& v,
                    fdl::GgufWriter& copy) {
  auto attempt = [](auto&& fn) {
    try {
      fn();
    } catch (const fdl::GgufError&) {
    }
  };
  attempt([&] { g_sink = g_sink + f.get_string(key).size(); });
  attempt([&] { g_sink = g_sink + f.get_uint(key); });
  attempt([&] { g_sink = g_sink + static_cast<uint64_t>(f.get_int_or(key, 0)); });
  attempt([&] { g_sink = g_sink + static_cast<uint64_t>(f.get_float(key) != 0.0); });
  attempt([&] { g_sink = g_sink + f.get_bool_or(key, false); });
  attempt([&] {
    for (std::string_view s : f.array_strings(key))
      if (!s.empty()) g_sink = g_sink + static_cast<uint8_t>(s.front()) + static_cast<uint8_t>(s.back());
  });
  attempt([&] {
    auto a = f.array_f32(key);
    if (!a.empty()) g_sink = g_sink + static_cast<uint64_t>(a.back() != 0.f);
  });
  attempt([&] {
    auto a = f.array_int(key);
    if (!a.empty()) g_sink = g_sink + static_cast<uint64_t>(a.back());
  });
  if (v.type == fdl::GgufType::STRING && !v.str.empty()) g_sink = g_sink + static_cast<uint8_t>(v.str.back());
  attempt([&] { copy.set_value(key, v); });
}

void exercise_tensor(const fdl::GgufFile& f, const fdl::GgufTensorInfo& t) {
  if (f.find_tensor(t.name) != &t) __builtin_trap();
  if (t.n_bytes > 0) g_sink = g_sink + t.data[0] + t.data[t.n_bytes - 1];
  const auto type = t.type();
  if (!fdl::is_supported_weight_type(type)) return;
  // Dequantize the first row, bounded so huge rows do not dominate the run time.
  const auto traits = fdl::ggml_type_traits(t.type_id);
  const uint64_t n = std::min<uint64_t>(t.ne[0], 4096) / traits->block_size * traits->block_size;
  if (n == 0) return;
  std::vector<float> row(n);
  fdl::dequantize_row(type, t.data, row.data(), n);
  g_sink = g_sink + static_cast<uint64_t>(row.back() != 0.f);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    fdl::GgufFile f = fdl::GgufFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz");
    g_sink = g_sink + f.version() + f.alignment() + f.data_offset() + f.file_size();
    fdl::GgufWriter copy(f.alignment());
    for (const auto& [key, v] : f.metadata()) {
      if (f.find(key) != &v) __builtin_trap();
      exercise_value(f, key, v, copy);
    }
    for (const auto& t : f.tensors()) exercise_tensor(f, t);
  } catch (const fdl::GgufError&) {
    // expected for malformed input
  }
  return 0;
}
