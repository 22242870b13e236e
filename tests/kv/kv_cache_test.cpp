// KvCache invariants from include/flashdllm/kv_cache.h, one test each, plus a randomized
// operation sequence checking the pool accounting.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <random>
#include <vector>

#include "flashdllm/kv_cache.h"

namespace fdl {
namespace {

KvShape shape() { return KvShape{.n_layer = 2, .n_kv_head = 2, .head_dim = 3, .block_size = 4}; }

// A value unique to (seq tag, layer, position, element, k-or-v), so overwrites are visible.
float tag_value(int tag, int layer, size_t pos, size_t e, bool v) {
  return float(tag * 100000 + layer * 10000 + int(pos) * 10 + int(e)) + (v ? 0.5f : 0.f);
}

void write_token(KvCache& kv, SeqId s, int tag, size_t pos) {
  const size_t n = kv.pool().shape().elems_per_token_per_layer();
  for (int l = 0; l < kv.pool().shape().n_layer; ++l)
    for (size_t e = 0; e < n; ++e) {
      kv.k_slot(s, l, pos)[e] = tag_value(tag, l, pos, e, false);
      kv.v_slot(s, l, pos)[e] = tag_value(tag, l, pos, e, true);
    }
}

// Checks positions [0, len) of `s` hold what write_token(tag) wrote; `tag_at(pos)` gives the
// tag written at each position (forked sequences share a prefix written under another tag).
template <class TagAt>
void expect_tokens(KvCache& kv, SeqId s, size_t len, TagAt tag_at) {
  const size_t n = kv.pool().shape().elems_per_token_per_layer();
  for (size_t p = 0; p < len; ++p)
    for (int l = 0; l < kv.pool().shape().n_layer; ++l)
      for (size_t e = 0; e < n; ++e) {
        ASSERT_EQ(kv.k_slot(s, l, p)[e], tag_value(tag_at(p), l, p, e, false)) << "pos " << p;
        ASSERT_EQ(kv.v_slot(s, l, p)[e], tag_value(tag_at(p), l, p, e, true)) << "pos " << p;
      }
}

size_t used_blocks(const BlockPool& pool) {
  size_t used = 0;
  for (BlockId b = 0; b < BlockId(pool.capacity()); ++b) used += pool.meta(b).ref_count > 0;
  return used;
}

TEST(KvCache, AppendReturnsFirstNewPositionAndAllocatesBlocksLazily) {
  BlockPool pool(shape(), 8);
  KvCache kv(pool);
  SeqId s = kv.create_sequence();
  EXPECT_EQ(kv.length(s), 0u);
  EXPECT_TRUE(kv.block_table(s).empty());
  EXPECT_EQ(kv.append_slots(s, 3), 0u);
  EXPECT_EQ(kv.block_table(s).size(), 1u);
  EXPECT_EQ(kv.append_slots(s, 1), 3u);
  EXPECT_EQ(kv.block_table(s).size(), 1u);
  EXPECT_EQ(kv.append_slots(s, 1), 4u);
  EXPECT_EQ(kv.block_table(s).size(), 2u);
  EXPECT_EQ(kv.length(s), 5u);
  EXPECT_EQ(pool.meta(kv.block_table(s)[0]).n_filled, 4u);
  EXPECT_EQ(pool.meta(kv.block_table(s)[1]).n_filled, 1u);
}

TEST(KvCache, LifetimeExpiresWithTheCacheOnly) {
  BlockPool pool(shape(), 8);
  std::weak_ptr<const void> gone;
  {
    KvCache kv(pool);
    gone = kv.lifetime();
    KvCache other(pool);
    EXPECT_FALSE(gone.expired());
    EXPECT_FALSE(other.lifetime().expired());
    EXPECT_NE(gone.lock(), other.lifetime().lock()) << "one token per cache";
  }
  EXPECT_TRUE(gone.expired());
}

TEST(KvCache, AppendingNeverMovesOrChangesEarlierSlots) {
  BlockPool pool(shape(), 16);
  KvCache kv(pool);
  SeqId s = kv.create_sequence();
  std::vector<const float*> k_ptrs, v_ptrs;
  for (size_t n = 0; n < 40; ++n) {
    const size_t pos = kv.append_slots(s, 1);
    write_token(kv, s, 1, pos);
    k_ptrs.push_back(kv.k_slot(s, 1, pos));
    v_ptrs.push_back(kv.v_slot(s, 1, pos));
    // Every earlier slot keeps its address and its bytes.
    for (size_t p = 0; p <= pos; ++p) {
      ASSERT_EQ(kv.k_slot(s, 1, p), k_ptrs[p]);
      ASSERT_EQ(kv.v_slot(s, 1, p), v_ptrs[p]);
    }
    expect_tokens(kv, s, pos + 1, [](size_t) { return 1; });
  }
  EXPECT_EQ(kv.blocks_copied(), 0u);
}

TEST(KvCache, ForkSharesAllBlocksByRefcount) {
  BlockPool pool(shape(), 8);
  KvCache kv(pool);
  SeqId a = kv.create_sequence();
  kv.append_slots(a, 10);
  const size_t free_before = pool.n_free();
  SeqId b = kv.fork_sequence(a);
  EXPECT_EQ(pool.n_free(), free_before);
  EXPECT_EQ(kv.length(b), 10u);
  ASSERT_EQ(kv.block_table(a).size(), kv.block_table(b).size());
  for (size_t i = 0; i < kv.block_table(a).size(); ++i) {
    EXPECT_EQ(kv.block_table(a)[i], kv.block_table(b)[i]);
    EXPECT_EQ(pool.meta(kv.block_table(a)[i]).ref_count, 2);
  }
}

TEST(KvCache, AppendAfterForkCopiesExactlyTheSharedTailBlock) {
  BlockPool pool(shape(), 8);
  KvCache kv(pool);
  SeqId a = kv.create_sequence();
  for (size_t p = 0; p < 10; ++p) write_token(kv, a, 1, kv.append_slots(a, 1));  // 2.5 blocks
  SeqId b = kv.fork_sequence(a);
  const std::vector<BlockId> parent(kv.block_table(a).begin(), kv.block_table(a).end());
  const size_t free_before = pool.n_free();

  write_token(kv, b, 2, kv.append_slots(b, 1));  // position 10, into the shared tail block

  EXPECT_EQ(kv.blocks_copied(), 1u);
  EXPECT_EQ(pool.n_free(), free_before - 1);
  std::span<const BlockId> child = kv.block_table(b);
  ASSERT_EQ(child.size(), 3u);
  EXPECT_EQ(child[0], parent[0]);
  EXPECT_EQ(child[1], parent[1]);
  EXPECT_NE(child[2], parent[2]);
  EXPECT_EQ(pool.meta(parent[2]).ref_count, 1);  // the parent keeps the original tail
  EXPECT_EQ(pool.meta(child[2]).ref_count, 1);
  // The child sees the shared prefix and its own token; the parent is untouched.
  expect_tokens(kv, b, 11, [](size_t p) { return p < 10 ? 1 : 2; });
  expect_tokens(kv, a, 10, [](size_t) { return 1; });
  // Appending more into the (now private) tail and into fresh blocks copies nothing else.
  for (int i = 0; i < 6; ++i) write_token(kv, b, 2, kv.append_slots(b, 1));
  write_token(kv, a, 3, kv.append_slots(a, 1));  // the parent's tail is private again
  EXPECT_EQ(kv.blocks_copied(), 1u);
  expect_tokens(kv, a, 11, [](size_t p) { return p < 10 ? 1 : 3; });
}

TEST(KvCache, ForkAtBlockBoundaryCopiesNothing) {
  BlockPool pool(shape(), 8);
  KvCache kv(pool);
  SeqId a = kv.create_sequence();
  kv.append_slots(a, 8);  // exactly two full blocks
  SeqId b = kv.fork_sequence(a);
  kv.append_slots(b, 1);
  kv.append_slots(a, 1);
  EXPECT_EQ(kv.blocks_copied(), 0u);
  EXPECT_NE(kv.block_table(a)[2], kv.block_table(b)[2]);
}

TEST(KvCache, TruncateIntoSharedBlockThenAppendCopiesIt) {
  BlockPool pool(shape(), 8);
  KvCache kv(pool);
  SeqId a = kv.create_sequence();
  for (size_t p = 0; p < 8; ++p) write_token(kv, a, 1, kv.append_slots(a, 1));
  SeqId b = kv.fork_sequence(a);
  kv.truncate(b, 6);  // block 1 is full and shared; b now ends inside it
  write_token(kv, b, 2, kv.append_slots(b, 1));
  EXPECT_EQ(kv.blocks_copied(), 1u);
  expect_tokens(kv, a, 8, [](size_t) { return 1; });
  expect_tokens(kv, b, 7, [](size_t p) { return p < 6 ? 1 : 2; });
}

TEST(KvCache, TruncateReleasesWholeBlocksAndAppendReusesThem) {
  BlockPool pool(shape(), 8);
  KvCache kv(pool);
  SeqId s = kv.create_sequence();
  kv.append_slots(s, 13);  // 4 blocks
  EXPECT_EQ(pool.n_free(), 4u);
  kv.truncate(s, 5);  // keeps 2 blocks
  EXPECT_EQ(kv.length(s), 5u);
  EXPECT_EQ(kv.block_table(s).size(), 2u);
  EXPECT_EQ(pool.n_free(), 6u);
  EXPECT_EQ(pool.meta(kv.block_table(s)[1]).n_filled, 1u);
  const BlockId kept_tail = kv.block_table(s)[1];
  // Filling the kept tail needs no new block; the next append takes one from the free list.
  EXPECT_EQ(kv.append_slots(s, 3), 5u);
  EXPECT_EQ(pool.n_free(), 6u);
  EXPECT_EQ(kv.block_table(s)[1], kept_tail);
  kv.append_slots(s, 8);
  EXPECT_EQ(pool.n_free(), 4u);
  kv.truncate(s, 0);
  EXPECT_TRUE(kv.block_table(s).empty());
  EXPECT_EQ(pool.n_free(), 8u);
  EXPECT_THROW(kv.truncate(s, 1), std::invalid_argument);
}

TEST(KvCache, FullPoolThrowsAndLeavesSequenceUnchanged) {
  BlockPool pool(shape(), 3);
  KvCache kv(pool);
  SeqId a = kv.create_sequence();
  for (size_t p = 0; p < 6; ++p) write_token(kv, a, 1, kv.append_slots(a, 1));
  const std::vector<BlockId> before(kv.block_table(a).begin(), kv.block_table(a).end());
  EXPECT_THROW(kv.append_slots(a, 7), KvCacheFull);  // needs 2 more blocks, 1 free
  EXPECT_EQ(kv.length(a), 6u);
  EXPECT_EQ(std::vector<BlockId>(kv.block_table(a).begin(), kv.block_table(a).end()), before);
  EXPECT_EQ(pool.n_free(), 1u);
  expect_tokens(kv, a, 6, [](size_t) { return 1; });
  // Copy-on-write also counts: with the last block taken, a fork cannot append into the
  // shared tail, and neither sequence changes.
  SeqId b = kv.fork_sequence(a);
  SeqId c = kv.create_sequence();
  kv.append_slots(c, 1);
  EXPECT_EQ(pool.n_free(), 0u);
  EXPECT_THROW(kv.append_slots(b, 1), KvCacheFull);
  EXPECT_EQ(kv.length(b), 6u);
  EXPECT_EQ(kv.block_table(b)[1], before[1]);
  EXPECT_EQ(pool.meta(before[1]).ref_count, 2);
  EXPECT_EQ(kv.blocks_copied(), 0u);
  EXPECT_THROW(kv.append_slots(a, size_t(1) << 62), KvCacheFull);
  EXPECT_EQ(kv.length(a), 6u);
}

TEST(KvCache, BadSequenceIdsAndPositionsThrow) {
  BlockPool pool(shape(), 2);
  KvCache kv(pool);
  EXPECT_THROW(kv.length(0), std::out_of_range);
  SeqId s = kv.create_sequence();
  kv.append_slots(s, 2);
  EXPECT_THROW(kv.k_slot(s, 0, 2), std::out_of_range);
  EXPECT_THROW(kv.k_slot(s, 2, 0), std::out_of_range);
  kv.free_sequence(s);
  EXPECT_THROW(kv.length(s), std::out_of_range);
  EXPECT_THROW(kv.free_sequence(s), std::out_of_range);
  EXPECT_THROW(kv.fork_sequence(s), std::out_of_range);
  EXPECT_THROW(kv.append_slots(-1, 1), std::out_of_range);
  EXPECT_EQ(pool.n_free(), 2u);
}

TEST(KvCache, SequenceIdsAreReusedAndDestructorReturnsBlocks) {
  BlockPool pool(shape(), 4);
  {
    KvCache kv(pool);
    SeqId a = kv.create_sequence();
    SeqId b = kv.create_sequence();
    kv.append_slots(a, 5);
    kv.fork_sequence(a);
    kv.free_sequence(b);
    EXPECT_EQ(kv.n_sequences(), 2u);
    EXPECT_EQ(kv.create_sequence(), b);
    EXPECT_EQ(pool.n_free(), 2u);
  }
  EXPECT_EQ(pool.n_free(), 4u);
}

// Random create/fork/append/truncate/free: after every operation each block's refcount equals
// the number of block-table entries pointing at it, free + used == capacity, and every
// sequence still reads back exactly the tokens it wrote.
TEST(KvCache, RandomOperationsKeepAccountingAndContents) {
  BlockPool pool(shape(), 24);
  KvCache kv(pool);
  std::mt19937 rng(1234);
  std::map<SeqId, std::vector<int>> written;  // per sequence: tag written at each position
  int next_tag = 1;
  int n_full = 0;
  for (int step = 0; step < 3000; ++step) {
    const int op = int(rng() % 10);
    std::vector<SeqId> live;
    for (auto& [id, v] : written) live.push_back(id);
    const SeqId pick = live.empty() ? -1 : live[rng() % live.size()];
    if (op == 0 || live.empty()) {
      written[kv.create_sequence()] = {};
    } else if (op == 1) {
      written[kv.fork_sequence(pick)] = written[pick];
    } else if (op <= 5) {
      const size_t n = 1 + rng() % 6;
      try {
        const size_t first = kv.append_slots(pick, n);
        ASSERT_EQ(first, written[pick].size());
        const int tag = next_tag++;
        for (size_t p = first; p < first + n; ++p) {
          write_token(kv, pick, tag, p);
          written[pick].push_back(tag);
        }
      } catch (const KvCacheFull&) {
        ++n_full;
        ASSERT_EQ(kv.length(pick), written[pick].size());
      }
    } else if (op <= 7) {
      const size_t len = written[pick].empty() ? 0 : rng() % (written[pick].size() + 1);
      kv.truncate(pick, len);
      written[pick].resize(len);
    } else {
      kv.free_sequence(pick);
      written.erase(pick);
    }
    std::map<BlockId, int> refs;
    for (auto& [id, v] : written) {
      ASSERT_EQ(kv.length(id), v.size());
      for (BlockId b : kv.block_table(id)) ++refs[b];
    }
    for (BlockId b = 0; b < BlockId(pool.capacity()); ++b)
      ASSERT_EQ(pool.meta(b).ref_count, refs.count(b) ? refs[b] : 0) << "block " << b;
    ASSERT_EQ(pool.n_free() + used_blocks(pool), pool.capacity());
    ASSERT_EQ(kv.n_sequences(), written.size());
    if (step % 50 == 0)
      for (auto& [id, v] : written) expect_tokens(kv, id, v.size(), [&v = v](size_t p) { return v[p]; });
  }
  // The sequence must have exercised the interesting paths.
  EXPECT_GT(n_full, 0);
  EXPECT_GT(kv.blocks_copied(), 0u);
}

}  // namespace
}  // namespace fdl
