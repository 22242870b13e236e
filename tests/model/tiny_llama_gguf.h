// Writes small synthetic Llama GGUF files (deterministic pseudo-random weights) with knobs
// to break them in one specific way, for config/weight validation and dtype tests.
#pragma once

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "flashdllm/dtype.h"
#include "flashdllm/gguf.h"
#include "test_support.h"

namespace fdl::test {

struct TinyLlamaSpec {
  std::string arch = "llama";
  int n_vocab = 40, n_embd = 64, n_layer = 2, n_head = 4, n_head_kv = 2, n_ff = 96, n_ctx = 128;
  GgmlType matrix_type = GgmlType::F32;  ///< type of every 2-D weight
  /// Store F32 matrices holding exactly the values `matrix_type` would decode to, so a
  /// quantized model and this one describe the same function.
  bool f32_holding_matrix_type_values = false;
  bool tied_output = false;
  std::set<std::string> omit_keys;                              ///< full key names
  std::set<std::string> omit_tensors;
  std::map<std::string, std::vector<uint64_t>> shape_override;  ///< tensor -> ne
  std::map<std::string, GgmlType> type_override;                ///< tensor -> stored type
  std::map<std::string, float> extra_f32_keys;
  std::map<std::string, uint32_t> extra_u32_keys;
  std::map<std::string, std::string> extra_string_keys;
  std::optional<std::vector<float>> rope_freqs;  ///< writes rope_freqs.weight
  std::map<std::string, std::vector<uint64_t>> extra_tensors;  ///< F32 tensors the model does not use
  /// tensor -> {element index -> value} written over the generated values (a NaN, say)
  std::map<std::string, std::map<size_t, float>> set_values;
};

namespace tiny_detail {

// A small deterministic generator (splitmix64) so every file is reproducible.
inline float weight_value(const std::string& name, size_t i) {
  uint64_t z = std::hash<std::string>{}(name) + 0x9e3779b97f4a7c15ull * (i + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return float(double(z >> 11) / double(1ull << 53) - 0.5);  // [-0.5, 0.5)
}

// Values of a matrix after a round trip through `type`.
inline std::vector<float> matrix_values(const std::string& name, size_t n, GgmlType type, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = weight_value(name, i) * scale;
  if (type == GgmlType::F16)
    for (float& x : v) x = fp16_to_fp32(fp32_to_fp16(x));
  if (type == GgmlType::BF16)
    for (float& x : v) x = bf16_to_fp32(fp32_to_bf16(x));
  if (type == GgmlType::Q8_0) {
    std::vector<BlockQ8_0> q(n / 32);
    quantize_row_q8_0(v.data(), q.data(), n);
    dequantize_row(GgmlType::Q8_0, q.data(), v.data(), n);
  }
  return v;
}

}  // namespace tiny_detail

/// Writes the model to `scratch_dir()/name` and returns the path.
inline std::filesystem::path write_tiny_llama(const std::string& name, const TinyLlamaSpec& s) {
  GgufWriter w;
  auto key = [&](const std::string& k) { return s.omit_keys.count(k) == 0; };
  if (key("general.architecture")) w.set_string("general.architecture", s.arch);
  w.set_string("general.name", "tiny");
  const std::string a = s.arch + ".";
  if (key(a + "context_length")) w.set_uint32(a + "context_length", uint32_t(s.n_ctx));
  if (key(a + "embedding_length")) w.set_uint32(a + "embedding_length", uint32_t(s.n_embd));
  if (key(a + "block_count")) w.set_uint32(a + "block_count", uint32_t(s.n_layer));
  if (key(a + "feed_forward_length")) w.set_uint32(a + "feed_forward_length", uint32_t(s.n_ff));
  if (key(a + "attention.head_count")) w.set_uint32(a + "attention.head_count", uint32_t(s.n_head));
  if (key(a + "attention.head_count_kv"))
    w.set_uint32(a + "attention.head_count_kv", uint32_t(s.n_head_kv));
  if (key(a + "attention.layer_norm_rms_epsilon"))
    w.set_float32(a + "attention.layer_norm_rms_epsilon", 1e-5f);
  if (key(a + "vocab_size")) w.set_uint32(a + "vocab_size", uint32_t(s.n_vocab));
  for (const auto& [k, v] : s.extra_f32_keys) w.set_float32(k, v);
  for (const auto& [k, v] : s.extra_u32_keys) w.set_uint32(k, v);
  for (const auto& [k, v] : s.extra_string_keys) w.set_string(k, v);

  const uint64_t d = uint64_t(s.n_embd), hd = uint64_t(s.n_embd / s.n_head);
  auto add = [&](const std::string& tname, std::vector<uint64_t> ne, bool matrix) {
    if (s.omit_tensors.count(tname)) return;
    if (auto it = s.shape_override.find(tname); it != s.shape_override.end()) ne = it->second;
    uint64_t n = 1;
    for (uint64_t x : ne) n *= x;
    GgmlType file_type = matrix && !s.f32_holding_matrix_type_values ? s.matrix_type : GgmlType::F32;
    if (auto it = s.type_override.find(tname); it != s.type_override.end()) file_type = it->second;
    const GgmlType value_type = matrix ? s.matrix_type : GgmlType::F32;
    // Norm weights around 1, matrices small enough to keep activations tame.
    const float scale = matrix ? 0.6f : 0.4f;
    w.add_tensor(tname, file_type, ne, [=](std::span<uint8_t> out) {
      std::vector<float> v = tiny_detail::matrix_values(tname, n, value_type, scale);
      if (!matrix)
        for (float& x : v) x += 1.0f;
      if (auto it = s.set_values.find(tname); it != s.set_values.end())
        for (const auto& [i, value] : it->second) v.at(i) = value;
      switch (file_type) {
        case GgmlType::F32: std::memcpy(out.data(), v.data(), n * 4); break;
        case GgmlType::F16:
          for (size_t i = 0; i < n; ++i) {
            const uint16_t h = fp32_to_fp16(v[i]);
            std::memcpy(out.data() + 2 * i, &h, 2);
          }
          break;
        case GgmlType::BF16:
          for (size_t i = 0; i < n; ++i) {
            const uint16_t h = fp32_to_bf16(v[i]);
            std::memcpy(out.data() + 2 * i, &h, 2);
          }
          break;
        case GgmlType::Q8_0:
          quantize_row_q8_0(v.data(), reinterpret_cast<BlockQ8_0*>(out.data()), n);
          break;
        default:  // unsupported types: the content does not matter, only the declared type
          std::memset(out.data(), 0, out.size());
      }
    });
  };
  add("token_embd.weight", {d, uint64_t(s.n_vocab)}, true);
  add("output_norm.weight", {d}, false);
  if (!s.tied_output) add("output.weight", {d, uint64_t(s.n_vocab)}, true);
  for (int l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    add(p + "attn_norm.weight", {d}, false);
    add(p + "attn_q.weight", {d, uint64_t(s.n_head) * hd}, true);
    add(p + "attn_k.weight", {d, uint64_t(s.n_head_kv) * hd}, true);
    add(p + "attn_v.weight", {d, uint64_t(s.n_head_kv) * hd}, true);
    add(p + "attn_output.weight", {uint64_t(s.n_head) * hd, d}, true);
    add(p + "ffn_norm.weight", {d}, false);
    add(p + "ffn_gate.weight", {d, uint64_t(s.n_ff)}, true);
    add(p + "ffn_up.weight", {d, uint64_t(s.n_ff)}, true);
    add(p + "ffn_down.weight", {uint64_t(s.n_ff), d}, true);
  }
  if (s.rope_freqs) {
    const std::vector<float> f = *s.rope_freqs;
    w.add_tensor("rope_freqs.weight", GgmlType::F32, {f.size()},
                 [f](std::span<uint8_t> out) { std::memcpy(out.data(), f.data(), f.size() * 4); });
  }
  for (const auto& [tname, ne] : s.extra_tensors) add(tname, ne, false);
  const std::filesystem::path path = scratch_dir() / name;
  w.write(path);
  return path;
}

}  // namespace fdl::test
