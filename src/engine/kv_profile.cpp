// The storage profile the Auto placement uses (see kv_offload.h: load_kv_profile).
#include <algorithm>
#include <chrono>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "engine/kv_offload.h"
#include "engine/prefill_speed.h"

namespace fdl::engine {
namespace {

// The cost rule decides whether a slow disk is still worth it; the floors only switch off a
// tier that is unusable (seconds per 4 KiB read, or next to no bandwidth).
kv::ProfileFloors engine_floors() { return {1e6, 0.01, 0.01}; }

}  // namespace

std::optional<kv::StorageProfile> load_kv_profile(Model& model, const KvTierOptions& options,
                                                  int block_size) {
  if (!options.profile_json.empty()) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(options.profile_json);
    } catch (const std::exception& e) {
      throw std::invalid_argument(std::string("kv tiers: storage profile is not JSON: ") +
                                  e.what());
    }
    kv::StorageProfile p = kv::StorageProfile::from_json(j);
    kv::apply_floors(p, engine_floors());
    return p;
  }
  kv::ProfileOptions opt;
  opt.block_bytes = model.kv_shape(block_size).block_bytes();
  opt.disk_path = options.tiers.disk_path;
  opt.model = "engine,bytes=" + std::to_string(model.gguf().file_size()) +
              ",threads=" + std::to_string(model.n_threads());
  opt.recompute_tok_per_s = [&] { return measure_prefill_tok_per_s(model, block_size, 128); };
  opt.floors = engine_floors();
  try {
    const auto dir = options.profile_cache_dir.empty() ? kv::default_profile_cache_dir()
                                                       : options.profile_cache_dir;
    kv::StorageProfile p = kv::load_or_measure_profile(opt, dir, false);
    kv::apply_floors(p, engine_floors());
    spdlog::info("kv tiers: storage profile {} ({}): host {:.2f}/{:.2f} GB/s, disk {:.2f}/{:.2f} "
                 "GB/s, recompute {:.0f} tok/s", p.from_cache ? "cached" : "measured",
                 p.measured_at, p.host_write_gbps, p.host_read_gbps, p.disk_write_gbps,
                 p.disk_read_gbps, p.recompute_tok_per_s);
    return p;
  } catch (const std::exception& e) {
    spdlog::warn("kv tiers: no storage profile ({}); auto placement prefers the lower tiers",
                 e.what());
    return std::nullopt;
  }
}

}  // namespace fdl::engine

namespace fdl::engine {

std::unique_ptr<TierManager> make_tier_manager(Model& model, BlockPool& pool, const KvTierOptions& options) {
  model.bind_kv_pool(pool);  // a GPU model's arena and mirror exist before the tiers pin memory
  return std::make_unique<TierManager>(pool, options.tiers);
}

std::unique_ptr<KvOffload> make_offload(Model& model, TierManager& tiers,
                                        const GeneratorOptions& resolved) {
  const KvTierOptions& o = resolved.kv_tiers;
  if (!tiers.tier_enabled(BlockTier::Host) && !tiers.tier_enabled(BlockTier::Disk)) {
    if (o.enabled())
      spdlog::warn("kv tiers: neither tier 1 nor tier 2 could be set up; cached blocks are "
                   "dropped when tier 0 is full (see the tier stats for why)");
    return nullptr;
  }
  std::optional<kv::StorageProfile> profile;
  if (o.placement == KvPlacementMode::Auto) profile = load_kv_profile(model, o, resolved.block_size);
  return std::make_unique<KvOffload>(tiers, o, std::move(profile), resolved.block_size,
                                     model.kv_shape(resolved.block_size).block_bytes());
}

}  // namespace fdl::engine
