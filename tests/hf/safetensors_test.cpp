// The safetensors reader: the shared Hugging Face test model, small files built in memory for
// every validation rule, open errors, and checkpoint directories (single file and sharded).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <initializer_list>

#include "hf/safetensors.h"
#include "test_support.h"

namespace fdl::hf {
namespace {

namespace fs = std::filesystem;

// ---- building files ----

/// A safetensors file: the 8-byte little-endian size of `header`, `header`, then a buffer of
/// `buffer_bytes` bytes whose byte i is i & 0xff.
std::vector<uint8_t> st_bytes(std::string_view header, size_t buffer_bytes) {
  std::vector<uint8_t> out;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  for (size_t i = 0; i < buffer_bytes; ++i) out.push_back(static_cast<uint8_t>(i));
  return out;
}

/// A size prefix that says `n`, followed by `rest` verbatim.
std::vector<uint8_t> raw_prefix(uint64_t n, std::string_view rest) {
  std::vector<uint8_t> out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

// String building goes through append: GCC 12 raises a false -Wrestrict on
// `"literal" + std::string&&` when it inlines the insert at position 0.
std::string cat(std::initializer_list<std::string_view> parts) {
  std::string s;
  for (std::string_view p : parts) s += p;
  return s;
}

/// A header object from raw "key":value members.
std::string obj(std::initializer_list<std::string> members) {
  std::string s = "{";
  for (const auto& m : members) {
    if (s.size() > 1) s += ",";
    s += m;
  }
  s += "}";
  return s;
}

/// One header entry: "name":{"dtype":...,"shape":...,"data_offsets":...}; shape and offsets
/// are raw JSON so that tests can put anything there.
std::string entry(std::string_view name, std::string_view dtype, std::string_view shape,
                  std::string_view offsets) {
  return cat({"\"", name, "\":{\"dtype\":\"", dtype, "\",\"shape\":", shape, ",\"data_offsets\":",
              offsets, "}"});
}

std::string parse_error(const std::vector<uint8_t>& bytes) {
  try {
    SafetensorsFile::from_bytes(bytes, "t.safetensors");
  } catch (const SafetensorsError& e) {
    return e.what();
  }
  return "<no error>";
}

/// The file is rejected with a one-line message naming it and containing every part.
::testing::AssertionResult error_has(const std::vector<uint8_t>& bytes,
                                     std::initializer_list<std::string> parts) {
  const std::string msg = parse_error(bytes);
  if (msg.rfind("t.safetensors: ", 0) != 0)
    return ::testing::AssertionFailure() << "message does not start with the file name: " << msg;
  if (msg.find('\n') != std::string::npos)
    return ::testing::AssertionFailure() << "message spans lines: " << msg;
  for (const auto& p : parts)
    if (msg.find(p) == std::string::npos)
      return ::testing::AssertionFailure() << "expected \"" << p << "\" in: " << msg;
  return ::testing::AssertionSuccess();
}

/// A header {<one>} over a buffer of `buffer_bytes`.
::testing::AssertionResult one_entry_error(const std::string& e, size_t buffer_bytes,
                                           std::initializer_list<std::string> parts) {
  return error_has(st_bytes(obj({e}), buffer_bytes), parts);
}

template <typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const SafetensorsError& e) {
    return e.what();
  }
  return "<no error>";
}

bool contains(const std::string& s, std::string_view part) {
  return s.find(part) != std::string::npos;
}

/// A fresh, empty directory under the test run's scratch directory.
fs::path fresh_dir(const std::string& name) {
  fs::path d = test::scratch_dir() / name;
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

void write_file(const fs::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << p;
}

void write_text(const fs::path& p, const std::string& text) {
  write_file(p, std::vector<uint8_t>(text.begin(), text.end()));
}

// ---- the shared test model ----

TEST(Safetensors, RealModel) {
  const fs::path path = test::model_path("codelm-16m-hf/model.safetensors");
  FDL_ASSERT_INPUT(path);
  const SafetensorsFile f = SafetensorsFile::open(path);
  EXPECT_EQ(f.path(), path.string());
  ASSERT_EQ(f.tensors().size(), 74u);

  const SafetensorsTensor* embed = f.find("model.embed_tokens.weight");
  ASSERT_NE(embed, nullptr);
  EXPECT_EQ(embed->dtype, "F16");
  EXPECT_EQ(embed->shape, (std::vector<uint64_t>{8192, 384}));
  EXPECT_EQ(embed->n_elements(), 8192u * 384u);
  EXPECT_EQ(embed->n_bytes, 8192u * 384u * 2u);

  const SafetensorsTensor* norm = f.find("model.norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->shape, (std::vector<uint64_t>{384}));
  const SafetensorsTensor* down = f.find("model.layers.0.mlp.down_proj.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->shape, (std::vector<uint64_t>{384, 1024}));
  EXPECT_EQ(f.find("lm_head.weight"), nullptr);  // tied to the embedding
  EXPECT_EQ(f.find("model.embed_tokens"), nullptr);

  // Offset order: the first tensor starts the buffer and each one ends where the next begins.
  EXPECT_EQ(f.tensors().front().name, "model.embed_tokens.weight");
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const SafetensorsTensor& t = f.tensors()[i];
    EXPECT_EQ(t.dtype, "F16") << t.name;
    EXPECT_EQ(t.n_bytes, t.n_elements() * 2) << t.name;
    EXPECT_EQ(f.find(t.name), &t);
    if (i + 1 < f.tensors().size()) {
      EXPECT_EQ(t.data + t.n_bytes, f.tensors()[i + 1].data) << t.name;
    }
  }
  ASSERT_EQ(f.metadata().count("format"), 1u);
  EXPECT_EQ(f.metadata().at("format"), "pt");

  // The single-file checkpoint directory finds the same tensors.
  const SafetensorsCheckpoint ck = SafetensorsCheckpoint::open(path.parent_path());
  EXPECT_EQ(ck.tensors().size(), 74u);
  ASSERT_NE(ck.find("model.embed_tokens.weight"), nullptr);
  EXPECT_EQ(ck.find("model.embed_tokens.weight")->n_bytes, embed->n_bytes);
}

// ---- valid files ----

TEST(Safetensors, SmallValidFile) {
  // Header order (alphabetical in JSON) differs from offset order on purpose.
  const std::string header = obj({"\"__metadata__\":{\"format\":\"pt\",\"note\":\"x\"}",
                                  entry("a", "F32", "[2]", "[8,16]"),
                                  entry("b", "I16", "[2,2]", "[0,8]"),
                                  entry("c", "F64", "[]", "[16,24]"),
                                  entry("d", "BOOL", "[0,3]", "[24,24]"),
                                  entry("e", "F4", "[2,2]", "[24,26]")});
  SafetensorsFile f = SafetensorsFile::from_bytes(st_bytes(header, 26), "t.safetensors");
  ASSERT_EQ(f.tensors().size(), 5u);
  std::vector<std::string> names;
  for (const auto& t : f.tensors()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"b", "a", "c", "d", "e"}));

  const uint8_t* buffer = f.tensors()[0].data;
  const SafetensorsTensor* a = f.find("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->data, buffer + 8);
  EXPECT_EQ(a->data[0], 8);  // the builder's byte i is i
  EXPECT_EQ(a->n_bytes, 8u);
  EXPECT_EQ(a->shape, (std::vector<uint64_t>{2}));
  const SafetensorsTensor* c = f.find("c");
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->shape.empty());
  EXPECT_EQ(c->n_elements(), 1u);
  EXPECT_EQ(c->n_bytes, 8u);
  const SafetensorsTensor* d = f.find("d");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->n_elements(), 0u);
  EXPECT_EQ(d->n_bytes, 0u);
  EXPECT_EQ(f.find("e")->n_bytes, 2u);
  EXPECT_EQ(f.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"note", "x"}}));

  // Moving keeps the views valid: the bytes live in the file object's heap state.
  SafetensorsFile moved = std::move(f);
  EXPECT_EQ(moved.find("a")->data, a->data);
  EXPECT_EQ(moved.path(), "t.safetensors");
}

TEST(Safetensors, EmptyHeaderAndPadding) {
  EXPECT_TRUE(SafetensorsFile::from_bytes(st_bytes("{}", 0)).tensors().empty());
  // Writers pad the header with spaces to align the buffer.
  SafetensorsFile f =
      SafetensorsFile::from_bytes(st_bytes(obj({entry("w", "U8", "[3]", "[0,3]")}) + "     ", 3));
  EXPECT_EQ(f.find("w")->n_bytes, 3u);
  EXPECT_EQ(f.path(), "<memory>");
}

TEST(Safetensors, DtypeBits) {
  EXPECT_EQ(safetensors_dtype_bits("F16"), 16u);
  EXPECT_EQ(safetensors_dtype_bits("BF16"), 16u);
  EXPECT_EQ(safetensors_dtype_bits("F8_E4M3"), 8u);
  EXPECT_EQ(safetensors_dtype_bits("I64"), 64u);
  EXPECT_EQ(safetensors_dtype_bits("f16"), 0u);
  EXPECT_EQ(safetensors_dtype_bits(""), 0u);
}

// The fuzzer's committed seeds are meant to be valid files: mutations start from accepted input.
TEST(Safetensors, FuzzSeedsAreValid) {
  const fs::path seeds = fs::path(FLASHDLLM_SOURCE_DIR) / "fuzz" / "corpus-safetensors";
  FDL_ASSERT_INPUT(seeds);
  int n = 0;
  for (const auto& e : fs::directory_iterator(seeds)) {
    EXPECT_EQ(error_of([&] { SafetensorsFile::open(e.path()); }), "<no error>");
    ++n;
  }
  EXPECT_GT(n, 0);
}

// ---- validation errors ----

TEST(SafetensorsErrors, SizePrefix) {
  EXPECT_TRUE(error_has({1, 2, 3}, {"3 bytes", "shorter than the 8-byte"}));
  EXPECT_TRUE(error_has({}, {"0 bytes"}));
  EXPECT_TRUE(error_has(raw_prefix(0, "{}"), {"header size is 0"}));
  EXPECT_TRUE(error_has(raw_prefix(100, "{}"), {"header size 100 runs past the end of the file",
                                                "2 bytes after"}));
  EXPECT_TRUE(error_has(raw_prefix(uint64_t(200) << 20, "{}"), {"above the limit", "100 MiB"}));
  EXPECT_TRUE(error_has(raw_prefix(~uint64_t(0), "{}"), {"above the limit"}));
}

TEST(SafetensorsErrors, HeaderJson) {
  EXPECT_TRUE(error_has(st_bytes("{\"a\":", 0), {"header is not valid JSON"}));
  EXPECT_TRUE(error_has(st_bytes("{} x", 0), {"header is not valid JSON"}));
  EXPECT_TRUE(error_has(st_bytes("{\"\xff\":1}", 0), {"header is not valid JSON"}));
  EXPECT_TRUE(error_has(st_bytes("[1,2]", 0), {"not a JSON object"}));
  EXPECT_TRUE(error_has(st_bytes(" {}", 0), {"not a JSON object"}));
  EXPECT_TRUE(error_has(st_bytes("\"{}\"", 0), {"not a JSON object"}));
  // The same key twice: JSON parsers keep one silently; the reader refuses.
  EXPECT_TRUE(error_has(
      st_bytes(obj({entry("w", "U8", "[1]", "[0,1]"), entry("w", "U8", "[1]", "[0,1]")}), 1),
      {"key 'w' twice"}));
  // Deep nesting is never needed; it is refused while parsing.
  EXPECT_TRUE(one_entry_error(entry("w", "U8", "[[1]]", "[0,1]"), 1, {"nests JSON containers"}));
  EXPECT_TRUE(error_has(st_bytes(cat({"{\"w\":{\"x\":", std::string(10000, '['), "}}"}), 0),
                        {"nests JSON containers"}));
}

TEST(SafetensorsErrors, EntryShape) {
  EXPECT_TRUE(one_entry_error("\"w\":5", 0, {"tensor 'w': entry is a JSON number, not an object"}));
  EXPECT_TRUE(one_entry_error("\"w\":[]", 0, {"tensor 'w': entry is a JSON array"}));
  EXPECT_TRUE(one_entry_error("\"w\":{\"shape\":[1],\"data_offsets\":[0,1]}", 1,
                              {"tensor 'w'", "missing \"dtype\""}));
  EXPECT_TRUE(one_entry_error("\"w\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}", 1,
                              {"tensor 'w'", "missing \"shape\""}));
  EXPECT_TRUE(one_entry_error("\"w\":{\"dtype\":\"U8\",\"shape\":[1]}", 1,
                              {"tensor 'w'", "missing \"data_offsets\""}));
  EXPECT_TRUE(one_entry_error("\"w\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,1]}", 1,
                              {"tensor 'w'", "dtype is a JSON number, not a string"}));
  EXPECT_TRUE(one_entry_error(entry("w", "U8", "\"1\"", "[0,1]"), 1,
                              {"tensor 'w'", "shape is a JSON string, not an array"}));
  EXPECT_TRUE(one_entry_error(entry("w", "U8", "[1]", "{}"), 1,
                              {"tensor 'w'", "data_offsets must be an array of two integers"}));
  EXPECT_TRUE(one_entry_error("\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}", 1,
                              {"empty name"}));
  // Unknown keys are ignored, as the reference implementation does.
  EXPECT_EQ(parse_error(st_bytes(
                "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"extra\":1}}", 1)),
            "<no error>");
}

TEST(SafetensorsErrors, Dtype) {
  EXPECT_TRUE(one_entry_error(entry("w", "F17", "[1]", "[0,2]"), 2,
                              {"tensor 'w'", "unknown dtype 'F17'"}));
  EXPECT_TRUE(one_entry_error(entry("w", "f16", "[1]", "[0,2]"), 2, {"unknown dtype 'f16'"}));
  EXPECT_TRUE(one_entry_error(entry("w", "F4", "[3]", "[0,2]"), 2,
                              {"F4 [3] is 12 bits, not a whole number of bytes"}));
}

TEST(SafetensorsErrors, ShapeValues) {
  EXPECT_TRUE(one_entry_error(entry("w", "U8", "[2,-1]", "[0,1]"), 1,
                              {"tensor 'w'", "shape[1] is negative (-1)"}));
  EXPECT_TRUE(one_entry_error(entry("w", "U8", "[1.5]", "[0,1]"), 1,
                              {"shape[0] is not an integer (1.5)"}));
  EXPECT_TRUE(one_entry_error(entry("w", "U8", "[1e400]", "[0,1]"), 1,
                              {"header is not valid JSON"}));
  EXPECT_TRUE(one_entry_error(entry("w", "U8", "[18446744073709551616]", "[0,1]"), 1,
                              {"shape[0] is not an integer"}));
  EXPECT_TRUE(one_entry_error(entry("w", "U8", "[\"1\"]", "[0,1]"), 1,
                              {"shape[0] is a string, not an integer"}));
  EXPECT_TRUE(one_entry_error(entry("w", "U8", "[1,1,1,1,1,1,1,1,1]", "[0,1]"), 1,
                              {"shape has 9 dims; at most 8"}));
  EXPECT_EQ(parse_error(st_bytes(obj({entry("w", "U8", "[1,1,1,1,1,1,1,1]", "[0,1]")}), 1)),
            "<no error>");
  EXPECT_TRUE(one_entry_error(entry("w", "U8", "[4294967296,4294967296]", "[0,1]"), 1,
                              {"element count of shape [4294967296, 4294967296] overflows"}));
  EXPECT_TRUE(one_entry_error(entry("w", "F32", "[4611686018427387904]", "[0,1]"), 1,
                              {"byte size of F32 [4611686018427387904] overflows"}));
  // A zero dimension makes an empty tensor, however large the others.
  EXPECT_EQ(parse_error(st_bytes(
                obj({entry("w", "F32", "[4294967296,4294967296,0]", "[0,0]")}), 0)),
            "<no error>");
}

TEST(SafetensorsErrors, DataOffsets) {
  EXPECT_TRUE(one_entry_error(entry("w", "U8", "[1]", "[0]"), 1,
                              {"tensor 'w'", "data_offsets must be an array of two integers",
                               "an array of 1"}));
  EXPECT_TRUE(one_entry_error(entry("w", "U8", "[1]", "[0,1,2]"), 1, {"an array of 3"}));
  EXPECT_TRUE(one_entry_error(entry("w", "U8", "[1]", "[0,-1]"), 1,
                              {"data_offsets end is negative"}));
  EXPECT_TRUE(one_entry_error(entry("w", "U8", "[1]", "[0.0,1]"), 1,
                              {"data_offsets begin is not an integer"}));
  EXPECT_TRUE(one_entry_error(entry("w", "U8", "[1]", "[null,1]"), 1,
                              {"data_offsets begin is a null"}));
  EXPECT_TRUE(one_entry_error(entry("w", "U8", "[0]", "[8,4]"), 8,
                              {"data_offsets [8, 4] have begin > end"}));
  EXPECT_TRUE(one_entry_error(entry("w", "U8", "[100]", "[0,100]"), 16,
                              {"data_offsets [0, 100] end past the byte buffer (16 bytes)"}));
  EXPECT_TRUE(one_entry_error(entry("w", "U8", "[1]", "[0,18446744073709551615]"), 16,
                              {"end past the byte buffer"}));
}

TEST(SafetensorsErrors, ByteSizeMismatch) {
  EXPECT_EQ(parse_error(st_bytes(
                obj({entry("model.embed_tokens.weight", "F16", "[8192,384]", "[0,100]")}), 100)),
            "t.safetensors: tensor 'model.embed_tokens.weight': data_offsets [0, 100] hold 100 "
            "bytes, but F16 [8192, 384] needs 6291456");
  EXPECT_TRUE(one_entry_error(entry("w", "F32", "[2]", "[0,4]"), 4,
                              {"hold 4 bytes, but F32 [2] needs 8"}));
}

TEST(SafetensorsErrors, OverlapAndHoles) {
  EXPECT_TRUE(error_has(st_bytes(obj({entry("a", "U8", "[8]", "[0,8]"), entry("b", "U8", "[8]", "[4,12]")}), 12),
                        {"tensor 'b': data_offsets [4, 12] overlap tensor 'a' [0, 8]"}));
  EXPECT_TRUE(error_has(st_bytes(obj({entry("a", "U8", "[8]", "[0,8]"), entry("b", "U8", "[8]", "[0,8]")}), 8),
                        {"overlap tensor"}));
  // An empty tensor inside another one is an overlap too.
  EXPECT_TRUE(error_has(st_bytes(obj({entry("a", "U8", "[8]", "[0,8]"), entry("z", "U8", "[0]", "[4,4]")}), 8),
                        {"tensor 'z'", "overlap tensor 'a'"}));
  EXPECT_TRUE(error_has(st_bytes(obj({entry("a", "U8", "[4]", "[0,4]"), entry("b", "U8", "[4]", "[8,12]")}), 12),
                        {"hole", "bytes [4, 8)", "fully covered"}));
  EXPECT_TRUE(error_has(st_bytes(obj({entry("a", "U8", "[4]", "[4,8]")}), 8),
                        {"hole", "bytes [0, 4)", "fully covered"}));
  EXPECT_TRUE(error_has(st_bytes(obj({entry("a", "U8", "[4]", "[0,4]")}), 7),
                        {"hole", "last 3 bytes [4, 7)", "fully covered"}));
  EXPECT_TRUE(error_has(st_bytes("{}", 1), {"hole", "last 1 bytes"}));
}

TEST(SafetensorsErrors, Metadata) {
  EXPECT_TRUE(error_has(st_bytes("{\"__metadata__\":[1]}", 0),
                        {"__metadata__ is a JSON array, not an object of strings"}));
  EXPECT_TRUE(error_has(st_bytes("{\"__metadata__\":{\"k\":1}}", 0),
                        {"__metadata__ value of 'k' is a JSON number, not a string"}));
  EXPECT_TRUE(error_has(st_bytes("{\"__metadata__\":{\"k\":{\"x\":\"y\"}}}", 0),
                        {"__metadata__ value of 'k' is a JSON object"}));
}

TEST(SafetensorsErrors, MessagesStayOnOneLine) {
  EXPECT_TRUE(one_entry_error(entry("a\\nb", "F17", "[1]", "[0,1]"), 1, {"tensor 'a\\x0ab'"}));
  EXPECT_TRUE(error_has(st_bytes("{\"a\":\n\n", 0), {"not valid JSON"}));
}

// Every truncation and every single-byte change of a valid file is either accepted or
// rejected with SafetensorsError; sanitizers catch anything worse.
TEST(SafetensorsErrors, TruncationAndCorruptionSweep) {
  const std::vector<uint8_t> good = st_bytes(
      obj({"\"__metadata__\":{\"k\":\"v\"}", entry("a", "F16", "[2,2]", "[0,8]"),
           entry("b", "I32", "[1]", "[8,12]")}),
      12);
  for (size_t n = 0; n < good.size(); ++n) {
    const std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<ptrdiff_t>(n));
    EXPECT_NE(parse_error(cut), "<no error>") << "truncated to " << n;
  }
  for (size_t i = 0; i < good.size(); ++i)
    for (uint8_t v : {uint8_t(0), uint8_t(0xff), uint8_t('['), uint8_t('9'), uint8_t('"')}) {
      std::vector<uint8_t> bad = good;
      bad[i] = v;
      (void)parse_error(bad);
    }
}

// ---- opening files ----

TEST(SafetensorsOpen, Errors) {
  const fs::path dir = fresh_dir("st-open");
  const std::string missing = error_of([&] { SafetensorsFile::open(dir / "nope.safetensors"); });
  EXPECT_TRUE(contains(missing, (dir / "nope.safetensors").string() + ": cannot open: "))
      << missing;
  EXPECT_TRUE(contains(missing, std::strerror(ENOENT))) << missing;

  const std::string is_dir = error_of([&] { SafetensorsFile::open(dir); });
  EXPECT_TRUE(contains(is_dir, dir.string() + ": ")) << is_dir;
  EXPECT_TRUE(contains(is_dir, std::strerror(EISDIR))) << is_dir;

  write_text(dir / "empty.safetensors", "");
  EXPECT_TRUE(contains(error_of([&] { SafetensorsFile::open(dir / "empty.safetensors"); }),
                       "empty.safetensors: file is 0 bytes"));
}

TEST(SafetensorsOpen, PermissionDenied) {
  const fs::path dir = fresh_dir("st-perm");
  const fs::path locked = dir / "locked.safetensors";
  write_file(locked, st_bytes("{}", 0));
  ::chmod(locked.c_str(), 0);
  if (::access(locked.c_str(), R_OK) == 0) {
    GTEST_SKIP() << "running with permission to read mode-000 files (root?)";
  }
  const std::string denied = error_of([&] { SafetensorsFile::open(locked); });
  EXPECT_TRUE(contains(denied, locked.string() + ": cannot open: ")) << denied;
  EXPECT_TRUE(contains(denied, std::strerror(EACCES))) << denied;
}

TEST(SafetensorsOpen, FromDisk) {
  const fs::path dir = fresh_dir("st-disk");
  write_file(dir / "w.safetensors", st_bytes(obj({entry("w", "U8", "[5]", "[0,5]")}), 5));
  const SafetensorsFile f = SafetensorsFile::open(dir / "w.safetensors");
  ASSERT_NE(f.find("w"), nullptr);
  EXPECT_EQ(f.find("w")->data[4], 4);

  write_file(dir / "bad.safetensors", st_bytes(obj({entry("w", "U8", "[5]", "[0,4]")}), 4));
  const std::string msg = error_of([&] { SafetensorsFile::open(dir / "bad.safetensors"); });
  EXPECT_TRUE(contains(msg, (dir / "bad.safetensors").string() + ": tensor 'w': ")) << msg;
}

// ---- checkpoint directories ----

std::vector<uint8_t> shard(std::initializer_list<std::string> names) {
  // Each tensor is U8 [2] holding consecutive bytes.
  std::string header = "{";
  uint64_t at = 0;
  for (const auto& n : names) {
    if (at) header += ",";
    header += entry(n, "U8", "[2]", cat({"[", std::to_string(at), ",", std::to_string(at + 2), "]"}));
    at += 2;
  }
  return st_bytes(header + "}", at);
}

std::string index_json(std::initializer_list<std::pair<std::string, std::string>> map) {
  std::string s = "{\"metadata\":{\"total_size\":8},\"weight_map\":{";
  bool first = true;
  for (const auto& [t, f] : map) {
    if (!first) s += ",";
    first = false;
    s += "\"" + t + "\":\"" + f + "\"";
  }
  return s + "}}";
}

TEST(SafetensorsCheckpointDir, SingleFile) {
  const fs::path dir = fresh_dir("ck-single");
  write_file(dir / "model.safetensors", shard({"z", "a", "m"}));
  const SafetensorsCheckpoint ck = SafetensorsCheckpoint::open(dir);
  EXPECT_EQ(ck.dir(), dir);
  ASSERT_EQ(ck.shards().size(), 1u);
  std::vector<std::string> names;
  for (const SafetensorsTensor* t : ck.tensors()) names.push_back(t->name);
  EXPECT_EQ(names, (std::vector<std::string>{"a", "m", "z"}));
  ASSERT_NE(ck.find("m"), nullptr);
  EXPECT_EQ(ck.find("m")->n_bytes, 2u);
  EXPECT_EQ(ck.find("q"), nullptr);
}

TEST(SafetensorsCheckpointDir, TwoShards) {
  const fs::path dir = fresh_dir("ck-two");
  write_file(dir / "model-00001-of-00002.safetensors", shard({"b", "d"}));
  write_file(dir / "model-00002-of-00002.safetensors", shard({"a", "c"}));
  write_text(dir / "model.safetensors.index.json",
             index_json({{"a", "model-00002-of-00002.safetensors"},
                         {"b", "model-00001-of-00002.safetensors"},
                         {"c", "model-00002-of-00002.safetensors"},
                         {"d", "model-00001-of-00002.safetensors"}}));
  // A stray single file is ignored when the index exists.
  write_file(dir / "model.safetensors", shard({"stray"}));
  SafetensorsCheckpoint ck = SafetensorsCheckpoint::open(dir);
  EXPECT_EQ(ck.shards().size(), 2u);
  std::vector<std::string> names;
  for (const SafetensorsTensor* t : ck.tensors()) names.push_back(t->name);
  EXPECT_EQ(names, (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_EQ(ck.find("stray"), nullptr);
  const SafetensorsTensor* c = ck.find("c");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->data[0], 2);  // second tensor of its shard
  SafetensorsCheckpoint moved = std::move(ck);
  EXPECT_EQ(moved.find("c"), c);
}

TEST(SafetensorsCheckpointDir, IndexErrors) {
  const fs::path dir = fresh_dir("ck-bad");
  write_file(dir / "s1.safetensors", shard({"a", "b"}));
  write_file(dir / "s2.safetensors", shard({"b", "c"}));
  const fs::path index = dir / "model.safetensors.index.json";
  auto open_error = [&](const std::string& text) {
    write_text(index, text);
    return error_of([&] { SafetensorsCheckpoint::open(dir); });
  };

  std::string msg = open_error(index_json({{"a", "../s1.safetensors"}}));
  EXPECT_TRUE(contains(msg, index.string() + ": ")) << msg;
  EXPECT_TRUE(contains(msg, "'../s1.safetensors' is not a plain file name")) << msg;
  msg = open_error(index_json({{"a", "/etc/passwd"}}));
  EXPECT_TRUE(contains(msg, "'/etc/passwd' is not a plain file name")) << msg;
  msg = open_error(index_json({{"a", ".."}}));
  EXPECT_TRUE(contains(msg, "'..' is not a plain file name")) << msg;

  msg = open_error(index_json({{"a", "s1.safetensors"}, {"c", "s1.safetensors"}}));
  EXPECT_TRUE(contains(msg, index.string() + ": tensor 'c' is listed in shard 's1.safetensors', "
                                             "but that shard does not contain it")) << msg;

  msg = open_error(index_json({{"a", "s1.safetensors"}, {"c", "s2.safetensors"}}));
  EXPECT_TRUE(contains(msg, "tensor 'b' is in two shards")) << msg;
  EXPECT_TRUE(contains(msg, "s1.safetensors") && contains(msg, "s2.safetensors")) << msg;

  msg = open_error(index_json({{"a", "missing.safetensors"}}));
  EXPECT_TRUE(contains(msg, (dir / "missing.safetensors").string() + ": cannot open")) << msg;

  msg = open_error("{\"weight_map\":");
  EXPECT_TRUE(contains(msg, index.string() + ": index is not valid JSON")) << msg;
  msg = open_error("{\"metadata\":{}}");
  EXPECT_TRUE(contains(msg, "no \"weight_map\"")) << msg;
  msg = open_error("{\"weight_map\":{\"a\":3}}");
  EXPECT_TRUE(contains(msg, "weight_map entry of tensor 'a' is a JSON number")) << msg;
  msg = open_error("{\"weight_map\":{}}");
  EXPECT_TRUE(contains(msg, "weight_map lists no tensors")) << msg;
}

TEST(SafetensorsCheckpointDir, DirectoryErrors) {
  const fs::path dir = fresh_dir("ck-empty");
  std::string msg = error_of([&] { SafetensorsCheckpoint::open(dir); });
  EXPECT_TRUE(contains(msg, dir.string() + ": no safetensors checkpoint")) << msg;
  EXPECT_TRUE(contains(msg, "model.safetensors.index.json and model.safetensors")) << msg;

  msg = error_of([&] { SafetensorsCheckpoint::open(dir / "nope"); });
  EXPECT_TRUE(contains(msg, (dir / "nope").string() + ": cannot open checkpoint directory: ") &&
              contains(msg, std::strerror(ENOENT)))
      << msg;

  write_file(dir / "model.safetensors", shard({"a"}));
  msg = error_of([&] { SafetensorsCheckpoint::open(dir / "model.safetensors"); });
  EXPECT_TRUE(contains(msg, std::strerror(ENOTDIR))) << msg;

  // A broken single file: the error names that file.
  write_file(dir / "model.safetensors", st_bytes("{}", 3));
  msg = error_of([&] { SafetensorsCheckpoint::open(dir); });
  EXPECT_TRUE(contains(msg, (dir / "model.safetensors").string() + ": byte buffer has a hole"))
      << msg;
}

}  // namespace
}  // namespace fdl::hf
