// Malformed GGUF files, part 1: header and metadata. Each test breaks exactly one thing and
// checks that the error names the file, the byte offset and the field.
#include <gtest/gtest.h>

#include <initializer_list>

#include "gguf/raw_gguf.h"

namespace fdl {
namespace {

using test::parse_error;
using test::RawGguf;

::testing::AssertionResult error_has(const std::vector<uint8_t>& bytes,
                                     std::initializer_list<std::string> parts,
                                     const GgufLimits& limits = {}) {
  const std::string msg = parse_error(bytes, limits);
  for (const auto& p : parts)
    if (msg.find(p) == std::string::npos)
      return ::testing::AssertionFailure() << "expected \"" << p << "\" in: " << msg;
  return ::testing::AssertionSuccess();
}

std::string at(size_t offset) { return "t.gguf: offset " + std::to_string(offset) + ": "; }

TEST(GgufMalformedHeader, EmptyFile) {
  EXPECT_TRUE(error_has({}, {at(0) + "file is 0 bytes, too short for the GGUF magic"}));
}

TEST(GgufMalformedHeader, BadMagic) {
  RawGguf r;
  r.raw("GGML", 4).u32(3).u64(0).u64(0);
  EXPECT_TRUE(error_has(r.bytes, {at(0) + "bad magic 0x4c4d4747 ('GGML'), expected 'GGUF'"}));
}

TEST(GgufMalformedHeader, Version1Rejected) {
  EXPECT_TRUE(error_has(RawGguf().header(0, 0, 1).bytes,
                        {at(4) + "GGUF version 1 is not supported"}));
}

TEST(GgufMalformedHeader, FutureVersionRejected) {
  EXPECT_TRUE(error_has(RawGguf().header(0, 0, 4).bytes,
                        {at(4) + "unsupported GGUF version 4 (supported: 2, 3)"}));
}

TEST(GgufMalformedHeader, BigEndianFileNamed) {
  EXPECT_TRUE(error_has(RawGguf().header(0, 0, 0x03000000u).bytes,
                        {at(4) + "unsupported GGUF version 50331648", "big-endian"}));
}

TEST(GgufMalformedHeader, Version2AndEmptyFileAccepted) {
  GgufFile f = GgufFile::from_bytes(RawGguf().header(0, 0, 2).bytes);
  EXPECT_EQ(f.version(), 2u);
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset(), 32u);
}

TEST(GgufMalformedHeader, TruncatedTensorCount) {
  RawGguf r;
  r.u32(0x46554747u).u32(3).u32(0);
  EXPECT_TRUE(error_has(r.bytes, {at(8) + "tensor count needs 8 bytes but the file ends after 4",
                                  "truncated file, size 12"}));
}

TEST(GgufMalformedHeader, TensorCountAboveLimit) {
  EXPECT_TRUE(error_has(RawGguf().header((1u << 20) + 1, 0).bytes,
                        {at(8) + "tensor count 1048577 exceeds the limit of 1048576"}));
}

TEST(GgufMalformedHeader, MetadataCountAboveLimit) {
  EXPECT_TRUE(error_has(RawGguf().header(0, uint64_t{1} << 40).bytes,
                        {at(16) + "metadata count 1099511627776 exceeds the limit of 1048576"}));
}

TEST(GgufMalformedHeader, MetadataCountCannotFitInFile) {
  RawGguf r;
  r.header(0, 1000).zeros(100);
  EXPECT_TRUE(error_has(r.bytes, {at(16) + "metadata count 1000 cannot fit in the 100 bytes left"}));
}

TEST(GgufMalformedHeader, TensorCountCannotFitInFile) {
  RawGguf r;
  r.header(5, 0).zeros(64);
  EXPECT_TRUE(error_has(r.bytes, {at(8) + "tensor count 5 cannot fit in the 64 bytes left"}));
}

TEST(GgufMalformedMetadata, KeyLengthPastEndOfFile) {
  RawGguf r;
  r.header(0, 1).u64(1000).zeros(20);
  EXPECT_TRUE(error_has(r.bytes, {at(24) + "metadata key #0: key length 1000 runs past end of file (20 bytes left"}));
}

TEST(GgufMalformedMetadata, KeyLongerThanSpecLimit) {
  RawGguf r;
  r.header(0, 1).u64(70000).zeros(70000 + 16);
  EXPECT_TRUE(error_has(r.bytes, {at(24) + "metadata key #0: key length 70000 exceeds the limit of 65535"}));
}

TEST(GgufMalformedMetadata, UnknownValueType) {
  RawGguf r;
  r.header(0, 1).str("a.b").u32(13).zeros(8);
  EXPECT_TRUE(error_has(r.bytes, {at(35) + "metadata key #0 'a.b': value type 13 is not a known GGUF metadata value type"}));
}

TEST(GgufMalformedMetadata, TruncatedScalarValue) {
  RawGguf r;
  r.header(0, 1).str("k").type(GgufType::UINT64).u32(7);  // 4 of the 8 bytes
  EXPECT_TRUE(error_has(r.bytes, {at(37) + "metadata key #0 'k': UINT64 value needs 8 bytes but the file ends after 4"}));
}

TEST(GgufMalformedMetadata, StringValuePastEndOfFile) {
  RawGguf r;
  r.header(0, 1).str("name").type(GgufType::STRING).u64(500).raw("abc", 3);
  EXPECT_TRUE(error_has(r.bytes, {at(40) + "metadata key #0 'name': string value length 500 runs past end of file (3 bytes left"}));
}

TEST(GgufMalformedMetadata, StringValueAboveLimit) {
  RawGguf r;
  r.header(0, 1).kv_str("k", std::string(17, 'x'));
  GgufLimits lim;
  lim.max_string_bytes = 16;
  EXPECT_TRUE(error_has(r.bytes, {at(37) + "metadata key #0 'k': string value length 17 exceeds the limit of 16"}, lim));
}

TEST(GgufMalformedMetadata, BoolNotZeroOrOne) {
  RawGguf r;
  r.header(0, 1).str("flag").type(GgufType::BOOL).u8(2);
  EXPECT_TRUE(error_has(r.bytes, {at(40) + "metadata key #0 'flag': BOOL value 2 is not 0 or 1"}));
}

TEST(GgufMalformedMetadata, DuplicateKey) {
  RawGguf r;
  r.header(0, 2).kv_u32("a", 1);
  const size_t second = r.size();
  r.kv_u32("a", 2);
  EXPECT_TRUE(error_has(r.bytes, {at(second) + "metadata key #1 'a': duplicate metadata key (first defined at offset 24)"}));
}

TEST(GgufMalformedArray, UnknownElementType) {
  RawGguf r;
  r.header(0, 1).str("arr").type(GgufType::ARRAY).u32(99).u64(0);
  EXPECT_TRUE(error_has(r.bytes, {at(39) + "metadata key #0 'arr': array element type 99 is not a known"}));
}

TEST(GgufMalformedArray, CountAboveLimit) {
  RawGguf r;
  r.header(0, 1).str("arr").type(GgufType::ARRAY).type(GgufType::UINT8).u64(11).zeros(11);
  GgufLimits lim;
  lim.max_array_elems = 10;
  EXPECT_TRUE(error_has(r.bytes, {at(43) + "metadata key #0 'arr': array length 11 exceeds the limit of 10"}, lim));
}

TEST(GgufMalformedArray, FixedSizeElementsPastEndOfFile) {
  RawGguf r;
  r.header(0, 1).str("arr").type(GgufType::ARRAY).type(GgufType::UINT32).u64(1000).zeros(8);
  EXPECT_TRUE(error_has(r.bytes, {at(43) + "metadata key #0 'arr': array of 1000 UINT32 runs past end of file (8 bytes left"}));
}

TEST(GgufMalformedArray, ByteCountOverflowIsNotWrapped) {
  // 2^62 UINT64 elements = 2^65 bytes: the size computation must not wrap to a small number.
  RawGguf r;
  r.header(0, 1).str("arr").type(GgufType::ARRAY).type(GgufType::UINT64).u64(uint64_t{1} << 62).zeros(64);
  GgufLimits lim;
  lim.max_array_elems = UINT64_MAX;
  EXPECT_TRUE(error_has(r.bytes, {at(43) + "metadata key #0 'arr': array of 4611686018427387904 UINT64 runs past end of file"}, lim));
}

TEST(GgufMalformedArray, StringElementPastEndOfFile) {
  RawGguf r;
  r.header(0, 1).str("toks").type(GgufType::ARRAY).type(GgufType::STRING).u64(2).str("ab");
  const size_t second = r.size();
  r.u64(100).raw("xyz", 3);
  EXPECT_TRUE(error_has(r.bytes, {at(second) + "metadata key #0 'toks': array string length 100 runs past end of file"}));
}

TEST(GgufMalformedArray, BoolElementNotZeroOrOne) {
  RawGguf r;
  r.header(0, 1).str("bits").type(GgufType::ARRAY).type(GgufType::BOOL).u64(3).u8(1).u8(0).u8(7);
  EXPECT_TRUE(error_has(r.bytes, {at(52 + 2) + "metadata key #0 'bits': BOOL array element #2 is 7"}));
}

RawGguf nested_arrays(int depth) {
  RawGguf r;
  r.header(0, 1).str("n").type(GgufType::ARRAY);
  for (int i = 1; i < depth; ++i) r.type(GgufType::ARRAY).u64(1);  // array of one array ...
  r.type(GgufType::INT32).u64(2).u32(7).u32(9);                     // ... of two INT32
  return r;
}

TEST(GgufMalformedArray, NestingTooDeep) {
  EXPECT_TRUE(error_has(nested_arrays(9).bytes, {"metadata key #0 'n': arrays nested deeper than 8 levels"}));
}

TEST(GgufMalformedArray, ModerateNestingAccepted) {
  GgufFile f = GgufFile::from_bytes(nested_arrays(3).bytes);
  const GgufValue* v = f.find("n");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->elem_type, GgufType::ARRAY);
  EXPECT_EQ(v->count, 1u);
  // A nested array cannot be decoded by the flat getters.
  EXPECT_THROW(f.array_int("n"), GgufError);
}

TEST(GgufMalformedAlignment, Zero) {
  RawGguf r;
  r.header(0, 1).kv_u32("general.alignment", 0);
  EXPECT_TRUE(error_has(r.bytes, {at(24) + "metadata key 'general.alignment' is 0, must be a power of two and a multiple of 8"}));
}

TEST(GgufMalformedAlignment, NotPowerOfTwo) {
  RawGguf r;
  r.header(0, 1).kv_u32("general.alignment", 48);
  EXPECT_TRUE(error_has(r.bytes, {at(24) + "metadata key 'general.alignment' is 48, must be a power of two and a multiple of 8"}));
}

TEST(GgufMalformedAlignment, BelowEightBytes) {
  // gguf.md requires a multiple of 8; smaller alignments would give misaligned F16/F32 views.
  RawGguf r;
  r.header(0, 1).kv_u32("general.alignment", 4);
  EXPECT_TRUE(error_has(r.bytes, {at(24) + "metadata key 'general.alignment' is 4, must be a power of two and a multiple of 8"}));
}

TEST(GgufMalformedAlignment, WrongType) {
  RawGguf r;
  r.header(0, 1).kv_str("general.alignment", "32");
  EXPECT_TRUE(error_has(r.bytes, {at(24) + "metadata key 'general.alignment' has type STRING, expected UINT32"}));
}

TEST(GgufMalformedAlignment, HugeAlignmentPushesDataPastEnd) {
  // 2^63 is a valid power of two, but the data section would start at byte 2^63.
  RawGguf r;
  r.header(1, 1).str("general.alignment").type(GgufType::UINT64).u64(uint64_t{1} << 63);
  r.tensor("w", {4}, GgmlType::F32, 0).zeros(64);
  EXPECT_TRUE(error_has(r.bytes, {"tensor #0 'w': data [0, +16) runs past end of file (data section starts at 9223372036854775808"}));
}

TEST(GgufOpenErrors, MissingFileAndDirectory) {
  try {
    GgufFile::open("/nonexistent-dir/x.gguf");
    ADD_FAILURE() << "no error";
  } catch (const GgufError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/x.gguf: cannot open: No such file or directory"),
              std::string::npos) << e.what();
  }
  try {
    GgufFile::open("/tmp");
    ADD_FAILURE() << "no error";
  } catch (const GgufError& e) {
    EXPECT_NE(std::string(e.what()).find("/tmp: not a regular file"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fdl
