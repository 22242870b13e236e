// TierCapacity: sizes as bytes or fractions, and bad input rejected with a clear error.
#include <gtest/gtest.h>

#include "flashdllm/kv_tiers.h"

namespace fdl {
namespace {

TEST(TierCapacity, ParsesBytesUnitsAndFractions) {
  EXPECT_EQ(TierCapacity::parse("1048576").bytes, 1048576u);
  EXPECT_EQ(TierCapacity::parse("512MiB").bytes, 512ull << 20);
  EXPECT_EQ(TierCapacity::parse("4GiB").bytes, 4ull << 30);
  EXPECT_EQ(TierCapacity::parse("2GB").bytes, 2000000000ull);
  EXPECT_EQ(TierCapacity::parse("64k").bytes, 65536u);
  EXPECT_DOUBLE_EQ(TierCapacity::parse("25%").fraction, 0.25);
  EXPECT_DOUBLE_EQ(TierCapacity::parse("0.5").fraction, 0.5);
  EXPECT_EQ(TierCapacity::parse("0.5").bytes, 0u);
}

TEST(TierCapacity, RejectsJunk) {
  for (const char* bad : {"", "abc", "-1", "12XB", "150%", "1.5", "nan", "inf", "1e30"})
    EXPECT_THROW(TierCapacity::parse(bad), std::invalid_argument) << bad;
}

TEST(TierCapacity, ResolvesToWholeBlocksNeverAboveTheCap) {
  const TierCapacity bytes = TierCapacity::parse("10000");
  EXPECT_EQ(bytes.resolve_blocks(0, 4096), 2u);  // 2.44 blocks -> 2
  const TierCapacity frac = TierCapacity::parse("50%");
  EXPECT_EQ(frac.resolve_bytes(1000), 500u);
  EXPECT_EQ(frac.resolve_blocks(1000, 300), 1u);
  EXPECT_EQ(TierCapacity{}.resolve_blocks(1 << 30, 4096), 0u);
  EXPECT_THROW(bytes.resolve_blocks(0, 0), std::invalid_argument);
  EXPECT_GT(host_ram_bytes(), 0u);
  EXPECT_GT(free_disk_bytes(std::filesystem::temp_directory_path()), 0u);
  EXPECT_EQ(free_disk_bytes("/nonexistent/flashdllm"), 0u);
}

}  // namespace
}  // namespace fdl
