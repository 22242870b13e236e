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
// Thread-safety: none; the scheduler (engine thread) owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "flashdllm/kv_cache.h"

namespace fdl::engine {

class PrefixCache {
 public:
  PrefixCache(BlockPool& pool, int block_size);
  ~PrefixCache();  ///< releases every cached block
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  /// Longest run of cached blocks that hold tokens[0 .. k * block_size), k <= max_blocks.
  /// Marks them used now. The ids are not retained: attach them to a sequence
  /// (KvCache::create_sequence_from) before anything can evict them.
  std::vector<BlockId> lookup(std::string_view scope, std::span<const int32_t> tokens,
                              size_t max_blocks);
  /// Caches blocks[i] as holding tokens[i*bs .. (i+1)*bs) for every full block i (up to
  /// blocks.size() and tokens.size() / bs). Blocks already cached under the same key are
  /// skipped (another sequence wrote the same prefix first); new ones are retained.
  void insert(std::string_view scope, std::span<const int32_t> tokens,
              std::span<const BlockId> blocks);
  /// Releases up to `n` evictable blocks; returns how many went back to the pool.
  size_t evict(size_t n);

  size_t size() const { return entries_.size(); }  ///< blocks listed
  size_t n_evictable() const;                      ///< of those, held only by the cache
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
    BlockId block = -1;
    std::vector<int32_t> tokens;  ///< compared on every hit
    uint64_t last_used = 0;
    uint32_t depth = 0;           ///< block index in its chain (evict deeper first)
  };
  Key root(std::string_view scope) const;
  Key chain(const Key& parent, std::string_view scope, std::span<const int32_t> tokens) const;

  BlockPool& pool_;
  size_t block_size_;
  uint64_t tick_ = 0;
  std::unordered_map<Key, Entry, KeyHash> entries_;
};

}  // namespace fdl::engine
