// Internal: the scheduler's side of the KV tiers. Wraps the TierManager with the placement
// choice (the cost rule of kv/placement_policy.h over the measured StorageProfile and the
// model's measured prefill speed, or a fixed mode), counters for KvTierMetrics and spans for
// the step trace. The PrefixCache decides *which* blocks leave tier 0 (LRU) and keeps their
// OffloadIds; this class decides *where* they go and performs the moves.
//
// Where a block goes (docs/KV_TIERS.md, "Integration"):
//  - from tier 0 (a cached block the pool needs back): Host, Disk or Drop;
//  - from tier 1 (tier 1 is full and a newer block wants in): Disk or Drop.
// Auto compares the expected costs C_host, C_disk, C_drop (tier-0 pressure is 1: the block
// must leave) and takes the cheapest; ties go Host, Disk, Drop. Without a profile Auto
// behaves as Disk mode. Tiers that are off (not configured, disabled by an I/O error) cost
// infinity; a paused disk (breaker open) turns a disk choice into a drop at demotion time.
//
// Errors: misuse of ids propagates from TierManager (std::invalid_argument/out_of_range);
// transfer failures come back as statuses, never exceptions.
// Thread-safety: none (engine thread). Units: seconds, bytes, tokens per second.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "flashdllm/kv_cache.h"
#include "flashdllm/kv_tiers.h"
#include "flashdllm/metrics.h"
#include "flashdllm/model.h"
#include "flashdllm/options.h"
#include "kv/placement_policy.h"
#include "kv/storage_profile.h"

namespace fdl::engine {

class StepTrace;

class KvOffload {
 public:
  /// `tiers` must outlive this object. `profile` feeds Auto (ignored by fixed modes).
  KvOffload(TierManager& tiers, const KvTierOptions& options,
            std::optional<kv::StorageProfile> profile, int block_size, size_t block_bytes);

  TierManager& tiers() { return tiers_; }
  KvPlacementMode mode() const { return mode_; }
  int block_size() const { return block_size_; }
  void set_trace(StepTrace* trace) { trace_ = trace; }

  /// Engine step counter (reuse scores decay in steps).
  void set_step(uint64_t step) { step_ = step; }
  uint64_t step() const { return step_; }
  double half_life_steps() const { return half_life_; }

  /// Where a cached tier-0 block with reuse probability `p` goes (never Keep).
  kv::Placement choose_from_device(double p) const;
  /// Where a tier-1 block goes when tier 1 needs its slot: DemoteDisk or Drop.
  kv::Placement choose_from_host(double p) const;

  /// Free slots in tier 1 / tier 2 (0 when the tier is off).
  size_t free_blocks(BlockTier t) const;
  bool tier_on(BlockTier t) const;

  // Transfers (counted and traced). See flashdllm/kv_tiers.h for the statuses.
  TierEvent demote(BlockId block, BlockTier to);
  TierEvent demote_to_disk(OffloadId id);
  /// wait_resident with counting: Ok = the caller owns event.block.
  TierEvent bring_back(OffloadId id, size_t n_tokens);
  /// Starts a promotion early; true when one was started.
  bool prefetch(OffloadId id);
  /// Whether promotions from tier 1 are asynchronous device copies (then worth prefetching).
  bool copies_async() const { return tiers_.copies_async(); }
  /// Non-blocking: no transfer in flight on `id` (a prefetch has landed, or failed).
  bool ready(OffloadId id);
  /// Sends queued device copies to the device now.
  void flush();
  void discard(OffloadId id, bool counts_as_drop);
  void count_drop() { ++m_.dropped; }
  /// Waits for every tier-2 transfer (and device copies on their way to tier 2) and collects
  /// completions. Returns the ids whose tier-0 -> tier-2 write failed (their tier-0 block is
  /// still resident under the id).
  std::vector<OffloadId> settle();
  /// Once per step: collects finished tier-2 transfers (non-blocking).
  void poll();

  /// A prefill-carrying forward of `tokens` tokens took `seconds` (recompute speed).
  void observe_prefill(size_t tokens, double seconds);
  double recompute_tok_per_s() const;
  /// Measured seconds per tier-2 block written / read back (0 = no sample yet).
  double disk_write_s() const { return disk_write_s_; }
  double disk_read_s() const { return disk_read_s_; }

  KvTierMetrics metrics() const;

 private:
  void record_events(const std::vector<TierEvent>& events, std::vector<OffloadId>* failed);
  void count_wait(double us);  // the engine thread waited `us` for a device copy
  kv::PlacementInputs inputs() const;

  TierManager& tiers_;
  KvPlacementMode mode_;
  std::optional<kv::StorageProfile> profile_;
  int block_size_;
  size_t block_bytes_;
  double half_life_;
  uint64_t step_ = 0;
  double measured_tok_per_s_ = 0;  // EMA of prefill forwards
  // What tier 2 really costs here, measured on the engine thread (EMA, seconds per block):
  // writes are waited for in settle(), so their cost is settle's wall time per block (batched
  // writes overlap); reads are wait_resident's wall time (a finished prefetch costs ~0).
  size_t unsettled_disk_writes_ = 0;
  double disk_write_s_ = 0;
  double disk_read_s_ = 0;
  StepTrace* trace_ = nullptr;
  KvTierMetrics m_;
};

/// The storage profile for Auto: `options.profile_json` if given (std::invalid_argument when
/// malformed), else the cached one for this disk path / block size / model, measured when
/// missing. Floors are relaxed (the cost rule decides), so a slow-but-cheaper disk stays on.
/// Returns nullopt (logged) when measuring fails.
std::optional<kv::StorageProfile> load_kv_profile(Model& model, const KvTierOptions& options,
                                                  int block_size);

}  // namespace fdl::engine

namespace fdl::engine {

/// The tier manager of a Generator/Engine: always built (it owns the "disk_offload"
/// breaker); with no tier configured it holds nothing and costs nothing.
/// Binds `pool` to the model first (Model::bind_kv_pool).
std::unique_ptr<TierManager> make_tier_manager(Model& model, BlockPool& pool, const KvTierOptions& options);
/// The offload layer, or nullptr when no lower tier is enabled. Loads the storage profile
/// for Auto (see load_kv_profile).
std::unique_ptr<KvOffload> make_offload(Model& model, TierManager& tiers,
                                        const GeneratorOptions& resolved);

}  // namespace fdl::engine
