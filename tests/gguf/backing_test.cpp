// GgufBacking::HugePageCopy must expose exactly the bytes and metadata the mmap path does.
#include <gtest/gtest.h>

#include <cstring>

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

}  // namespace
}  // namespace fdl
