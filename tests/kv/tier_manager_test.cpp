// TierManager: demote/promote round trips through host and disk, checksums, disk failures,
// prefetch accounting, the breaker, and "every block accounted for".
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <thread>

#include "flashdllm/kv_tiers.h"
#include "tier_test_util.h"

namespace fdl {
namespace {

using test::block_copy;
using test::fill_block;

constexpr size_t kBlockBytes = 11520;

TierConfig config(size_t host_blocks, size_t disk_blocks, const std::string& name) {
  TierConfig c;
  c.host.bytes = host_blocks * kBlockBytes;
  if (disk_blocks > 0) {
    c.disk.bytes = disk_blocks * kBlockBytes;
    c.disk_path = test::fresh_dir(name);
  }
  c.disk_queue_depth = 4;
  return c;
}

// free + used == capacity in every tier, and every live id is in exactly one place.
void expect_accounted(const TierManager& tm, const BlockPool& pool) {
  const TierStats s = tm.stats();
  EXPECT_EQ(s.tier[0].capacity_blocks, pool.capacity());
  EXPECT_EQ(s.tier[0].used_blocks + pool.n_free(), pool.capacity());
  for (int t = 1; t < 3; ++t) EXPECT_LE(s.tier[t].used_blocks, s.tier[t].capacity_blocks);
}

TEST(TierManager, HostRoundTripIsByteIdenticalAndFreesTier0) {
  BlockPool pool(test::tier_shape(), 4);
  ASSERT_EQ(pool.shape().block_bytes(), kBlockBytes);
  TierManager tm(pool, config(2, 0, "host-rt"));
  const BlockId b = pool.allocate();
  fill_block(pool, b, 1);
  pool.meta(b).prefix_hash = 77;
  pool.meta(b).n_filled = 3;
  const auto want = block_copy(pool, b);
  const TierEvent ev = tm.demote(b, BlockTier::Host);
  ASSERT_EQ(ev.status, TransferStatus::Ok);
  EXPECT_EQ(pool.n_free(), 4u) << "tier-0 block released at once";
  EXPECT_EQ(tm.meta(ev.id).tier, BlockTier::Host);
  EXPECT_EQ(tm.meta(ev.id).state, BlockState::Inactive);
  EXPECT_NE(tm.meta(ev.id).checksum, 0u);
  EXPECT_EQ(tm.meta(ev.id).prefix_hash, 77u);
  EXPECT_EQ(tm.stats().tier[1].used_blocks, 1u);
  // Reuse of the freed tier-0 block must not disturb the offloaded copy.
  const BlockId other = pool.allocate();
  fill_block(pool, other, 99);
  const TierEvent back = tm.wait_resident(ev.id);
  ASSERT_EQ(back.status, TransferStatus::Ok);
  EXPECT_EQ(block_copy(pool, back.block), want);
  EXPECT_EQ(pool.meta(back.block).state, BlockState::Active);
  EXPECT_EQ(pool.meta(back.block).prefix_hash, 77u);
  EXPECT_EQ(pool.meta(back.block).n_filled, 3u);
  EXPECT_EQ(pool.meta(back.block).ref_count, 1);
  EXPECT_FALSE(tm.contains(ev.id));
  const TierStats s = tm.stats();
  EXPECT_EQ(s.blocks_moved[0][1], 1u);
  EXPECT_EQ(s.blocks_moved[1][0], 1u);
  EXPECT_EQ(s.bytes_moved[0][1], kBlockBytes);
  EXPECT_EQ(s.tier[1].used_blocks, 0u);
  expect_accounted(tm, pool);
}

TEST(TierManager, DiskRoundTripIsByteIdenticalWithAsyncWrite) {
  BlockPool pool(test::tier_shape(), 8);
  TierManager tm(pool, config(0, 8, "disk-rt"));
  ASSERT_TRUE(tm.tier_enabled(BlockTier::Disk));
  EXPECT_TRUE(tm.stats().disk_direct_io);
  std::vector<OffloadId> ids;
  std::vector<std::vector<uint8_t>> want;
  for (int i = 0; i < 6; ++i) {  // more than the queue depth of 4
    const BlockId b = pool.allocate();
    fill_block(pool, b, 10 + i);
    want.push_back(block_copy(pool, b));
    const TierEvent ev = tm.demote(b, BlockTier::Disk);
    ASSERT_EQ(ev.status, TransferStatus::Pending);
    EXPECT_LE(tm.stats().tier[2].used_blocks, 8u);
    ids.push_back(ev.id);
  }
  // Completions arrive through poll() (non-blocking); drain() waits for the rest. Every
  // write is reported exactly once.
  size_t demoted = 0;
  auto count = [&] {
    for (const TierEvent& e : tm.poll())
      if (e.kind == TierEvent::Kind::Demote && e.status == TransferStatus::Ok) ++demoted;
  };
  count();
  tm.drain();
  EXPECT_EQ(tm.in_flight(), 0u);
  count();
  count();
  ASSERT_EQ(demoted, ids.size());
  EXPECT_EQ(pool.n_free(), 8u) << "tier-0 blocks released once their writes completed";
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(tm.meta(ids[i]).tier, BlockTier::Disk);
    const TierEvent back = tm.wait_resident(ids[i]);
    ASSERT_EQ(back.status, TransferStatus::Ok) << to_string(back.status);
    EXPECT_EQ(block_copy(pool, back.block), want[i]) << i;
    pool.release(back.block);
  }
  EXPECT_EQ(tm.stats().tier[2].used_blocks, 0u);
  EXPECT_EQ(tm.stats().blocks_moved[2][0], 6u);
  EXPECT_GT(tm.stats().tier[2].write_latency.count, 0u);
  expect_accounted(tm, pool);
}

TEST(TierManager, HostToDiskToDeviceRoundTrip) {
  BlockPool pool(test::tier_shape(), 2);
  TierManager tm(pool, config(1, 2, "h2d"));
  const BlockId b = pool.allocate();
  fill_block(pool, b, 5);
  const auto want = block_copy(pool, b);
  const OffloadId id = tm.demote(b, BlockTier::Host).id;
  ASSERT_EQ(tm.demote_to_disk(id).status, TransferStatus::Pending);
  EXPECT_EQ(tm.meta(id).state, BlockState::PendingEvict);
  const TierEvent back = tm.wait_resident(id);  // waits for the write, then reads back
  ASSERT_EQ(back.status, TransferStatus::Ok);
  EXPECT_EQ(block_copy(pool, back.block), want);
  const TierStats s = tm.stats();
  EXPECT_EQ(s.blocks_moved[1][2], 1u);
  EXPECT_EQ(s.blocks_moved[2][0], 1u);
  EXPECT_EQ(s.tier[1].used_blocks, 0u);
  EXPECT_EQ(s.tier[2].used_blocks, 0u);
}

// A pool of 16-bit K/V (the CUDA model's default cache for 16-bit models): blocks of half
// the bytes (5760, still not a multiple of 4 KiB) go through host and disk and come back
// byte-identical, and the tiers count the block's own size.
TEST(TierManager, SixteenBitBlocksRoundTripThroughHostAndDisk) {
  for (const KvDtype t : {KvDtype::F16, KvDtype::BF16}) {
    KvShape shape = test::tier_shape();
    shape.dtype = t;
    ASSERT_EQ(shape.block_bytes() * 2, kBlockBytes);
    BlockPool pool(shape, 3);
    TierConfig c;
    c.host.bytes = 1 * shape.block_bytes();
    c.disk.bytes = 2 * shape.block_bytes();
    c.disk_path = test::fresh_dir(std::string("kv16-") + kv_dtype_name(t));
    c.disk_queue_depth = 4;
    TierManager tm(pool, c);
    ASSERT_TRUE(tm.tier_enabled(BlockTier::Disk));
    const BlockId b = pool.allocate(), d = pool.allocate();
    fill_block(pool, b, 21);
    fill_block(pool, d, 22);
    const auto want_b = block_copy(pool, b), want_d = block_copy(pool, d);
    const OffloadId via_host = tm.demote(b, BlockTier::Host).id;
    ASSERT_EQ(tm.demote_to_disk(via_host).status, TransferStatus::Pending);
    const OffloadId to_disk = tm.demote(d, BlockTier::Disk).id;
    tm.drain();
    fill_block(pool, pool.allocate(), 99);  // reuse of a freed tier-0 block
    for (const auto& [id, want] : {std::pair{via_host, want_b}, std::pair{to_disk, want_d}}) {
      const TierEvent back = tm.wait_resident(id);
      ASSERT_EQ(back.status, TransferStatus::Ok) << kv_dtype_name(t) << " " << to_string(back.status);
      EXPECT_EQ(block_copy(pool, back.block), want) << kv_dtype_name(t);
      pool.release(back.block);
    }
    const TierStats s = tm.stats();
    EXPECT_EQ(s.bytes_moved[0][1], shape.block_bytes());
    EXPECT_EQ(s.bytes_moved[2][0], 2 * shape.block_bytes());
  }
}

TEST(TierManager, FlippedBitIsDetectedNeverReturnedAsGoodData) {
  for (BlockTier where : {BlockTier::Host, BlockTier::Disk}) {
    BlockPool pool(test::tier_shape(), 2);
    TierManager tm(pool, config(2, 2, "flip"));
    const BlockId b = pool.allocate();
    fill_block(pool, b, 3);
    const OffloadId id = tm.demote(b, where).id;
    tm.corrupt_for_test(id, 1234, 5);
    const TierEvent back = tm.wait_resident(id);
    EXPECT_EQ(back.status, TransferStatus::Corrupt);
    EXPECT_EQ(back.block, -1);
    EXPECT_EQ(pool.n_free(), 2u) << "the corrupt copy was released, not handed out";
    const TierStats s = tm.stats();
    EXPECT_EQ(s.tier[size_t(where)].checksum_failures, 1u);
    EXPECT_EQ(s.tier[size_t(where)].used_blocks, 0u);
    EXPECT_FALSE(tm.contains(id));
  }
}

TEST(TierManager, DiskWriteErrorDisablesTier2AndKeepsTheBlock) {
  for (const char* fault : {"eio", "enospc", "short"}) {
    BlockPool pool(test::tier_shape(), 3);
    TierManager tm(pool, config(1, 4, "werr"));
    const BlockId b = pool.allocate();
    fill_block(pool, b, 8);
    const auto want = block_copy(pool, b);
    tm.inject_disk_fault_for_test(true, fault);
    const TierEvent ev = tm.demote(b, BlockTier::Disk);
    ASSERT_EQ(ev.status, TransferStatus::Pending);
    const TierEvent back = tm.wait_resident(ev.id);
    // The data never left tier 0, so it comes back intact.
    ASSERT_EQ(back.status, TransferStatus::Ok) << fault;
    EXPECT_EQ(back.block, b);
    EXPECT_EQ(block_copy(pool, b), want);
    EXPECT_EQ(pool.meta(b).state, BlockState::Active);
    bool saw_error = false;
    for (const TierEvent& e : tm.poll()) saw_error |= e.status == TransferStatus::IoError;
    EXPECT_TRUE(saw_error);
    const TierStats s = tm.stats();
    EXPECT_FALSE(s.tier[2].enabled);
    EXPECT_EQ(s.tier[2].io_errors, 1u);
    EXPECT_FALSE(s.tier[2].disabled_reason.empty());
    EXPECT_EQ(s.tier[2].used_blocks, 0u);
    // Later operations degrade cleanly: disk refused, host still works.
    EXPECT_EQ(tm.demote(b, BlockTier::Disk).status, TransferStatus::TierDisabled);
    EXPECT_EQ(tm.demote(b, BlockTier::Host).status, TransferStatus::Ok);
  }
}

TEST(TierManager, DiskReadErrorMeansRecomputeAndOthersOnDiskAreLost) {
  for (const char* fault : {"eio", "short"}) {
    BlockPool pool(test::tier_shape(), 3);
    TierManager tm(pool, config(0, 4, "rerr"));
    std::vector<OffloadId> ids;
    for (int i = 0; i < 2; ++i) {
      const BlockId b = pool.allocate();
      fill_block(pool, b, 20 + i);
      ids.push_back(tm.demote(b, BlockTier::Disk).id);
    }
    tm.drain();
    tm.poll();
    ASSERT_EQ(tm.stats().blocks_moved[0][2], 2u);
    tm.inject_disk_fault_for_test(false, fault);
    const TierEvent first = tm.wait_resident(ids[0]);
    EXPECT_EQ(first.status, TransferStatus::IoError) << fault;
    EXPECT_EQ(first.block, -1);
    EXPECT_FALSE(tm.tier_enabled(BlockTier::Disk));
    EXPECT_EQ(tm.stats().tier[2].io_errors, 1u);
    const TierEvent second = tm.wait_resident(ids[1]);
    EXPECT_EQ(second.status, TransferStatus::Lost) << "a disabled tier's data is not trusted";
    EXPECT_EQ(pool.n_free(), 3u);
    EXPECT_EQ(tm.stats().tier[2].used_blocks, 0u);
    EXPECT_EQ(tm.stats().offloaded_blocks, 0u);
  }
}

// After an I/O error tier 2 waits disk_retry_s, then comes back: its next transfer is the
// test. Blocks stored before the error stay lost; a new failure soon after doubles the wait.
TEST(TierManager, DiskComesBackAfterItsWaitAndOlderBlocksStayLost) {
  BlockPool pool(test::tier_shape(), 4);
  TierConfig cfg = config(0, 4, "retry");
  cfg.disk_retry_s = 0.5;
  TierManager tm(pool, cfg);
  auto demote = [&](uint32_t seed) {
    const BlockId b = pool.allocate();
    fill_block(pool, b, seed);
    const TierEvent ev = tm.demote(b, BlockTier::Disk);
    if (ev.status == TransferStatus::TierDisabled) pool.release(b);
    tm.drain();
    tm.poll();
    return std::pair{ev, b};
  };
  const OffloadId before = demote(1).first.id;
  tm.inject_disk_fault_for_test(true, "eio");
  const auto [failed, kept] = demote(2);
  ASSERT_EQ(tm.wait_resident(failed.id).status, TransferStatus::Ok);  // the block never left tier 0
  pool.release(kept);
  const auto off_at = std::chrono::steady_clock::now();
  EXPECT_FALSE(tm.tier_enabled(BlockTier::Disk));
  EXPECT_EQ(demote(3).first.status, TransferStatus::TierDisabled);
  while (!tm.tier_enabled(BlockTier::Disk)) {
    ASSERT_LT(std::chrono::steady_clock::now() - off_at, std::chrono::seconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(std::chrono::steady_clock::now() - off_at, std::chrono::milliseconds(490));
  EXPECT_TRUE(tm.stats().tier[2].enabled);
  EXPECT_TRUE(tm.stats().tier[2].disabled_reason.empty());
  // Stored after the tier came back: it round-trips. Stored before the error: lost.
  const OffloadId after = demote(4).first.id;
  const TierEvent back = tm.wait_resident(after);
  ASSERT_EQ(back.status, TransferStatus::Ok);
  pool.release(back.block);
  EXPECT_EQ(tm.wait_resident(before).status, TransferStatus::Lost);
  EXPECT_EQ(tm.stats().tier[2].used_blocks, 0u);
  // Failing again at once: twice the wait.
  tm.inject_disk_fault_for_test(true, "eio");
  const auto [failed_again, kept_again] = demote(5);
  ASSERT_EQ(tm.wait_resident(failed_again.id).status, TransferStatus::Ok);
  pool.release(kept_again);
  const auto off_again = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_FALSE(tm.tier_enabled(BlockTier::Disk));
  while (!tm.tier_enabled(BlockTier::Disk)) {
    ASSERT_LT(std::chrono::steady_clock::now() - off_again, std::chrono::seconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(std::chrono::steady_clock::now() - off_again, std::chrono::milliseconds(990));
  EXPECT_EQ(pool.n_free(), 4u);
}

// disk_retry_s 0: an I/O error turns tier 2 off for good.
TEST(TierManager, DiskRetryZeroKeepsTier2Off) {
  BlockPool pool(test::tier_shape(), 2);
  TierConfig cfg = config(0, 2, "noretry");
  cfg.disk_retry_s = 0;
  TierManager tm(pool, cfg);
  const BlockId b = pool.allocate();
  fill_block(pool, b, 1);
  tm.inject_disk_fault_for_test(true, "eio");
  const TierEvent ev = tm.demote(b, BlockTier::Disk);
  ASSERT_EQ(tm.wait_resident(ev.id).status, TransferStatus::Ok);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(tm.tier_enabled(BlockTier::Disk));
}

TEST(TierManager, PrefetchCountsHitsLateAndMisses) {
  BlockPool pool(test::tier_shape(), 6);
  TierManager tm(pool, config(2, 4, "prefetch"));
  auto offload = [&](BlockTier t, uint32_t seed) {
    const BlockId b = pool.allocate();
    fill_block(pool, b, seed);
    return tm.demote(b, t).id;
  };
  const OffloadId host_id = offload(BlockTier::Host, 1);
  const OffloadId disk_id = offload(BlockTier::Disk, 2);
  const OffloadId miss_id = offload(BlockTier::Host, 3);
  tm.drain();
  tm.poll();
  ASSERT_EQ(tm.stats().blocks_moved[0][2], 1u);
  const std::vector<OffloadId> ids = {host_id, disk_id};
  const auto evs = tm.prefetch(ids);
  EXPECT_EQ(evs[0].status, TransferStatus::Ok);       // host: done at once
  EXPECT_EQ(evs[1].status, TransferStatus::Pending);  // disk: in flight
  EXPECT_EQ(tm.meta(disk_id).state, BlockState::Loading);
  const TierEvent a = tm.wait_resident(host_id);  // hit
  const TierEvent b = tm.wait_resident(disk_id);  // hit or late: depends on the disk
  const TierEvent c = tm.wait_resident(miss_id);  // miss
  for (const auto& e : {a, b, c}) {
    ASSERT_EQ(e.status, TransferStatus::Ok);
    pool.release(e.block);
  }
  const TierStats s = tm.stats();
  EXPECT_EQ(s.prefetch_hits + s.prefetch_late, 2u);
  EXPECT_GE(s.prefetch_hits, 1u);
  EXPECT_EQ(s.prefetch_misses, 1u);
}

TEST(TierManager, FullTiersReportNoSpaceAndNothingChanges) {
  BlockPool pool(test::tier_shape(), 4);
  TierManager tm(pool, config(1, 1, "full"));
  BlockId b[4];
  for (auto& x : b) x = pool.allocate();
  ASSERT_EQ(tm.demote(b[0], BlockTier::Host).status, TransferStatus::Ok);
  const TierEvent h = tm.demote(b[1], BlockTier::Host);
  EXPECT_EQ(h.status, TransferStatus::NoSpace);
  EXPECT_EQ(pool.meta(b[1]).ref_count, 1) << "the caller still owns it";
  ASSERT_EQ(tm.demote(b[1], BlockTier::Disk).status, TransferStatus::Pending);
  EXPECT_EQ(tm.demote(b[2], BlockTier::Disk).status, TransferStatus::NoSpace);
  const TierStats s = tm.stats();
  EXPECT_EQ(s.tier[1].used_blocks, 1u);
  EXPECT_EQ(s.tier[2].used_blocks, 1u);
  expect_accounted(tm, pool);
  // Promotion into a full tier 0 is refused without losing the offloaded copy.
  tm.drain();
  tm.poll();
  ASSERT_EQ(tm.stats().blocks_moved[0][2], 1u);
  BlockId filler[2] = {pool.allocate(), pool.allocate()};
  ASSERT_EQ(pool.n_free(), 0u);
  EXPECT_EQ(tm.wait_resident(1).status, TransferStatus::NoSpace);
  EXPECT_TRUE(tm.contains(1));
  pool.release(filler[0]);
  pool.release(filler[1]);
  tm.discard(1);
  tm.discard(2);
  EXPECT_EQ(tm.stats().tier[1].used_blocks + tm.stats().tier[2].used_blocks, 0u);
}

TEST(TierManager, MisuseThrowsClearly) {
  BlockPool pool(test::tier_shape(), 2);
  TierManager tm(pool, config(2, 0, "misuse"));
  const BlockId b = pool.allocate();
  pool.retain(b);
  EXPECT_THROW(tm.demote(b, BlockTier::Host), std::invalid_argument) << "shared block";
  pool.release(b);
  EXPECT_THROW(tm.demote(b, BlockTier::Device), std::invalid_argument);
  EXPECT_THROW(tm.demote(99, BlockTier::Host), std::out_of_range);
  EXPECT_THROW(tm.meta(12345), std::out_of_range);
  EXPECT_THROW(tm.wait_resident(12345), std::out_of_range);
  EXPECT_EQ(tm.demote(b, BlockTier::Disk).status, TransferStatus::TierDisabled);
  EXPECT_THROW(tm.inject_disk_fault_for_test(true, "eio"), std::invalid_argument);
}

TEST(TierManager, BadDiskPathDisablesTier2WithAReason) {
  BlockPool pool(test::tier_shape(), 2);
  TierConfig c = config(1, 0, "badpath");
  c.disk.bytes = 4 * kBlockBytes;
  c.disk_path = "/nonexistent/flashdllm-kv";
  TierManager tm(pool, c);
  EXPECT_FALSE(tm.tier_enabled(BlockTier::Disk));
  EXPECT_NE(tm.stats().tier[2].disabled_reason.find("not a directory"), std::string::npos);
}

TEST(TierManager, BreakerPausesDiskOffloadUntilReset) {
  BlockPool pool(test::tier_shape(), 2);
  TierManager tm(pool, config(1, 2, "breaker"));
  const BlockId b = pool.allocate();
  tm.trip_breaker("test");
  EXPECT_EQ(tm.demote(b, BlockTier::Disk).status, TransferStatus::Paused);
  TierStats s = tm.stats();
  EXPECT_TRUE(s.breaker_open);
  EXPECT_TRUE(s.breaker_manual);
  EXPECT_EQ(s.breaker_trips, 1u);
  EXPECT_EQ(tm.demote(b, BlockTier::Host).status, TransferStatus::Ok) << "host tier unaffected";
  const BlockId b2 = pool.allocate();
  tm.reset_breaker();
  EXPECT_EQ(tm.demote(b2, BlockTier::Disk).status, TransferStatus::Pending);
  EXPECT_FALSE(tm.stats().breaker_open);
}

TEST(TierManager, BreakerTripsAutomaticallyOnSlowTransfers) {
  BlockPool pool(test::tier_shape(), 4);
  TierConfig c = config(0, 4, "breaker-auto");
  c.breaker = {.threshold_ms = 0.0, .window = 4, .min_samples = 2, .cooldown_ms = 1e9};
  TierManager tm(pool, c);  // threshold 0: any real transfer is "slow"
  for (int i = 0; i < 2; ++i) {
    const BlockId b = pool.allocate();
    ASSERT_EQ(tm.demote(b, BlockTier::Disk).status, TransferStatus::Pending);
  }
  tm.drain();
  tm.poll();
  ASSERT_EQ(tm.stats().blocks_moved[0][2], 2u);
  EXPECT_TRUE(tm.stats().breaker_open);
  EXPECT_FALSE(tm.stats().breaker_manual);
  EXPECT_EQ(tm.demote(pool.allocate(), BlockTier::Disk).status, TransferStatus::Paused);
}

TEST(TierManager, StatsJsonIsParseable) {
  BlockPool pool(test::tier_shape(), 2);
  TierManager tm(pool, config(1, 1, "json"));
  tm.demote(pool.allocate(), BlockTier::Host);
  const auto j = nlohmann::json::parse(tm.stats().to_json());
  EXPECT_EQ(j["tiers"]["host"]["used_blocks"], 1);
  EXPECT_EQ(j["moved"]["device_to_host"]["bytes"], kBlockBytes);
  EXPECT_EQ(j["breaker"]["open"], false);
}

}  // namespace
}  // namespace fdl

namespace fdl {
namespace {

// A random mix of every operation; after each step (with the disk drained) the stores'
// occupancy equals what the live ids say, and tier 0 holds exactly the blocks the test owns.
TEST(TierManager, EveryBlockIsAccountedForUnderARandomWorkload) {
  BlockPool pool(test::tier_shape(), 6);
  TierManager tm(pool, config(3, 5, "stress"));
  std::vector<BlockId> owned;
  std::vector<OffloadId> live;
  uint32_t x = 12345;
  auto rnd = [&](uint32_t n) {
    x = x * 1664525u + 1013904223u;
    return (x >> 8) % n;
  };
  for (int step = 0; step < 400; ++step) {
    switch (rnd(6)) {
      case 0:
        if (pool.n_free() > 0) {
          owned.push_back(pool.allocate());
          fill_block(pool, owned.back(), uint32_t(step));
        }
        break;
      case 1:
      case 2:
        if (!owned.empty()) {
          const size_t i = rnd(uint32_t(owned.size()));
          const TierEvent e = tm.demote(owned[i], rnd(2) ? BlockTier::Host : BlockTier::Disk);
          if (e.status == TransferStatus::Ok || e.status == TransferStatus::Pending) {
            live.push_back(e.id);
            owned.erase(owned.begin() + ptrdiff_t(i));
          }
        }
        break;
      case 3:
        if (!live.empty()) {
          const size_t i = rnd(uint32_t(live.size()));
          const TierEvent e = tm.wait_resident(live[i]);
          if (e.status == TransferStatus::NoSpace) break;
          ASSERT_EQ(e.status, TransferStatus::Ok);
          owned.push_back(e.block);
          live.erase(live.begin() + ptrdiff_t(i));
        }
        break;
      case 4:
        if (!live.empty()) {
          const size_t i = rnd(uint32_t(live.size()));
          if (tm.meta(live[i]).tier == BlockTier::Host &&
              tm.meta(live[i]).state == BlockState::Inactive)
            tm.demote_to_disk(live[i]);
        }
        break;
      case 5:
        if (!live.empty()) {
          const size_t i = rnd(uint32_t(live.size()));
          tm.discard(live[i]);
          live.erase(live.begin() + ptrdiff_t(i));
        } else if (!owned.empty()) {
          pool.release(owned.back());
          owned.pop_back();
        }
        break;
    }
    tm.drain();
    tm.poll();
    size_t on_host = 0, on_disk = 0;
    for (OffloadId id : live) {
      on_host += tm.meta(id).tier == BlockTier::Host;
      on_disk += tm.meta(id).tier == BlockTier::Disk;
    }
    const TierStats s = tm.stats();
    ASSERT_EQ(s.tier[1].used_blocks, on_host) << "step " << step;
    ASSERT_EQ(s.tier[2].used_blocks, on_disk) << "step " << step;
    ASSERT_LE(on_host, s.tier[1].capacity_blocks);
    ASSERT_LE(on_disk, s.tier[2].capacity_blocks);
    ASSERT_EQ(pool.capacity() - pool.n_free(), owned.size()) << "step " << step;
    ASSERT_EQ(s.offloaded_blocks, live.size());
  }
  EXPECT_GT(tm.stats().blocks_moved[1][2], 0u) << "the workload reached every path";
  EXPECT_GT(tm.stats().blocks_moved[2][0], 0u);
}

}  // namespace
}  // namespace fdl

namespace fdl {
namespace {

// The layering preemption into the tiers builds on: preempt a whole sequence out of a KvCache into
// the lower tiers, let another sequence use tier 0, then bring every block back intact.
TEST(TierManager, PreemptedSequenceComesBackIntactThroughTheTiers) {
  BlockPool pool(test::tier_shape(), 4);
  KvCache kv(pool);
  TierManager tm(pool, config(2, 2, "kvcache"));
  const SeqId s = kv.create_sequence();
  kv.append_slots(s, 14);  // 4 blocks of 4 tokens, the last one partly filled
  for (size_t pos = 0; pos < 14; ++pos)
    for (int l = 0; l < pool.shape().n_layer; ++l) kv.k_slot(s, l, pos)[0] = float(pos * 10 + l);
  const std::vector<BlockId> table(kv.block_table(s).begin(), kv.block_table(s).end());
  std::vector<std::vector<uint8_t>> want;
  std::vector<OffloadId> ids;
  for (BlockId b : table) {
    want.push_back(block_copy(pool, b));
    pool.retain(b);  // keep the blocks while the sequence lets go of them
  }
  kv.free_sequence(s);
  for (size_t i = 0; i < table.size(); ++i) {
    const TierEvent e = tm.demote(table[i], i < 2 ? BlockTier::Host : BlockTier::Disk);
    ASSERT_TRUE(e.status == TransferStatus::Ok || e.status == TransferStatus::Pending);
    ids.push_back(e.id);
  }
  EXPECT_EQ(tm.meta(ids[3]).n_filled, 2u);
  tm.drain();
  tm.poll();
  EXPECT_EQ(pool.n_free(), 4u) << "all of tier 0 is free for other work";
  const SeqId other = kv.create_sequence();
  kv.append_slots(other, 16);
  kv.free_sequence(other);
  tm.prefetch(ids);
  for (size_t i = 0; i < ids.size(); ++i) {
    const TierEvent e = tm.wait_resident(ids[i]);
    ASSERT_EQ(e.status, TransferStatus::Ok);
    EXPECT_EQ(block_copy(pool, e.block), want[i]) << i;
  }
  EXPECT_EQ(pool.n_free(), 0u);
  EXPECT_EQ(tm.stats().offloaded_blocks, 0u);
}

}  // namespace
}  // namespace fdl

namespace fdl {
namespace {

TEST(TierManager, AutomaticBreakerTripResumesAfterCooldown) {
  BlockPool pool(test::tier_shape(), 4);
  TierConfig c = config(0, 4, "breaker-cool");
  c.breaker = {.threshold_ms = 0.0, .window = 4, .min_samples = 1, .cooldown_ms = 20};
  TierManager tm(pool, c);
  ASSERT_EQ(tm.demote(pool.allocate(), BlockTier::Disk).status, TransferStatus::Pending);
  tm.drain();
  tm.poll();
  ASSERT_TRUE(tm.stats().breaker_open);
  const BlockId b = pool.allocate();
  EXPECT_EQ(tm.demote(b, BlockTier::Disk).status, TransferStatus::Paused);
  std::this_thread::sleep_for(std::chrono::milliseconds(40));
  EXPECT_EQ(tm.demote(b, BlockTier::Disk).status, TransferStatus::Pending) << "cool-down over";
  EXPECT_FALSE(tm.stats().breaker_open);
  EXPECT_EQ(tm.stats().breaker_trips, 1u);
}

TEST(TierManager, BlocksInFlightCannotBeMovedAgain) {
  BlockPool pool(test::tier_shape(), 2);
  TierManager tm(pool, config(1, 2, "inflight"));
  const BlockId b = pool.allocate();
  const TierEvent e = tm.demote(b, BlockTier::Disk);
  ASSERT_EQ(e.status, TransferStatus::Pending);
  EXPECT_EQ(pool.meta(b).state, BlockState::PendingEvict);
  EXPECT_NE(pool.meta(b).checksum, 0u) << "checksum stored in the block's BlockMeta";
  EXPECT_THROW(tm.demote(b, BlockTier::Host), std::invalid_argument);
  EXPECT_THROW(tm.demote_to_disk(e.id), std::invalid_argument) << "not a tier-1 block";
  tm.discard(e.id);  // waits for the write, then frees the disk slot
  EXPECT_EQ(tm.stats().tier[2].used_blocks, 0u);
  EXPECT_EQ(pool.n_free(), 2u);
}

}  // namespace
}  // namespace fdl
