// BlockMirror: a backend that owns the authoritative block bytes (the CUDA model's device
// arena) sees every tier transfer — demotions pull the block's bytes from it before they are
// checksummed and copied out, promotions push the verified bytes back — and a mirror that
// no longer exists is simply not called. Host and disk tiers.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "flashdllm/kv_tiers.h"
#include "tier_test_util.h"

namespace fdl {
namespace {

// Stands in for a device arena: holds its own copy of each block.
class FakeDeviceArena final : public BlockMirror {
 public:
  void pull(BlockId id, std::span<uint8_t> host) override {
    ++pulls;
    const auto& b = blocks.at(id);
    std::copy(b.begin(), b.end(), host.begin());
  }
  void push(BlockId id, std::span<const uint8_t> host) override {
    ++pushes;
    blocks[id].assign(host.begin(), host.end());
  }
  void pool_closing() override { ++closings; }
  std::map<BlockId, std::vector<uint8_t>> blocks;
  int pulls = 0, pushes = 0, closings = 0;
};

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(seed + i * 7);
  return v;
}

// Two blocks of host memory, and two of disk when `to` is Disk (in a fresh directory `name`).
TierConfig two_block_tiers(const BlockPool& pool, BlockTier to, const std::string& name) {
  TierConfig cfg;
  cfg.host.bytes = 2 * pool.shape().block_bytes();
  if (to == BlockTier::Disk) {
    cfg.disk.bytes = 2 * pool.shape().block_bytes();
    cfg.disk_path = test::fresh_dir(name);
  }
  return cfg;
}

void round_trip(BlockTier to, const std::string& name) {
  BlockPool pool(test::tier_shape(), 4);
  const size_t bb = pool.shape().block_bytes();
  TierManager tm(pool, two_block_tiers(pool, to, name));
  auto arena = std::make_shared<FakeDeviceArena>();
  pool.set_mirror(arena);

  const BlockId b = pool.allocate();
  pool.meta(b).n_filled = uint32_t(pool.shape().block_size);
  const std::vector<uint8_t> device_bytes = pattern(bb, 11);
  arena->blocks[b] = device_bytes;  // what the "device" computed
  std::fill(pool.block_bytes(b).begin(), pool.block_bytes(b).end(), uint8_t(0xEE));  // stale host bytes

  const TierEvent out = tm.demote(b, to);
  ASSERT_TRUE(out.status == TransferStatus::Ok || out.status == TransferStatus::Pending);
  tm.drain();
  tm.poll();
  EXPECT_EQ(arena->pulls, 1);
  // Overwrite the host arena again: the promotion must restore the device's bytes from the tier.
  std::fill(pool.block_bytes(b).begin(), pool.block_bytes(b).end(), uint8_t(0xDD));
  const TierEvent back = tm.wait_resident(out.id);
  ASSERT_EQ(back.status, TransferStatus::Ok) << "the tier copy must be the device's bytes (checksum)";
  EXPECT_EQ(arena->pushes, 1);
  EXPECT_EQ(arena->blocks.at(back.block), device_bytes) << "the promoted block reached the device";
  pool.release(back.block);

  // A mirror that is gone is not called (the backend was destroyed before the pool).
  const BlockId c = pool.allocate();
  arena.reset();
  const TierEvent out2 = tm.demote(c, BlockTier::Host);
  EXPECT_EQ(out2.status, TransferStatus::Ok);
  const TierEvent back2 = tm.wait_resident(out2.id);
  EXPECT_EQ(back2.status, TransferStatus::Ok);
  pool.release(back2.block);
}

TEST(BlockMirror, HostTierPullsOnDemotionAndPushesOnPromotion) { round_trip(BlockTier::Host, "mirror-host"); }
TEST(BlockMirror, DiskTierPullsOnDemotionAndPushesOnPromotion) { round_trip(BlockTier::Disk, "mirror-disk"); }

TEST(BlockMirror, PoolWithoutMirrorLeavesHostBytesAlone) {
  BlockPool pool(test::tier_shape(), 2);
  const BlockId b = pool.allocate();
  std::fill(pool.block_bytes(b).begin(), pool.block_bytes(b).end(), uint8_t(0x5A));
  pool.pull_from_mirror(b);
  pool.push_to_mirror(b);
  for (uint8_t x : pool.block_bytes(b)) ASSERT_EQ(x, 0x5A);
  pool.release(b);
}

// Stands in for the CUDA model's asynchronous push: push() only queues the copy, which reads
// the host bytes when the "DMA" runs, at the next host_write_fence (or pull); `landed` keeps
// every copy in the order it reached the "device".
class DeferredDeviceArena final : public BlockMirror {
 public:
  explicit DeferredDeviceArena(BlockPool& pool) : pool_(pool) {}
  void pull(BlockId id, std::span<uint8_t> host) override {
    land_all();  // a pull is ordered after the pushes before it
    const auto& b = blocks.at(id);
    std::copy(b.begin(), b.end(), host.begin());
  }
  void push(BlockId id, std::span<const uint8_t> /*host*/) override { queued.push_back(id); }
  void host_write_fence(BlockId id) noexcept override {
    if (std::find(queued.begin(), queued.end(), id) == queued.end()) return;  // nothing reads it
    fenced.push_back(id);
    land_all();
  }
  void land_all() {
    for (const BlockId id : queued) {
      const auto host = pool_.block_bytes(id);
      blocks[id].assign(host.begin(), host.end());
      landed.emplace_back(id, blocks[id]);
    }
    queued.clear();
  }
  std::map<BlockId, std::vector<uint8_t>> blocks;
  std::vector<BlockId> queued, fenced;
  std::vector<std::pair<BlockId, std::vector<uint8_t>>> landed;

 private:
  BlockPool& pool_;
};

// Two promotions in a row into the same tier-0 block (the first one's block freed in
// between): the second must not overwrite the host bytes the first push has not read yet.
// The tier manager writes the arena through block_bytes_for_write, which waits for the
// mirror's pushes of that block first. From host memory (synchronous) and from disk (the
// promotion's bytes are written when the read completes).
void promote_twice_into_one_block(BlockTier tier, const std::string& name) {
  BlockPool pool(test::tier_shape(), 4);
  const size_t bb = pool.shape().block_bytes();
  TierManager tm(pool, two_block_tiers(pool, tier, name));
  auto arena = std::make_shared<DeferredDeviceArena>(pool);
  pool.set_mirror(arena);
  const BlockId a = pool.allocate(), b = pool.allocate();
  for (const BlockId id : {a, b}) pool.meta(id).n_filled = uint32_t(pool.shape().block_size);
  const auto bytes_a = pattern(bb, 1), bytes_b = pattern(bb, 2);
  arena->blocks[a] = bytes_a;
  arena->blocks[b] = bytes_b;
  const TierEvent out_a = tm.demote(a, tier), out_b = tm.demote(b, tier);
  for (const TierEvent& e : {out_a, out_b})
    ASSERT_TRUE(e.status == TransferStatus::Ok || e.status == TransferStatus::Pending) << int(e.status);
  tm.drain();
  tm.poll();

  const TierEvent back_a = tm.wait_resident(out_a.id);
  ASSERT_EQ(back_a.status, TransferStatus::Ok);
  ASSERT_EQ(arena->queued.size(), 1u) << "the push of a is still in flight";
  // Only a's block is free next, so b's promotion lands in the same tier-0 block.
  std::vector<BlockId> fillers;
  while (pool.n_free() > 0) fillers.push_back(pool.allocate());
  pool.release(back_a.block);
  const TierEvent back_b = tm.wait_resident(out_b.id);
  ASSERT_EQ(back_b.status, TransferStatus::Ok);
  ASSERT_EQ(back_b.block, back_a.block);
  EXPECT_EQ(arena->fenced, std::vector<BlockId>{back_a.block}) << "b's promotion waited for a's push only";
  arena->land_all();
  ASSERT_EQ(arena->landed.size(), 2u);
  EXPECT_EQ(arena->landed[0].second, bytes_a) << "a's push read b's bytes: the host arena was rewritten under it";
  EXPECT_EQ(arena->landed[1].second, bytes_b);
  pool.release(back_b.block);
  for (const BlockId id : fillers) pool.release(id);
}

// A block id outside the pool gets the pool's range error, mirror or not (the fence ignores
// ids it never pushed).
TEST(BlockMirror, WritingAnUnknownBlockIsARangeError) {
  BlockPool pool(test::tier_shape(), 2);
  auto arena = std::make_shared<DeferredDeviceArena>(pool);
  pool.set_mirror(arena);
  EXPECT_THROW((void)pool.block_bytes_for_write(2), std::out_of_range);
  EXPECT_THROW((void)pool.block_bytes_for_write(-1), std::out_of_range);
  EXPECT_TRUE(arena->fenced.empty());
}

TEST(BlockMirror, HostPromotionsWaitForPushesThatStillReadTheHostArena) {
  promote_twice_into_one_block(BlockTier::Host, "mirror-fence-host");
}
TEST(BlockMirror, DiskPromotionsWaitForPushesThatStillReadTheHostArena) {
  promote_twice_into_one_block(BlockTier::Disk, "mirror-fence-disk");
}

// A pool tells its live mirror before its arena is freed (a mirror that page-locked the arena
// must release it then), exactly once; a mirror already gone is not called.
TEST(BlockMirror, PoolClosingIsReportedToALiveMirrorOnce) {
  auto arena = std::make_shared<FakeDeviceArena>();
  {
    BlockPool pool(test::tier_shape(), 2);
    pool.set_mirror(arena);
    EXPECT_EQ(pool.arena_bytes().size(), 2 * pool.shape().block_bytes());
    EXPECT_EQ(pool.arena_bytes().data(), pool.block_bytes(0).data());
    EXPECT_EQ(arena->closings, 0);
  }
  EXPECT_EQ(arena->closings, 1);
  {
    auto gone = std::make_shared<FakeDeviceArena>();
    BlockPool pool(test::tier_shape(), 2);
    pool.set_mirror(gone);
    gone.reset();  // the backend went first: the pool's destructor must not touch it
  }
}

}  // namespace
}  // namespace fdl
