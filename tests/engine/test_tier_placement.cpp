// The placement choice of the offload layer (kv_offload.h): fixed modes, and Auto following
// the cost rule over a storage profile and the measured prefill speed.
#include <gtest/gtest.h>

#include "engine/kv_offload.h"
#include "kv/tier_test_util.h"

namespace fdl {
namespace {

kv::StorageProfile profile(size_t block_bytes, double recompute_tok_per_s, bool disk) {
  kv::StorageProfile p;
  p.block_bytes = block_bytes;
  p.host_write_gbps = p.host_read_gbps = 8;
  p.host_block_latency_us = 3;
  p.host_enabled = true;
  p.disk_measured = disk;
  p.disk_enabled = disk;
  p.disk_write_gbps = p.disk_read_gbps = 1.5;
  p.disk_read_block_latency_us = 50;
  p.disk_read_4k_latency_us = 40;
  p.recompute_measured = true;
  p.recompute_tok_per_s = recompute_tok_per_s;
  return p;
}

struct TierRig {
  explicit TierRig(size_t host_blocks, bool disk)
      : pool(test::tier_shape(), 8) {
    opt.tiers.host.bytes = host_blocks * pool.shape().block_bytes();
    if (disk) {
      opt.tiers.disk.bytes = 16 * pool.shape().block_bytes();
      opt.tiers.disk_path = test::fresh_dir("tier-placement");
    }
    tiers = std::make_unique<TierManager>(pool, opt.tiers);
  }
  BlockPool pool;
  KvTierOptions opt;
  std::unique_ptr<TierManager> tiers;
};

TEST(TierPlacement, FixedModes) {
  TierRig s(4, true);
  const size_t bb = s.pool.shape().block_bytes();
  auto with = [&](KvPlacementMode mode) {
    s.opt.placement = mode;
    return engine::KvOffload(*s.tiers, s.opt, std::nullopt, 4, bb);
  };
  EXPECT_EQ(with(KvPlacementMode::Recompute).choose_from_device(0.9), kv::Placement::Drop);
  EXPECT_EQ(with(KvPlacementMode::Host).choose_from_device(0.9), kv::Placement::DemoteHost);
  EXPECT_EQ(with(KvPlacementMode::Host).choose_from_host(0.9), kv::Placement::Drop);
  EXPECT_EQ(with(KvPlacementMode::Disk).choose_from_device(0.9), kv::Placement::DemoteHost);
  EXPECT_EQ(with(KvPlacementMode::Disk).choose_from_host(0.9), kv::Placement::DemoteDisk);
  EXPECT_THROW(parse_kv_placement("fast"), std::invalid_argument);
  EXPECT_EQ(parse_kv_placement("disk"), KvPlacementMode::Disk);
}

TEST(TierPlacement, AutoFollowsTheCostRule) {
  TierRig s(4, true);
  const size_t bb = s.pool.shape().block_bytes();
  s.opt.placement = KvPlacementMode::Auto;
  // Slow recompute (a big model on a CPU): keeping a copy anywhere beats recomputing.
  engine::KvOffload slow(*s.tiers, s.opt, profile(bb, 100, true), 4, bb);
  EXPECT_EQ(slow.choose_from_device(0.6), kv::Placement::DemoteHost);
  EXPECT_EQ(slow.choose_from_host(0.6), kv::Placement::DemoteDisk);
  // Recompute far faster than any copy (a tiny model on a big accelerator): drop.
  engine::KvOffload fast(*s.tiers, s.opt, profile(bb, 1e12, true), 4, bb);
  EXPECT_EQ(fast.choose_from_device(0.6), kv::Placement::Drop);
  EXPECT_EQ(fast.choose_from_host(0.6), kv::Placement::Drop);
  // A block never reused costs nothing to drop: drop.
  EXPECT_EQ(slow.choose_from_device(0.0), kv::Placement::Drop);
  // The live prefill measurement replaces the profile's recompute speed.
  engine::KvOffload live(*s.tiers, s.opt, profile(bb, 100, true), 4, bb);
  for (int i = 0; i < 50; ++i) live.observe_prefill(1'000'000'000, 1e-3);
  EXPECT_GT(live.recompute_tok_per_s(), 1e11);
  EXPECT_EQ(live.choose_from_device(0.6), kv::Placement::Drop);
  // The manager's view wins over the profile's: tier 2 switched off -> never chosen.
  s.tiers->disable_disk("test");
  EXPECT_EQ(slow.choose_from_host(0.6), kv::Placement::Drop);
}

TEST(TierPlacement, AutoWithoutHostTierUsesDiskWhenCheaperThanRecompute) {
  TierRig s(0, true);
  const size_t bb = s.pool.shape().block_bytes();
  s.opt.placement = KvPlacementMode::Auto;
  engine::KvOffload slow(*s.tiers, s.opt, profile(bb, 100, true), 4, bb);
  EXPECT_EQ(slow.choose_from_device(0.6), kv::Placement::DemoteDisk);
}

// The profile says the disk is free; what the engine measures waiting for real writes says
// otherwise, and Auto follows the measurement.
TEST(TierPlacement, AutoUsesTheMeasuredDiskCostOverThePaperOne) {
  TierRig s(4, true);
  const size_t bb = s.pool.shape().block_bytes();
  s.opt.placement = KvPlacementMode::Auto;
  kv::StorageProfile p = profile(bb, 1.2e6, true);  // drop: 0.6 * 4 / 1.2e6 = 2 us
  p.disk_write_gbps = p.disk_read_gbps = 1e6;       // "1 PB/s", no latency: ~0 us
  p.disk_read_block_latency_us = 0;
  engine::KvOffload off(*s.tiers, s.opt, p, 4, bb);
  EXPECT_EQ(off.choose_from_host(0.6), kv::Placement::DemoteDisk);
  for (uint32_t i = 0; i < 3; ++i) {
    const BlockId b = s.pool.allocate();
    test::fill_block(s.pool, b, i);
    const TierEvent h = off.demote(b, BlockTier::Host);
    ASSERT_EQ(h.status, TransferStatus::Ok);
    ASSERT_EQ(off.demote_to_disk(h.id).status, TransferStatus::Pending);
    EXPECT_TRUE(off.settle().empty());
  }
  // An O_DIRECT write waited for at queue depth 1 takes far more than 2 us on any disk.
  EXPECT_GT(off.disk_write_s(), 2e-6);
  EXPECT_EQ(off.choose_from_host(0.6), kv::Placement::Drop);
  EXPECT_EQ(s.tiers->stats().tier[2].used_blocks, 3u);
}

}  // namespace
}  // namespace fdl
