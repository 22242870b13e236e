// flashdllm/kv_cache.h — paged KV cache: a pool of fixed-size blocks and per-sequence block
// tables (the design vLLM calls PagedAttention, Kwon et al. 2023).
//
// Layout: one block holds the K and V vectors of `block_size` consecutive token positions
// for *all* layers, contiguously, so a block moves between tiers in one transfer:
//   block bytes = n_layer * 2 (K,V) * block_size * n_kv_head * head_dim * element bytes
//   element order: [layer][k|v][slot in block][kv_head][head_dim]
// Elements are fp32 (KvDtype::F32, the CPU model's and the default) or, for the CUDA model
// of a 16-bit model, that 16-bit type (KvDtype::F16 / BF16: half the bytes per block, so
// twice the tokens per byte of HBM and half the bytes per tier move; docs/GPU.md).
// Units: positions and lengths in tokens; sizes in bytes.
//
// Invariants (each has a test):
//  - appending a token writes only its own slot; existing blocks are never copied or
//    reallocated (the pool's arena is allocated once);
//  - truncate frees whole blocks past the new length back to the pool;
//  - fork shares all blocks by refcount; the first append into a shared tail block copies
//    that one block (copy-on-write), never the whole cache;
//  - free + used == capacity at all times.
//
// Errors: running out of blocks throws fdl::KvCacheFull (the caller decides to preempt);
// bad sequence ids or positions throw std::out_of_range / std::invalid_argument.
// Thread-safety: not thread-safe; one engine thread owns the cache.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "flashdllm/kv_dtype.h"

namespace fdl {

class KvCacheFull : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

using BlockId = int32_t;
using SeqId = int32_t;

/// Shape of the per-token KV data, from the model (Model::kv_shape).
struct KvShape {
  int n_layer = 0;
  int n_kv_head = 0;
  int head_dim = 0;
  int block_size = 16;  ///< tokens per block (--block-size)
  KvDtype dtype = KvDtype::F32;
  /// Elements of one token's K (or V) in one layer: n_kv_head * head_dim.
  size_t elems_per_token_per_layer() const { return size_t(n_kv_head) * head_dim; }
  size_t block_bytes() const {
    return size_t(n_layer) * 2 * block_size * elems_per_token_per_layer() * kv_dtype_bytes(dtype);
  }
};

/// Where a block lives. Tier 0 is the compute memory; the tiered manager adds the others.
enum class BlockTier : uint8_t { Device = 0, Host = 1, Disk = 2 };
enum class BlockState : uint8_t { Free, Active, Inactive, PendingEvict, Loading };

/// Per-block metadata record. The tiered KV manager extends placement using these fields.
struct BlockMeta {
  BlockTier tier = BlockTier::Device;
  BlockState state = BlockState::Free;
  int32_t ref_count = 0;
  uint32_t n_filled = 0;         ///< token slots written
  uint64_t access_count = 0;
  uint64_t last_access_step = 0; ///< engine step counter at last use
  float predicted_reuse = 0.f;   ///< decayed access frequency (filled by the tier manager)
  uint64_t prefix_hash = 0;      ///< hash chain value of the tokens it holds (0 = none)
  uint64_t checksum = 0;         ///< XXH3-64 of the bytes when demoted (0 = none)
};

/// A backend that keeps the authoritative copy of tier-0 block bytes in its own memory (the
/// CUDA model's device KV arena). Code that reads a block's bytes on the host to move them
/// elsewhere (tier demotion) first calls BlockPool::pull_from_mirror; code that writes a
/// block's bytes on the host for the model to use (tier promotion) takes them from
/// BlockPool::block_bytes_for_write and calls push_to_mirror after. All run on the thread
/// that runs the model's forwards.
class BlockMirror {
 public:
  virtual ~BlockMirror() = default;
  /// Copy block `id` (shape().block_bytes() bytes, the pool's per-block layout) into `host`.
  /// Synchronous: the bytes are in `host` on return (pushes before it included).
  virtual void pull(BlockId id, std::span<uint8_t> host) = 0;
  /// Copy `host` (the same layout) into the backend's copy of block `id`. May return before
  /// the copy has read `host`: the backend orders it before its next use of the block, and
  /// `host` must not change until host_write_fence(id) has returned.
  virtual void push(BlockId id, std::span<const uint8_t> host) = 0;
  /// Returns once no copy started by push(id) still reads block `id`'s host bytes (pushes of
  /// other blocks may go on). Does not throw: a copy that failed is a device fault, which the
  /// backend's next forward reports.
  virtual void host_write_fence(BlockId /*id*/) noexcept {}
  /// Called once by a pool this mirror is registered with, from its destructor, while its
  /// host arena still exists: a mirror that page-locked the arena (for DMA) releases it here.
  virtual void pool_closing() {}

  // Asynchronous direct copies (the KV tiers' fast path on a GPU). A backend that supports
  // them copies blocks straight between its own memory and page-locked host memory that the
  // tier manager owns (the tier-1 arena, disk staging), on a copy stream of its own, many
  // blocks per group, and computes a checksum of every block on the device (block_checksum
  // below: of the bytes it sends for a pull, of the bytes that landed for a push). Ordering
  // guarantees the backend gives:
  //  - a pull reads the block as the forwards queued before it left it;
  //  - a block whose pull is still running is not overwritten: a later forward (or copy) that
  //    writes it first waits for the pull on the device, so the caller may hand the block back
  //    to the pool as soon as the pull is queued;
  //  - a push waits for the forwards queued before it (they may still use the block's old
  //    contents) and for the pulls of the same block queued before it; copies of one
  //    direction run in queue order.
  // Host memory handed to a copy must not be reused or freed before copy_done() says the
  // copy has completed.
  // A pushed block must not be read by a forward before copy_done() says it has landed.
  // Thread-safety: the thread that runs the model's forwards.

  /// Identifies one queued copy: its group and its place in the group.
  struct CopyHandle {
    uint64_t group = 0;
    uint32_t index = 0;
  };
  /// Whether queue_copy and the calls below are supported (false: use pull/push).
  virtual bool copies_async() const { return false; }
  /// Page-locks [p, p + bytes) for DMA until the returned handle is released (released in its
  /// deleter; independent of the mirror's lifetime). Throws std::runtime_error on failure.
  virtual std::shared_ptr<void> pin_host(void* /*p*/, size_t /*bytes*/) { return nullptr; }
  /// Queue a copy of block `id` to (to_host) or from `host` (block bytes, page-locked by
  /// pin_host). It joins the open group, which goes to the device when it is full, at flush(),
  /// when a copy of the other direction is queued, when copy_done() or wait_copy() asks about
  /// one of its copies, or before a forward that writes one of its pulled blocks. Throws
  /// std::logic_error for a block outside the backend's arena (nothing is queued then).
  virtual CopyHandle queue_copy(BlockId /*id*/, uint8_t* /*host*/, bool /*to_host*/) {
    throw std::logic_error("BlockMirror: asynchronous copies are not supported");
  }
  virtual void flush() {}
  /// Non-blocking: whether the copy has completed (flushes its group if still open).
  virtual bool copy_done(CopyHandle /*h*/) { return true; }
  /// Blocks until the copy has completed.
  virtual void wait_copy(CopyHandle /*h*/) {}
  /// The device checksum of a completed copy's block; then forgets the copy (each handle is
  /// collected once; a group's resources are reused once all its copies are collected).
  virtual uint64_t collect_copy(CopyHandle /*h*/) { return 0; }
  /// Bytes moved and device time spent by completed groups, per direction (0 = to host,
  /// 1 = to device): what the live GB/s figures are made of.
  struct CopyTotals {
    uint64_t bytes[2] = {0, 0};
    double device_ms[2] = {0, 0};
    uint64_t groups[2] = {0, 0};
  };
  virtual CopyTotals copy_totals() const { return {}; }
  /// Link bandwidth of one large page-locked transfer each way through `host` (at least
  /// `bytes`), in bytes per second: {host -> device, device -> host}; {0, 0} if unknown.
  virtual std::pair<double, double> measure_link(uint8_t* /*host*/, size_t /*bytes*/) { return {0, 0}; }
};

/// The checksum of a block's bytes that asynchronous copies compute on the device (and the CPU
/// reference the tests compare with): the sum modulo 2^64 over the block's 8-byte words w_i
/// (little-endian; a partial last word padded with zeros) of splitmix64's finaliser applied to
/// w_i XOR (i + 1) * 0x9E3779B97F4A7C15, then finalised once more with the byte count. Order-free,
/// so any split of the sum over threads gives the same value; a changed word changes its term
/// completely. Not cryptographic: it detects corruption, not tampering.
uint64_t block_checksum(std::span<const uint8_t> bytes);

namespace detail {
/// Unmaps a BlockPool's arena (an anonymous mapping of `bytes`).
struct ArenaUnmap {
  size_t bytes = 0;
  void operator()(uint8_t* p) const noexcept;
};
}  // namespace detail

/// Fixed-capacity pool of blocks in one arena, with a free list and refcounts.
class BlockPool {
 public:
  BlockPool(const KvShape& shape, size_t n_blocks);
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;
  ~BlockPool();  ///< tells a live mirror (BlockMirror::pool_closing) before the arena goes

  const KvShape& shape() const { return shape_; }
  size_t capacity() const { return meta_.size(); }
  /// Unique per pool object in this process (never reused, unlike an address): lets a
  /// backend that keeps per-pool state (a device arena) tell a new pool from a dead one.
  uint64_t uid() const { return uid_; }
  size_t n_free() const { return free_.size(); }

  /// Take a free block (ref_count = 1). Throws KvCacheFull when none is left.
  BlockId allocate();
  void retain(BlockId id);   ///< ref_count += 1
  void release(BlockId id);  ///< ref_count -= 1; returns to the free list at 0

  BlockMeta& meta(BlockId id);
  const BlockMeta& meta(BlockId id) const;

  /// K of (layer, slot) of block `id` at k_ptr, V at v_ptr, as fp32: only for an F32 pool
  /// (std::logic_error otherwise: a 16-bit pool's bytes are a device backend's layout, reached
  /// through block_bytes / slot_bytes). std::out_of_range for a bad id, layer or slot.
  float* k_ptr(BlockId id, int layer, int slot);
  float* v_ptr(BlockId id, int layer, int slot);
  const float* k_ptr(BlockId id, int layer, int slot) const;
  const float* v_ptr(BlockId id, int layer, int slot) const;
  std::span<uint8_t> block_bytes(BlockId id);
  /// The bytes of one slot's K (v = false) or V (v = true) in one layer, any dtype.
  std::span<uint8_t> slot_bytes(BlockId id, int layer, int slot, bool v);
  /// block_bytes(id) for writing on the host while a mirror may still be copying from it
  /// (BlockMirror::push returns early): waits for the mirror's host_write_fence(id) first.
  /// Writes whose effect on the mirror's copy the mirror replays itself (KvCache's slot moves,
  /// logged for the CUDA model) and writes with no mirror (the CPU model's KV) may use
  /// block_bytes / k_ptr / v_ptr.
  std::span<uint8_t> block_bytes_for_write(BlockId id);
  /// The whole host arena (capacity() blocks, contiguous, allocated once): what a mirror may
  /// page-lock so that pull/push copies run by DMA.
  std::span<uint8_t> arena_bytes() { return {arena_.get(), arena_.get_deleter().bytes}; }

  /// Registers the backend that holds the blocks' bytes (held weakly: a backend destroyed
  /// before the pool just stops mirroring). Empty: the host arena is authoritative (CPU).
  /// A different live mirror it replaces is told pool_closing() (it no longer hears of this
  /// pool, so it must not keep the arena pinned).
  void set_mirror(std::weak_ptr<BlockMirror> mirror);
  /// Host arena <- the mirror's copy of `id` (no-op without a mirror).
  void pull_from_mirror(BlockId id);
  /// The mirror's copy of `id` <- host arena (no-op without a mirror); may return before the
  /// copy is done (BlockMirror::push): write the arena through block_bytes_for_write.
  void push_to_mirror(BlockId id);
  /// The registered mirror (empty when none, or it is gone).
  std::shared_ptr<BlockMirror> mirror() const { return mirror_.lock(); }

 private:
  size_t layer_stride() const;
  float* f32_slot(BlockId id, int layer, int slot, bool v);  // k_ptr / v_ptr: F32 pools only
  KvShape shape_;
  // Allocated once, never resized: an anonymous mapping, zero on first touch and committed
  // page by page as blocks are written. A pool whose device mirror holds the bytes (CUDA)
  // touches it only for tier copies (and a mirror that page-locks it for DMA commits it), so
  // without tiers its host RAM stays near zero.
  std::unique_ptr<uint8_t, detail::ArenaUnmap> arena_;
  std::vector<BlockMeta> meta_;
  std::vector<BlockId> free_;
  std::weak_ptr<BlockMirror> mirror_;
  uint64_t uid_;
};

/// Per-sequence block tables over one BlockPool.
class KvCache {
 public:
  explicit KvCache(BlockPool& pool);
  /// Releases the blocks of every live sequence back to the pool (which must outlive it).
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  SeqId create_sequence();
  void free_sequence(SeqId seq);               ///< releases all its blocks
  SeqId fork_sequence(SeqId parent);           ///< shares blocks by refcount
  /// A new sequence whose first blocks are `prefix` (full blocks shared by refcount, e.g.
  /// from a prefix cache): its length is prefix.size() * block_size. Nothing is copied.
  /// Throws std::out_of_range for a block id outside the pool or a free block.
  SeqId create_sequence_from(std::span<const BlockId> prefix);
  /// Free blocks append_slots(seq, n) would take (new blocks plus a copy-on-write copy).
  size_t blocks_needed(SeqId seq, size_t n) const;
  size_t length(SeqId seq) const;              ///< tokens stored
  /// Reserve slots for `n` more tokens (allocating blocks as needed, copy-on-write for a
  /// shared tail block) and return the first new position. Throws KvCacheFull, leaving the
  /// sequence unchanged.
  size_t append_slots(SeqId seq, size_t n);
  /// Drop tokens at positions >= new_length (rollback); whole blocks past it are released.
  void truncate(SeqId seq, size_t new_length);
  /// Block table: logical block i -> physical block id.
  std::span<const BlockId> block_table(SeqId seq) const;
  BlockPool& pool() { return pool_; }
  const BlockPool& pool() const { return pool_; }
  size_t n_sequences() const;
  /// Blocks copied by copy-on-write since construction (one per append into a shared,
  /// partially filled tail block). A metric, and how the tests prove "never the whole cache".
  uint64_t blocks_copied() const { return blocks_copied_; }
  /// Unique per cache object in this process (see BlockPool::uid).
  uint64_t uid() const { return uid_; }
  /// Expires when this cache is destroyed: a backend that keeps per-cache state (the CUDA
  /// model's copy-on-write bookkeeping) drops it then, without holding the cache alive.
  std::weak_ptr<const void> lifetime() const { return alive_; }
  /// Called by append_slots right after each copy-on-write copy, with the shared block `src`
  /// (still live: another sequence holds it) and its private copy `dst`, once the host bytes
  /// and dst's metadata are in place. For backends that keep their own copy of the arena
  /// (the CUDA model mirrors the copy on the device). One observer at a time: a new call
  /// replaces the previous one; an empty function removes it. It runs on the thread calling
  /// append_slots and must not throw (an exception would leave append_slots half done).
  using BlockCopyObserver = std::function<void(BlockId src, BlockId dst)>;
  void set_block_copy_observer(BlockCopyObserver observer) { copy_observer_ = std::move(observer); }

  /// K (or V) vector of `seq` at `pos` in `layer`: n_kv_head * head_dim floats, laid out
  /// [kv_head][head_dim]. `pos` must be < length(seq) (std::out_of_range otherwise).
  float* k_slot(SeqId seq, int layer, size_t pos);
  float* v_slot(SeqId seq, int layer, size_t pos);
  /// Copies the K and V vectors of slot `from` to slot `to` of `seq`, in every layer (host
  /// arena; a backend with its own copy hears of it through the slot-move observer). Tree
  /// verification uses it to pack an accepted branch into consecutive slots before truncating
  /// the rest. Both must be < length(seq) (std::out_of_range), and `to`'s block must be private
  /// to `seq` (std::invalid_argument: it would change another sequence). from == to does
  /// nothing (no observer call, not counted).
  void move_slot(SeqId seq, size_t from, size_t to);
  /// Slot moves (move_slot with from != to) since construction.
  uint64_t slots_moved() const { return slots_moved_; }
  /// Called by move_slot right after the host copy, with the physical places of the source
  /// and the target: (block id, slot within the block). For backends that keep their own
  /// copy of the arena (the CUDA model repeats the move on the device, ordered with the
  /// copy-on-write copies of the block-copy observer). Same rules as the block-copy observer:
  /// one at a time, replaced by a new call, removed by an empty function, must not throw.
  using SlotMoveObserver =
      std::function<void(BlockId from_block, int from_slot, BlockId to_block, int to_slot)>;
  void set_slot_move_observer(SlotMoveObserver observer) { move_observer_ = std::move(observer); }

 private:
  struct Seq {
    bool live = false;
    size_t length = 0;
    std::vector<BlockId> blocks;
  };
  Seq& seq_ref(SeqId s);
  const Seq& seq_ref(SeqId s) const;
  BlockPool& pool_;
  std::vector<Seq> seqs_;
  std::vector<SeqId> free_ids_;
  uint64_t blocks_copied_ = 0;
  uint64_t slots_moved_ = 0;
  uint64_t uid_;
  std::shared_ptr<char> alive_ = std::make_shared<char>('\0');
  BlockCopyObserver copy_observer_;
  SlotMoveObserver move_observer_;
};

}  // namespace fdl
