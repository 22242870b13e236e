// storage_profile.h — measured speeds of the KV tiers and of recompute, the inputs of the
// placement cost rule (placement_policy.h).
//
// What is measured (measure_storage_profile):
//  - tier 0 <-> tier 1: memcpy of block-sized chunks between two buffers of `host_bytes`
//    each (default 128 MiB, 4x a 32 MiB L3, so the copies stream from DRAM): bandwidth in
//    each direction (GB/s = 1e9 bytes/s) and the median latency of one block copy (us);
//  - tier 1 <-> tier 2: on a scratch file under disk_path, opened O_DIRECT, through io_uring:
//    sequential write then read bandwidth of `disk_bytes` in 1 MiB transfers (8 in flight),
//    and the median queue-depth-1 latency of random 4 KiB reads and of one-block reads of
//    data written just before (written, so reads hit the device, not unwritten extents).
//    Where O_DIRECT is refused the numbers are page-cache numbers: disk_direct_io is false
//    and disk_note says so;
//  - recompute: prefill tokens/s from a caller callback (the CLI runs Model::forward).
// Floors (ProfileFloors) then disable tiers that are too slow, with a logged reason.
//
// Cache: one JSON file per (device, canonical disk path, block bytes, model) under
// $XDG_CACHE_HOME/flashdllm (else ~/.cache/flashdllm), with the measurement timestamp.
// A stale or mismatched file is ignored (warning) and re-measured; `refresh` forces it.
//
// Errors: bad options throw std::invalid_argument; a disk that cannot be measured is not an
// error: disk_measured = false, disk_enabled = false, the reason is recorded.
// Thread-safety: free functions, no shared state.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "kv/placement_policy.h"

namespace fdl::kv {

struct ProfileFloors {
  double disk_read_latency_us_max = 150.0;  ///< 4 KiB QD1 read latency (NVMe floor)
  double disk_bandwidth_gbps_min = 2.0;     ///< sequential read bandwidth, GB/s
  double host_bandwidth_gbps_min = 1.0;     ///< slower of the two copy directions, GB/s
};

struct StorageProfile {
  static constexpr int kVersion = 1;
  std::string key;               ///< what this profile is for (see profile_cache_key)
  int64_t measured_unix = 0;     ///< seconds since the epoch
  std::string measured_at;       ///< ISO 8601 UTC
  uint64_t block_bytes = 0;

  double host_write_gbps = 0;    ///< tier 0 -> tier 1
  double host_read_gbps = 0;     ///< tier 1 -> tier 0
  double host_block_latency_us = 0;

  bool disk_measured = false;
  std::string disk_path;
  bool disk_direct_io = false;
  std::string disk_note;         ///< fallback or failure explanation
  double disk_write_gbps = 0;
  double disk_read_gbps = 0;
  double disk_read_4k_latency_us = 0;
  double disk_read_block_latency_us = 0;

  bool recompute_measured = false;
  std::string model;
  double recompute_tok_per_s = 0;

  bool host_enabled = false;
  bool disk_enabled = false;
  std::string host_disabled_reason;
  std::string disk_disabled_reason;

  bool from_cache = false;       ///< not serialised

  nlohmann::json to_json() const;
  /// Throws std::invalid_argument naming the missing/mistyped field or a version mismatch.
  static StorageProfile from_json(const nlohmann::json& j);
  /// The cost-rule inputs for this profile (tiers that are disabled are unavailable).
  PlacementInputs placement_inputs(double tier0_pressure, int block_size) const;
};

struct ProfileOptions {
  uint64_t block_bytes = 0;               ///< > 0: the model's KV block size
  std::filesystem::path disk_path;        ///< empty: tier 2 not measured
  uint64_t host_bytes = 128ull << 20;     ///< per buffer; >= 2 blocks
  uint64_t disk_bytes = 256ull << 20;     ///< sequential file size; >= 1 MiB
  int latency_samples = 200;              ///< QD1 reads for each latency median
  std::string model;                      ///< recorded, and part of the cache key
  std::function<double()> recompute_tok_per_s;  ///< optional
  ProfileFloors floors;
  bool refuse_direct_for_test = false;    ///< exercise the buffered fallback
};

StorageProfile measure_storage_profile(const ProfileOptions& opt);
/// Sets host/disk_enabled and the reasons; logs each tier it disables.
void apply_floors(StorageProfile& p, const ProfileFloors& floors);

std::string profile_cache_key(const ProfileOptions& opt);
std::filesystem::path default_profile_cache_dir();
std::filesystem::path profile_cache_file(const std::filesystem::path& dir, const std::string& key);
/// nullopt when missing, unreadable, malformed or for another key (logged at warn/debug).
std::optional<StorageProfile> load_cached_profile(const std::filesystem::path& file,
                                                  const std::string& key);
/// Atomic (temp file + rename). Throws std::runtime_error when the directory is unwritable.
void save_profile(const std::filesystem::path& file, const StorageProfile& p);
/// The cached profile for `opt` unless `refresh`; else measure, apply floors and cache it
/// (a cache write failure is logged, not thrown).
StorageProfile load_or_measure_profile(const ProfileOptions& opt,
                                       const std::filesystem::path& cache_dir, bool refresh);

}  // namespace fdl::kv
