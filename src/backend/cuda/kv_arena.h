// kv_arena.h — the CUDA model's KV cache on the device: an arena for one BlockPool at a time,
// the pool's BlockMirror for the KV tiers, and the replay of host copy-on-write copies and
// slot moves.
//
// Arena: the host BlockPool's layout and block ids (the pool still hands out ids, refcounts
// and metadata; its host arena only stages tier copies — a known waste of host memory until
// the pool can be told not to allocate). Allocated by ensure() (CudaModel::bind_kv_pool, else
// the first forward with a pool), sized from pool.capacity() and the pool's shape, zeroed, and
// re-allocated if a different pool is passed. Storage is fp32 words for any KvDtype (a 16-bit
// block holds an even number of elements). The device copy is authoritative: the arena
// registers its Mirror as the pool's BlockMirror, so the KV tiers pull a block's bytes from
// the device before demoting it and push promoted bytes back (kv_cache.h). Other host writes
// into the pool's arena are not seen.
//
// Copy-on-write (fork_sequence, then append_slots into the shared tail) and slot moves
// (KvCache::move_slot, packing an accepted tree branch): each forward registers observers on
// its KvCache (set_block_copy_observer, set_slot_move_observer: sync_block_copies) that log, in
// one list in host order, the block copies and slot moves made in the host arena; the next
// forward on that cache first replays them in order as device-to-device copies on the compute
// stream, before any kernel (the device arena is written only by forwards, so the sources
// still hold their data then). The observers hold only a weak reference to the log: they
// outlive the model harmlessly. Copies and moves made in a cache before its first forward with
// this model are not logged (the device holds nothing of that cache yet); if another observer
// replaced ours in between, the forward throws std::logic_error (check_reported:
// blocks_copied() or slots_moved() grew by more than the log holds).
//
// Tier copies: the Mirror's synchronous pull / push (copy_block) run on the compute stream,
// so they are ordered with every kernel and copy-on-write replay around them; the
// asynchronous ones (BlockMirror::queue_copy) go through a TierCopier (tier_copier.h), whose
// pulls a forward that writes their blocks waits for on the device (fence_tier_pulls).
//
// Errors: CudaError for CUDA failures; KvCacheFull when the arena does not fit in device
// memory; std::logic_error for unreported copies or a copy for a pool the arena does not hold.
// Thread-safety: none (the thread that runs the model's forwards, as the Model interface).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <unordered_set>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/tier_copier.h"
#include "flashdllm/kv_cache.h"
#include "flashdllm/model.h"

namespace fdl::cuda {

class KvArena {
 public:
  /// `compute`: the stream the model's forwards run on; every arena copy is ordered on it.
  explicit KvArena(cudaStream_t compute);
  ~KvArena();  ///< waits for tier copies into and out of the arena
  KvArena(const KvArena&) = delete;
  KvArena& operator=(const KvArena&) = delete;

  /// Makes the arena serve `pool` (nothing to do when it already does): after the work in
  /// flight on the old arena (the compute stream too when `steps_in_flight`: submitted steps
  /// use it), allocates and zeroes one for `pool` on the compute stream and registers the
  /// Mirror with it. Returns true when the arena moved (captured graphs hold its old address).
  /// Throws KvCacheFull when the device cannot hold it (the arena then serves no pool).
  bool ensure(BlockPool& pool, bool steps_in_flight);
  /// Throws std::logic_error when `kv` made more block copies or slot moves since its last
  /// forward than its observers reported (another observer replaced ours).
  void check_reported(const KvCache& kv) const;
  /// Before a step's kernels: the compute stream waits for tier pulls still reading a block
  /// the step writes (TierCopier::fence_writes).
  void fence_tier_pulls(const StepBatch& batch, KvCache& kv);
  /// Called after ensure(kv.pool()): replays the pool's logged copies and moves on the
  /// compute stream (before this cache's kernels, every copy and move any cache of the pool
  /// made runs on the device, in host order) and re-registers `kv`'s observers.
  void sync_block_copies(KvCache& kv);

  /// Block 0 of the arena (null before ensure), in the pool's layout.
  void* data() const { return arena_.get(); }
  const KvShape& shape() const { return arena_shape_; }
  size_t block_elems() const;  ///< K/V elements per block (all layers), the pool's layout
  /// Whether tier copies of the current pool run from page-locked host memory (see
  /// CudaModel::kv_host_pinned).
  bool host_pinned() const;
  /// Caches whose copy-on-write logs are kept (see CudaModel::tracked_caches).
  size_t tracked_caches() const { return cache_copies_.size(); }

 private:
  class Mirror;
  /// Host <-> device copy of one block (the Mirror's pull / push), on the compute stream
  /// (ordered with every kernel and copy-on-write replay before and after it). A pull is
  /// synchronous; a push returns once queued (the host does not wait for the DMA): until
  /// settle_pushes() the host arena may still be read.
  void copy_block(uint64_t pool_uid, BlockId id, void* host, bool to_host);
  /// Waits until every queued push (or, given an id, the pushes of that block) has read its
  /// host bytes. Never throws: a failed wait means a device fault, which the next forward
  /// reports; the host bytes are then no longer read either.
  void settle_pushes(BlockId id = -1) noexcept;
  /// Runs the pool's logged copies and moves on the compute stream, in order, and clears the
  /// log.
  void replay_pool_log();

  cudaStream_t stream_;
  // The pool the arena serves: its uid (never reused, unlike an address) and its shape.
  uint64_t arena_uid_ = 0;
  KvShape arena_shape_{};
  size_t arena_blocks_ = 0;
  DeviceBuffer<float> arena_;
  // Copy-on-write / slot-move log (see the header comment): filled by the observers, replayed
  // and cleared by sync_block_copies at the start of each forward.
  struct KvCopy {
    BlockId src = 0, dst = 0;
    int src_slot = -1, dst_slot = -1;  // -1: the whole block (copy-on-write); else one slot, all layers
  };
  // The copies and moves of every KvCache on the arena's pool not yet done on the device, in
  // host order: one log per pool, not per cache, because a block one cache frees (a moved
  // slot's source, truncated) may be the next block another cache writes.
  struct CopyLog {
    std::vector<KvCopy> ops;
  };
  std::shared_ptr<CopyLog> pool_log_ = std::make_shared<CopyLog>();
  // What one cache's observers reported since its last forward (they hold this weakly; one
  // weak_ptr fits std::function's inline storage, so re-registering allocates nothing), and
  // where they log.
  struct Reported {
    std::weak_ptr<CopyLog> log;
    uint64_t copies = 0, moves = 0;
  };
  // Per KvCache (by uid): its counters at its last forward and its pool.
  struct CacheCopies {
    std::shared_ptr<Reported> reported = std::make_shared<Reported>();
    uint64_t seen = 0;        // blocks_copied()
    uint64_t moves_seen = 0;  // slots_moved()
    uint64_t pool_uid = 0;
    std::weak_ptr<const void> cache_alive;  // KvCache::lifetime(): expired entries are dropped
  };
  std::map<uint64_t, CacheCopies> cache_copies_;
  std::shared_ptr<Mirror> mirror_;      // registered (weakly) with the pool the arena serves
  cudaEvent_t push_done_ = nullptr;     // recorded after the last push
  std::unordered_set<BlockId> pushed_;  // blocks whose pushes may still read the host arena
  std::unique_ptr<TierCopier> tier_copier_;  // asynchronous tier copies (BlockMirror::queue_copy)
  std::vector<BlockId> written_;             // fence_tier_pulls' scratch
  std::vector<BlockId> replay_targets_;      // replay_pool_log's scratch
};

}  // namespace fdl::cuda
