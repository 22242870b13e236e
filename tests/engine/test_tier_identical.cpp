// KV-tier acceptance: with tier 0 capped so small that cached blocks must move to tier 1 and
// tier 2 during generation, greedy outputs equal those of an uncapped run (several prompts,
// several sequences at once, two models; sampled requests too), and tier occupancy never
// exceeds capacity.
#include <gtest/gtest.h>

#include "test_tier_fixture.h"

namespace fdl {
namespace {

struct Case {
  const char* name;
  const LoadedModel& (*model)();
  int n_ctx;
  int n_requests;
  int max_new;
};

void run_case(const Case& c) {
  SCOPED_TRACE(c.name);
  const auto& m = c.model();
  GeneratorOptions g;
  g.n_ctx = c.n_ctx;
  g.block_size = 16;
  g.max_sequences = 4;
  std::vector<GenerationRequest> reqs;
  // Greedy and sampled requests: sampling continues the same random stream wherever the
  // KV comes from.
  for (int i = 0; i < c.n_requests; ++i) {
    auto prompt = test::tier_prompt(20 + 3 * size_t(i), 70 + i);
    reqs.push_back(i % 2 ? test::sampled_request(std::move(prompt), c.max_new, 40 + i)
                         : test::greedy_request(std::move(prompt), c.max_new));
  }
  auto gen = test::make_generator(m, g);
  const auto want = gen.generate(reqs);  // uncapped: every sequence has its full context

  const size_t block_bytes = m.model->kv_shape(16).block_bytes();
  const auto dir = test::fresh_dir("tier-identical");
  // Tier 0: one full context for four sequences; tier 1: 3 blocks (fills at once, ages to
  // tier 2); tier 2: 64 blocks.
  g.kv_tiers = test::tier_options(block_bytes, 3, 64, dir, KvPlacementMode::Disk);
  const size_t tier0 = size_t(c.n_ctx / 16);
  test::TierFixture f(m, g, SchedulerOptions{}, tier0);
  ASSERT_NE(f.offload, nullptr);
  for (size_t i = 0; i < reqs.size(); ++i) f.add(i, reqs[i]);
  f.run();
  // A second round of the same prompts hits blocks that now live in tiers 1 and 2.
  for (size_t i = 0; i < reqs.size(); ++i) f.add(100 + i, reqs[i]);
  f.run();
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(f.records[i].ids, want[i].generated_ids) << "request " << i;
    EXPECT_EQ(f.records[100 + i].ids, want[i].generated_ids) << "round 2, request " << i;
  }
  const KvTierMetrics km = f.offload->metrics();
  const auto& mv = km.tiers.blocks_moved;
  EXPECT_GT(mv[0][1], 0u);  // tier 0 -> 1
  EXPECT_GT(mv[1][2], 0u);  // tier 1 -> 2
  EXPECT_GT(mv[1][0] + mv[2][0], 0u);  // promoted back
  EXPECT_GT(km.promoted, 0);
  EXPECT_EQ(km.tiers.tier[1].checksum_failures + km.tiers.tier[2].checksum_failures, 0u);
  EXPECT_EQ(km.lost_tokens, 0);
  EXPECT_EQ(f.max_used[0], tier0);  // tier 0 was full at some point: the cap was binding
  EXPECT_EQ(f.max_used[1], 3u);
  EXPECT_GT(f.scheduler.counters().preemptions, 0);
  EXPECT_GT(f.scheduler.counters().prefix_hits, 0);
  f.scheduler.clear_prefix_cache();
  EXPECT_EQ(f.pool.n_free(), f.pool.capacity());
  EXPECT_EQ(f.tiers->stats().offloaded_blocks, 0u);  // nothing leaked in the lower tiers
}

TEST(TierCapped, Stories260kOutputsEqualTheUncappedRun) {
  run_case({"stories260K", &test::stories_model, 128, 6, 90});
}

TEST(TierCapped, Codelm16mOutputsEqualTheUncappedRun) {
  run_case({"codelm-16m", &test::codelm_model, 96, 4, 50});
}

// Every placement mode gives the same outputs; only where blocks go differs.
TEST(TierCapped, EveryPlacementModeGivesTheSameOutputs) {
  const auto& m = test::stories_model();
  GeneratorOptions g;
  g.n_ctx = 128;
  g.max_sequences = 4;
  std::vector<GenerationRequest> reqs;
  for (uint32_t i = 0; i < 5; ++i)
    reqs.push_back(test::greedy_request(test::tier_prompt(30 + i, 200 + i), 60));
  auto gen = test::make_generator(m, g);
  const auto want = gen.generate(reqs);
  const size_t bb = m.model->kv_shape(16).block_bytes();
  for (auto mode : {KvPlacementMode::Recompute, KvPlacementMode::Host, KvPlacementMode::Disk,
                    KvPlacementMode::Auto}) {
    SCOPED_TRACE(to_string(mode));
    auto opt = test::tier_options(bb, 4, 32, test::fresh_dir("tier-modes"), mode);
    // A fixed profile keeps the test independent of this machine's speed.
    if (mode == KvPlacementMode::Auto) opt.profile_json = test::tier_profile_json(bb);
    g.kv_tiers = opt;
    test::TierFixture f(m, g, SchedulerOptions{}, 8);
    for (size_t i = 0; i < reqs.size(); ++i) f.add(i, reqs[i]);
    f.run();
    for (size_t i = 0; i < reqs.size(); ++i) f.add(10 + i, reqs[i]);
    f.run();
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(f.records[i].ids, want[i].generated_ids) << i;
      EXPECT_EQ(f.records[10 + i].ids, want[i].generated_ids) << i;
    }
    const auto km = f.offload->metrics();
    if (mode == KvPlacementMode::Recompute) {
      EXPECT_EQ(km.tiers.blocks_moved[0][1] + km.tiers.blocks_moved[0][2], 0u);
      EXPECT_GT(km.dropped, 0);
    } else {
      EXPECT_GT(km.tiers.blocks_moved[0][1], 0u);
    }
    if (mode == KvPlacementMode::Host) {
      EXPECT_EQ(km.tiers.blocks_moved[1][2], 0u);
    }
    if (mode == KvPlacementMode::Disk) {
      EXPECT_GT(km.tiers.blocks_moved[1][2], 0u);
    }
  }
}

}  // namespace
}  // namespace fdl
