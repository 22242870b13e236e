// KvArena: the device KV arena, its BlockMirror and the copy-on-write replay (kv_arena.h).
#include "backend/cuda/kv_arena.h"

#include <span>
#include <stdexcept>
#include <string>
#include <utility>

#include "backend/cuda/cuda_check.h"

namespace fdl::cuda {

KvArena::KvArena(cudaStream_t compute) : stream_(compute) {
  FDL_CUDA_CHECK(cudaEventCreateWithFlags(&push_done_, cudaEventDisableTiming));
  tier_copier_ = std::make_unique<TierCopier>(stream_, [this] { replay_pool_log(); });
}

KvArena::~KvArena() {
  tier_copier_.reset();  // waits for tier copies into and out of the arena
  if (push_done_) cudaEventDestroy(push_done_);
}

void KvArena::check_reported(const KvCache& kv) const {
  if (const auto it = cache_copies_.find(kv.uid()); it != cache_copies_.end()) {
    const CacheCopies& cc = it->second;
    if (kv.blocks_copied() >= cc.seen && kv.blocks_copied() - cc.seen != cc.reported->copies)
      throw std::logic_error("forward: --device cuda: " + std::to_string(kv.blocks_copied() - cc.seen) +
                             " copy-on-write block copies since the last forward but " +
                             std::to_string(cc.reported->copies) +
                             " reported to the CUDA model (was its KvCache block-copy observer replaced?)");
    if (kv.slots_moved() >= cc.moves_seen && kv.slots_moved() - cc.moves_seen != cc.reported->moves)
      throw std::logic_error("forward: --device cuda: " + std::to_string(kv.slots_moved() - cc.moves_seen) +
                             " KV slot moves since the last forward but " + std::to_string(cc.reported->moves) +
                             " reported to the CUDA model (was its KvCache slot-move observer replaced?)");
  }
}

void KvArena::replay_pool_log() {
  if (arena_.get() != nullptr && !pool_log_->ops.empty() && tier_copier_->pulls_pending()) {
    // A copy logged after a block's pull was queued (the block went back to the pool and was
    // handed out again) must not overwrite it before the pull has read it.
    replay_targets_.clear();
    for (const KvCopy& op : pool_log_->ops) replay_targets_.push_back(op.dst);
    tier_copier_->fence_writes(replay_targets_);
  }
  if (arena_.get() != nullptr) {
    const size_t block_bytes = arena_shape_.block_bytes();
    const size_t slot_bytes = arena_shape_.elems_per_token_per_layer() * kv_dtype_bytes(arena_shape_.dtype);
    auto* arena = reinterpret_cast<uint8_t*>(arena_.get());
    // In order: a block or slot copied to may itself be the source of a later copy.
    for (const KvCopy& op : pool_log_->ops) {
      uint8_t* dst = arena + size_t(op.dst) * block_bytes;
      const uint8_t* src = arena + size_t(op.src) * block_bytes;
      if (op.src_slot < 0) {
        FDL_CUDA_CHECK(cudaMemcpyAsync(dst, src, block_bytes, cudaMemcpyDeviceToDevice, stream_));
        continue;
      }
      // One slot's K and V in every layer: 2 * n_layer rows of slot_bytes, one row per
      // [layer][k|v] at a stride of block_size slots (the pool's layout, kv_cache.h).
      const size_t pitch = size_t(arena_shape_.block_size) * slot_bytes;
      FDL_CUDA_CHECK(cudaMemcpy2DAsync(dst + size_t(op.dst_slot) * slot_bytes, pitch,
                                       src + size_t(op.src_slot) * slot_bytes, pitch, slot_bytes,
                                       2 * size_t(arena_shape_.n_layer), cudaMemcpyDeviceToDevice, stream_));
    }
  }
  pool_log_->ops.clear();
}

// Called after ensure(kv.pool()): the log is the pool's. Before this cache's kernels, every
// copy and move any cache of the pool made runs on the device, in host order.
void KvArena::sync_block_copies(KvCache& kv) {
  replay_pool_log();
  std::erase_if(cache_copies_, [](const auto& e) { return e.second.cache_alive.expired(); });  // destroyed caches
  CacheCopies& cc = cache_copies_[kv.uid()];
  cc.pool_uid = kv.pool().uid();
  cc.cache_alive = kv.lifetime();
  cc.seen = kv.blocks_copied();
  cc.moves_seen = kv.slots_moved();
  *cc.reported = Reported{pool_log_, 0, 0};
  // Re-registered every step: cheap (the weak_ptr fits std::function's inline storage).
  kv.set_block_copy_observer([rep = std::weak_ptr<Reported>(cc.reported)](BlockId src, BlockId dst) {
    if (const auto r = rep.lock()) {
      ++r->copies;
      if (const auto l = r->log.lock()) l->ops.push_back(KvCopy{src, dst, -1, -1});
    }
  });
  kv.set_slot_move_observer([rep = std::weak_ptr<Reported>(cc.reported)](BlockId src, int src_slot, BlockId dst,
                                                                          int dst_slot) {
    if (const auto r = rep.lock()) {
      ++r->moves;
      if (const auto l = r->log.lock()) l->ops.push_back(KvCopy{src, dst, src_slot, dst_slot});
    }
  });
}

// The tier manager's view of the device arena (BlockMirror): the arena has the pool's
// per-block layout, so a block is one contiguous copy, on the compute stream, so it is ordered
// with the kernels and copy-on-write replays around it. A pull (demotion) is synchronous: the
// host needs the bytes. A push (promotion) is only queued: the host goes on (the next block's
// checksum, the next disk completion) while the DMA runs, and the next forward's kernels
// follow it in stream order; host writes to the arena wait for it first
// (host_write_fence, through BlockPool::block_bytes_for_write). Copies are from page-locked
// memory: on the first copy the mirror pins the pool's host arena (cudaHostRegister: ~60 ms
// per GiB on the H200, so a pool without KV tiers, which never copies, does not pay it), and
// each copy is one DMA at PCIe speed instead of a staged pageable copy (a pageable push is
// staged before cudaMemcpyAsync returns); if the system refuses, copies stay pageable. The pin
// is released, after the pushes in flight, when the pool closes or the mirror goes, whichever
// comes first.
namespace {
// Page-locks host memory the KV tiers own (BlockMirror::pin_host), released with the handle.
std::shared_ptr<void> pin_host_memory(void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return nullptr;
  const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error("cannot page-lock " + std::to_string(bytes >> 20) + " MiB of host memory for KV tier copies: " +
                             cudaGetErrorString(e));
  }
  return std::shared_ptr<void>(p, [](void* q) {
    if (cudaHostUnregister(q) != cudaSuccess) (void)cudaGetLastError();
  });
}
}  // namespace

class KvArena::Mirror final : public BlockMirror {
 public:
  Mirror(KvArena& arena, BlockPool& pool) : owner_(arena), pool_uid_(pool.uid()), arena_(pool.arena_bytes()) {}
  ~Mirror() override { unpin(); }
  void pull(BlockId id, std::span<uint8_t> host) override {
    pin_once();
    owner_.copy_block(pool_uid_, id, host.data(), true);
  }
  void push(BlockId id, std::span<const uint8_t> host) override {
    pin_once();
    owner_.copy_block(pool_uid_, id, const_cast<uint8_t*>(host.data()), false);
  }
  void host_write_fence(BlockId id) noexcept override { owner_.settle_pushes(id); }

  // Asynchronous direct copies (BlockMirror): the arena's TierCopier.
  bool copies_async() const override { return owner_.arena_shape_.block_bytes() % 8 == 0; }
  std::shared_ptr<void> pin_host(void* p, size_t bytes) override { return pin_host_memory(p, bytes); }
  CopyHandle queue_copy(BlockId id, uint8_t* host, bool to_host) override {
    check_live();
    return owner_.tier_copier_->queue(id, host, to_host);
  }
  void flush() override { owner_.tier_copier_->flush(); }
  bool copy_done(CopyHandle h) override { return owner_.tier_copier_->done(h); }
  void wait_copy(CopyHandle h) override { owner_.tier_copier_->wait(h); }
  uint64_t collect_copy(CopyHandle h) override { return owner_.tier_copier_->collect(h); }
  CopyTotals copy_totals() const override { return owner_.tier_copier_->totals(); }
  std::pair<double, double> measure_link(uint8_t* host, size_t bytes) override {
    check_live();
    return owner_.tier_copier_->measure_link(host, bytes);
  }

  void pool_closing() override {
    owner_.settle_pushes();  // before the arena goes
    unpin();
    closed_ = true;  // the arena is going: never pin it again
  }
  bool pinned() const { return pinned_ != nullptr; }

 private:
  void pin_once() {
    if (tried_ || closed_ || arena_.empty()) return;
    tried_ = true;
    if (cudaHostRegister(arena_.data(), arena_.size(), cudaHostRegisterDefault) == cudaSuccess)
      pinned_ = arena_.data();
    else
      (void)cudaGetLastError();  // not pinned: clear the error, copy from pageable memory
  }
  void unpin() {
    if (pinned_ && cudaHostUnregister(pinned_) != cudaSuccess) (void)cudaGetLastError();
    pinned_ = nullptr;
  }
  void check_live() const {
    if (owner_.arena_uid_ != pool_uid_)
      throw std::logic_error("CudaModel: a tier copy for a pool the device arena no longer holds");
  }
  KvArena& owner_;
  uint64_t pool_uid_;
  std::span<uint8_t> arena_;  // the pool's host arena
  void* pinned_ = nullptr;
  bool tried_ = false, closed_ = false;
};

bool KvArena::host_pinned() const { return mirror_ && mirror_->pinned(); }

void KvArena::copy_block(uint64_t pool_uid, BlockId id, void* host, bool to_host) {
  // A mirror is registered only by ensure and expires when the arena moves to another pool,
  // so a call for another pool or an out-of-range block is a bug, not a no-op.
  if (pool_uid != arena_uid_ || arena_.get() == nullptr || id < 0 || size_t(id) >= arena_blocks_)
    throw std::logic_error("CudaModel: block copy for block " + std::to_string(id) +
                           " of a pool the device arena does not hold");
  replay_pool_log();  // a pending copy-on-write or slot move may target `id`
  const size_t bytes = arena_shape_.block_bytes();
  uint8_t* dev = reinterpret_cast<uint8_t*>(arena_.get()) + size_t(id) * bytes;
  if (to_host) {
    FDL_CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream_));
    FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));
    pushed_.clear();  // queued before the pull, so done too
  } else {
    // Tracked before queueing: whatever fails after, a fence still waits for (or rules out) it.
    pushed_.insert(id);
    FDL_CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream_));
    if (cudaEventRecord(push_done_, stream_) != cudaSuccess) {
      (void)cudaGetLastError();
      FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));  // no event: wait for the copy here
      pushed_.clear();
    }
  }
}

void KvArena::fence_tier_pulls(const StepBatch& batch, KvCache& kv) {
  if (!tier_copier_->pulls_pending()) return;
  // The blocks this step writes: its tokens' blocks (from each sequence's first token of the
  // step to the end of its table: tree nodes sit in slots right of their positions) and the
  // targets of pending copy-on-write copies and slot moves.
  written_.clear();
  const int bs = kv.pool().shape().block_size;
  for (size_t t = 0; t < batch.size(); ++t) {
    const SeqId s = batch.seqs[t];
    if (t > 0 && batch.seqs[t - 1] == s && batch.positions[t] >= batch.positions[t - 1]) continue;
    const auto table = kv.block_table(s);
    for (size_t i = size_t(batch.positions[t] / bs); i < table.size(); ++i) written_.push_back(table[i]);
  }
  for (const KvCopy& op : pool_log_->ops) written_.push_back(op.dst);
  tier_copier_->fence_writes(written_);
}

void KvArena::settle_pushes(BlockId id) noexcept {
  if (pushed_.empty() || (id >= 0 && !pushed_.contains(id))) return;
  // One event after the latest push: waiting for it waits for all of them.
  if (cudaEventSynchronize(push_done_) != cudaSuccess) (void)cudaGetLastError();  // a device fault: see above
  pushed_.clear();
}

size_t KvArena::block_elems() const { return arena_shape_.block_bytes() / kv_dtype_bytes(arena_shape_.dtype); }

bool KvArena::ensure(BlockPool& pool, bool steps_in_flight) {
  if (arena_uid_ == pool.uid() && arena_blocks_ == pool.capacity()) return false;
  if (steps_in_flight) FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));  // submitted steps use the old arena
  settle_pushes();  // pushes in flight write the old arena and read the old pool's host arena
  tier_copier_->flush();
  tier_copier_->synchronize();  // tier copies in flight address the old arena
  // Nothing refers to the old arena from here on, also if the allocation below fails.
  arena_uid_ = 0;
  arena_blocks_ = 0;
  mirror_.reset();
  // Pending copies and moves of the old pool have nothing left to replay into (its blocks
  // leave the device with the arena): a fresh log, which the old pool's caches' observers do
  // not reach (theirs expires); a cache that comes back registers anew at its next forward.
  pool_log_ = std::make_shared<CopyLog>();
  std::erase_if(cache_copies_, [&](const auto& e) { return e.second.pool_uid != pool.uid(); });
  // fp32 storage for any dtype (a 16-bit block holds an even number of elements).
  const size_t floats = pool.capacity() * (pool.shape().block_bytes() / sizeof(float));
  arena_.reset();
  try {
    arena_.grow(floats);
  } catch (const CudaError& e) {
    throw KvCacheFull("--device cuda: cannot allocate the KV arena of " + std::to_string(pool.capacity()) +
                      " blocks (" + std::to_string(floats * 4 >> 20) + " MiB) on the device: " + e.what());
  }
  FDL_CUDA_CHECK(cudaMemsetAsync(arena_.get(), 0, floats * sizeof(float), stream_));
  arena_uid_ = pool.uid();
  arena_shape_ = pool.shape();
  arena_blocks_ = pool.capacity();
  if (arena_shape_.block_bytes() % 8 == 0)
    tier_copier_->set_arena(reinterpret_cast<uint8_t*>(arena_.get()), arena_shape_.block_bytes(), arena_blocks_);
  mirror_ = std::make_shared<Mirror>(*this, pool);  // the previous pool's mirror expires
  pool.set_mirror(mirror_);
  return true;
}

}  // namespace fdl::cuda
