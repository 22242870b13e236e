// Removes this test process's scratch directory (models written by make-model tests, garbage
// files for the error tests) when the test program ends, so repeated runs leave nothing in /tmp.
#include <gtest/gtest.h>

#include <filesystem>
#include <system_error>

#include "test_support.h"

namespace {

class RemoveScratchDir : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;  // best effort: a leftover temp dir is not a test failure
    std::filesystem::remove_all(fdl::test::scratch_dir(), ec);
  }
};

[[maybe_unused]] ::testing::Environment* const kCleanup =
    ::testing::AddGlobalTestEnvironment(new RemoveScratchDir);

}  // namespace
