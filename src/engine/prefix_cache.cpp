// Prefix cache (see prefix_cache.h).
#include "engine/prefix_cache.h"

#include "engine/kv_offload.h"

#include <algorithm>
#include <cstring>
// XXH3_state_t on the stack needs the type's definition.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

namespace fdl::engine {
namespace {
constexpr size_t kOneShotBytes = 1024;
}  // namespace

PrefixCache::PrefixCache(BlockPool& pool, int block_size, KvOffload* offload)
    : pool_(pool), offload_(offload), block_size_(size_t(block_size)) {}

PrefixCache::~PrefixCache() { clear(); }

void PrefixCache::clear() {
  for (auto& [key, e] : entries_) {
    if (e.block >= 0)
      pool_.release(e.block);
    else if (e.offload != 0)
      offload_->discard(e.offload, false);
  }
  entries_.clear();
}

PrefixCache::Key PrefixCache::root(std::string_view scope) const {
  const XXH128_hash_t h = XXH3_128bits_withSeed(scope.data(), scope.size(), 0x666c617368646cull);
  return {h.low64, h.high64};
}

PrefixCache::Key PrefixCache::chain(const Key& parent, std::string_view scope,
                                    std::span<const int32_t> tokens) const {
  // parent key | scope length | scope | tokens: the length keeps (scope, tokens) unambiguous.
  // Hashed in one call from a stack buffer when it fits (about 4x faster than the streaming
  // state for a block's worth: walks hash every block of every waiting request's prefix);
  // XXH3's streaming digest equals the one-shot hash of the same bytes, so keys match.
  const uint64_t n_scope = scope.size();
  const size_t bytes = sizeof parent + sizeof n_scope + scope.size() + tokens.size_bytes();
  if (bytes <= kOneShotBytes) {
    alignas(16) unsigned char buf[kOneShotBytes];
    std::memcpy(buf, &parent, sizeof parent);
    std::memcpy(buf + sizeof parent, &n_scope, sizeof n_scope);
    std::memcpy(buf + sizeof parent + sizeof n_scope, scope.data(), scope.size());
    std::memcpy(buf + sizeof parent + sizeof n_scope + scope.size(), tokens.data(), tokens.size_bytes());
    const XXH128_hash_t h = XXH3_128bits(buf, bytes);
    return {h.low64, h.high64};
  }
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

void PrefixCache::touch(Entry& e) {
  e.last_used = tick_;
  if (offload_ == nullptr) return;
  const uint64_t now = offload_->step();
  e.reuse = kv::decay_reuse_score(e.reuse, now - std::min(now, e.reuse_step),
                                  offload_->half_life_steps()) + 1.f;
  e.reuse_step = now;
}

double PrefixCache::reuse_probability(const Entry& e) const {
  const uint64_t now = offload_->step();
  return kv::reuse_probability(kv::decay_reuse_score(
      e.reuse, now - std::min(now, e.reuse_step), offload_->half_life_steps()));
}

PrefixCache::EntryMap::iterator PrefixCache::next_in_chain(Key& key, std::string_view scope,
                                                        std::span<const int32_t> block_tokens) {
  key = chain(key, scope, block_tokens);
  auto it = entries_.find(key);
  // The token check makes a hash collision a miss, never another prompt's KV.
  if (it != entries_.end() && !std::equal(block_tokens.begin(), block_tokens.end(),
                                          it->second.tokens.begin(), it->second.tokens.end()))
    return entries_.end();
  return it;
}

size_t PrefixCache::match_blocks(std::string_view scope, std::span<const int32_t> tokens,
                                 size_t max_blocks) const {
  // The walk only reads; next_in_chain is non-const because the other walks modify entries.
  auto& self = const_cast<PrefixCache&>(*this);
  const size_t n = std::min(max_blocks, tokens.size() / block_size_);
  Key key = root(scope);
  for (size_t i = 0; i < n; ++i)
    if (self.next_in_chain(key, scope, tokens.subspan(i * block_size_, block_size_)) ==
        self.entries_.end())
      return i;
  return n;
}

std::vector<BlockId> PrefixCache::acquire(std::string_view scope, std::span<const int32_t> tokens,
                                          size_t max_blocks) {
  std::vector<BlockId> hit;
  if (offload_ != nullptr && offload_->copies_async()) {
    // Device copies: start every offloaded block of the path at once (one copy group), so
    // claiming them below waits for one transfer at most, not one per block.
    const size_t want = to_prefetch(scope, tokens, max_blocks);
    if (want > 0) {
      if (pool_.n_free() < want) evict(want - pool_.n_free(), false);
      prefetch(scope, tokens, max_blocks, std::min(want, pool_.n_free()));
    }
  }
  const size_t n = std::min(max_blocks, tokens.size() / block_size_);
  Key key = root(scope);
  ++tick_;
  for (size_t i = 0; i < n; ++i) {
    const auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    auto it = next_in_chain(key, scope, block_tokens);
    if (it == entries_.end())
      break;
    Entry& e = it->second;
    if (e.block < 0) {
      if (offload_ == nullptr || e.offload == 0) break;
      // Room for the promotion: other unused tier-0 entries go down first. The blocks hit so
      // far are retained (not evictable) and this entry is pinned (not aged down).
      e.pinned = true;
      if (pool_.n_free() == 0 && !e.prefetching) evict(1);
      const TierEvent ev = offload_->bring_back(e.offload, block_size_);
      e.pinned = false;
      e.prefetching = false;
      if (ev.status == TransferStatus::NoSpace) break;
      if (ev.status != TransferStatus::Ok) {
        // Corrupt, IoError or Lost: the copy is gone (the id is retired); the prompt
        // recomputes these tokens. Later blocks of the chain are unreachable and age out.
        entries_.erase(it);
        break;
      }
      e.block = ev.block;  // the cache's reference
      e.offload = 0;
    }
    touch(e);
    pool_.retain(e.block);  // the caller's reference
    hit.push_back(e.block);
  }
  return hit;
}

size_t PrefixCache::to_prefetch(std::string_view scope, std::span<const int32_t> tokens,
                                size_t max_blocks) {
  if (offload_ == nullptr) return 0;
  size_t n_out = 0;
  const size_t n = std::min(max_blocks, tokens.size() / block_size_);
  Key key = root(scope);
  ++tick_;
  for (size_t i = 0; i < n; ++i) {
    auto it = next_in_chain(key, scope, tokens.subspan(i * block_size_, block_size_));
    if (it == entries_.end()) break;
    Entry& e = it->second;
    e.last_used = tick_;  // about to be used: evictions for the prefetch age others first
    n_out += e.block < 0 && e.offload != 0 && !e.prefetching && worth_prefetching(e);
  }
  return n_out;
}

bool PrefixCache::worth_prefetching(const Entry& e) const {
  // A synchronous memcpy from tier 1 (CPU) gains nothing by starting early; a device copy or
  // a disk read runs while the engine computes.
  const BlockMeta& m = offload_->tiers().meta(e.offload);
  return m.state == BlockState::Inactive &&
         (m.tier == BlockTier::Disk || (m.tier == BlockTier::Host && offload_->copies_async()));
}

size_t PrefixCache::prefetch(std::string_view scope, std::span<const int32_t> tokens,
                             size_t max_blocks, size_t max_new_blocks) {
  if (offload_ == nullptr || max_new_blocks == 0) return 0;
  size_t started = 0;
  const size_t n = std::min(max_blocks, tokens.size() / block_size_);
  Key key = root(scope);
  for (size_t i = 0; i < n && started < max_new_blocks; ++i) {
    const auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    auto it = next_in_chain(key, scope, block_tokens);
    if (it == entries_.end())
      break;
    Entry& e = it->second;
    if (e.block >= 0 || e.offload == 0 || e.prefetching || !worth_prefetching(e)) continue;
    if (!offload_->prefetch(e.offload)) break;  // no tier-0 room or the disk is off
    e.prefetching = true;
    e.last_used = tick_;  // about to be used: age others first
    ++started;
  }
  if (started > 0) offload_->flush();
  return started;
}

PrefixCache::PathState PrefixCache::path_state(std::string_view scope, std::span<const int32_t> tokens,
                                               size_t max_blocks) {
  if (offload_ == nullptr) return PathState::Resident;
  const size_t n = std::min(max_blocks, tokens.size() / block_size_);
  Key key = root(scope);
  PathState state = PathState::Resident;
  for (size_t i = 0; i < n; ++i) {
    auto it = next_in_chain(key, scope, tokens.subspan(i * block_size_, block_size_));
    if (it == entries_.end()) break;
    const Entry& e = it->second;
    if (e.block >= 0 || e.offload == 0) continue;
    if (!e.prefetching) return PathState::Offloaded;
    // One block still in flight is enough to know: later ones are not asked (each question
    // about a block in flight collects completions).
    if (state == PathState::Resident && !offload_->ready(e.offload)) state = PathState::Loading;
  }
  return state;
}

size_t PrefixCache::n_prefetching() const {
  size_t n = 0;
  for (const auto& [key, e] : entries_) n += e.prefetching;
  return n;
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
      // or a collision with different tokens (keep the first; the token check on every walk
      // makes the newcomer a miss, never a wrong hit). An offloaded copy of the same tokens
      // is replaced by the resident one: cheaper to use, and the lower tier gets its slot.
      if (e.block < 0 && e.offload != 0 && !e.pinned &&
          std::equal(block_tokens.begin(), block_tokens.end(), e.tokens.begin(), e.tokens.end())) {
        offload_->discard(e.offload, false);
        e.offload = 0;
        e.prefetching = false;
        e.block = blocks[i];
        pool_.retain(e.block);
      }
      touch(e);
      continue;
    }
    e.block = blocks[i];
    e.tokens.assign(block_tokens.begin(), block_tokens.end());
    e.depth = uint32_t(i);
    touch(e);
    pool_.retain(e.block);
  }
}

size_t PrefixCache::n_evictable() const {
  size_t n = 0;
  for (const auto& [key, e] : entries_) n += e.block >= 0 && pool_.meta(e.block).ref_count == 1;
  return n;
}

size_t PrefixCache::n_offloaded() const {
  size_t n = 0;
  for (const auto& [key, e] : entries_) n += e.block < 0 && e.offload != 0;
  return n;
}

std::vector<OffloadId> PrefixCache::offloaded_ids() const {
  std::vector<OffloadId> ids;
  for (const auto& [key, e] : entries_)
    if (e.block < 0 && e.offload != 0) ids.push_back(e.offload);
  return ids;
}

void PrefixCache::drop(const Key& key, Entry& e) {
  if (e.block >= 0) {
    pool_.release(e.block);
    if (offload_ != nullptr) offload_->count_drop();
  } else if (e.offload != 0) {
    offload_->discard(e.offload, true);
  }
  entries_.erase(key);
}

namespace {
// Least recently used first; within one use (a chain touched together) the deepest first,
// so a chain loses its tail before its head and a cached prefix keeps no hole.
template <typename V>
void sort_lru(std::vector<V>& v) {
  std::sort(v.begin(), v.end(), [](const V& a, const V& b) {
    if (a.second->last_used != b.second->last_used) return a.second->last_used < b.second->last_used;
    return a.second->depth > b.second->depth;
  });
}
}  // namespace

std::vector<PrefixCache::Victim> PrefixCache::lru_in(BlockTier t) {
  std::vector<Victim> out;
  for (auto& [key, e] : entries_) {
    if (e.block >= 0 || e.offload == 0 || e.pinned || e.prefetching) continue;
    const BlockMeta& m = offload_->tiers().meta(e.offload);
    if (m.tier == t && m.state == BlockState::Inactive) out.emplace_back(key, &e);
  }
  sort_lru(out);
  return out;
}

void PrefixCache::make_room_disk(size_t n) {
  auto lru = lru_in(BlockTier::Disk);
  for (size_t i = 0; i < n && i < lru.size(); ++i) drop(lru[i].first, *lru[i].second);
}

void PrefixCache::make_room_host(size_t n) {
  auto lru = lru_in(BlockTier::Host);
  lru.resize(std::min(n, lru.size()));
  std::vector<Victim> down;
  for (auto& v : lru) {
    if (offload_->choose_from_host(reuse_probability(*v.second)) == kv::Placement::DemoteDisk)
      down.push_back(v);
    else
      drop(v.first, *v.second);
  }
  if (down.empty()) return;
  const size_t free = offload_->free_blocks(BlockTier::Disk);
  if (free < down.size()) make_room_disk(down.size() - free);
  bool submitted = false;
  for (auto& v : down) {
    const TierEvent ev = offload_->demote_to_disk(v.second->offload);
    if (ev.status == TransferStatus::Pending)
      submitted = true;
    else
      drop(v.first, *v.second);  // disk full, paused or off: the host slot is needed anyway
  }
  if (!submitted) return;
  offload_->settle();  // host slots are freed when the writes complete
  for (auto& v : down) {
    auto it = entries_.find(v.first);
    if (it == entries_.end()) continue;
    // A failed write left the block in tier 1; its slot is still needed.
    if (offload_->tiers().meta(it->second.offload).tier == BlockTier::Host) drop(it->first, it->second);
  }
}

void PrefixCache::demote_all(std::vector<Victim>& victims) {
  std::vector<Victim> to_host, to_disk;
  for (auto& v : victims) {
    switch (offload_->choose_from_device(reuse_probability(*v.second))) {
      case kv::Placement::DemoteHost: to_host.push_back(v); break;
      case kv::Placement::DemoteDisk: to_disk.push_back(v); break;
      default: drop(v.first, *v.second); break;
    }
  }
  if (!to_host.empty()) {
    const size_t free = offload_->free_blocks(BlockTier::Host);
    if (free < to_host.size()) make_room_host(to_host.size() - free);
    for (auto& v : to_host) {
      Entry& e = *v.second;
      const TierEvent ev = offload_->demote(e.block, BlockTier::Host);
      if (ev.status == TransferStatus::Ok) {
        e.offload = ev.id;
        e.block = -1;
      } else if (offload_->choose_from_host(reuse_probability(e)) == kv::Placement::DemoteDisk) {
        to_disk.push_back(v);
      } else {
        drop(v.first, e);
      }
    }
  }
  if (to_disk.empty()) return;
  const size_t free = offload_->free_blocks(BlockTier::Disk);
  if (free < to_disk.size()) make_room_disk(to_disk.size() - free);
  bool submitted = false;
  for (auto& v : to_disk) {
    Entry& e = *v.second;
    const TierEvent ev = offload_->demote(e.block, BlockTier::Disk);
    if (ev.status == TransferStatus::Pending) {
      e.offload = ev.id;  // the tier-0 block stays allocated until the write completes
      e.block = -1;
      submitted = true;
    } else {
      drop(v.first, e);
    }
  }
  if (!submitted) return;
  // Wait for the writes: the caller needs the tier-0 blocks free now.
  for (OffloadId id : offload_->settle()) {
    // The write failed (tier 2 is now off): the untouched block is still resident under
    // the id. Take it back and release it; the tokens are recomputed if needed again.
    for (auto& v : to_disk) {
      auto it = entries_.find(v.first);
      if (it == entries_.end() || it->second.offload != id) continue;
      const TierEvent back = offload_->tiers().wait_resident(id);
      if (back.status == TransferStatus::Ok) pool_.release(back.block);
      it->second.offload = 0;
      offload_->count_drop();
      entries_.erase(it);
      break;
    }
  }
}

size_t PrefixCache::claim_prefetched() {
  size_t n = 0;
  for (auto it = entries_.begin(); it != entries_.end();) {
    Entry& e = it->second;
    // A device copy still in flight is not waited for: other blocks make the room.
    if (!e.prefetching || (offload_->copies_async() && !offload_->ready(e.offload))) {
      ++it;
      continue;
    }
    e.prefetching = false;
    const TierEvent ev = offload_->bring_back(e.offload, block_size_);
    if (ev.status == TransferStatus::Ok) {
      e.block = ev.block;
      e.offload = 0;
      ++n;
    } else if (ev.status != TransferStatus::NoSpace) {
      it = entries_.erase(it);  // lost on the way back: recomputed if needed
      continue;
    }
    ++it;
  }
  return n;
}

size_t PrefixCache::evict(size_t n, bool take_prefetched) {
  if (n == 0) return 0;
  // Blocks prefetched for waiting requests hold tier 0 outside the cache's reach: when room
  // is short, they become ordinary cached tier-0 blocks, evictable like the rest (but not to
  // make room for another prefetch: two waiting requests would take turns evicting each
  // other's prefixes and neither would ever be admitted).
  if (offload_ != nullptr && take_prefetched && n_evictable() < n) claim_prefetched();
  std::vector<Victim> candidates;
  for (auto& [key, e] : entries_)
    if (e.block >= 0 && pool_.meta(e.block).ref_count == 1) candidates.emplace_back(key, &e);
  sort_lru(candidates);
  if (candidates.size() > n) candidates.resize(n);
  const size_t freed = candidates.size();
  if (offload_ == nullptr) {
    for (auto& [key, e] : candidates) {
      pool_.release(e->block);
      entries_.erase(key);
    }
    return freed;
  }
  demote_all(candidates);
  offload_->flush();  // the device copies start now, beside the next forward
  return freed;
}

}  // namespace fdl::engine
