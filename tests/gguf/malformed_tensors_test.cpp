// Malformed GGUF files, part 2: the tensor table and tensor data, plus whole-file robustness
// sweeps (every truncation, byte corruption) over a valid file made by GgufWriter.
#include <gtest/gtest.h>

#include <initializer_list>

#include "gguf/raw_gguf.h"
#include "test_support.h"

namespace fdl {
namespace {

using test::parse_error;
using test::RawGguf;

::testing::AssertionResult error_has(const std::vector<uint8_t>& bytes,
                                     std::initializer_list<std::string> parts) {
  const std::string msg = parse_error(bytes);
  for (const auto& p : parts)
    if (msg.find(p) == std::string::npos)
      return ::testing::AssertionFailure() << "expected \"" << p << "\" in: " << msg;
  return ::testing::AssertionSuccess();
}

std::string at(size_t offset) { return "t.gguf: offset " + std::to_string(offset) + ": "; }

// A file with one tensor-info entry (at offset 24) and `data_bytes` of zeroed data.
std::vector<uint8_t> one_tensor(const std::vector<uint64_t>& ne, GgmlType type, uint64_t offset,
                                size_t data_bytes) {
  RawGguf r;
  r.header(1, 0).tensor("w", ne, type, offset).pad_to(32).zeros(data_bytes);
  return r.bytes;
}

TEST(GgufMalformedTensor, Valid) {
  GgufFile f = GgufFile::from_bytes(one_tensor({8, 2}, GgmlType::F32, 0, 64));
  const GgufTensorInfo& t = f.tensor("w");
  EXPECT_EQ(t.n_bytes, 64u);
  EXPECT_EQ(t.n_elements(), 16u);
  EXPECT_EQ(f.data_offset(), 96u);  // 24 header + 41 tensor info = 65, aligned up to 32
}

TEST(GgufMalformedTensor, NDimsZero) {
  EXPECT_TRUE(error_has(one_tensor({}, GgmlType::F32, 0, 64),
                        {at(33) + "tensor #0 'w': n_dims 0 is out of range 1..4"}));
}

TEST(GgufMalformedTensor, NDimsFive) {
  EXPECT_TRUE(error_has(one_tensor({1, 1, 1, 1, 1}, GgmlType::F32, 0, 64),
                        {at(33) + "tensor #0 'w': n_dims 5 is out of range 1..4"}));
}

TEST(GgufMalformedTensor, DimensionZero) {
  EXPECT_TRUE(error_has(one_tensor({4, 0}, GgmlType::F32, 0, 64),
                        {at(45) + "tensor #0 'w': dimension ne[1] is 0"}));
}

TEST(GgufMalformedTensor, ElementCountOverflow) {
  EXPECT_TRUE(error_has(one_tensor({uint64_t{1} << 32, uint64_t{1} << 32}, GgmlType::F32, 0, 64),
                        {at(45) + "tensor #0 'w': element count overflows at ne[1] = 4294967296"}));
}

TEST(GgufMalformedTensor, ByteSizeOverflow) {
  // 2^62 F32 elements fit in int64 but their 2^64 bytes do not fit in uint64.
  EXPECT_TRUE(error_has(one_tensor({uint64_t{1} << 62}, GgmlType::F32, 0, 64),
                        {at(33) + "tensor #0 'w': byte size of 4611686018427387904 F32 elements overflows"}));
}

TEST(GgufMalformedTensor, UnknownType) {
  EXPECT_TRUE(error_has(one_tensor({32}, static_cast<GgmlType>(4), 0, 64),
                        {at(45) + "tensor #0 'w': unknown tensor type id 4"}));
}

TEST(GgufMalformedTensor, RowNotMultipleOfBlockSize) {
  EXPECT_TRUE(error_has(one_tensor({33, 2}, GgmlType::Q8_0, 0, 128),
                        {at(33) + "tensor #0 'w': ne[0] = 33 is not a multiple of the Q8_0 block size 32"}));
}

TEST(GgufMalformedTensor, MisalignedOffset) {
  EXPECT_TRUE(error_has(one_tensor({4}, GgmlType::F32, 4, 64),
                        {at(49) + "tensor #0 'w': data offset 4 is not a multiple of the alignment 32"}));
}

TEST(GgufMalformedTensor, DataPastEndOfFile) {
  EXPECT_TRUE(error_has(one_tensor({8, 2}, GgmlType::F32, 0, 60),
                        {at(24) + "tensor #0 'w': data [0, +64) runs past end of file (data section starts at 96, file size 156)"}));
}

TEST(GgufMalformedTensor, OffsetNearUint64MaxDoesNotWrap) {
  EXPECT_TRUE(error_has(one_tensor({8}, GgmlType::F32, UINT64_MAX - 31, 64),
                        {at(24) + "tensor #0 'w': data [18446744073709551584, +32) runs past end of file"}));
}

TEST(GgufMalformedTensor, TruncatedInsideTensorInfo) {
  RawGguf r;
  r.header(1, 0).str("w").u32(2).u64(8).u32(0);  // 25 bytes: less than one minimal entry
  EXPECT_TRUE(error_has(r.bytes, {at(8) + "tensor count 1 cannot fit in the 25 bytes left"}));
  RawGguf r2;
  r2.header(1, 0).str("weights.0").u32(2).u64(8).u32(0);  // ne[1] cut after 4 of 8 bytes
  EXPECT_TRUE(error_has(r2.bytes, {at(53) + "tensor #0 'weights.0': ne[1] needs 8 bytes but the file ends after 4"}));
}

TEST(GgufMalformedTensor, DuplicateName) {
  RawGguf r;
  r.header(2, 0).tensor("w", {8}, GgmlType::F32, 0);
  const size_t second = r.size();
  r.tensor("w", {8}, GgmlType::F32, 32).pad_to(32).zeros(64);
  EXPECT_TRUE(error_has(r.bytes, {at(second) + "tensor #1 'w': duplicate tensor name (first defined at offset 24)"}));
}

TEST(GgufMalformedTensor, OverlappingData) {
  RawGguf r;
  r.header(2, 0).tensor("a", {16}, GgmlType::F32, 0);
  const size_t second = r.size();
  r.tensor("b", {16}, GgmlType::F32, 32).pad_to(32).zeros(128);
  EXPECT_TRUE(error_has(r.bytes, {at(second) + "tensor #1 'b': data [32, +64) overlaps tensor 'a' [0, +64)"}));
}

TEST(GgufMalformedTensor, AdjacentAndOutOfOrderTensorsAccepted) {
  RawGguf r;
  r.header(2, 0).tensor("second", {16}, GgmlType::F32, 64).tensor("first", {16}, GgmlType::F32, 0);
  r.pad_to(32).zeros(128);
  GgufFile f = GgufFile::from_bytes(r.bytes);
  EXPECT_EQ(f.tensor("first").data + 64, f.tensor("second").data);
}

// A valid file with metadata of every kind and two tensors, made by the writer.
std::vector<uint8_t> writer_sample() {
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  w.set_uint32("llama.block_count", 2);
  w.set_float32("eps", 1e-5f);
  w.set_bool("flag", true);
  w.set_array_strings("tokens", {"<unk>", "a", "bc"});
  w.set_array_f32("scores", {0.f, -1.f, -2.f});
  w.set_array_i32("types", {2, 1, 1});
  w.add_tensor("a", GgmlType::F32, {4, 2}, [](std::span<uint8_t> b) { std::fill(b.begin(), b.end(), 1); });
  w.add_tensor("q", GgmlType::Q8_0, {32}, [](std::span<uint8_t> b) { std::fill(b.begin(), b.end(), 2); });
  const auto path = test::scratch_dir() / "sample.gguf";
  w.write(path);
  std::vector<uint8_t> bytes(std::filesystem::file_size(path));
  FILE* fp = std::fopen(path.c_str(), "rb");
  EXPECT_EQ(std::fread(bytes.data(), 1, bytes.size(), fp), bytes.size());
  std::fclose(fp);
  return bytes;
}

TEST(GgufRobustness, EveryTruncationIsRejectedWithAClearMessage) {
  const std::vector<uint8_t> full = writer_sample();
  ASSERT_EQ(parse_error(full), "<parsed>");
  for (size_t len = 0; len < full.size(); ++len) {
    const std::string msg = parse_error(std::vector<uint8_t>(full.begin(), full.begin() + len));
    const bool clear = msg.find("truncated") != std::string::npos ||
                       msg.find("runs past end of file") != std::string::npos ||
                       msg.find("cannot fit") != std::string::npos ||
                       msg.find("too short") != std::string::npos;
    EXPECT_TRUE(clear) << "prefix of " << len << " bytes: " << msg;
    EXPECT_EQ(msg.rfind("t.gguf: offset ", 0), 0u) << msg;
  }
}

TEST(GgufRobustness, CorruptedBytesNeverCrash) {
  // Overwrite each byte of the header/metadata/tensor table with values that tend to turn
  // lengths into huge numbers; the parser must either accept the file or throw GgufError.
  const std::vector<uint8_t> full = writer_sample();
  GgufFile ok = GgufFile::from_bytes(full);
  const size_t table_end = ok.data_offset();
  size_t rejected = 0;
  for (size_t i = 0; i < table_end; ++i) {
    for (uint8_t v : {uint8_t{0x00}, uint8_t{0x01}, uint8_t{0x7f}, uint8_t{0x80}, uint8_t{0xff}}) {
      std::vector<uint8_t> b = full;
      if (b[i] == v) continue;
      b[i] = v;
      if (parse_error(b) != "<parsed>") ++rejected;
    }
  }
  EXPECT_GT(rejected, table_end);  // most corruptions are detected
}

TEST(GgufRobustness, CommittedFuzzRegressionsAreRejectedCleanly) {
  // Inputs in fuzz/corpus/ once crashed the fuzz target; each must now parse or be rejected.
  const auto dir = std::filesystem::path(FLASHDLLM_SOURCE_DIR) / "fuzz" / "corpus";
  FDL_ASSERT_INPUT(dir);
  size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::vector<uint8_t> bytes(entry.file_size());
    FILE* fp = std::fopen(entry.path().c_str(), "rb");
    ASSERT_NE(fp, nullptr);
    ASSERT_EQ(std::fread(bytes.data(), 1, bytes.size(), fp), bytes.size());
    std::fclose(fp);
    const std::string msg = parse_error(bytes);
    if (entry.path().filename().string().find("alignment-1") != std::string::npos) {
      EXPECT_NE(msg.find("metadata key 'general.alignment' is 1, must be a power of two and a multiple of 8"),
                std::string::npos) << msg;
    }
    ++n;
  }
  EXPECT_GE(n, 1u);
}

}  // namespace
}  // namespace fdl
