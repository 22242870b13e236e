// Placement by cost: decisions for hand-computed profiles (numbers worked out in comments).
#include <gtest/gtest.h>

#include <cmath>

#include "kv/placement_policy.h"

namespace fdl::kv {
namespace {

// 1 MB blocks of 16 tokens. Host: 10 GB/s both ways, 1 us. Disk: write 1 GB/s, read 2 GB/s,
// 100 us. Recompute: 1000 tokens/s (a slow CPU).
PlacementInputs inputs() {
  PlacementInputs in;
  in.block_bytes = 1000000;
  in.block_size = 16;
  in.host = {true, 10e9, 10e9, 1e-6};
  in.disk = {true, 1e9, 2e9, 100e-6};
  in.recompute_tok_per_s = 1000;
  in.tier0_pressure = 1.0;
  return in;
}

BlockCandidate cand(double p, uint32_t tokens = 16, uint64_t last = 0, bool tail = false) {
  return {0, tokens, p, last, tail};
}

TEST(PlacementPolicy, CostsMatchTheFormula) {
  const PlacementDecision d = decide_placement(inputs(), cand(0.5));
  // C_host = 1e6/1e10 + 0.5 * (1e6/1e10 + 1e-6) = 1e-4 + 0.5 * 1.01e-4
  EXPECT_NEAR(d.cost_host, 1.505e-4, 1e-12);
  // C_disk = 1e6/1e9 + 0.5 * (1e6/2e9 + 1e-4) = 1e-3 + 3e-4
  EXPECT_NEAR(d.cost_disk, 1.3e-3, 1e-12);
  // C_drop = 0.5 * 16 / 1000
  EXPECT_NEAR(d.cost_drop, 8e-3, 1e-12);
  // C_keep = 1.0 * min(host p=1: 2.01e-4, disk p=1: 1.6e-3, recompute 16 tokens: 1.6e-2)
  EXPECT_NEAR(d.cost_keep, 2.01e-4, 1e-12);
  EXPECT_EQ(d.choice, Placement::DemoteHost);
  EXPECT_NEAR(d.savings(), 2.01e-4 - 1.505e-4, 1e-12);
}

TEST(PlacementPolicy, LowPressureKeeps) {
  PlacementInputs in = inputs();
  in.tier0_pressure = 0.5;  // keep = 1.005e-4 < host 1.505e-4
  EXPECT_EQ(decide_placement(in, cand(0.5)).choice, Placement::Keep);
  in.tier0_pressure = 0;
  EXPECT_EQ(decide_placement(in, cand(0.0)).choice, Placement::Keep);
}

TEST(PlacementPolicy, WithoutHostTheDiskWinsOnASlowCpu) {
  PlacementInputs in = inputs();
  in.host.available = false;  // keep = min(1.6e-3, 1.6e-2) = 1.6e-3 > disk 1.3e-3
  EXPECT_EQ(decide_placement(in, cand(0.5)).choice, Placement::DemoteDisk);
}

TEST(PlacementPolicy, FastRecomputeBeatsTheDisk) {
  PlacementInputs in = inputs();
  in.host.available = false;
  in.recompute_tok_per_s = 1e6;  // drop = 0.5 * 16 / 1e6 = 8e-6 << disk 1.3e-3
  EXPECT_EQ(decide_placement(in, cand(0.5)).choice, Placement::Drop);
}

TEST(PlacementPolicy, NeverReusedBlocksAreDropped) {
  const PlacementDecision d = decide_placement(inputs(), cand(0.0));
  EXPECT_EQ(d.cost_drop, 0.0);
  EXPECT_EQ(d.choice, Placement::Drop);
}

TEST(PlacementPolicy, CertainReuseOfAFullBlockTiesAndKeeps) {
  // p = 1, full block: C_host == C_keep (2.01e-4): ties resolve to Keep.
  EXPECT_EQ(decide_placement(inputs(), cand(1.0)).choice, Placement::Keep);
}

TEST(PlacementPolicy, HotTailAlwaysStays) {
  const PlacementDecision d = decide_placement(inputs(), cand(0.0, 3, 0, true));
  EXPECT_EQ(d.choice, Placement::Keep);
  EXPECT_GT(d.cost_keep, d.cost_drop) << "costs are still reported";
}

TEST(PlacementPolicy, UnknownRecomputeSpeedNeverDropsAReusedBlock) {
  PlacementInputs in = inputs();
  in.host.available = in.disk.available = false;
  in.recompute_tok_per_s = 0;
  const PlacementDecision d = decide_placement(in, cand(0.5));
  EXPECT_TRUE(std::isinf(d.cost_drop));
  EXPECT_EQ(d.choice, Placement::Keep);
}

TEST(PlacementPolicy, RankIsBySavingsThenLru) {
  const BlockCandidate c[] = {
      {1, 16, 0.5, 30, false},  // savings 2.01e-4 - 1.505e-4
      {2, 16, 0.1, 50, false},  // host 1e-4 + 0.1 * 1.01e-4 = 1.101e-4: more savings
      {3, 16, 0.5, 10, false},  // same savings as 1, older: before 1
      {4, 16, 0.0, 5, true},    // hot tail: never listed
      {5, 16, 1.0, 1, false},   // keep: not listed
  };
  const auto r = rank_evictions(inputs(), c);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].candidate.block, 2);
  EXPECT_EQ(r[1].candidate.block, 3);
  EXPECT_EQ(r[2].candidate.block, 1);
}

TEST(PlacementPolicy, ReuseScoreDecaysAndMapsToAProbability) {
  EXPECT_FLOAT_EQ(decay_reuse_score(2.f, 10, 10.0), 1.f);
  EXPECT_FLOAT_EQ(decay_reuse_score(2.f, 0, 10.0), 2.f);
  EXPECT_EQ(decay_reuse_score(2.f, 10, 0.0), 0.f);
  EXPECT_DOUBLE_EQ(reuse_probability(0.f), 0.0);
  EXPECT_NEAR(reuse_probability(1.f), 1 - std::exp(-1.0), 1e-7);
  BlockMeta m;
  m.n_filled = 7;
  m.predicted_reuse = 1.f;
  m.last_access_step = 42;
  const BlockCandidate c = candidate_from_meta(9, m, false);
  EXPECT_EQ(c.n_tokens, 7u);
  EXPECT_EQ(c.last_access_step, 42u);
  EXPECT_NEAR(c.reuse_probability, 0.632, 1e-3);
}

TEST(PlacementPolicy, BadInputsAreRejected) {
  PlacementInputs in = inputs();
  EXPECT_THROW(decide_placement(in, cand(1.5)), std::invalid_argument);
  EXPECT_THROW(decide_placement(in, cand(std::nan(""))), std::invalid_argument);
  in.tier0_pressure = 2;
  EXPECT_THROW(decide_placement(in, cand(0.5)), std::invalid_argument);
  in = inputs();
  in.block_bytes = 0;
  EXPECT_THROW(decide_placement(in, cand(0.5)), std::invalid_argument);
  in = inputs();
  in.disk.read_latency_s = -1;
  EXPECT_THROW(decide_placement(in, cand(0.5)), std::invalid_argument);
}

}  // namespace
}  // namespace fdl::kv
