// GgufWriter failure paths: argument validation, and real I/O errors from the kernel (missing
// directory, file-size limit reached mid-write) that must leave no partial file behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>

#include "flashdllm/gguf.h"
#include "test_support.h"

namespace fdl {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const GgufError& e) {
    return e.what();
  }
  return "<no error>";
}

void fill_zero(std::span<uint8_t> b) { std::fill(b.begin(), b.end(), 0); }

size_t entries_in(const std::filesystem::path& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

TEST(GgufWriterErrors, InvalidArgumentsAreRejectedWithReasons) {
  EXPECT_NE(error_of([] { GgufWriter w(48); }).find("alignment 48 must be a power of two and a multiple of 8"), std::string::npos);
  EXPECT_NE(error_of([] { GgufWriter w(0); }).find("alignment 0"), std::string::npos);
  EXPECT_NE(error_of([] { GgufWriter w(4); }).find("alignment 4 must be"), std::string::npos);
  GgufWriter w;
  EXPECT_NE(error_of([&] { w.set_uint32("", 1); }).find("metadata key is empty"), std::string::npos);
  EXPECT_NE(error_of([&] { w.set_uint32(std::string(70000, 'k'), 1); }).find("70000 bytes exceeds the GGUF limit of 65535"), std::string::npos);
  EXPECT_NE(error_of([&] { w.add_tensor("", GgmlType::F32, {1}, fill_zero); }).find("tensor name is empty"), std::string::npos);
  EXPECT_NE(error_of([&] { w.add_tensor(std::string(64, 'n'), GgmlType::F32, {1}, fill_zero); }).find("ggml allows at most 63"), std::string::npos);
  EXPECT_NE(error_of([&] { w.add_tensor("t", GgmlType::F32, {}, fill_zero); }).find("tensor 't': has 0 dims, expected 1..4"), std::string::npos);
  EXPECT_NE(error_of([&] { w.add_tensor("t", GgmlType::F32, {1, 1, 1, 1, 1}, fill_zero); }).find("has 5 dims"), std::string::npos);
  EXPECT_NE(error_of([&] { w.add_tensor("t", GgmlType::F32, {4, 0}, fill_zero); }).find("tensor 't': dimension ne[1] is 0"), std::string::npos);
  EXPECT_NE(error_of([&] { w.add_tensor("t", static_cast<GgmlType>(5), {32}, fill_zero); }).find("unknown type type#5"), std::string::npos);
  EXPECT_NE(error_of([&] { w.add_tensor("t", GgmlType::Q8_0, {48}, fill_zero); }).find("ne[0] = 48 is not a multiple of the Q8_0 block size 32"), std::string::npos);
  EXPECT_NE(error_of([&] { w.add_tensor("t", GgmlType::F32, {uint64_t{1} << 62, 8}, fill_zero); }).find("element count overflows"), std::string::npos);
  EXPECT_NE(error_of([&] { w.add_tensor("t", GgmlType::F32, {4}, nullptr); }).find("no filler"), std::string::npos);
  w.add_tensor("t", GgmlType::F32, {4}, fill_zero);
  EXPECT_NE(error_of([&] { w.add_tensor("t", GgmlType::F32, {4}, fill_zero); }).find("tensor 't': duplicate tensor name"), std::string::npos);
}

TEST(GgufWriterErrors, ConflictingAlignmentKey) {
  GgufWriter w(64);
  w.set_uint32("general.alignment", 32);
  const auto path = test::scratch_dir() / "conflict.gguf";
  EXPECT_NE(error_of([&] { w.write(path); }).find("general.alignment must be the UINT32 64"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(GgufWriterErrors, MissingDirectory) {
  GgufWriter w;
  w.set_string("a", "b");
  const std::string msg = error_of([&] { w.write("/nonexistent-flashdllm-dir/out.gguf"); });
  EXPECT_NE(msg.find("/nonexistent-flashdllm-dir/out.gguf: directory /nonexistent-flashdllm-dir does not exist"), std::string::npos) << msg;
  EXPECT_EQ(msg.find(".tmp"), std::string::npos) << msg;
}

TEST(GgufWriterErrors, TargetIsADirectoryIsRefusedAndNothingIsLeft) {
  const auto dir = test::scratch_dir() / "rename-target";
  std::filesystem::create_directories(dir / "out.gguf" / "child");  // non-empty directory
  GgufWriter w;
  w.set_string("a", "b");
  const std::string msg = error_of([&] { w.write(dir / "out.gguf"); });
  EXPECT_NE(msg.find("refusing to overwrite " + (dir / "out.gguf").string() + ": not a regular file"), std::string::npos) << msg;
  EXPECT_EQ(entries_in(dir), 1u);  // only the directory itself; no temp file was left
}

TEST(GgufWriterErrors, FillerExceptionLeavesExistingFileUntouched) {
  const auto dir = test::scratch_dir() / "filler-throws";
  std::filesystem::create_directories(dir);
  const auto path = dir / "model.gguf";
  { std::ofstream(path) << "previous contents"; }
  GgufWriter w;
  w.add_tensor("t", GgmlType::F32, {4}, [](std::span<uint8_t>) { throw std::runtime_error("rng failed"); });
  EXPECT_THROW(w.write(path), std::runtime_error);
  std::ifstream in(path);
  std::string content;
  std::getline(in, content);
  EXPECT_EQ(content, "previous contents");
  EXPECT_EQ(entries_in(dir), 1u);
}

// A real mid-write I/O failure: RLIMIT_FSIZE makes the kernel fail write() with EFBIG once
// the file reaches the limit, exactly like a full disk fails it with ENOSPC. Run in a child
// process so the limit does not affect other tests.
TEST(GgufWriterErrors, WriteFailureMidTensorReportsOffsetAndRemovesTempFile) {
  const auto dir = test::scratch_dir() / "fsize-limit";
  std::filesystem::create_directories(dir);
  EXPECT_EXIT(
      {
        ::signal(SIGXFSZ, SIG_IGN);  // get EFBIG from write() instead of being killed
        struct rlimit lim {};
        ::getrlimit(RLIMIT_FSIZE, &lim);
        lim.rlim_cur = 64 * 1024;
        if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) std::_Exit(10);
        GgufWriter w;
        w.set_string("general.architecture", "llama");
        w.add_tensor("big", GgmlType::F32, {1024, 1024}, fill_zero);  // 4 MiB > 64 KiB
        const std::string msg = error_of([&] { w.write(dir / "big.gguf"); });
        if (msg.find("big.gguf: write failed at offset 65536: File too large") == std::string::npos) {
          std::fprintf(stderr, "unexpected: %s\n", msg.c_str());
          std::_Exit(11);
        }
        if (entries_in(dir) != 0) std::_Exit(12);
        std::fprintf(stderr, "write failure reported\n");
        std::_Exit(0);
      },
      ::testing::ExitedWithCode(0), "write failure reported");
}

}  // namespace
}  // namespace fdl
