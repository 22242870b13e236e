// GgufWriter -> GgufFile round trips: every metadata value type, every tensor type family,
// alignment handling, and the typed getters' conversions and errors.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>

#include "gguf/raw_gguf.h"
#include "test_support.h"

namespace fdl {
namespace {

std::filesystem::path scratch(const std::string& name) { return test::scratch_dir() / name; }

// Fills byte i of tensor `seed` with a value that depends on both, so a misplaced tensor or
// offset shows up as a mismatch.
GgufWriter::Filler pattern(uint8_t seed) {
  return [seed](std::span<uint8_t> b) {
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 31 + seed);
  };
}
bool has_pattern(const GgufTensorInfo& t, uint8_t seed) {
  for (size_t i = 0; i < t.n_bytes; ++i)
    if (t.data[i] != static_cast<uint8_t>(i * 31 + seed)) return false;
  return true;
}

TEST(GgufRoundTrip, InMemoryBytesEqualTheWrittenFile) {
  GgufWriter w(64);  // a non-default alignment adds general.alignment
  w.set_string("general.architecture", "llama");
  w.add_tensor("a", GgmlType::F32, {3, 5}, pattern(1));
  w.add_tensor("b", GgmlType::F16, {7}, pattern(2));
  const auto path = scratch("in_memory.gguf");
  w.write(path);
  std::ifstream in(path, std::ios::binary);
  const std::vector<uint8_t> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::vector<uint8_t> bytes = w.to_bytes("mem");
  EXPECT_EQ(bytes, file);
  const GgufFile f = GgufFile::from_bytes(bytes, "mem");
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_TRUE(has_pattern(f.tensor("a"), 1));
  EXPECT_TRUE(has_pattern(f.tensor("b"), 2));
}

TEST(GgufRoundTrip, EveryScalarAndArrayType) {
  GgufWriter w;
  w.set_uint8("u8", 250);
  w.set_int8("i8", -120);
  w.set_uint16("u16", 65000);
  w.set_int16("i16", -32000);
  w.set_uint32("u32", 4000000000u);
  w.set_int32("i32", -2000000000);
  w.set_uint64("u64", UINT64_MAX);
  w.set_int64("i64", INT64_MIN);
  w.set_float32("f32", 0.1f);
  w.set_float64("f64", 1.0 / 3.0);
  w.set_bool("yes", true);
  w.set_bool("no", false);
  w.set_string("empty", "");
  w.set_string("text", std::string("h\xc3\xa9llo\0world", 12));  // UTF-8 and an embedded NUL
  w.set_array_strings("strs", {"", "a", "\xe2\x96\x81piece"});
  w.set_array_strings("no_strs", {});
  w.set_array_f32("floats", {1.5f, -0.f, INFINITY});
  w.set_array_i32("ints", {INT32_MIN, 0, INT32_MAX});
  w.set_array_bool("bools", {true, false, true});
  const auto path = scratch("values.gguf");
  w.write(path);

  GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  ASSERT_EQ(f.metadata().size(), 19u);
  EXPECT_EQ(f.metadata()[0].first, "u8");  // insertion order
  EXPECT_EQ(f.metadata()[18].first, "bools");
  EXPECT_EQ(f.find("u8")->type, GgufType::UINT8);
  EXPECT_EQ(f.get_uint("u8"), 250u);
  EXPECT_EQ(f.find("i8")->type, GgufType::INT8);
  EXPECT_EQ(f.get_int_or("i8", 0), -120);
  EXPECT_EQ(f.get_uint("u16"), 65000u);
  EXPECT_EQ(f.get_int_or("i16", 0), -32000);
  EXPECT_EQ(f.get_uint("u32"), 4000000000u);
  EXPECT_EQ(f.get_int_or("i32", 0), -2000000000);
  EXPECT_EQ(f.get_uint("u64"), UINT64_MAX);
  EXPECT_EQ(f.get_int_or("i64", 0), INT64_MIN);
  EXPECT_EQ(f.find("f32")->type, GgufType::FLOAT32);
  EXPECT_EQ(static_cast<float>(f.get_float("f32")), 0.1f);
  EXPECT_EQ(f.get_float("f64"), 1.0 / 3.0);
  EXPECT_TRUE(f.get_bool_or("yes", false));
  EXPECT_FALSE(f.get_bool_or("no", true));
  EXPECT_EQ(f.get_string("empty"), "");
  EXPECT_EQ(f.get_string("text"), std::string("h\xc3\xa9llo\0world", 12));
  const auto strs = f.array_strings("strs");
  ASSERT_EQ(strs.size(), 3u);
  EXPECT_EQ(strs[0], "");
  EXPECT_EQ(strs[2], "\xe2\x96\x81piece");
  EXPECT_TRUE(f.array_strings("no_strs").empty());
  const auto floats = f.array_f32("floats");
  ASSERT_EQ(floats.size(), 3u);
  EXPECT_EQ(floats[0], 1.5f);
  EXPECT_TRUE(std::signbit(floats[1]));
  EXPECT_TRUE(std::isinf(floats[2]));
  EXPECT_EQ(f.array_int("ints"), (std::vector<int64_t>{INT32_MIN, 0, INT32_MAX}));
  EXPECT_EQ(f.array_bool("bools"), (std::vector<bool>{true, false, true}));
  EXPECT_THROW(f.array_bool("ints"), GgufError);
  EXPECT_TRUE(f.tensors().empty());
}

TEST(GgufRoundTrip, SettingAKeyAgainReplacesItInPlace) {
  GgufWriter w;
  w.set_uint32("a", 1);
  w.set_string("b", "x");
  w.set_string("a", "now a string");
  EXPECT_TRUE(w.has_key("a"));
  EXPECT_FALSE(w.has_key("c"));
  const auto path = scratch("replace.gguf");
  w.write(path);
  GgufFile f = GgufFile::open(path);
  ASSERT_EQ(f.metadata().size(), 2u);
  EXPECT_EQ(f.metadata()[0].first, "a");
  EXPECT_EQ(f.get_string("a"), "now a string");
}

TEST(GgufRoundTrip, TensorsOfEveryKindAreAlignedAndIntact) {
  struct Spec {
    const char* name;
    GgmlType type;
    std::vector<uint64_t> ne;
    uint64_t bytes;
  };
  const std::vector<Spec> specs = {
      {"f32", GgmlType::F32, {3}, 12},
      {"f16", GgmlType::F16, {5, 3}, 30},
      {"bf16", GgmlType::BF16, {7, 1, 2}, 28},
      {"q8_0", GgmlType::Q8_0, {64, 3}, 2 * 3 * 34},
      {"q4_k", GgmlType::Q4_K, {256, 1, 1, 2}, 2 * 144},
      {"i32", GgmlType::I32, {1, 1, 1, 1}, 4},
  };
  for (uint64_t alignment : {uint64_t{32}, uint64_t{64}, uint64_t{4096}}) {
    SCOPED_TRACE("alignment " + std::to_string(alignment));
    GgufWriter w(alignment);
    w.set_string("general.architecture", "test");
    uint8_t seed = 1;
    for (const auto& s : specs) w.add_tensor(s.name, s.type, s.ne, pattern(seed++));
    const auto path = scratch("tensors.gguf");
    w.write(path);

    GgufFile f = GgufFile::open(path);
    EXPECT_EQ(f.alignment(), alignment);
    EXPECT_EQ(f.data_offset() % alignment, 0u);
    EXPECT_EQ(f.find("general.alignment") != nullptr, alignment != 32);
    ASSERT_EQ(f.tensors().size(), specs.size());
    seed = 1;
    for (size_t i = 0; i < specs.size(); ++i) {
      const GgufTensorInfo& t = f.tensors()[i];
      EXPECT_EQ(t.name, specs[i].name);
      EXPECT_EQ(t.type(), specs[i].type);
      EXPECT_EQ(t.n_dims, specs[i].ne.size());
      for (size_t d = 0; d < 4; ++d)
        EXPECT_EQ(t.ne[d], d < specs[i].ne.size() ? specs[i].ne[d] : 1u);
      EXPECT_EQ(t.n_bytes, specs[i].bytes);
      EXPECT_EQ(t.offset % alignment, 0u);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % alignment, 0u);
      EXPECT_TRUE(has_pattern(t, seed++)) << t.name;
    }
  }
}

TEST(GgufRoundTrip, SetValueCopiesEveryValueKindIncludingNestedArrays) {
  // Source: a hand-assembled file with a nested array (the writer has no direct setter).
  test::RawGguf r;
  r.header(0, 3).kv_u32("scalar", 7).kv_str("s", "str");
  r.str("nested").type(GgufType::ARRAY).type(GgufType::ARRAY).u64(2);
  r.type(GgufType::STRING).u64(2).str("x").str("yz");
  r.type(GgufType::UINT16).u64(3).raw("\x01\x00\x02\x00\x03\x00", 6);
  GgufFile src = GgufFile::from_bytes(r.bytes);

  const auto vocab = test::model_path("stories260K.gguf");
  std::optional<GgufFile> stories;
  if (std::filesystem::exists(vocab)) stories = GgufFile::open(vocab);

  GgufWriter w;
  for (const auto& [k, v] : src.metadata()) w.set_value(k, v);
  if (stories)
    for (const auto& [k, v] : stories->metadata()) w.set_value(k, v);
  const auto path = scratch("copied.gguf");
  w.write(path);
  GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.get_uint("scalar"), 7u);
  EXPECT_EQ(f.get_string("s"), "str");
  const GgufValue* n = f.find("nested");
  ASSERT_NE(n, nullptr);
  EXPECT_EQ(n->elem_type, GgufType::ARRAY);
  EXPECT_EQ(n->count, 2u);
  // The copied bytes of the nested array are identical to the source's.
  const GgufValue* orig = src.find("nested");
  EXPECT_EQ(std::memcmp(n->data, orig->data, 12 + 8 + 1 + 8 + 2 + 12 + 6), 0);
  if (stories) {
    for (const auto& [k, v] : stories->metadata()) {
      const GgufValue* c = f.find(k);
      ASSERT_NE(c, nullptr) << k;
      EXPECT_EQ(c->type, v.type) << k;
    }
    EXPECT_EQ(f.array_strings("tokenizer.ggml.tokens"), stories->array_strings("tokenizer.ggml.tokens"));
    EXPECT_EQ(f.array_f32("tokenizer.ggml.scores"), stories->array_f32("tokenizer.ggml.scores"));
    EXPECT_EQ(f.array_int("tokenizer.ggml.token_type"), stories->array_int("tokenizer.ggml.token_type"));
  }
}

TEST(GgufGetters, ConversionsAndErrorsNameTheKey) {
  GgufWriter w;
  w.set_int32("neg", -1);
  w.set_uint64("big", UINT64_MAX);
  w.set_uint32("count", 12);
  w.set_string("name", "x");
  w.set_array_i32("ids", {1, 2});
  const auto path = scratch("getters.gguf");
  w.write(path);
  GgufFile f = GgufFile::open(path);

  auto message = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const GgufError& e) {
      return e.what();
    }
    return "<no error>";
  };
  EXPECT_EQ(f.get_float("count"), 12.0);  // integers accepted as floats
  EXPECT_EQ(f.get_uint_or("missing", 5), 5u);
  EXPECT_EQ(f.get_string_or("missing", "dflt"), "dflt");
  EXPECT_EQ(f.get_float_or("missing", 2.5), 2.5);
  EXPECT_EQ(f.get_int_or("count", 0), 12);
  EXPECT_NE(message([&] { f.get_uint("missing.key"); }).find("getters.gguf: metadata key 'missing.key' is required but missing"), std::string::npos);
  EXPECT_NE(message([&] { f.get_uint("neg"); }).find("metadata key 'neg' is -1, expected a non-negative integer"), std::string::npos);
  EXPECT_NE(message([&] { f.get_int_or("big", 0); }).find("metadata key 'big' is 18446744073709551615, too large"), std::string::npos);
  EXPECT_NE(message([&] { f.get_string("count"); }).find("metadata key 'count' has type UINT32, expected STRING"), std::string::npos);
  EXPECT_NE(message([&] { f.get_uint("name"); }).find("metadata key 'name' has type STRING, expected an unsigned integer"), std::string::npos);
  EXPECT_NE(message([&] { f.get_bool_or("count", false); }).find("metadata key 'count' has type UINT32, expected BOOL"), std::string::npos);
  EXPECT_NE(message([&] { f.array_strings("ids"); }).find("metadata key 'ids' has type ARRAY of INT32, expected ARRAY of STRING"), std::string::npos);
  EXPECT_NE(message([&] { f.array_f32("name"); }).find("metadata key 'name' has type STRING, expected ARRAY of FLOAT32"), std::string::npos);
  EXPECT_NE(message([&] { f.tensor("nope"); }).find("tensor 'nope' not found"), std::string::npos);
}

}  // namespace
}  // namespace fdl
