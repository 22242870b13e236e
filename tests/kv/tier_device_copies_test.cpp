// The tier manager over a mirror that copies asynchronously (BlockMirror::copies_async, the
// CUDA model's path): tier memory page-locked once at construction, demotions that hand the
// tier-0 block back before the copy has run, promotions that are Pending until the copy and
// its device checksum have completed, and the orderings the device guarantees. The stand-in
// runs each queued copy only when the test lets the "device" progress, so every state in
// between is observable here, without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>

#include "flashdllm/kv_tiers.h"
#include "tier_test_util.h"

namespace fdl {
namespace {

// A device arena whose copies run in queue order when progress() is called (or when a write
// needs a pending pull of its block done first, as the CUDA model's fence does).
class DeferredCopyArena final : public BlockMirror {
 public:
  explicit DeferredCopyArena(size_t block_bytes, size_t n_blocks)
      : block_bytes_(block_bytes), arena_(block_bytes * n_blocks) {}

  // Synchronous path: not used when copies_async() (the tests fail if it is).
  void pull(BlockId, std::span<uint8_t>) override { ++sync_calls; }
  void push(BlockId, std::span<const uint8_t>) override { ++sync_calls; }

  bool copies_async() const override { return true; }
  std::shared_ptr<void> pin_host(void* p, size_t bytes) override {
    pinned.emplace_back(p, bytes);
    return std::shared_ptr<void>(p, [this, p](void*) { unpinned.push_back(p); });
  }
  CopyHandle queue_copy(BlockId id, uint8_t* host, bool to_host) override {
    if (id < 0 || size_t(id) * block_bytes_ >= arena_.size()) throw std::logic_error("bad block");
    if (!pinned_range(host)) throw std::logic_error("copy from memory that was never page-locked");
    queue_.push_back({id, host, to_host, next_++, false, 0});
    return {queue_.back().seq, 0};
  }
  bool copy_done(CopyHandle h) override { return find(h.group).ran; }
  void wait_copy(CopyHandle h) override {
    ++waits;
    while (!find(h.group).ran) run_one();
  }
  uint64_t collect_copy(CopyHandle h) override {
    Copy& c = find(h.group);
    if (!c.ran) throw std::logic_error("collect before done");
    const uint64_t sum = c.sum;
    while (!queue_.empty() && queue_.front().ran && queue_.front().seq <= h.group) queue_.pop_front();
    return sum;
  }

  /// The "device" runs up to `n` queued copies.
  void progress(size_t n = SIZE_MAX) {
    for (size_t i = 0; i < n && pending() > 0; ++i) run_one();
  }
  size_t pending() const {
    return size_t(std::count_if(queue_.begin(), queue_.end(), [](const Copy& c) { return !c.ran; }));
  }
  /// A forward writes block `id`: pulls still reading it run first (the device fence).
  void forward_writes(BlockId id, uint8_t value) {
    fence(id);
    std::fill_n(block(id), block_bytes_, value);
  }
  void forward_writes(BlockId id, const std::vector<uint8_t>& bytes) {
    fence(id);
    std::copy(bytes.begin(), bytes.end(), block(id));
  }
  uint8_t* block(BlockId id) { return arena_.data() + size_t(id) * block_bytes_; }

  int sync_calls = 0, waits = 0;
  std::vector<std::pair<void*, size_t>> pinned;
  std::vector<void*> unpinned;

 private:
  struct Copy {
    BlockId block;
    uint8_t* host;
    bool to_host;
    uint64_t seq;
    bool ran;
    uint64_t sum;
  };
  void fence(BlockId id) {
    for (auto& c : queue_)
      if (!c.ran && c.to_host && c.block == id)
        while (!c.ran) run_one();
  }
  bool pinned_range(const uint8_t* p) const {
    for (const auto& [base, n] : pinned)
      if (p >= static_cast<const uint8_t*>(base) && p + block_bytes_ <= static_cast<const uint8_t*>(base) + n)
        return true;
    return false;
  }
  Copy& find(uint64_t seq) {
    for (auto& c : queue_)
      if (c.seq == seq) return c;
    throw std::logic_error("unknown copy");
  }
  void run_one() {
    for (auto& c : queue_)
      if (!c.ran) {
        if (c.to_host) {
          c.sum = block_checksum({block(c.block), block_bytes_});
          std::copy_n(block(c.block), block_bytes_, c.host);
        } else {
          std::copy_n(c.host, block_bytes_, block(c.block));
          c.sum = block_checksum({block(c.block), block_bytes_});
        }
        c.ran = true;
        return;
      }
  }
  size_t block_bytes_;
  std::vector<uint8_t> arena_;
  std::deque<Copy> queue_;
  uint64_t next_ = 1;
};

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = uint8_t(seed + i * 13 + (i >> 8));
  return v;
}

struct Rig {
  explicit Rig(size_t host_blocks = 4, bool disk = false, const std::string& name = "devcopies")
      : pool(test::tier_shape(), 6),
        bb(pool.shape().block_bytes()),
        arena(std::make_shared<DeferredCopyArena>(bb, pool.capacity())) {
    pool.set_mirror(arena);  // before the tier manager: it sees the asynchronous mirror
    TierConfig cfg;
    cfg.host.bytes = host_blocks * bb;
    if (disk) {
      cfg.disk.bytes = 4 * bb;
      cfg.disk_path = test::fresh_dir(name);
      cfg.disk_queue_depth = 4;
    }
    tm = std::make_unique<TierManager>(pool, cfg);
  }
  // A full tier-0 block holding `bytes` on the device.
  BlockId device_block(const std::vector<uint8_t>& bytes) {
    const BlockId b = pool.allocate();
    pool.meta(b).n_filled = uint32_t(pool.shape().block_size);
    arena->forward_writes(b, bytes);  // as a forward would: after pulls still reading b
    return b;
  }
  BlockPool pool;
  size_t bb;
  std::shared_ptr<DeferredCopyArena> arena;
  std::unique_ptr<TierManager> tm;
};

TEST(TierDeviceCopies, HostMemoryIsPageLockedOnceAtStartUp) {
  Rig rig(4, true, "devcopies-pin");
  EXPECT_TRUE(rig.tm->copies_async());
  // Tier 1's arena and the disk staging buffers, each once, before any copy.
  ASSERT_EQ(rig.arena->pinned.size(), 2u);
  EXPECT_GE(rig.arena->pinned[0].second, 4 * rig.bb);
  EXPECT_GE(rig.arena->pinned[1].second, 4 * rig.bb);
  const BlockId b = rig.device_block(pattern(rig.bb, 1));
  rig.tm->demote(b, BlockTier::Host);
  rig.tm->drain();
  EXPECT_EQ(rig.arena->pinned.size(), 2u) << "a copy must never pin memory in the request path";
  rig.tm.reset();
  EXPECT_EQ(rig.arena->unpinned.size(), 2u);
}

TEST(TierDeviceCopies, DemotionHandsTheBlockBackBeforeTheCopyRuns) {
  Rig rig;
  const auto bytes = pattern(rig.bb, 7);
  const BlockId b = rig.device_block(bytes);
  const size_t free_before = rig.pool.n_free();
  const TierEvent ev = rig.tm->demote(b, BlockTier::Host);
  ASSERT_EQ(ev.status, TransferStatus::Ok);
  EXPECT_EQ(rig.pool.n_free(), free_before + 1) << "the engine must not wait for the copy";
  EXPECT_EQ(rig.arena->pending(), 1u);
  EXPECT_FALSE(rig.tm->ready(ev.id));
  EXPECT_EQ(rig.tm->stats().blocks_moved[0][1], 0u) << "counted when the copy completes";
  rig.arena->progress();
  EXPECT_TRUE(rig.tm->ready(ev.id));
  EXPECT_EQ(rig.tm->stats().blocks_moved[0][1], 1u);
  EXPECT_EQ(rig.tm->meta(ev.id).checksum, block_checksum({bytes.data(), bytes.size()}));
  EXPECT_EQ(rig.arena->sync_calls, 0);
}

TEST(TierDeviceCopies, AReusedSlotIsNotOverwrittenWhileItsPullStillReadsIt) {
  Rig rig;
  const auto bytes = pattern(rig.bb, 21);
  const BlockId b = rig.device_block(bytes);
  const TierEvent ev = rig.tm->demote(b, BlockTier::Host);
  ASSERT_EQ(ev.status, TransferStatus::Ok);
  // The pool hands the same block out at once; a forward writes into it before the device
  // ran the pull: the fence runs the pull first.
  const BlockId again = rig.pool.allocate();
  ASSERT_EQ(again, b);
  rig.arena->forward_writes(again, 0x5A);
  rig.pool.release(again);
  const TierEvent back = rig.tm->wait_resident(ev.id);
  ASSERT_EQ(back.status, TransferStatus::Ok);
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), rig.arena->block(back.block)));
  rig.pool.release(back.block);
}

TEST(TierDeviceCopies, APromotedBlockIsClaimedOnlyOnceItHasLandedAndBeenVerified) {
  Rig rig;
  const auto bytes = pattern(rig.bb, 33);
  const TierEvent ev = rig.tm->demote(rig.device_block(bytes), BlockTier::Host);
  rig.arena->progress();
  const std::vector<OffloadId> ids{ev.id};
  const auto started = rig.tm->prefetch(ids);
  ASSERT_EQ(started.size(), 1u);
  ASSERT_EQ(started[0].status, TransferStatus::Pending);
  const BlockId target = started[0].block;
  EXPECT_EQ(rig.pool.meta(target).state, BlockState::Loading);
  EXPECT_FALSE(rig.tm->ready(ev.id)) << "in flight: admission must not use it yet";
  EXPECT_EQ(rig.tm->stats().blocks_moved[1][0], 0u);
  rig.arena->progress();
  EXPECT_TRUE(rig.tm->ready(ev.id));
  const int waits = rig.arena->waits;
  const TierEvent back = rig.tm->wait_resident(ev.id);
  ASSERT_EQ(back.status, TransferStatus::Ok);
  EXPECT_EQ(back.block, target);
  EXPECT_EQ(rig.arena->waits, waits) << "a landed prefetch is claimed without waiting";
  EXPECT_EQ(rig.pool.meta(back.block).state, BlockState::Active);
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), rig.arena->block(back.block)));
  const TierStats st = rig.tm->stats();
  EXPECT_EQ(st.blocks_moved[1][0], 1u);
  EXPECT_EQ(st.prefetch_hits, 1u);
  EXPECT_EQ(st.tier[1].used_blocks, 0u) << "the host slot is free once the copy has read it";
  rig.pool.release(back.block);
}

TEST(TierDeviceCopies, AFlippedBitInTierOneIsCaughtByTheDeviceChecksum) {
  Rig rig;
  const TierEvent ev = rig.tm->demote(rig.device_block(pattern(rig.bb, 45)), BlockTier::Host);
  rig.tm->drain();
  rig.tm->corrupt_for_test(ev.id, rig.bb / 2, 3);
  const size_t free_before = rig.pool.n_free();
  const TierEvent back = rig.tm->wait_resident(ev.id);
  EXPECT_EQ(back.status, TransferStatus::Corrupt);
  EXPECT_EQ(back.block, -1);
  EXPECT_EQ(rig.pool.n_free(), free_before) << "the corrupt block goes back to the pool";
  EXPECT_EQ(rig.tm->stats().tier[1].checksum_failures, 1u);
}

TEST(TierDeviceCopies, DiskRoundTripGoesThroughPageLockedStaging) {
  Rig rig(0, true, "devcopies-disk");
  const auto bytes = pattern(rig.bb, 57);
  const TierEvent ev = rig.tm->demote(rig.device_block(bytes), BlockTier::Disk);
  ASSERT_EQ(ev.status, TransferStatus::Pending);
  rig.tm->drain();  // the pull, then the disk write
  EXPECT_EQ(rig.tm->meta(ev.id).tier, BlockTier::Disk);
  EXPECT_EQ(rig.tm->meta(ev.id).state, BlockState::Inactive);
  EXPECT_EQ(rig.tm->stats().blocks_moved[0][2], 1u);
  const TierEvent back = rig.tm->wait_resident(ev.id);  // disk read, then the push
  ASSERT_EQ(back.status, TransferStatus::Ok);
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), rig.arena->block(back.block)));
  EXPECT_EQ(rig.tm->stats().blocks_moved[2][0], 1u);
  rig.pool.release(back.block);
  EXPECT_EQ(rig.arena->sync_calls, 0);
}

TEST(TierDeviceCopies, ManyBlocksInFlightCompleteInOrderAndDiscardWaitsForItsCopy) {
  Rig rig(4);
  std::vector<std::vector<uint8_t>> data;
  std::vector<BlockId> blocks;
  std::vector<OffloadId> ids;
  for (int i = 0; i < 4; ++i) {
    data.push_back(pattern(rig.bb, uint8_t(60 + i)));
    blocks.push_back(rig.device_block(data.back()));
  }
  const BlockId fifth = rig.device_block(data[0]);
  for (BlockId b : blocks) {
    const TierEvent ev = rig.tm->demote(b, BlockTier::Host);
    ASSERT_EQ(ev.status, TransferStatus::Ok);
    ids.push_back(ev.id);
  }
  EXPECT_EQ(rig.tm->in_flight(), 4u);
  EXPECT_EQ(rig.tm->demote(fifth, BlockTier::Host).status, TransferStatus::NoSpace)
      << "slots of copies in flight stay taken";
  rig.arena->progress(2);
  rig.tm->poll();
  EXPECT_EQ(rig.tm->in_flight(), 2u);
  rig.tm->discard(ids[3]);  // waits for its copy, then frees the slot
  EXPECT_EQ(rig.tm->in_flight(), 0u);
  for (int i = 0; i < 3; ++i) {
    const TierEvent back = rig.tm->wait_resident(ids[size_t(i)]);
    ASSERT_EQ(back.status, TransferStatus::Ok) << i;
    EXPECT_TRUE(std::equal(data[size_t(i)].begin(), data[size_t(i)].end(), rig.arena->block(back.block))) << i;
    rig.pool.release(back.block);
  }
}

TEST(BlockChecksum, EveryWordAndItsPlaceCount) {
  std::vector<uint8_t> a = pattern(4096 + 5, 3);
  const uint64_t base = block_checksum(a);
  for (size_t byte : {size_t(0), size_t(7), size_t(8), size_t(2048), size_t(4100)}) {
    for (int bit : {0, 5, 7}) {
      auto b = a;
      b[byte] ^= uint8_t(1u << bit);
      EXPECT_NE(block_checksum(b), base) << byte << ":" << bit;
    }
  }
  // Two words swapped: same multiset of words, other places.
  auto s = a;
  std::swap_ranges(s.begin(), s.begin() + 8, s.begin() + 8);
  EXPECT_NE(block_checksum(s), base);
  // The length is part of it (a zero tail is not the same block).
  auto z = a;
  z.push_back(0);
  EXPECT_NE(block_checksum(z), base);
  EXPECT_EQ(block_checksum(a), base);
}

}  // namespace
}  // namespace fdl
