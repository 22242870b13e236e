// BlockPool: allocation, refcounts, layout of K/V inside a block, error handling.
#include <gtest/gtest.h>

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
  const size_t tok = s.floats_per_token_per_layer();
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
