// A Scheduler over a real model with lower KV tiers (tier 1 host, tier 2 disk), every step
// under the test's control, and a per-step check that no tier ever holds more blocks than
// its capacity. The disk tier lives in a fresh directory under the system temp dir.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <random>

#include <gtest/gtest.h>

#include "engine/engine_context.h"
#include "engine/kv_offload.h"
#include "engine/resolved_options.h"
#include "engine/scheduler.h"
#include "engine_test_support.h"
#include "kv/tier_test_util.h"

namespace fdl::test {

/// Prompts of random ids (BOS first); distinct seeds give distinct block hashes.
inline std::vector<int32_t> tier_prompt(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(3, 511);
  std::vector<int32_t> p{1};
  while (p.size() < n) p.push_back(id(rng));
  return p;
}

/// Tier options: `host_blocks` / `disk_blocks` of `block_bytes` (0 = tier off).
inline KvTierOptions tier_options(size_t block_bytes, size_t host_blocks, size_t disk_blocks,
                                  const std::filesystem::path& disk_dir,
                                  KvPlacementMode mode = KvPlacementMode::Disk) {
  KvTierOptions t;
  t.placement = mode;
  t.tiers.host.bytes = host_blocks * block_bytes;
  if (disk_blocks > 0) {
    t.tiers.disk.bytes = disk_blocks * block_bytes;
    t.tiers.disk_path = disk_dir;
  }
  return t;
}

/// A fixed storage profile (this VM's order of magnitude) so Auto runs without measuring.
inline std::string tier_profile_json(size_t block_bytes) {
  kv::StorageProfile p;
  p.block_bytes = block_bytes;
  p.host_write_gbps = p.host_read_gbps = 8;
  p.host_block_latency_us = 3;
  p.disk_measured = true;
  p.disk_write_gbps = p.disk_read_gbps = 1.5;
  p.disk_read_block_latency_us = 50;
  p.disk_read_4k_latency_us = 40;
  p.recompute_measured = true;
  p.recompute_tok_per_s = 50000;
  p.host_enabled = p.disk_enabled = true;
  return p.to_json().dump();
}

struct TierFixture {
  /// `mirror` (optional) is registered with the pool before the tier manager is built, as a
  /// GPU model's is: a mirror with asynchronous copies makes the tiers use them. `run_with`
  /// (optional) is a model standing in front of m's (a wrapper of it) that the steps run.
  TierFixture(const LoadedModel& m, GeneratorOptions g, SchedulerOptions s, size_t kv_blocks,
              std::function<std::shared_ptr<BlockMirror>(BlockPool&)> mirror = {}, Model* run_with = nullptr)
      : model(run_with != nullptr ? *run_with : *m.model), tokenizer(*m.tokenizer), options(engine::resolve_options(model, g)),
        pool(model.kv_shape(options.block_size),
             engine::resolve_pool_blocks(options, kv_blocks, "TierFixture")),
        kv(pool), spec(options.spec),
        mirror_(mirror ? mirror(pool) : nullptr),
        tiers((pool.set_mirror(mirror_), engine::make_tier_manager(model, pool, options.kv_tiers))),
        offload(engine::make_offload(model, *tiers, options)),
        ctx{model, tokenizer, kv, options, model.config().n_vocab, batch, logits, stats, spec,
            offload.get(), nullptr},
        scheduler(ctx, s) {
    engine::validate_scheduler_options(s, options);
  }

  struct Record {
    std::vector<int32_t> ids;
    std::string finish_reason;
    int32_t cached_prompt_tokens = 0;
    bool finished = false;
  };

  void add(RequestId id, GenerationRequest r) {
    scheduler.add(id, std::move(r), [this, id](const RequestOutput& o) {
      Record& rec = records[id];
      for (const auto& t : o.tokens) rec.ids.push_back(t.id);
      if (o.finished) {
        rec.finished = true;
        rec.finish_reason = o.finish_reason;
        rec.cached_prompt_tokens = o.cached_prompt_tokens;
      }
    });
  }

  /// Runs to completion, checking tier occupancy against capacity after every step.
  void run() {
    while (scheduler.has_work()) {
      scheduler.step();
      const TierStats s = tiers->stats();
      for (size_t t = 0; t < 3; ++t) {
        ASSERT_LE(s.tier[t].used_blocks, s.tier[t].capacity_blocks) << "tier " << t;
        max_used[t] = std::max(max_used[t], s.tier[t].used_blocks);
      }
    }
  }

  size_t block_bytes() const { return pool.shape().block_bytes(); }

  Model& model;
  const Tokenizer& tokenizer;
  GeneratorOptions options;
  BlockPool pool;
  KvCache kv;
  StepBatch batch;
  std::vector<float> logits;
  GeneratorStats stats;
  engine::SpecState spec;
  std::shared_ptr<BlockMirror> mirror_;
  std::unique_ptr<TierManager> tiers;
  std::unique_ptr<engine::KvOffload> offload;
  engine::EngineContext ctx;
  engine::Scheduler scheduler;
  std::map<RequestId, Record> records;
  std::array<size_t, 3> max_used{};
};

}  // namespace fdl::test
