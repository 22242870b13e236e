// KvCache::set_block_copy_observer: called once per copy-on-write copy with (shared source,
// private copy), after the copy's bytes and metadata are in place; never for appends that
// copy nothing; replaceable and removable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include "flashdllm/kv_cache.h"

namespace fdl {
namespace {

KvShape shape() { return KvShape{.n_layer = 2, .n_kv_head = 1, .head_dim = 2, .block_size = 4}; }

struct Seen {
  BlockId src, dst;
  bool bytes_equal;    // dst's bytes already equal src's when the observer runs
  uint32_t dst_filled; // dst's n_filled at that time
  int32_t src_refs;    // src is still held by the other sequence
};

TEST(KvCopyObserver, ReportsEachCopyOnWriteWithSourceAndDestination) {
  BlockPool pool(shape(), 8);
  KvCache kv(pool);
  std::vector<Seen> seen;
  kv.set_block_copy_observer([&](BlockId src, BlockId dst) {
    const auto a = pool.block_bytes(src), b = pool.block_bytes(dst);
    seen.push_back({src, dst, std::memcmp(a.data(), b.data(), a.size()) == 0, pool.meta(dst).n_filled,
                    pool.meta(src).ref_count});
  });
  const SeqId a = kv.create_sequence();
  kv.append_slots(a, 6);  // one full block, a tail block with 2 of 4 slots used
  for (size_t p = 0; p < 6; ++p) kv.k_slot(a, 1, p)[1] = float(p + 1);
  EXPECT_TRUE(seen.empty()) << "no copy for appends into private blocks";

  const SeqId b = kv.fork_sequence(a);
  const BlockId shared_tail = kv.block_table(b)[1];
  kv.append_slots(b, 1);  // writes into the shared partial tail: copy-on-write
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].src, shared_tail);
  EXPECT_EQ(seen[0].dst, kv.block_table(b)[1]);
  EXPECT_NE(seen[0].src, seen[0].dst);
  EXPECT_TRUE(seen[0].bytes_equal);
  EXPECT_EQ(seen[0].dst_filled, 2u);
  EXPECT_EQ(seen[0].src_refs, 1) << "the source is still the parent's block";
  EXPECT_EQ(kv.block_table(a)[1], shared_tail);
  EXPECT_EQ(kv.blocks_copied(), 1u);

  kv.append_slots(a, 1);  // a's tail is private again (b took a copy): nothing copied
  EXPECT_EQ(seen.size(), 1u);

  // A fork at a block boundary shares only full blocks: appending allocates, copies nothing.
  kv.append_slots(a, 1);  // a: 8 tokens, two full blocks
  const SeqId c = kv.fork_sequence(a);
  kv.append_slots(c, 1);
  EXPECT_EQ(seen.size(), 1u);
  EXPECT_EQ(kv.blocks_copied(), 1u);
}

TEST(KvCopyObserver, CanBeReplacedAndRemoved) {
  BlockPool pool(shape(), 8);
  KvCache kv(pool);
  int first = 0, second = 0;
  kv.set_block_copy_observer([&](BlockId, BlockId) { ++first; });
  kv.set_block_copy_observer([&](BlockId, BlockId) { ++second; });
  const SeqId a = kv.create_sequence();
  kv.append_slots(a, 1);
  const SeqId b = kv.fork_sequence(a);
  kv.append_slots(b, 1);
  EXPECT_EQ(first, 0);
  EXPECT_EQ(second, 1);
  kv.set_block_copy_observer({});
  const SeqId c = kv.fork_sequence(a);
  kv.append_slots(c, 1);
  EXPECT_EQ(second, 1);
  EXPECT_EQ(kv.blocks_copied(), 2u);
}

TEST(KvCopyObserver, NotCalledWhenTheAppendFailsForLackOfBlocks) {
  BlockPool pool(shape(), 2);
  KvCache kv(pool);
  int calls = 0;
  kv.set_block_copy_observer([&](BlockId, BlockId) { ++calls; });
  const SeqId a = kv.create_sequence();
  kv.append_slots(a, 5);  // both blocks used, the tail partly
  const SeqId b = kv.fork_sequence(a);
  EXPECT_THROW(kv.append_slots(b, 1), KvCacheFull);  // the copy would need a third block
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(kv.blocks_copied(), 0u);
}

// KvCache::move_slot (packing an accepted tree branch): copies a slot's K and V in every
// layer and reports the physical places (block, slot) to the slot-move observer, which a
// backend holding its own copy of the arena (CUDA) replays; from == to changes nothing.
TEST(KvSlotMoveObserver, MoveSlotCopiesAndReportsPhysicalSlots) {
  BlockPool pool(KvShape{.n_layer = 2, .n_kv_head = 1, .head_dim = 4, .block_size = 4}, 8);
  KvCache kv(pool);
  const SeqId s = kv.create_sequence();
  kv.append_slots(s, 10);
  for (size_t p = 0; p < 10; ++p)
    for (int layer = 0; layer < 2; ++layer)
      for (int d = 0; d < 4; ++d) {
        kv.k_slot(s, layer, p)[d] = float(100 * p + 10 * layer + d);
        kv.v_slot(s, layer, p)[d] = -float(100 * p + 10 * layer + d);
      }
  std::vector<std::tuple<BlockId, int, BlockId, int>> seen;
  kv.set_slot_move_observer([&](BlockId fb, int fs, BlockId tb, int ts) { seen.emplace_back(fb, fs, tb, ts); });
  const auto table = kv.block_table(s);
  kv.move_slot(s, 9, 5);  // block 2 slot 1 -> block 1 slot 1
  kv.move_slot(s, 6, 6);  // a no-op: neither reported nor counted
  kv.move_slot(s, 3, 2);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], std::make_tuple(table[2], 1, table[1], 1));
  EXPECT_EQ(seen[1], std::make_tuple(table[0], 3, table[0], 2));
  EXPECT_EQ(kv.slots_moved(), 2u);
  for (int layer = 0; layer < 2; ++layer) {
    EXPECT_EQ(kv.k_slot(s, layer, 5)[3], float(900 + 10 * layer + 3));
    EXPECT_EQ(kv.v_slot(s, layer, 2)[0], -float(300 + 10 * layer));
    EXPECT_EQ(kv.k_slot(s, layer, 9)[1], float(900 + 10 * layer + 1)) << "the source keeps its bytes";
  }
  kv.set_slot_move_observer({});
  kv.move_slot(s, 1, 0);
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_EQ(kv.slots_moved(), 3u);
  EXPECT_THROW(kv.move_slot(s, 10, 0), std::out_of_range);
  EXPECT_THROW(kv.move_slot(s, 0, 10), std::out_of_range);
  // A shared target would change the other sequence: refused; from == to is still a no-op.
  const SeqId child = kv.fork_sequence(s);
  EXPECT_THROW(kv.move_slot(child, 9, 8), std::invalid_argument);
  EXPECT_NO_THROW(kv.move_slot(child, 8, 8));
  EXPECT_EQ(kv.slots_moved(), 3u);
}

// A 16-bit pool: move_slot copies exactly the slot's 2-byte elements of every layer (K and V)
// and nothing next to them.
TEST(KvSlotMoveObserver, MoveSlotOfASixteenBitPoolCopiesItsBytes) {
  BlockPool pool(KvShape{.n_layer = 2, .n_kv_head = 1, .head_dim = 4, .block_size = 4, .dtype = KvDtype::F16}, 4);
  KvCache kv(pool);
  const SeqId s = kv.create_sequence();
  kv.append_slots(s, 6);
  const auto table = kv.block_table(s);
  uint8_t next = 1;
  for (const BlockId b : table) {
    const std::span<uint8_t> bytes = pool.block_bytes(b);
    for (uint8_t& x : bytes) x = next++;
  }
  std::vector<uint8_t> before(pool.block_bytes(table[0]).begin(), pool.block_bytes(table[0]).end());
  kv.move_slot(s, 5, 2);  // block 1 slot 1 -> block 0 slot 2
  for (int layer = 0; layer < 2; ++layer)
    for (const bool v : {false, true}) {
      const auto from = pool.slot_bytes(table[1], layer, 1, v), to = pool.slot_bytes(table[0], layer, 2, v);
      ASSERT_EQ(to.size(), 8u);  // 4 elements of 2 bytes
      EXPECT_TRUE(std::equal(from.begin(), from.end(), to.begin())) << "layer " << layer << " v " << v;
      // Everything else in block 0 is unchanged.
      const size_t at = size_t(to.data() - pool.block_bytes(table[0]).data());
      std::copy(to.begin(), to.end(), before.begin() + ptrdiff_t(at));
    }
  EXPECT_TRUE(std::equal(before.begin(), before.end(), pool.block_bytes(table[0]).begin()));
  EXPECT_THROW(kv.k_slot(s, 0, 0), std::logic_error);  // no fp32 view of 16-bit elements
}

}  // namespace
}  // namespace fdl
