// GgufWriter output targets that a rename must not clobber: FIFOs and other non-regular files
// are refused, a symlink is written through (the link stays, its target gets the model), and
// errors name the path the caller gave rather than the writer's temporary file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <iterator>

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

size_t entries_in(const std::filesystem::path& dir) {
  size_t n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++n;
  return n;
}

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

GgufWriter small_writer() {
  GgufWriter w;
  w.set_string("general.name", "target-test");
  return w;
}

TEST(GgufWriterTarget, FifoIsRefusedAndStaysAFifo) {
  const auto dir = test::scratch_dir() / "fifo-target";
  std::filesystem::create_directories(dir);
  const auto fifo = dir / "pipe.gguf";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string msg = error_of([&] { small_writer().write(fifo); });
  EXPECT_EQ(msg, "refusing to overwrite " + fifo.string() + ": not a regular file");
  struct stat st{};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_EQ(entries_in(dir), 1u);  // no temp file left behind
}

TEST(GgufWriterTarget, SymlinkToFifoIsRefused) {
  const auto dir = test::scratch_dir() / "link-to-fifo";
  std::filesystem::create_directories(dir);
  ASSERT_EQ(::mkfifo((dir / "pipe").c_str(), 0600), 0);
  std::filesystem::create_symlink("pipe", dir / "link.gguf");
  const std::string msg = error_of([&] { small_writer().write(dir / "link.gguf"); });
  EXPECT_NE(msg.find("refusing to overwrite " + (dir / "link.gguf").string()), std::string::npos) << msg;
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "link.gguf"));
  EXPECT_EQ(entries_in(dir), 2u);
}

TEST(GgufWriterTarget, SymlinkIsWrittenThrough) {
  const auto dir = test::scratch_dir() / "symlink-target";
  std::filesystem::create_directories(dir / "real");
  const auto real = dir / "real" / "model.gguf";
  { std::ofstream(real) << "old contents"; }
  const auto link = dir / "link.gguf";
  std::filesystem::create_symlink("real/model.gguf", link);  // relative target
  small_writer().write(link);
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_EQ(std::filesystem::read_symlink(link), std::filesystem::path("real/model.gguf"));
  const std::string bytes = read_all(real);
  ASSERT_GE(bytes.size(), 4u);
  EXPECT_EQ(bytes.substr(0, 4), "GGUF");
  EXPECT_EQ(entries_in(dir), 2u);          // link and real/, nothing else
  EXPECT_EQ(entries_in(dir / "real"), 1u);  // the model only, no temp file
}

TEST(GgufWriterTarget, DanglingSymlinkCreatesItsTarget) {
  const auto dir = test::scratch_dir() / "dangling-target";
  std::filesystem::create_directories(dir);
  std::filesystem::create_symlink(dir / "new.gguf", dir / "link.gguf");  // absolute target
  small_writer().write(dir / "link.gguf");
  EXPECT_TRUE(std::filesystem::is_symlink(dir / "link.gguf"));
  EXPECT_TRUE(std::filesystem::is_regular_file(dir / "new.gguf"));
}

TEST(GgufWriterTarget, MissingDirectoryIsNamed) {
  const auto dir = test::scratch_dir() / "missing-parent";
  std::filesystem::create_directories(dir);
  const auto out = dir / "no-such-dir" / "out.gguf";
  const std::string msg = error_of([&] { small_writer().write(out); });
  EXPECT_EQ(msg, out.string() + ": directory " + (dir / "no-such-dir").string() + " does not exist");
  EXPECT_FALSE(std::filesystem::exists(dir / "no-such-dir"));
}

TEST(GgufWriterTarget, ParentIsAFileIsNamed) {
  const auto dir = test::scratch_dir() / "parent-is-file";
  std::filesystem::create_directories(dir);
  { std::ofstream(dir / "plain") << "x"; }
  const auto out = dir / "plain" / "out.gguf";
  const std::string msg = error_of([&] { small_writer().write(out); });
  EXPECT_EQ(msg, out.string() + ": " + (dir / "plain").string() + " is not a directory");
}

}  // namespace
}  // namespace fdl
