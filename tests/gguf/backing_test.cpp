// GgufBacking::HugePageCopy must expose exactly the bytes and metadata the mmap path does; only
// such a copy (or an in-memory file) can be edited in place.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <vector>

#include "flashdllm/gguf.h"
#include "test_support.h"

namespace fdl {
namespace {

TEST(GgufBacking, HugePageCopyMatchesMmapByteForByte) {
  const auto path = test::model_path("stories260K.gguf");
  const GgufFile mapped = GgufFile::open(path, {}, GgufBacking::Mmap);
  const GgufFile copied = GgufFile::open(path, {}, GgufBacking::HugePageCopy);
  ASSERT_EQ(mapped.tensors().size(), copied.tensors().size());
  ASSERT_EQ(mapped.metadata().size(), copied.metadata().size());
  EXPECT_EQ(mapped.get_string("general.architecture"), copied.get_string("general.architecture"));
  for (size_t i = 0; i < mapped.tensors().size(); ++i) {
    const auto& a = mapped.tensors()[i];
    const auto& b = copied.tensors()[i];
    ASSERT_EQ(a.name, b.name);
    ASSERT_EQ(a.n_bytes, b.n_bytes);
    EXPECT_NE(a.data, b.data) << "the copy must not alias the file mapping";
    EXPECT_EQ(std::memcmp(a.data, b.data, a.n_bytes), 0) << a.name;
  }
}

TEST(GgufBacking, HugePageCopyOfMissingFileNamesThePath) {
  try {
    (void)GgufFile::open("/nonexistent/dir/m.gguf", {}, GgufBacking::HugePageCopy);
    FAIL() << "expected GgufError";
  } catch (const GgufError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir/m.gguf"), std::string::npos) << e.what();
  }
}

// edit_in_place: the held copy is writable for the call and read-only after it (a later
// edit still works, after an exception too); a zero-copy mapping is refused without running
// the edit and the file on disk never changes; bytes outside the tensor data are refused.
TEST(GgufBacking, OnlyAPrivateCopyIsEditedInPlace) {
  const auto path = test::model_path("stories260K.gguf");
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> disk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  GgufFile copied = GgufFile::open(path, {}, GgufBacking::HugePageCopy);
  const GgufTensorInfo& t = copied.tensors().front();
  const uint8_t first = t.data[0];
  EXPECT_TRUE(copied.edit_in_place(t.data, t.n_bytes, [&](uint8_t* w) { w[0] = uint8_t(first + 1); }));
  EXPECT_EQ(t.data[0], uint8_t(first + 1));
  EXPECT_THROW(copied.edit_in_place(t.data, 1, [](uint8_t*) { throw std::runtime_error("edit failed"); }),
               std::runtime_error);
  EXPECT_TRUE(copied.edit_in_place(t.data, 1, [&](uint8_t* w) { w[0] = first; }));
  EXPECT_EQ(t.data[0], first);
  EXPECT_THROW(copied.edit_in_place(disk.data(), 1, [](uint8_t*) {}), std::invalid_argument);
  EXPECT_THROW(copied.edit_in_place(t.data, size_t(copied.file_size()), [](uint8_t*) {}), std::invalid_argument);

  GgufFile mapped = GgufFile::open(path, {}, GgufBacking::Mmap);
  bool ran = false;
  EXPECT_FALSE(mapped.edit_in_place(mapped.tensors().front().data, 1, [&](uint8_t*) { ran = true; }));
  EXPECT_FALSE(ran);

  GgufFile in_memory = GgufFile::from_bytes(std::vector<uint8_t>(disk.begin(), disk.end()));
  const GgufTensorInfo& m = in_memory.tensors().front();
  EXPECT_TRUE(in_memory.edit_in_place(m.data, 1, [&](uint8_t* w) { w[0] = uint8_t(first + 2); }));
  EXPECT_EQ(m.data[0], uint8_t(first + 2));

  std::ifstream again(path, std::ios::binary);
  const std::vector<char> after((std::istreambuf_iterator<char>(again)), std::istreambuf_iterator<char>());
  EXPECT_EQ(after, disk);
}

}  // namespace
}  // namespace fdl
