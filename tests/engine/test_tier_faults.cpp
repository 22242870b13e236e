// KV-tier acceptance: a bit flipped in a demoted block (tier 1 or tier 2) is detected, the
// block is recomputed and the output does not change; a disk tier that fails (a path that
// cannot be used, an injected EIO on write or on read) switches tier 2 off without a crash
// and without changing the output.
#include <gtest/gtest.h>

#include <fstream>

#include "test_tier_fixture.h"

namespace fdl {
namespace {

GeneratorOptions small_options() {
  GeneratorOptions g;
  g.n_ctx = 128;
  g.block_size = 16;
  g.max_sequences = 4;
  return g;
}

std::vector<GenerationRequest> round_one() {
  std::vector<GenerationRequest> reqs;
  for (uint32_t i = 0; i < 4; ++i)
    reqs.push_back(test::greedy_request(test::tier_prompt(60 + 5 * i, 300 + i), 40));
  return reqs;
}
std::vector<GenerationRequest> round_two() {  // different prompts: they push round one down
  std::vector<GenerationRequest> reqs;
  for (uint32_t i = 0; i < 4; ++i)
    reqs.push_back(test::greedy_request(test::tier_prompt(70 + 3 * i, 400 + i), 30));
  return reqs;
}

std::vector<std::vector<int32_t>> reference(const LoadedModel& m,
                                            const std::vector<GenerationRequest>& reqs) {
  auto gen = test::make_generator(m, small_options());
  std::vector<std::vector<int32_t>> out;
  for (const auto& r : gen.generate(reqs)) out.push_back(r.generated_ids);
  return out;
}

void run_rounds(test::TierFixture& f, const std::vector<GenerationRequest>& reqs, RequestId base) {
  for (size_t i = 0; i < reqs.size(); ++i) f.add(base + i, reqs[i]);
  f.run();
}

void expect_outputs(test::TierFixture& f, const std::vector<std::vector<int32_t>>& want,
                    RequestId base) {
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(f.records[base + i].finished) << base + i;
    EXPECT_EQ(f.records[base + i].ids, want[i]) << "request " << base + i;
  }
}

void corrupt_case(size_t host_blocks, size_t disk_blocks, size_t checked_tier) {
  const auto& m = test::stories_model();
  const auto a = round_one(), b = round_two();
  const auto want_a = reference(m, a), want_b = reference(m, b);
  GeneratorOptions g = small_options();
  const size_t bb = m.model->kv_shape(16).block_bytes();
  g.kv_tiers = test::tier_options(bb, host_blocks, disk_blocks, test::fresh_dir("tier-corrupt"));
  test::TierFixture f(m, g, SchedulerOptions{}, 8);
  run_rounds(f, a, 0);
  run_rounds(f, b, 10);
  const auto ids = f.scheduler.prefix_cache().offloaded_ids();
  ASSERT_FALSE(ids.empty());
  size_t flipped = 0;
  for (OffloadId id : ids)
    if (size_t(f.tiers->meta(id).tier) == checked_tier) {
      f.tiers->corrupt_for_test(id, (id * 131) % bb, int(id % 8));
      ++flipped;
    }
  ASSERT_GT(flipped, 0u);
  run_rounds(f, a, 20);  // round one again: its blocks come back from the lower tiers
  expect_outputs(f, want_a, 0);
  expect_outputs(f, want_b, 10);
  expect_outputs(f, want_a, 20);
  const auto km = f.offload->metrics();
  EXPECT_GT(km.tiers.tier[checked_tier].checksum_failures, 0u);
  EXPECT_GT(km.failed_promotions, 0);
  EXPECT_GE(km.lost_tokens, 16 * int64_t(km.failed_promotions));
  f.scheduler.clear_prefix_cache();
  EXPECT_EQ(f.pool.n_free(), f.pool.capacity());
}

TEST(TierIntegrity, BitFlipInTier1IsDetectedAndRecomputed) { corrupt_case(64, 0, 1); }
TEST(TierIntegrity, BitFlipInTier2IsDetectedAndRecomputed) { corrupt_case(0, 64, 2); }

TEST(TierDiskFailure, UnusableDiskPathLeavesTier2OffAndOutputsUnchanged) {
  const auto& m = test::stories_model();
  const auto a = round_one();
  const auto want = reference(m, a);
  GeneratorOptions g = small_options();
  const size_t bb = m.model->kv_shape(16).block_bytes();
  // A regular file where a directory is expected.
  const auto file = test::fresh_dir("tier-badpath") / "not-a-dir";
  { std::ofstream(file) << "x"; }
  g.kv_tiers = test::tier_options(bb, 2, 32, file);
  test::TierFixture f(m, g, SchedulerOptions{}, 8);
  ASSERT_NE(f.offload, nullptr);  // tier 1 still works
  EXPECT_FALSE(f.tiers->tier_enabled(BlockTier::Disk));
  EXPECT_FALSE(f.tiers->stats().tier[2].disabled_reason.empty());
  run_rounds(f, a, 0);
  run_rounds(f, a, 10);
  expect_outputs(f, want, 0);
  expect_outputs(f, want, 10);
  EXPECT_EQ(f.offload->metrics().tiers.blocks_moved[1][2], 0u);
}

TEST(TierDiskFailure, WriteErrorDisablesTier2AndOutputsUnchanged) {
  const auto& m = test::stories_model();
  const auto a = round_one(), b = round_two();
  const auto want_a = reference(m, a), want_b = reference(m, b);
  const size_t bb = m.model->kv_shape(16).block_bytes();
  for (size_t host : {size_t(0), size_t(2)}) {  // tier 0 -> 2 writes, and tier 1 -> 2 writes
    SCOPED_TRACE(host ? "host tier in front" : "disk only");
    GeneratorOptions g = small_options();
    g.kv_tiers = test::tier_options(bb, host, 32, test::fresh_dir("tier-eio-write"));
    test::TierFixture f(m, g, SchedulerOptions{}, 8);
    ASSERT_TRUE(f.tiers->tier_enabled(BlockTier::Disk));
    f.tiers->inject_disk_fault_for_test(/*on_write=*/true, "eio", 1);
    run_rounds(f, a, 0);
    run_rounds(f, b, 10);
    run_rounds(f, a, 20);
    expect_outputs(f, want_a, 0);
    expect_outputs(f, want_b, 10);
    expect_outputs(f, want_a, 20);
    const TierStats s = f.tiers->stats();
    EXPECT_FALSE(s.tier[2].enabled);
    EXPECT_GT(s.tier[2].io_errors, 0u);
    EXPECT_EQ(s.tier[2].used_blocks, 0u);
    f.scheduler.clear_prefix_cache();
    EXPECT_EQ(f.pool.n_free(), f.pool.capacity());
  }
}

TEST(TierDiskFailure, ReadErrorLosesTier2AndTheBlocksAreRecomputed) {
  const auto& m = test::stories_model();
  const auto a = round_one(), b = round_two();
  const auto want_a = reference(m, a);
  const size_t bb = m.model->kv_shape(16).block_bytes();
  GeneratorOptions g = small_options();
  g.kv_tiers = test::tier_options(bb, 0, 64, test::fresh_dir("tier-eio-read"));
  test::TierFixture f(m, g, SchedulerOptions{}, 8);
  run_rounds(f, a, 0);
  run_rounds(f, b, 10);
  ASSERT_GT(f.tiers->stats().tier[2].used_blocks, 0u);
  f.tiers->inject_disk_fault_for_test(/*on_write=*/false, "eio", 1);
  run_rounds(f, a, 20);
  expect_outputs(f, want_a, 20);
  const auto km = f.offload->metrics();
  EXPECT_FALSE(km.tiers.tier[2].enabled);
  EXPECT_GT(km.failed_promotions, 0);
  EXPECT_GT(km.lost_tokens, 0);
}

}  // namespace
}  // namespace fdl
