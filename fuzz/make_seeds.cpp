// Writes a small seed corpus for gguf_fuzz into the directory given as argv[1]: valid GGUF
// files covering every metadata value type, nested arrays, several tensor types, and a
// non-default alignment. Seeds are generated rather than committed so they always match the
// current writer.
#include <cstdio>
#include <filesystem>
#include <string>

#include "flashdllm/gguf.h"

namespace {

void fill_pattern(std::span<uint8_t> b) {
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 37 + 11);
}

fdl::GgufWriter all_value_types(uint64_t alignment) {
  fdl::GgufWriter w(alignment);
  w.set_string("general.architecture", "llama");
  w.set_string("general.name", "seed");
  w.set_uint8("u8", 200);
  w.set_int8("i8", -5);
  w.set_uint16("u16", 60000);
  w.set_int16("i16", -300);
  w.set_uint32("llama.block_count", 1);
  w.set_int32("i32", -70000);
  w.set_uint64("u64", uint64_t{1} << 40);
  w.set_int64("i64", -(int64_t{1} << 40));
  w.set_float32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.set_float64("f64", 0.125);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_array_strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "<0x00>", "\xe2\x96\x81the"});
  w.set_array_f32("tokenizer.ggml.scores", {0.f, 0.f, 0.f, 0.f, -1.5f});
  w.set_array_i32("tokenizer.ggml.token_type", {2, 3, 3, 6, 1});
  return w;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path out = argv[1];
  std::filesystem::create_directories(out);

  all_value_types(32).write(out / "seed-metadata-only");

  auto w = all_value_types(32);
  w.add_tensor("token_embd.weight", fdl::GgmlType::F32, {4, 5}, fill_pattern);
  w.add_tensor("blk.0.attn_q.weight", fdl::GgmlType::F16, {4, 4}, fill_pattern);
  w.add_tensor("blk.0.ffn_up.weight", fdl::GgmlType::BF16, {8, 2}, fill_pattern);
  w.add_tensor("output.weight", fdl::GgmlType::Q8_0, {32, 2}, fill_pattern);
  w.add_tensor("q4k", fdl::GgmlType::Q4_K, {256}, fill_pattern);
  w.add_tensor("cube", fdl::GgmlType::I8, {2, 2, 2, 2}, fill_pattern);
  w.write(out / "seed-tensors");

  auto w64 = all_value_types(64);
  w64.add_tensor("a", fdl::GgmlType::F32, {3}, fill_pattern);
  w64.add_tensor("b", fdl::GgmlType::F16, {5}, fill_pattern);
  w64.write(out / "seed-align64");

  // Nested arrays: copy an array-of-arrays value out of a hand-assembled file.
  std::vector<uint8_t> raw;
  auto put = [&](const void* p, size_t n) {
    raw.insert(raw.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  };
  auto u32 = [&](uint32_t v) { put(&v, 4); };
  auto u64 = [&](uint64_t v) { put(&v, 8); };
  u32(0x46554747u); u32(3); u64(0); u64(1);
  u64(6); put("nested", 6);
  u32(static_cast<uint32_t>(fdl::GgufType::ARRAY));
  u32(static_cast<uint32_t>(fdl::GgufType::ARRAY)); u64(2);
  u32(static_cast<uint32_t>(fdl::GgufType::STRING)); u64(1); u64(2); put("hi", 2);
  u32(static_cast<uint32_t>(fdl::GgufType::INT16)); u64(3); u32(0x00010002u); put("\x03\x00", 2);
  fdl::GgufFile nested = fdl::GgufFile::from_bytes(raw, "nested");
  fdl::GgufWriter wn;
  wn.set_value("nested", *nested.find("nested"));
  wn.add_tensor("t", fdl::GgmlType::F32, {1}, fill_pattern);
  wn.write(out / "seed-nested");
  return 0;
}
