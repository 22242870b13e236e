// TierManager: demote/promote/prefetch of KV blocks between tier 0 (BlockPool), tier 1
// (HostStore) and tier 2 (DiskStore), with checksums, per-tier counters and the offload
// breaker. Contract and threading model: flashdllm/kv_tiers.h.
//
// Every offloaded block is one Record. At any time a record is in exactly one place:
//  - tier 1 slot or tier 2 slot (meta.tier Host/Disk, state Inactive), or
//  - in flight (op != None: the source stays valid until the completion), or
//  - resident: a verified tier-0 block waiting to be claimed by wait_resident(), or
//  - finished with a failure outcome (Corrupt/IoError/Lost) waiting to be claimed.
// That is what makes "every block accounted for" checkable from the stores' counters.
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "flashdllm/kv_tiers.h"
#include "kv/disk_store.h"
#include "kv/host_store.h"
#include "kv/offload_breaker.h"

namespace fdl {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kDevice = 0, kHost = 1, kDisk = 2;

uint64_t checksum(const uint8_t* p, size_t n) { return XXH3_64bits(p, n); }

double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

}  // namespace

struct TierManager::Impl {
  // Disk ops (io_uring): DemoteFromDevice, HostToDisk, PromoteFromDisk, StagedToDisk.
  // Device copies (BlockMirror::queue_copy, asynchronous mirrors only): PullToHost,
  // PullToStaging (then StagedToDisk), PushFromHost, PushFromStaging (after PromoteFromDisk).
  enum class Op : uint8_t {
    None, DemoteFromDevice, HostToDisk, PromoteFromDisk, StagedToDisk,
    PullToHost, PullToStaging, PushFromHost, PushFromStaging
  };
  static bool is_copy(Op op) {
    return op == Op::PullToHost || op == Op::PullToStaging || op == Op::PushFromHost ||
           op == Op::PushFromStaging;
  }
  struct Record {
    BlockMeta meta;       // tier/state/checksum/access stats of the offloaded block
    uint32_t slot = 0;    // slot in meta.tier's store
    Op op = Op::None;
    BlockId block = -1;   // tier-0 block: in-flight demotion source or promotion target
    uint32_t disk_slot = 0;     // destination of an in-flight write
    int staging = -1;           // staging buffer of an in-flight transfer
    BlockState restore_state = BlockState::Active;
    Clock::time_point started{};
    bool prefetched = false;
    BlockMirror::CopyHandle copy;           // the device copy in flight (is_copy(op))
    std::optional<TransferStatus> outcome;  // set when a promotion (or failed demotion) ended
    uint32_t disk_epoch = 0;                // tier 2's epoch when the block was stored there
  };

  BlockPool& pool;
  size_t block_bytes;
  // Asynchronous device copies (a GPU model's mirror): tier 1 and the disk staging buffers
  // are page-locked once here, and blocks move by DMA straight between them and the device.
  // Member order is teardown order (last first): HostStore's destructor resets host_pin
  // through its unpin hook, so host_pin must still exist then; staging_pin unregisters the
  // staging region before the region is freed.
  bool dma = false;
  std::shared_ptr<void> host_pin;
  kv::AlignedBuffer staging_region;  // dma: all staging buffers in one page-locked region
  std::shared_ptr<void> staging_pin;  // after staging_region: unpinned before it is freed
  std::unique_ptr<kv::HostStore> host;
  std::unique_ptr<kv::DiskStore> disk;
  bool disk_enabled = false;
  // Tier 2 after an I/O error: off until disk_retry_at, then tried again. Each disabling starts
  // a new epoch; blocks stored in an earlier one are not trusted (Lost).
  uint32_t disk_epoch = 0;
  bool disk_off_for_error = false;
  double disk_retry_s = 0, disk_wait_s = 0;
  Clock::time_point disk_retry_at{}, disk_back_at{};
  kv::OffloadBreaker breaker;
  std::unordered_map<OffloadId, Record> records;
  OffloadId next_id = 1;
  std::vector<kv::AlignedBuffer> staging;
  std::vector<int> free_staging;
  std::deque<OffloadId> copies;      // records with a device copy in flight, in queue order
  std::vector<TierEvent> events;
  std::vector<kv::DiskCompletion> completions;
  TierStats st;

  Impl(BlockPool& p, const TierConfig& cfg)
      : pool(p), block_bytes(p.shape().block_bytes()), disk_retry_s(cfg.disk_retry_s), breaker(cfg.breaker) {
    st.tier[kDevice].enabled = true;
    const auto mirror = pool.mirror();
    dma = mirror && mirror->copies_async();
    st.async_copies = dma;
    const size_t host_blocks = cfg.host.resolve_blocks(host_ram_bytes(), block_bytes);
    if (host_blocks > 0) {
      kv::PinHooks hooks{cfg.host_pin, cfg.host_unpin};
      if (dma) {
        // Called during HostStore's construction only: the raw pointer does not keep the
        // mirror (and the model it refers to) alive.
        hooks.pin = [this, m = mirror.get()](void* ptr, size_t bytes) { host_pin = pin_timed(*m, ptr, bytes, "tier 1"); };
        hooks.unpin = [this](void*, size_t) { host_pin.reset(); };
      }
      host = std::make_unique<kv::HostStore>(block_bytes, host_blocks, std::move(hooks));
      st.tier[kHost].enabled = true;
      if (dma) {
        const auto [h2d, d2h] = mirror->measure_link(host->arena_ptr(),
                                                     std::min<size_t>(host->arena_bytes(), size_t(256) << 20));
        st.link_h2d_gbps = h2d / 1e9;
        st.link_d2h_gbps = d2h / 1e9;
        if (h2d > 0 && d2h > 0)
          spdlog::info("kv tiers: host<->device link {:.1f} GB/s to the device, {:.1f} GB/s to the host "
                       "(page-locked, one large transfer each way)", st.link_h2d_gbps, st.link_d2h_gbps);
      }
    } else {
      st.tier[kHost].disabled_reason = "no capacity (--kv-host-bytes is 0 or below one block)";
    }
    setup_disk(cfg);
  }

  // Page-locks memory for DMA at start-up (never in the request path), with a log line: on a
  // GPU machine this costs tens of milliseconds per GiB.
  static std::shared_ptr<void> pin_timed(BlockMirror& m, void* ptr, size_t bytes, const char* what) {
    const auto t0 = Clock::now();
    auto h = m.pin_host(ptr, bytes);
    spdlog::info("kv {}: page-locked {:.2f} GiB for DMA in {:.0f} ms", what, double(bytes) / double(1ull << 30),
                 us_since(t0) / 1000.0);
    return h;
  }

  // Looked up on every use: the model re-registers (a new mirror) when it re-binds the pool,
  // e.g. after measuring prefill speed on a pool of its own at start-up.
  std::shared_ptr<BlockMirror> mirror() const {
    auto m = pool.mirror();
    if (!m || !m->copies_async()) throw std::logic_error("TierManager: the model that copies KV blocks is gone");
    return m;
  }

  uint8_t* staging_ptr(int i) {
    if (dma) return staging_region.data() + size_t(i) * kv::round_up_io(block_bytes);
    return staging[size_t(i)].data();
  }

  void setup_disk(const TierConfig& cfg) {
    auto& reason = st.tier[kDisk].disabled_reason;
    if (cfg.disk_path.empty()) {
      reason = "no --kv-disk-path";
      return;
    }
    const size_t blocks = cfg.disk.resolve_blocks(free_disk_bytes(cfg.disk_path), block_bytes);
    if (blocks == 0) {
      reason = "no capacity (--kv-disk-bytes is 0 or below one block)";
      return;
    }
    try {
      disk = std::make_unique<kv::DiskStore>(kv::DiskStoreOptions{
          cfg.disk_path, block_bytes, blocks, cfg.disk_files, cfg.disk_queue_depth,
          cfg.disk_refuse_direct_for_test});
    } catch (const kv::DiskStoreError& e) {
      reason = e.what();
      spdlog::warn("kv tier 2 disabled: {}", reason);
      return;
    }
    disk_enabled = true;
    st.tier[kDisk].enabled = true;
    st.disk_direct_io = disk->direct_io();
    st.disk_io_note = disk->direct_io_note();
    staging.resize(cfg.disk_queue_depth);
    for (int i = int(cfg.disk_queue_depth); i-- > 0;) free_staging.push_back(i);
    if (dma) {  // device <-> disk goes through page-locked staging
      staging_region = kv::AlignedBuffer(size_t(cfg.disk_queue_depth) * kv::round_up_io(block_bytes), false);
      staging_pin = pin_timed(*mirror(), staging_region.data(), staging_region.size(), "tier 2 staging");
    }
  }

  ~Impl() {
    // Drain so no transfer writes into a staging buffer or block after we are gone.
    try {
      drain_all();
    } catch (...) {
    }
  }

  void drain_all() {
    while ((disk && disk->in_flight() > 0) || !copies.empty()) {
      if (!copies.empty()) {
        if (!pool.mirror()) {
          fail_copies_in_flight();  // the device and its copies are gone
          continue;
        }
        wait_front_copy();
      } else {
        wait_one();
      }
    }
  }

  // The mirror went away with copies in flight: each such record ends as an I/O error (its
  // tokens are recomputed) and gives back what the copy held.
  void fail_copies_in_flight() {
    for (OffloadId id : copies) {
      Record& r = find(id);
      if (r.staging >= 0) give_staging(r.staging), r.staging = -1;
      if ((r.op == Op::PullToHost || r.op == Op::PushFromHost) && host) host->release(r.slot);
      if (r.op == Op::PullToStaging && disk) disk->release(r.disk_slot);
      if ((r.op == Op::PushFromHost || r.op == Op::PushFromStaging) && r.block >= 0) pool.release(r.block);
      r.block = -1;
      r.op = Op::None;
      r.outcome = TransferStatus::IoError;
    }
    copies.clear();
  }

  Record& find(OffloadId id) {
    auto it = records.find(id);
    if (it == records.end())
      throw std::out_of_range("TierManager: unknown OffloadId " + std::to_string(id));
    return it->second;
  }

  void disable_disk(const std::string& reason) {
    if (!disk_enabled) return;
    disk_enabled = false;
    ++disk_epoch;
    st.tier[kDisk].enabled = false;
    st.tier[kDisk].disabled_reason = reason;
    if (disk_retry_s <= 0) {
      spdlog::error("kv tier 2 disabled: {}; blocks stored there will be recomputed", reason);
      return;
    }
    // A tier that fails again soon after coming back waits twice as long the next time.
    const auto now = Clock::now();
    const bool again_soon = disk_wait_s > 0 && now - disk_back_at < std::chrono::duration<double>(2 * disk_wait_s);
    disk_wait_s = again_soon ? std::min(2 * disk_wait_s, 32 * disk_retry_s) : disk_retry_s;
    disk_retry_at = now + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(disk_wait_s));
    disk_off_for_error = true;
    spdlog::error("kv tier 2 disabled: {}; blocks stored there will be recomputed; trying it again in {:.0f} s",
                  reason, disk_wait_s);
  }

  // Tier 2 back on once its wait after an I/O error is over; its next transfer tests it.
  void retry_disk_if_due() {
    if (!disk_off_for_error || Clock::now() < disk_retry_at) return;
    disk_off_for_error = false;
    disk_enabled = true;
    disk_back_at = Clock::now();
    st.tier[kDisk].enabled = true;
    st.tier[kDisk].disabled_reason.clear();
    spdlog::warn("kv tier 2 enabled again after {:.0f} s off", disk_wait_s);
  }

  void count_move(size_t from, size_t to) {
    ++st.blocks_moved[from][to];
    st.bytes_moved[from][to] += block_bytes;
  }

  int take_staging() {
    while (free_staging.empty()) wait_any();
    const int i = free_staging.back();
    free_staging.pop_back();
    if (!dma && staging[size_t(i)].size() == 0) staging[size_t(i)] = kv::AlignedBuffer(block_bytes);
    return i;
  }

  // Waits for the oldest transfer in flight, a device copy or a disk transfer.
  void wait_any() {
    if (!copies.empty())
      wait_front_copy();
    else
      wait_one();
  }

  // Device copies are collected in queue order (pump_copies): waiting for the oldest one is
  // how any of them is waited for.
  void wait_front_copy() {
    mirror()->wait_copy(find(copies.front()).copy);
    pump_copies();
  }
  void give_staging(int i) { free_staging.push_back(i); }

  void wait_one() {
    completions.clear();
    // A record waiting for a transfer the store no longer knows about would spin forever.
    if (disk->wait(completions, 1) == 0)
      throw std::logic_error("TierManager: waiting for a disk transfer that is not in flight");
    for (const auto& c : completions) on_completion(c);
  }

  void drive_idle(Record& r) {
    while (r.op != Op::None) {
      if (is_copy(r.op))
        wait_front_copy();
      else
        wait_one();
    }
  }

  // Collects finished device copies, oldest first (they complete in queue order).
  void pump_copies() {
    if (copies.empty()) return;
    const auto m = mirror();
    while (!copies.empty()) {
      const OffloadId id = copies.front();
      Record& r = find(id);
      if (!m->copy_done(r.copy)) break;
      copies.pop_front();
      on_copy_done(id, r, m->collect_copy(r.copy));
    }
  }

  // A disk read landed in staging buffer `sb`: push it to the record's tier-0 block (verified
  // when the copy completes). A copy that cannot be queued ends the promotion as IoError.
  void push_staged(OffloadId id, Record& r, int sb, double lat_us) {
    try {
      queue_copy(id, r, Op::PushFromStaging, r.block, staging_ptr(sb), false);
      r.staging = sb;  // read by the push; given back when it completes
    } catch (const std::exception& e) {
      spdlog::warn("kv tiers: copying block {} back to the device failed: {}; recompute", r.block, e.what());
      r.op = Op::None;
      give_staging(sb);
      pool.release(r.block);
      r.block = -1;
      r.outcome = TransferStatus::IoError;
      events.push_back({TierEvent::Kind::Promote, id, TransferStatus::IoError, BlockTier::Disk, BlockTier::Device, -1,
                        lat_us});
    }
  }

  void queue_copy(OffloadId id, Record& r, Op op, BlockId b, uint8_t* host_bytes, bool to_host) {
    r.copy = mirror()->queue_copy(b, host_bytes, to_host);
    r.op = op;
    copies.push_back(id);
  }

  void on_copy_done(OffloadId id, Record& r, uint64_t sum) {
    const double lat_us = us_since(r.started);
    const Op op = r.op;
    r.op = Op::None;
    switch (op) {
      case Op::PullToHost:
        r.meta.checksum = sum;
        r.meta.state = BlockState::Inactive;
        count_move(kDevice, kHost);
        st.tier[kHost].write_latency.record(lat_us);
        events.push_back({TierEvent::Kind::Demote, id, TransferStatus::Ok, BlockTier::Device, BlockTier::Host, -1,
                          lat_us});
        break;
      case Op::PullToStaging:
        r.meta.checksum = sum;
        write_staged(id, r);
        break;
      case Op::PushFromHost:
        host->release(r.slot);
        finish_promotion(id, r, kHost, lat_us, sum == r.meta.checksum);
        break;
      case Op::PushFromStaging:
        give_staging(r.staging);
        r.staging = -1;
        finish_promotion(id, r, kDisk, lat_us, sum == r.meta.checksum);
        break;
      default:
        throw std::logic_error("TierManager: device copy completion for a record with no copy");
    }
  }

  // The pulled bytes are in staging: write them to the record's disk slot.
  void write_staged(OffloadId id, Record& r) {
    r.op = Op::StagedToDisk;
    r.started = Clock::now();
    if (disk_enabled) {
      try {
        disk->submit_write(r.disk_slot, staging_ptr(r.staging), id);
        return;
      } catch (const kv::DiskStoreError& e) {
        ++st.tier[kDisk].io_errors;
        disable_disk(e.what());
      }
    }
    // The tier-0 block went back to the pool with the pull: the copy is lost.
    r.op = Op::None;
    give_staging(r.staging);
    r.staging = -1;
    disk->release(r.disk_slot);
    r.outcome = TransferStatus::IoError;
    events.push_back({TierEvent::Kind::Demote, id, TransferStatus::IoError, BlockTier::Device, BlockTier::Disk, -1,
                      0.0});
  }

  // The tier-0 block copy of an offloaded block's metadata: fresh refcount, state Loading.
  void install_meta(BlockId b, const BlockMeta& from) {
    BlockMeta& m = pool.meta(b);
    const int32_t refs = m.ref_count;
    m = from;
    m.ref_count = refs;
    m.tier = BlockTier::Device;
    m.state = BlockState::Loading;
  }

  // A GPU model holds its own copy of tier-0 blocks: hand it the verified bytes. A failed
  // device copy is logged and reported as an I/O error (the block is recomputed).
  bool push_verified(BlockId b) {
    try {
      pool.push_to_mirror(b);
      return true;
    } catch (const std::exception& e) {
      spdlog::warn("kv tiers: copying block {} back to the device failed: {}; recompute", b, e.what());
      return false;
    }
  }

  // The bytes are in tier 0 (the host arena, or the device for a device copy, whose checksum
  // the copy computed as they landed): mark resident, or discard on mismatch.
  void finish_promotion(OffloadId id, Record& r, size_t from, double lat_us,
                        std::optional<bool> device_checksum_ok = std::nullopt) {
    TierEvent ev{TierEvent::Kind::Promote, id, TransferStatus::Ok,
                 BlockTier(from), BlockTier::Device, r.block, lat_us};
    bool intact = false;
    if (device_checksum_ok) {
      intact = *device_checksum_ok;
    } else {
      const auto bytes = pool.block_bytes(r.block);
      intact = checksum(bytes.data(), bytes.size()) == r.meta.checksum;
    }
    if (!intact) {
      ++st.tier[from].checksum_failures;
      spdlog::warn("kv tier {}: checksum mismatch on block {} (offload id {}); discarded, "
                   "recompute", from, r.block, id);
      pool.release(r.block);  // never handed out as good data
      r.block = -1;
      r.outcome = ev.status = TransferStatus::Corrupt;
      ev.block = -1;
    } else if (!device_checksum_ok && !push_verified(r.block)) {
      pool.release(r.block);  // the model's copy could not be written: recompute instead
      r.block = -1;
      r.outcome = ev.status = TransferStatus::IoError;
      ev.block = -1;
    } else {
      pool.meta(r.block).state = BlockState::Active;
      r.meta = pool.meta(r.block);
      r.outcome = TransferStatus::Ok;
      count_move(from, kDevice);
    }
    st.tier[from].read_latency.record(lat_us);
    events.push_back(ev);
  }

  void on_completion(const kv::DiskCompletion& c) {
    Record& r = find(c.tag);
    const double lat_us = us_since(r.started);
    breaker.record(lat_us / 1000.0, Clock::now());
    const Op op = r.op;
    r.op = Op::None;
    if (r.staging >= 0 && op != Op::PromoteFromDisk) {
      give_staging(r.staging);
      r.staging = -1;
    }
    std::string err;
    if (!c.ok()) {
      ++st.tier[kDisk].io_errors;
      err = std::string(c.op == kv::DiskOp::Write ? "write" : "read") + " of slot " +
            std::to_string(c.slot) + " failed: " +
            (c.short_io ? std::string("short transfer") : std::strerror(c.error));
    }
    // A tier-0 block's bytes are now in its disk slot.
    auto stored_on_disk = [&] {
      r.meta.tier = BlockTier::Disk;
      r.meta.state = BlockState::Inactive;
      r.slot = r.disk_slot;
      r.disk_epoch = disk_epoch;
      count_move(kDevice, kDisk);
      st.tier[kDisk].write_latency.record(lat_us);
    };
    switch (op) {
      case Op::StagedToDisk: {  // written from staging after a device copy
        TierEvent ev{TierEvent::Kind::Demote, c.tag, TransferStatus::Ok, BlockTier::Device, BlockTier::Disk, -1,
                     lat_us};
        if (c.ok()) {
          stored_on_disk();
        } else {
          disk->release(r.disk_slot);
          r.outcome = ev.status = TransferStatus::IoError;  // its tier-0 block is long gone
          disable_disk(err);
        }
        events.push_back(ev);
        break;
      }
      case Op::DemoteFromDevice: {
        TierEvent ev{TierEvent::Kind::Demote, c.tag, TransferStatus::Ok, BlockTier::Device,
                     BlockTier::Disk, r.block, lat_us};
        if (c.ok()) {
          pool.release(r.block);
          ev.block = r.block = -1;
          stored_on_disk();
        } else {
          disk->release(r.disk_slot);
          pool.meta(r.block).state = r.restore_state;  // untouched: stays resident
          r.meta = pool.meta(r.block);
          r.outcome = TransferStatus::Ok;
          ev.status = TransferStatus::IoError;
          disable_disk(err);
        }
        events.push_back(ev);
        break;
      }
      case Op::HostToDisk: {
        TierEvent ev{TierEvent::Kind::Demote, c.tag, TransferStatus::Ok, BlockTier::Host,
                     BlockTier::Disk, -1, lat_us};
        r.meta.state = BlockState::Inactive;
        if (c.ok()) {
          host->release(r.slot);
          r.slot = r.disk_slot;
          r.disk_epoch = disk_epoch;
          r.meta.tier = BlockTier::Disk;
          count_move(kHost, kDisk);
          st.tier[kDisk].write_latency.record(lat_us);
        } else {
          disk->release(r.disk_slot);  // the host copy is still good
          ev.status = TransferStatus::IoError;
          disable_disk(err);
        }
        events.push_back(ev);
        break;
      }
      case Op::PromoteFromDisk: {
        disk->release(r.slot);
        const int sb = r.staging;
        r.staging = -1;
        if (c.ok() && dma) {
          push_staged(c.tag, r, sb, lat_us);
        } else if (c.ok()) {
          const auto dst = pool.block_bytes_for_write(r.block);  // a push may still read the arena
          std::memcpy(dst.data(), staging_ptr(sb), dst.size());
          give_staging(sb);
          finish_promotion(c.tag, r, kDisk, lat_us);
        } else {
          give_staging(sb);
          pool.release(r.block);
          r.block = -1;
          r.outcome = TransferStatus::IoError;
          events.push_back({TierEvent::Kind::Promote, c.tag, TransferStatus::IoError,
                            BlockTier::Disk, BlockTier::Device, -1, lat_us});
          disable_disk(err);
        }
        break;
      }
      default:
        throw std::logic_error("TierManager: disk completion for a record with no disk transfer");
    }
  }

  void pump() {
    pump_copies();
    if (!disk) return;
    completions.clear();
    disk->poll(completions);
    for (const auto& c : completions) on_completion(c);
    pump_copies();  // pushes queued by finished disk reads may be done already
  }

  OffloadId new_record(const BlockMeta& m) {
    const OffloadId id = next_id++;
    Record& r = records[id];
    r.meta = m;
    r.meta.ref_count = 1;
    return id;
  }

  // A demotion by device copy: queued, not waited for, and the tier-0 block goes back to the
  // pool at once (the device does not overwrite it before the pull has read it); the
  // checksum comes with the completion. `place` fills in where the bytes go. Returns the id.
  template <typename Place>
  OffloadId queue_pull(BlockId b, BlockTier to, Op op, uint8_t* dst, Place&& place) {
    BlockMeta m = pool.meta(b);
    m.checksum = 0;
    m.tier = to;
    m.state = BlockState::PendingEvict;
    const OffloadId id = new_record(m);
    Record& r = records[id];
    place(r);
    r.started = Clock::now();
    try {
      queue_copy(id, r, op, b, dst, true);
    } catch (...) {
      records.erase(id);
      throw;
    }
    pool.release(b);
    return id;
  }

  TierEvent demote_host(BlockId b) {
    TierEvent ev{TierEvent::Kind::Demote, 0, TransferStatus::Ok, BlockTier::Device,
                 BlockTier::Host, b, 0.0};
    if (!host) return ev.status = TransferStatus::TierDisabled, ev;
    const auto slot = host->allocate();
    if (!slot) return ev.status = TransferStatus::NoSpace, ev;
    const auto t0 = Clock::now();
    if (dma) {
      try {
        ev.id = queue_pull(b, BlockTier::Host, Op::PullToHost, host->slot_ptr(*slot),
                           [&](Record& r) { r.slot = *slot; });
      } catch (...) {
        host->release(*slot);
        throw;
      }
      ev.block = -1;
      ev.latency_us = us_since(t0);
      return ev;
    }
    try {
      pool.pull_from_mirror(b);  // the bytes a GPU model wrote
    } catch (...) {
      host->release(*slot);  // a failed device copy takes nothing: the caller keeps the block
      throw;
    }
    const auto src = pool.block_bytes(b);
    const uint64_t cs = checksum(src.data(), src.size());
    std::memcpy(host->bytes(*slot).data(), src.data(), src.size());
    BlockMeta m = pool.meta(b);
    m.checksum = cs;
    m.tier = BlockTier::Host;
    m.state = BlockState::Inactive;
    ev.id = new_record(m);
    records[ev.id].slot = *slot;
    pool.release(b);
    ev.block = -1;
    ev.latency_us = us_since(t0);
    st.tier[kHost].write_latency.record(ev.latency_us);
    count_move(kDevice, kHost);
    return ev;
  }

  TransferStatus disk_gate() {
    retry_disk_if_due();
    if (!disk_enabled) return TransferStatus::TierDisabled;
    if (!breaker.allows_offload(Clock::now())) return TransferStatus::Paused;
    return TransferStatus::Ok;
  }

  TierEvent demote_disk(BlockId b) {
    TierEvent ev{TierEvent::Kind::Demote, 0, disk_gate(), BlockTier::Device, BlockTier::Disk,
                 b, 0.0};
    if (ev.status != TransferStatus::Ok) return ev;
    const auto slot = disk->allocate();
    if (!slot) return ev.status = TransferStatus::NoSpace, ev;
    const int sb = take_staging();
    if (!disk_enabled) {  // waiting for a staging buffer reaped a failure
      give_staging(sb);
      disk->release(*slot);
      return ev.status = TransferStatus::TierDisabled, ev;
    }
    if (dma) {
      // Device -> staging, then staging -> disk when the pull completes; a failed write then
      // loses the copy (IoError: the tier-0 block went back to the pool with the pull).
      try {
        ev.id = queue_pull(b, BlockTier::Disk, Op::PullToStaging, staging_ptr(sb), [&](Record& r) {
          r.disk_slot = *slot;
          r.staging = sb;
        });
      } catch (...) {
        give_staging(sb);
        disk->release(*slot);
        throw;
      }
      ev.block = -1;
      ev.status = TransferStatus::Pending;
      return ev;
    }
    try {
      pool.pull_from_mirror(b);  // the bytes a GPU model wrote
    } catch (...) {
      give_staging(sb);  // a failed device copy takes nothing: the caller keeps the block
      disk->release(*slot);
      throw;
    }
    const auto src = pool.block_bytes(b);
    std::memcpy(staging_ptr(sb), src.data(), src.size());
    BlockMeta& pm = pool.meta(b);
    pm.checksum = checksum(src.data(), src.size());
    const BlockState restore = pm.state;
    pm.state = BlockState::PendingEvict;
    ev.id = new_record(pm);
    Record& r = records[ev.id];
    r.op = Op::DemoteFromDevice;
    r.block = b;
    r.disk_slot = *slot;
    r.staging = sb;
    r.restore_state = restore;
    r.started = Clock::now();
    try {
      disk->submit_write(*slot, staging_ptr(sb), ev.id);
    } catch (const kv::DiskStoreError& e) {
      give_staging(sb);
      disk->release(*slot);
      pm.state = restore;
      records.erase(ev.id);
      ++st.tier[kDisk].io_errors;
      disable_disk(e.what());
      ev.id = 0;
      return ev.status = TransferStatus::IoError, ev;
    }
    ev.status = TransferStatus::Pending;
    return ev;
  }

  TierEvent outcome_event(OffloadId id, const Record& r) {
    return {TierEvent::Kind::Promote, id, *r.outcome, r.meta.tier, BlockTier::Device,
            *r.outcome == TransferStatus::Ok ? r.block : -1, 0.0};
  }

  TierEvent promote(OffloadId id) {
    Record& r = find(id);
    if (r.op == Op::PromoteFromDisk || r.op == Op::PushFromStaging || r.op == Op::PushFromHost)
      return {TierEvent::Kind::Promote, id, TransferStatus::Pending, r.meta.tier,
              BlockTier::Device, r.block, 0.0};
    drive_idle(r);  // a demotion in flight finishes first
    if (r.outcome) return outcome_event(id, r);
    const BlockTier from = r.meta.tier;
    TierEvent ev{TierEvent::Kind::Promote, id, TransferStatus::Ok, from, BlockTier::Device, -1,
                 0.0};
    retry_disk_if_due();
    if (from == BlockTier::Disk && (!disk_enabled || r.disk_epoch != disk_epoch)) {
      disk->release(r.slot);
      r.outcome = ev.status = TransferStatus::Lost;
      return ev;
    }
    if (pool.n_free() == 0) return ev.status = TransferStatus::NoSpace, ev;
    const auto t0 = Clock::now();
    if (from == BlockTier::Host && dma) {
      // Queued: verified on the device as it lands, claimed once the copy has completed.
      r.block = pool.allocate();
      install_meta(r.block, r.meta);
      r.meta.state = BlockState::Loading;
      r.started = t0;
      try {
        queue_copy(id, r, Op::PushFromHost, r.block, host->slot_ptr(r.slot), false);
      } catch (...) {
        pool.release(r.block);
        r.block = -1;
        r.meta.state = BlockState::Inactive;
        throw;
      }
      ev.status = TransferStatus::Pending;
      ev.block = r.block;
      return ev;
    }
    if (from == BlockTier::Host) {
      r.block = pool.allocate();
      install_meta(r.block, r.meta);
      const auto dst = pool.block_bytes_for_write(r.block);  // a push may still read the arena
      std::memcpy(dst.data(), host->bytes(r.slot).data(), dst.size());
      host->release(r.slot);
      finish_promotion(id, r, kHost, us_since(t0));
      return outcome_event(id, r);
    }
    // Disk: asynchronous read into a staging buffer; verified in on_completion.
    const int sb = take_staging();
    if (!disk_enabled || r.disk_epoch != disk_epoch) {  // reaping for a staging buffer found a failure
      give_staging(sb);
      disk->release(r.slot);
      r.outcome = ev.status = TransferStatus::Lost;
      return ev;
    }
    r.block = pool.allocate();
    install_meta(r.block, r.meta);
    r.meta.state = BlockState::Loading;
    r.op = Op::PromoteFromDisk;
    r.staging = sb;
    r.started = t0;
    try {
      disk->submit_read(r.slot, staging_ptr(sb), id);
    } catch (const kv::DiskStoreError& e) {
      r.op = Op::None;
      r.staging = -1;
      give_staging(sb);
      pool.release(r.block);
      r.block = -1;
      disk->release(r.slot);
      ++st.tier[kDisk].io_errors;
      disable_disk(e.what());
      r.outcome = ev.status = TransferStatus::IoError;
      return ev;
    }
    ev.status = TransferStatus::Pending;
    ev.block = r.block;
    return ev;
  }

  void release_record(OffloadId id) {
    Record& r = find(id);
    drive_idle(r);
    if (r.outcome) {
      if (*r.outcome == TransferStatus::Ok && r.block >= 0) pool.release(r.block);
    } else if (r.meta.tier == BlockTier::Host) {
      host->release(r.slot);
    } else if (r.meta.tier == BlockTier::Disk) {
      disk->release(r.slot);
    }
    records.erase(id);
  }
};

TierManager::TierManager(BlockPool& pool, const TierConfig& cfg)
    : impl_(std::make_unique<Impl>(pool, cfg)) {}

TierManager::~TierManager() = default;

TierEvent TierManager::demote(BlockId block, BlockTier to) {
  Impl& m = *impl_;
  const BlockMeta& bm = m.pool.meta(block);  // std::out_of_range for a bad id
  if (bm.tier != BlockTier::Device || bm.ref_count != 1 ||
      (bm.state != BlockState::Active && bm.state != BlockState::Inactive))
    throw std::invalid_argument(
        "TierManager::demote: block " + std::to_string(block) +
        " must be a tier-0 block held by exactly one owner, Active or Inactive (ref_count " +
        std::to_string(bm.ref_count) + ")");
  m.pump();
  switch (to) {
    case BlockTier::Host: return m.demote_host(block);
    case BlockTier::Disk: return m.demote_disk(block);
    case BlockTier::Device: break;
  }
  throw std::invalid_argument("TierManager::demote: destination must be Host or Disk");
}

TierEvent TierManager::demote_to_disk(OffloadId id) {
  Impl& m = *impl_;
  m.pump();
  Impl::Record& r = m.find(id);
  if (r.op != Impl::Op::None || r.outcome || r.meta.tier != BlockTier::Host)
    throw std::invalid_argument("TierManager::demote_to_disk: offload id " + std::to_string(id) +
                                " is not an idle tier-1 block");
  TierEvent ev{TierEvent::Kind::Demote, id, m.disk_gate(), BlockTier::Host, BlockTier::Disk,
               -1, 0.0};
  if (ev.status != TransferStatus::Ok) return ev;
  const auto slot = m.disk->allocate();
  if (!slot) return ev.status = TransferStatus::NoSpace, ev;
  r.op = Impl::Op::HostToDisk;
  r.disk_slot = *slot;
  r.meta.state = BlockState::PendingEvict;
  r.started = std::chrono::steady_clock::now();
  try {
    m.disk->submit_write(*slot, m.host->slot_ptr(r.slot), id);
  } catch (const kv::DiskStoreError& e) {
    r.op = Impl::Op::None;
    r.meta.state = BlockState::Inactive;
    m.disk->release(*slot);
    ++m.st.tier[kDisk].io_errors;
    m.disable_disk(e.what());
    return ev.status = TransferStatus::IoError, ev;
  }
  ev.status = TransferStatus::Pending;
  return ev;
}

TierEvent TierManager::promote(OffloadId id) {
  impl_->pump();
  return impl_->promote(id);
}

std::vector<TierEvent> TierManager::prefetch(std::span<const OffloadId> ids) {
  std::vector<TierEvent> out;
  out.reserve(ids.size());
  for (OffloadId id : ids) {
    impl_->find(id).prefetched = true;
    out.push_back(promote(id));
  }
  return out;
}

TierEvent TierManager::wait_resident(OffloadId id) {
  Impl& m = *impl_;
  m.pump();
  Impl::Record& r = m.find(id);
  if (!r.prefetched)
    ++m.st.prefetch_misses;
  else if (r.outcome)
    ++m.st.prefetch_hits;
  else
    ++m.st.prefetch_late;
  if (!r.outcome) {
    const TierEvent ev = m.promote(id);
    if (ev.status == TransferStatus::NoSpace) return ev;
    m.drive_idle(r);
  }
  const TierEvent ev = m.outcome_event(id, r);
  m.records.erase(id);  // the block (if Ok) now belongs to the caller
  return ev;
}

std::vector<TierEvent> TierManager::poll() {
  impl_->pump();
  std::vector<TierEvent> out;
  out.swap(impl_->events);
  return out;
}

void TierManager::discard(OffloadId id) { impl_->release_record(id); }

void TierManager::drain() { impl_->drain_all(); }

void TierManager::drain_disk() {
  Impl& m = *impl_;
  auto staged = [&] {
    for (OffloadId id : m.copies)
      if (m.find(id).op == Impl::Op::PullToStaging) return true;
    return false;
  };
  while ((m.disk && m.disk->in_flight() > 0) || staged()) {
    if (staged())
      m.wait_front_copy();  // in queue order: the staged pull is among the first
    else
      m.wait_one();
  }
}

size_t TierManager::in_flight() const {
  return (impl_->disk ? impl_->disk->in_flight() : 0) + impl_->copies.size();
}

bool TierManager::copies_async() const { return impl_->dma; }

void TierManager::flush() {
  if (impl_->dma && !impl_->copies.empty()) impl_->mirror()->flush();
}

bool TierManager::ready(OffloadId id) {
  Impl& m = *impl_;
  if (m.find(id).op == Impl::Op::None) return true;
  m.pump();  // only for a transfer still in flight: callers ask about many landed blocks
  return m.find(id).op == Impl::Op::None;
}

const BlockMeta& TierManager::meta(OffloadId id) const { return impl_->find(id).meta; }

bool TierManager::contains(OffloadId id) const { return impl_->records.count(id) > 0; }

bool TierManager::tier_enabled(BlockTier t) const {
  switch (t) {
    case BlockTier::Device: return true;
    case BlockTier::Host: return impl_->host != nullptr;
    case BlockTier::Disk:
      impl_->retry_disk_if_due();
      return impl_->disk_enabled;
  }
  return false;
}

void TierManager::disable_disk(const std::string& reason) { impl_->disable_disk(reason); }

void TierManager::trip_breaker(const std::string& reason) {
  impl_->breaker.trip(std::chrono::steady_clock::now(), reason);
}

void TierManager::reset_breaker() { impl_->breaker.reset(); }

TierStats TierManager::stats() const {
  Impl& m = *impl_;
  TierStats s = m.st;
  s.tier[kDevice].capacity_blocks = m.pool.capacity();
  s.tier[kDevice].used_blocks = m.pool.capacity() - m.pool.n_free();
  if (m.host) {
    s.tier[kHost].capacity_blocks = m.host->capacity();
    s.tier[kHost].used_blocks = m.host->n_used();
  }
  if (m.disk) {
    s.tier[kDisk].capacity_blocks = m.disk->capacity();
    s.tier[kDisk].used_blocks = m.disk->n_used();
  }
  s.breaker_open = m.breaker.is_open();
  s.breaker_manual = m.breaker.manual();
  s.breaker_trips = m.breaker.trips();
  s.breaker_p95_ms = m.breaker.p95_ms();
  s.breaker_reason = m.breaker.reason();
  s.offloaded_blocks = m.records.size();
  if (m.dma)
    if (const auto mirror = m.pool.mirror()) {
      const BlockMirror::CopyTotals t = mirror->copy_totals();
      s.copy_d2h_bytes = t.bytes[0];
      s.copy_h2d_bytes = t.bytes[1];
      s.copy_d2h_ms = t.device_ms[0];
      s.copy_h2d_ms = t.device_ms[1];
    }
  return s;
}

size_t TierManager::free_blocks(BlockTier t) const {
  const Impl& m = *impl_;
  switch (t) {
    case BlockTier::Device: return m.pool.n_free();
    case BlockTier::Host: return m.host ? m.host->n_free() : 0;
    case BlockTier::Disk: return m.disk && m.disk_enabled ? m.disk->n_free() : 0;
  }
  return 0;
}

TierManager::CopyRates TierManager::copy_rates() const {
  const Impl& m = *impl_;
  CopyRates r;
  if (!m.dma) return r;
  const auto mirror = m.pool.mirror();
  const BlockMirror::CopyTotals t = mirror ? mirror->copy_totals() : BlockMirror::CopyTotals{};
  auto rate = [](uint64_t bytes, double ms, double link_gbps) {
    return bytes > 0 && ms > 0 ? double(bytes) / (ms * 1e-3) : link_gbps * 1e9;
  };
  r.d2h_bytes_per_s = rate(t.bytes[0], t.device_ms[0], m.st.link_d2h_gbps);
  r.h2d_bytes_per_s = rate(t.bytes[1], t.device_ms[1], m.st.link_h2d_gbps);
  return r;
}

void TierManager::corrupt_for_test(OffloadId id, size_t byte_offset, int bit) {
  Impl& m = *impl_;
  Impl::Record& r = m.find(id);
  m.drive_idle(r);
  if (r.outcome || byte_offset >= m.block_bytes || bit < 0 || bit > 7)
    throw std::invalid_argument("TierManager::corrupt_for_test: block not stored or bad offset");
  if (r.meta.tier == BlockTier::Host)
    m.host->bytes(r.slot)[byte_offset] ^= uint8_t(1u << bit);
  else
    m.disk->flip_bit_for_test(r.slot, byte_offset, bit);
}

std::vector<OffloadId> TierManager::stored_for_test() const {
  std::vector<OffloadId> ids;
  for (const auto& [id, r] : impl_->records)
    if (r.op == Impl::Op::None && !r.outcome && (r.meta.tier == BlockTier::Host || r.meta.tier == BlockTier::Disk))
      ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

void TierManager::inject_disk_fault_for_test(bool on_write, const std::string& fault, int count) {
  if (!impl_->disk) throw std::invalid_argument("TierManager: no disk tier to inject into");
  kv::DiskFault f;
  if (fault == "eio")
    f = kv::DiskFault::Eio;
  else if (fault == "enospc")
    f = kv::DiskFault::NoSpace;
  else if (fault == "short")
    f = kv::DiskFault::Short;
  else
    throw std::invalid_argument("TierManager: unknown fault '" + fault + "'");
  impl_->disk->inject_fault(on_write ? kv::DiskOp::Write : kv::DiskOp::Read, f, count);
}

}  // namespace fdl
