// flashdllm/kv_tiers.h — tiered KV block manager: moves whole KV blocks between tier 0 (the
// BlockPool arena: compute memory), tier 1 (host DRAM) and tier 2 (files on a local disk,
// O_DIRECT + io_uring), with an XXH3-64 checksum on every block that leaves tier 0.
//
// Identity: a block that leaves tier 0 gets an OffloadId (the tier-0 BlockId is given back to
// the pool, so it can be reused at once). The OffloadId names the block until it is promoted
// back (it then gets a fresh tier-0 BlockId) or discarded. A preempted sequence's block table
// is not mapped onto OffloadIds yet: its cached blocks go down through the prefix cache.
//
// Threading model: single-threaded, owned by the engine thread — no background thread.
//  - tier 0 <-> tier 1 copies: where the pool's mirror copies asynchronously (the CUDA model,
//    BlockMirror::copies_async), by DMA on the mirror's copy stream, queued and collected like
//    disk transfers: tier 1 and the disk staging buffers are page-locked once, at
//    construction; a demoted block goes back to the pool as soon as its copy is queued (the
//    device orders its reuse after the copy); a promotion is Pending until the copy and its
//    checksum (block_checksum, computed on the device as the bytes land) have completed.
//    Otherwise (the CPU model) synchronous memcpy on the caller's thread, XXH3-64 checksums.
//  - tier 2 transfers are asynchronous: demote/promote submit to io_uring and return; the
//    engine calls poll() once per step (non-blocking) to collect completions, or
//    wait_resident() when it needs a block now. Transfers overlap compute because the kernel
//    does the I/O while the engine thread runs the forward pass.
//
// Errors: misuse (unknown OffloadId, a block that is not exclusively owned, a tier id out of
// range) throws std::invalid_argument / std::out_of_range. Operational failures (tier full,
// tier disabled, breaker open, disk error, checksum mismatch) are returned as a
// TransferStatus, never thrown: the caller falls back to keeping or recomputing the block.
// Corrupt data is never placed into tier 0 as good data; a block whose checksum fails is
// released and reported Corrupt.
// Units: bytes, milliseconds (ms) for breaker settings, microseconds (us) in histograms.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "flashdllm/kv_cache.h"

namespace fdl {

/// Size of a tier: absolute bytes, or a fraction of a reference size (host RAM for tier 1,
/// free space of --kv-disk-path for tier 2). Both zero = tier disabled.
struct TierCapacity {
  uint64_t bytes = 0;
  double fraction = 0.0;  ///< in (0, 1]; used when bytes == 0
  /// Parses "1073741824", "512MiB", "4GiB", "2GB", "64KiB", "25%" or "0.25".
  /// Throws std::invalid_argument naming the text on anything else (negative, > 100%, junk).
  static TierCapacity parse(std::string_view text);
  /// Bytes this capacity means for a reference size.
  uint64_t resolve_bytes(uint64_t reference_bytes) const;
  /// Whole blocks that fit (never rounds up past the capacity).
  size_t resolve_blocks(uint64_t reference_bytes, size_t block_bytes) const;
};

/// Reference sizes for fractions: physical RAM, and free bytes of the filesystem holding
/// `dir` (0 when it cannot be read).
uint64_t host_ram_bytes();
uint64_t free_disk_bytes(const std::filesystem::path& dir);

struct OffloadBreakerConfig {
  double threshold_ms = 200.0;   ///< p95 tier-2 transfer latency that pauses disk offload
  size_t window = 64;            ///< latency samples in the sliding window
  size_t min_samples = 8;        ///< no automatic trip on fewer samples
  double cooldown_ms = 10000.0;  ///< automatic trips resume offload after this long
};

struct TierConfig {
  TierCapacity host;                   ///< tier 1 (--kv-host-bytes)
  TierCapacity disk;                   ///< tier 2 (--kv-disk-bytes)
  std::filesystem::path disk_path;     ///< --kv-disk-path; empty = no tier 2
  unsigned disk_files = 1;             ///< files the disk tier stripes over
  unsigned disk_queue_depth = 32;      ///< io_uring depth = max tier-2 transfers in flight
  /// Seconds after an I/O error disables tier 2 before it is tried again (the next transfer is
  /// the test; blocks stored before the error stay lost). Doubles, up to 32 times, when the
  /// tier fails again within twice its last wait; 0 keeps it off for good.
  double disk_retry_s = 30.0;
  OffloadBreakerConfig breaker;
  /// Page-locking hook for tier 1 (CUDA: cudaHostRegister/Unregister). Empty on CPU.
  std::function<void(void*, size_t)> host_pin, host_unpin;
  /// Test hook: act as if the disk filesystem refused O_DIRECT.
  bool disk_refuse_direct_for_test = false;
};

using OffloadId = uint64_t;  ///< 0 is never a valid id

enum class TransferStatus : uint8_t {
  Ok,            ///< done (for promotions: the block is resident in tier 0)
  Pending,       ///< submitted; completion comes through poll()/wait_resident()
  NoSpace,       ///< the destination tier (or tier 0 for a promotion) is full
  TierDisabled,  ///< destination/source tier is off (never configured, or disabled by an error)
  Paused,        ///< the offload breaker is open: disk offload paused
  IoError,       ///< the transfer failed (tier 2 is now off until TierConfig::disk_retry_s); recompute the block
  Corrupt,       ///< checksum mismatch on the way back; block discarded; recompute it
  Lost,          ///< the copy was in a tier disabled since it was stored; recompute the block
};
const char* to_string(TransferStatus s);

/// Log2-bucketed latency histogram in microseconds: bucket i counts [2^i, 2^(i+1)) us
/// (bucket 0 also takes < 1 us).
struct LatencyHistogram {
  static constexpr int kBuckets = 32;
  std::array<uint64_t, kBuckets> buckets{};
  uint64_t count = 0;
  double sum_us = 0.0;
  double max_us = 0.0;
  void record(double us);
  /// Upper bound (us) of the bucket holding quantile q in [0, 1]; 0 when empty.
  double quantile_us(double q) const;
  double mean_us() const { return count ? sum_us / double(count) : 0.0; }
};

struct TierCounters {
  size_t capacity_blocks = 0;
  size_t used_blocks = 0;          ///< occupancy (tier 0: pool blocks in use)
  bool enabled = false;
  std::string disabled_reason;     ///< why the tier is off (empty when enabled)
  uint64_t checksum_failures = 0;  ///< blocks from this tier that failed verification
  uint64_t io_errors = 0;          ///< failed or short transfers
  LatencyHistogram write_latency;  ///< transfers into this tier (tiers 1, 2)
  LatencyHistogram read_latency;   ///< transfers out of this tier back up
};

struct TierStats {
  std::array<TierCounters, 3> tier;                        ///< by BlockTier value
  std::array<std::array<uint64_t, 3>, 3> blocks_moved{};   ///< [from][to]
  std::array<std::array<uint64_t, 3>, 3> bytes_moved{};    ///< [from][to]
  uint64_t prefetch_hits = 0;    ///< wait_resident found a prefetched block already resident
  uint64_t prefetch_late = 0;    ///< ... prefetched but still in flight (had to wait)
  uint64_t prefetch_misses = 0;  ///< ... not prefetched at all
  bool disk_direct_io = false;
  std::string disk_io_note;      ///< why buffered I/O is used, when it is
  bool breaker_open = false;
  bool breaker_manual = false;
  uint64_t breaker_trips = 0;
  double breaker_p95_ms = 0.0;
  std::string breaker_reason;
  size_t offloaded_blocks = 0;   ///< live OffloadIds (in tier 1, tier 2, or in flight)
  /// Asynchronous device copies (a GPU model): tier 0 <-> tier 1 / staging by DMA.
  bool async_copies = false;
  double link_h2d_gbps = 0;      ///< one large page-locked transfer, measured at start-up
  double link_d2h_gbps = 0;
  uint64_t copy_h2d_bytes = 0;   ///< block bytes moved by completed device copies
  uint64_t copy_d2h_bytes = 0;
  double copy_h2d_ms = 0;        ///< device time of those copies (checksums included)
  double copy_d2h_ms = 0;
  /// One JSON object with all of the above (for metrics endpoints and --json output).
  std::string to_json() const;
};

/// What demote/promote/poll report for one block.
struct TierEvent {
  enum class Kind : uint8_t { Demote, Promote } kind = Kind::Demote;
  OffloadId id = 0;
  TransferStatus status = TransferStatus::Ok;
  BlockTier from = BlockTier::Device;
  BlockTier to = BlockTier::Device;
  BlockId block = -1;  ///< tier-0 block: the promoted block, or the block a failed demotion
                       ///< left in place (still owned by the caller)
  double latency_us = 0.0;
};

class TierManager {
 public:
  /// Builds tier 1 and tier 2 from `cfg` and the pool's block size. A disk tier that cannot
  /// be set up (bad path, bad disk_files/disk_queue_depth, no space, io_uring unavailable)
  /// is disabled with a logged reason; only host-memory exhaustion (std::bad_alloc), a
  /// host_pin failure or a bad breaker config (std::invalid_argument) throws. `pool` must outlive the
  /// manager (the destructor completes in-flight transfers into it).
  TierManager(BlockPool& pool, const TierConfig& cfg);
  ~TierManager();  ///< waits for in-flight disk transfers
  TierManager(const TierManager&) = delete;
  TierManager& operator=(const TierManager&) = delete;

  /// Move tier-0 block `block` to tier `to` (Host or Disk). The caller hands over its only
  /// reference (ref_count must be 1, state Active or Inactive; std::invalid_argument
  /// otherwise). On Ok/Pending the returned event's id names the block from now on:
  ///  - Host: synchronous; the tier-0 block is released at once (status Ok).
  ///  - Disk: the bytes are staged and written asynchronously (status Pending); the tier-0
  ///    block stays allocated in state PendingEvict (do not write to it) until poll()
  ///    reports the write; then it is released. If the write fails, poll() reports IoError
  ///    and the untouched block stays resident under the id: wait_resident(id) returns it.
  /// Ownership rule: once an id exists, its tier-0 block (if any) is handed back only by
  /// wait_resident() (or freed by discard()); events are informative.
  /// On NoSpace/TierDisabled/Paused nothing changed: the caller still owns the block.
  TierEvent demote(BlockId block, BlockTier to);
  /// Move an offloaded block from tier 1 to tier 2 (asynchronous, status Pending; the host
  /// slot is freed when the write completes; on failure the block stays in tier 1).
  TierEvent demote_to_disk(OffloadId id);
  /// Start bringing an offloaded block back into a fresh tier-0 block (state Loading). Host:
  /// synchronous, verified, Ok/Corrupt. Disk: Pending until poll()/wait_resident(). NoSpace
  /// when the pool is full (nothing changed). A block already loading returns Pending.
  TierEvent promote(OffloadId id);
  /// promote() each id, marking them prefetched (counts hits/late in wait_resident).
  /// Returns one event per id; failures are reported, not thrown.
  std::vector<TierEvent> prefetch(std::span<const OffloadId> ids);
  /// The engine needs `id` now: start its promotion if needed, wait for it, and hand the
  /// tier-0 block (one reference) to the caller. The OffloadId is retired unless the status
  /// is NoSpace (then it stays offloaded). Ok => event.block is resident and verified.
  TierEvent wait_resident(OffloadId id);
  /// Non-blocking: collect finished tier-2 transfers. Promotions that finished stay held for
  /// wait_resident(); their events are reported here too.
  std::vector<TierEvent> poll();
  /// Drop an offloaded block (a finished session, a recomputed block): frees its tier slot,
  /// or its tier-0 block if it was promoted but never claimed. Waits for an in-flight
  /// transfer on it first.
  void discard(OffloadId id);
  /// Block until every transfer in flight (tier 2, device copies) has completed (their events
  /// are kept for the next poll()). For shutdown, tests and step boundaries that need quiet.
  void drain();
  /// Block until no tier-2 transfer is in flight, nor a device copy on its way to tier 2.
  void drain_disk();
  size_t in_flight() const;  ///< tier-2 transfers and device copies not yet completed
  /// Whether tier-0 copies are asynchronous device copies (see the threading model).
  bool copies_async() const;
  /// Sends queued device copies to the device now (they also go at the next forward, poll(),
  /// or any wait). No-op without asynchronous copies.
  void flush();
  /// Non-blocking: true when no transfer is in flight on `id` any more (a promotion has
  /// landed and been verified, or failed; a demotion is stored). std::out_of_range if unknown.
  bool ready(OffloadId id);

  /// Metadata of an offloaded block: tier, state (Inactive, PendingEvict, Loading, Active
  /// once promoted), checksum, access stats, prefix hash. std::out_of_range for unknown ids.
  const BlockMeta& meta(OffloadId id) const;
  bool contains(OffloadId id) const;
  bool tier_enabled(BlockTier t) const;
  /// Disable tier 2 as an I/O error would: blocks stored there become Lost, and the tier comes
  /// back after TierConfig::disk_retry_s. tier_enabled(Disk) brings it back once that is due.
  void disable_disk(const std::string& reason);
  void trip_breaker(const std::string& reason);  ///< manual; latched until reset_breaker()
  void reset_breaker();
  TierStats stats() const;
  /// Free slots of tier `t` (0 when it is off): cheaper than stats() for the cost rule.
  size_t free_blocks(BlockTier t) const;
  /// Device copies: bytes per second each way, measured live over the completed copies (their
  /// checksums included), or the link's start-up figure before any; 0 without device copies.
  struct CopyRates {
    double h2d_bytes_per_s = 0, d2h_bytes_per_s = 0;
  };
  CopyRates copy_rates() const;

  /// Test hooks: flip one bit of an offloaded block where it is stored now (tier 1 or 2);
  /// make the next tier-2 write/read fail (fault: "eio", "enospc" or "short").
  void corrupt_for_test(OffloadId id, size_t byte_offset, int bit);
  void inject_disk_fault_for_test(bool on_write, const std::string& fault, int count = 1);
  /// Test hook: the offloaded blocks whose bytes sit in tier 1 or 2 with no transfer in
  /// flight (what corrupt_for_test can flip), in id order.
  std::vector<OffloadId> stored_for_test() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fdl
