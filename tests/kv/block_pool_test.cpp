// BlockPool: allocation, refcounts, layout of K/V inside a block, error handling.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <set>

#include "flashdllm/kv_cache.h"

namespace fdl {
namespace {

KvShape small_shape() { return KvShape{.n_layer = 3, .n_kv_head = 2, .head_dim = 4, .block_size = 4}; }

TEST(BlockPool, FreshPoolIsAllFreeAndHandsOutDistinctBlocks) {
  BlockPool pool(small_shape(), 5);
  EXPECT_EQ(pool.capacity(), 5u);
  EXPECT_EQ(pool.n_free(), 5u);
  std::set<BlockId> ids;
  for (int i = 0; i < 5; ++i) {
    BlockId b = pool.allocate();
    EXPECT_EQ(pool.meta(b).ref_count, 1);
    EXPECT_EQ(pool.meta(b).state, BlockState::Active);
    ids.insert(b);
  }
  EXPECT_EQ(ids.size(), 5u);
  EXPECT_EQ(pool.n_free(), 0u);
  EXPECT_THROW(pool.allocate(), KvCacheFull);
}

TEST(BlockPool, RefcountReturnsBlockOnlyAtZero) {
  BlockPool pool(small_shape(), 2);
  BlockId b = pool.allocate();
  pool.retain(b);
  EXPECT_EQ(pool.meta(b).ref_count, 2);
  pool.release(b);
  EXPECT_EQ(pool.n_free(), 1u);
  pool.release(b);
  EXPECT_EQ(pool.n_free(), 2u);
  EXPECT_EQ(pool.meta(b).state, BlockState::Free);
  EXPECT_THROW(pool.release(b), std::invalid_argument);
  EXPECT_THROW(pool.retain(b), std::invalid_argument);
}

TEST(BlockPool, LayoutIsLayerThenKvThenSlotAndBlocksDoNotOverlap) {
  const KvShape s = small_shape();
  BlockPool pool(s, 3);
  const size_t tok = s.elems_per_token_per_layer();
  BlockId a = pool.allocate(), b = pool.allocate();
  // Within a layer, V starts block_size token-vectors after K.
  EXPECT_EQ(pool.v_ptr(a, 0, 0) - pool.k_ptr(a, 0, 0), ptrdiff_t(s.block_size * tok));
  EXPECT_EQ(pool.k_ptr(a, 0, 1) - pool.k_ptr(a, 0, 0), ptrdiff_t(tok));
  EXPECT_EQ(pool.k_ptr(a, 1, 0) - pool.k_ptr(a, 0, 0), ptrdiff_t(2 * s.block_size * tok));
  // The whole block is block_bytes() long and ends with the last V slot of the last layer.
  std::span<uint8_t> bytes = pool.block_bytes(a);
  EXPECT_EQ(bytes.size(), s.block_bytes());
  const uint8_t* last_v_end =
      reinterpret_cast<const uint8_t*>(pool.v_ptr(a, s.n_layer - 1, s.block_size - 1) + tok);
  EXPECT_EQ(last_v_end, bytes.data() + bytes.size());
  // Writing every float of block a leaves block b untouched.
  std::span<uint8_t> bb = pool.block_bytes(b);
  std::fill(bb.begin(), bb.end(), uint8_t{0});
  std::fill(bytes.begin(), bytes.end(), uint8_t{0xAB});
  for (uint8_t x : bb) ASSERT_EQ(x, 0);
}

// A 16-bit pool (the CUDA model's cache of a 16-bit model): half the bytes per block, the
// same element order, byte access through slot_bytes, and no fp32 view of its elements.
TEST(BlockPool, SixteenBitPoolHalvesTheBlockAndRefusesFloatAccess) {
  for (const KvDtype t : {KvDtype::F16, KvDtype::BF16}) {
    KvShape s = small_shape();
    const size_t f32_bytes = s.block_bytes();
    s.dtype = t;
    EXPECT_EQ(s.block_bytes() * 2, f32_bytes);
    BlockPool pool(s, 3);
    const BlockId a = pool.allocate(), b = pool.allocate();
    const size_t row = s.elems_per_token_per_layer() * 2;
    EXPECT_EQ(pool.slot_bytes(a, 0, 0, false).size(), row);
    EXPECT_EQ(pool.slot_bytes(a, 0, 1, false).data() - pool.slot_bytes(a, 0, 0, false).data(), ptrdiff_t(row));
    EXPECT_EQ(pool.slot_bytes(a, 0, 0, true).data() - pool.slot_bytes(a, 0, 0, false).data(),
              ptrdiff_t(s.block_size * row));
    EXPECT_EQ(pool.slot_bytes(a, 1, 0, false).data() - pool.slot_bytes(a, 0, 0, false).data(),
              ptrdiff_t(2 * s.block_size * row));
    const std::span<uint8_t> bytes = pool.block_bytes(a);
    EXPECT_EQ(bytes.size(), s.block_bytes());
    EXPECT_EQ(pool.slot_bytes(a, s.n_layer - 1, s.block_size - 1, true).data() + row, bytes.data() + bytes.size());
    EXPECT_EQ(pool.block_bytes(b).data(), bytes.data() + bytes.size());  // blocks are contiguous, no gap
    EXPECT_THROW(pool.k_ptr(a, 0, 0), std::logic_error);
    EXPECT_THROW(pool.v_ptr(a, 0, 0), std::logic_error);
    EXPECT_THROW(pool.slot_bytes(a, s.n_layer, 0, false), std::out_of_range);
    EXPECT_THROW(pool.slot_bytes(a, 0, s.block_size, true), std::out_of_range);
    EXPECT_THROW(pool.slot_bytes(7, 0, 0, false), std::out_of_range);
  }
}

// Resident set size of this process in bytes (/proc/self/statm, Linux).
size_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages_total = 0, pages_resident = 0;
  statm >> pages_total >> pages_resident;
  return pages_resident * size_t(::sysconf(_SC_PAGESIZE));
}

// The arena is committed page by page as blocks are written (a CUDA pool, whose device
// mirror holds the bytes, writes it only for tier copies): constructing a 256 MiB pool costs
// no resident memory, writing one block costs about that block, and fresh blocks read zero.
TEST(BlockPool, ArenaCommitsMemoryOnlyAsBlocksAreWritten) {
  const KvShape s{.n_layer = 8, .n_kv_head = 8, .head_dim = 128, .block_size = 16};  // 1 MiB blocks
  ASSERT_EQ(s.block_bytes(), size_t(1) << 20);
  const size_t before = resident_bytes();
  BlockPool pool(s, 256);
  const size_t constructed = resident_bytes();
  EXPECT_LT(constructed, before + (size_t(16) << 20)) << "a fresh 256 MiB pool is not committed";
  const BlockId b = pool.allocate();
  const std::span<uint8_t> bytes = pool.block_bytes(b);
  EXPECT_TRUE(std::all_of(bytes.begin(), bytes.end(), [](uint8_t x) { return x == 0; }));
  std::fill(bytes.begin(), bytes.end(), uint8_t{7});
  const size_t written = resident_bytes();
  EXPECT_GE(written, constructed + (size_t(1) << 19)) << "the written block is resident";
  EXPECT_LT(written, constructed + (size_t(24) << 20)) << "nothing else is";
  EXPECT_EQ(pool.arena_bytes().size(), size_t(256) << 20);
}

TEST(BlockPool, BadArgumentsThrow) {
  EXPECT_THROW(BlockPool(KvShape{.n_layer = 0, .n_kv_head = 1, .head_dim = 1, .block_size = 1}, 1),
               std::invalid_argument);
  EXPECT_THROW(BlockPool(KvShape{.n_layer = 1, .n_kv_head = 1, .head_dim = 1, .block_size = 0}, 1),
               std::invalid_argument);
  BlockPool pool(small_shape(), 2);
  EXPECT_THROW(pool.meta(2), std::out_of_range);
  EXPECT_THROW(pool.meta(-1), std::out_of_range);
  BlockId b = pool.allocate();
  EXPECT_THROW(pool.k_ptr(b, 3, 0), std::out_of_range);
  EXPECT_THROW(pool.v_ptr(b, 0, 4), std::out_of_range);
}

}  // namespace
}  // namespace fdl
