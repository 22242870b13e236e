// Prefix cache (see prefix_cache.h).
#include "engine/prefix_cache.h"

#include <algorithm>
#include <cstring>
// XXH3_state_t on the stack needs the type's definition.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

namespace fdl::engine {

PrefixCache::PrefixCache(BlockPool& pool, int block_size)
    : pool_(pool), block_size_(size_t(block_size)) {}

PrefixCache::~PrefixCache() { clear(); }

void PrefixCache::clear() {
  for (auto& [key, e] : entries_) pool_.release(e.block);
  entries_.clear();
}

PrefixCache::Key PrefixCache::root(std::string_view scope) const {
  const XXH128_hash_t h = XXH3_128bits_withSeed(scope.data(), scope.size(), 0x666c617368646cull);
  return {h.low64, h.high64};
}

PrefixCache::Key PrefixCache::chain(const Key& parent, std::string_view scope,
                                    std::span<const int32_t> tokens) const {
  // parent key | scope length | scope | tokens: the length keeps (scope, tokens) unambiguous.
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  XXH3_128bits_update(&state, &parent, sizeof parent);
  const uint64_t scope_len = scope.size();
  XXH3_128bits_update(&state, &scope_len, sizeof scope_len);
  XXH3_128bits_update(&state, scope.data(), scope.size());
  XXH3_128bits_update(&state, tokens.data(), tokens.size_bytes());
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return {h.low64, h.high64};
}

std::vector<BlockId> PrefixCache::lookup(std::string_view scope, std::span<const int32_t> tokens,
                                         size_t max_blocks) {
  std::vector<BlockId> hit;
  const size_t n = std::min(max_blocks, tokens.size() / block_size_);
  Key key = root(scope);
  ++tick_;
  for (size_t i = 0; i < n; ++i) {
    const auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    key = chain(key, scope, block_tokens);
    auto it = entries_.find(key);
    if (it == entries_.end() ||
        !std::equal(block_tokens.begin(), block_tokens.end(), it->second.tokens.begin(),
                     it->second.tokens.end()))
      break;
    it->second.last_used = tick_;
    hit.push_back(it->second.block);
  }
  return hit;
}

void PrefixCache::insert(std::string_view scope, std::span<const int32_t> tokens,
                         std::span<const BlockId> blocks) {
  const size_t n = std::min(blocks.size(), tokens.size() / block_size_);
  Key key = root(scope);
  ++tick_;
  for (size_t i = 0; i < n; ++i) {
    const auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    key = chain(key, scope, block_tokens);
    auto [it, inserted] = entries_.try_emplace(key);
    Entry& e = it->second;
    if (!inserted) {
      // Same key: either the same prefix cached by another sequence (keep the first copy),
      // or a collision with different tokens (keep the first; the token check on lookup
      // makes the newcomer a miss, never a wrong hit).
      e.last_used = tick_;
      continue;
    }
    e.block = blocks[i];
    e.tokens.assign(block_tokens.begin(), block_tokens.end());
    e.last_used = tick_;
    e.depth = uint32_t(i);
    pool_.retain(e.block);
  }
}

size_t PrefixCache::n_evictable() const {
  size_t n = 0;
  for (const auto& [key, e] : entries_) n += pool_.meta(e.block).ref_count == 1 ? 1 : 0;
  return n;
}

size_t PrefixCache::evict(size_t n) {
  if (n == 0) return 0;
  std::vector<std::pair<Key, const Entry*>> candidates;
  for (const auto& [key, e] : entries_)
    if (pool_.meta(e.block).ref_count == 1) candidates.emplace_back(key, &e);
  // Least recently used first; within one use (a chain touched together) the deepest first.
  std::sort(candidates.begin(), candidates.end(), [](const auto& a, const auto& b) {
    if (a.second->last_used != b.second->last_used)
      return a.second->last_used < b.second->last_used;
    return a.second->depth > b.second->depth;
  });
  size_t freed = 0;
  for (const auto& [key, e] : candidates) {
    if (freed == n) break;
    pool_.release(e->block);
    entries_.erase(key);
    ++freed;
  }
  return freed;
}

}  // namespace fdl::engine
