// The tier tests write disk-tier directories (and a trace file) under this process's scratch
// dir; remove it when the program ends so repeated runs leave nothing in the temp dir.
#include <gtest/gtest.h>

#include <filesystem>
#include <system_error>

#include "test_support.h"

namespace {

class TierScratchCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;  // best effort; a leftover directory is not a failure
    std::filesystem::remove_all(fdl::test::scratch_dir(), ec);
  }
};

[[maybe_unused]] ::testing::Environment* const kTierCleanup =
    ::testing::AddGlobalTestEnvironment(new TierScratchCleanup);

}  // namespace
