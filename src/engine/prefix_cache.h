// Internal: the prefix cache — full KV blocks of earlier prompts, found again by a hash chain.
//
// Key of block i of a token sequence: XXH3-128 of (key of block i-1, the cache scope, the
// block's block_size token ids); block 0 chains from a root derived from the scope alone.
// A key therefore names the whole prefix up to the end of the block, not just the block.
// A hit also compares the stored token ids with the asked ones, so even a 128-bit collision
// can never hand one prompt's KV to another. Scopes (e.g. API keys) never share entries.
//
// Ownership: the cache holds one reference (BlockPool::retain) on every block it lists, so a
// cached block outlives the sequence that wrote it. A block only the cache references is
// "evictable"; evict() releases such blocks least recently used first, deepest block first
// among equals (a chain is freed from its tail, so a cached prefix never has a hole).
// Only full blocks are cached: the scheduler never writes into a full block again, so a
// shared block is immutable while cached.
//
// Tiers (optional KvOffload): an evicted block does not have to be released. The offload
// layer says where it goes (tier 1 host, tier 2 disk, or drop); a demoted entry keeps its
// key and tokens and holds an OffloadId instead of a BlockId. When tier 1 is full, its least
// recently used entries age down to tier 2 (or are dropped); when tier 2 is full, its least
// recently used entries are dropped. A hit on a demoted entry (acquire) brings it back into
// a fresh tier-0 block (checksum verified by the TierManager); a Corrupt/IoError/Lost block
// ends the hit there and is forgotten, so its tokens are recomputed by normal prefill.
// Occupancy of every tier stays within its capacity (the stores refuse to overfill).
//
// Thread-safety: none; the scheduler (engine thread) owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "flashdllm/kv_cache.h"
#include "flashdllm/kv_tiers.h"

namespace fdl::engine {

class KvOffload;

class PrefixCache {
 public:
  /// `offload` (may be null: no lower tiers) must outlive the cache.
  PrefixCache(BlockPool& pool, int block_size, KvOffload* offload = nullptr);
  ~PrefixCache();  ///< releases every cached block (and discards offloaded copies)
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  /// How many leading blocks of `tokens` (at most max_blocks) are cached, in any tier,
  /// without touching their LRU order: what admission ordering asks of every waiting prompt.
  size_t match_blocks(std::string_view scope, std::span<const int32_t> tokens,
                      size_t max_blocks) const;
  /// The longest run of cached blocks holding tokens[0 .. k * block_size), k <= max_blocks,
  /// marked used now; offloaded entries on the path are brought back into tier 0 (evicting
  /// other unused tier-0 entries for room), and every returned block is retained once for
  /// the caller, who must release it (typically after KvCache::create_sequence_from). The
  /// run ends at the first block that cannot be had (no room, or lost on the way back).
  std::vector<BlockId> acquire(std::string_view scope, std::span<const int32_t> tokens,
                               size_t max_blocks);
  /// Starts promotions for the offloaded entries on `tokens`' path (tier-2 reads, and tier-1
  /// device copies on a GPU), using at most `max_new_blocks` tier-0 blocks; returns how many
  /// were started. No effect without tiers.
  size_t prefetch(std::string_view scope, std::span<const int32_t> tokens, size_t max_blocks,
                  size_t max_new_blocks);
  /// How many entries on `tokens`' path prefetch() would start now; marks the whole path used
  /// now, so evictions that make room for the prefetch take other blocks first.
  size_t to_prefetch(std::string_view scope, std::span<const int32_t> tokens, size_t max_blocks);
  /// Where the cached blocks on `tokens`' path are, as far as acquire() is concerned:
  /// Resident (it would not wait), Loading (prefetches still in flight, every offloaded entry
  /// prefetched), Offloaded (an entry not prefetched: acquire would start and wait for it).
  /// Non-blocking.
  enum class PathState { Resident, Loading, Offloaded };
  PathState path_state(std::string_view scope, std::span<const int32_t> tokens, size_t max_blocks);
  /// Entries whose prefetch was started and not claimed yet (they hold tier-0 blocks).
  size_t n_prefetching() const;
  /// Caches blocks[i] as holding tokens[i*bs .. (i+1)*bs) for every full block i (up to
  /// blocks.size() and tokens.size() / bs). Blocks already cached under the same key are
  /// skipped (another sequence wrote the same prefix first); new ones are retained.
  void insert(std::string_view scope, std::span<const int32_t> tokens,
              std::span<const BlockId> blocks);
  /// Frees up to `n` tier-0 blocks held only by the cache (LRU, deepest first): each is
  /// demoted to a lower tier or released, as the offload layer decides (released without
  /// one). Returns how many tier-0 blocks went back to the pool.
  /// `take_prefetched` false: blocks prefetched for waiting requests stay (the room is for
  /// another prefetch).
  size_t evict(size_t n, bool take_prefetched = true);

  size_t size() const { return entries_.size(); }  ///< blocks listed (every tier)
  size_t n_evictable() const;                      ///< tier-0 blocks held only by the cache
  size_t n_offloaded() const;                      ///< entries stored in tier 1 or 2
  std::vector<OffloadId> offloaded_ids() const;    ///< their ids (tests corrupt them)
  void clear();                                    ///< releases everything

 private:
  struct Key {
    uint64_t lo = 0, hi = 0;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return size_t(k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull)); }
  };
  struct Entry {
    BlockId block = -1;           ///< tier-0 block (one reference), -1 when offloaded
    OffloadId offload = 0;        ///< lower-tier copy when block == -1
    std::vector<int32_t> tokens;  ///< compared on every hit
    uint64_t last_used = 0;
    uint32_t depth = 0;           ///< block index in its chain (evict deeper first)
    float reuse = 0.f;            ///< decayed access frequency (placement_policy.h)
    uint64_t reuse_step = 0;      ///< engine step of the last update of `reuse`
    bool pinned = false;          ///< being brought back: never aged down meanwhile
    bool prefetching = false;     ///< a tier-2 read was started early
  };
  using Victim = std::pair<Key, Entry*>;
  Key root(std::string_view scope) const;
  Key chain(const Key& parent, std::string_view scope, std::span<const int32_t> tokens) const;
  using EntryMap = std::unordered_map<Key, Entry, KeyHash>;
  /// Advances `key` past the next block (`block_tokens`) and returns its entry, or end()
  /// when there is none or it holds other tokens (a collision).
  EntryMap::iterator next_in_chain(Key& key, std::string_view scope,
                                   std::span<const int32_t> block_tokens);
  void touch(Entry& e);
  bool worth_prefetching(const Entry& e) const;
  double reuse_probability(const Entry& e) const;
  void drop(const Key& key, Entry& e);
  /// Offloaded entries stored in tier `t`, least recently used first, deepest first.
  std::vector<Victim> lru_in(BlockTier t);
  /// Makes `n` tier-1 (tier-2) slots free by ageing LRU entries down or dropping them.
  void make_room_host(size_t n);
  void make_room_disk(size_t n);
  /// Turns prefetched (still offloaded) entries into resident tier-0 entries.
  size_t claim_prefetched();
  /// Moves the victims' tier-0 blocks down (or releases them); all leave tier 0.
  void demote_all(std::vector<Victim>& victims);

  BlockPool& pool_;
  KvOffload* offload_;
  size_t block_size_;
  uint64_t tick_ = 0;
  EntryMap entries_;
};

}  // namespace fdl::engine
