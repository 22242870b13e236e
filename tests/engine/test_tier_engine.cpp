// The tiers through the public APIs: an Engine with a capped tier 0 and lower tiers gives
// the outputs of an uncapped Generator, reports tier metrics, and its "disk_offload" breaker
// is the tier manager's (tripping it pauses tier-2 offload). Generator's trace_file writes a
// Chrome trace with forward spans and demote/promote spans carrying byte counts.
#include <gtest/gtest.h>

#include <fstream>

#include "engine_api_support.h"
#include "test_tier_fixture.h"

namespace fdl {
namespace {

std::vector<GenerationRequest> requests() {
  std::vector<GenerationRequest> reqs;
  for (uint32_t i = 0; i < 6; ++i)
    reqs.push_back(test::greedy_request(test::tier_prompt(40 + 4 * i, 900 + i), 60));
  return reqs;
}

GeneratorOptions base_options() {
  GeneratorOptions g;
  g.n_ctx = 128;
  g.max_sequences = 4;
  return g;
}

TEST(TierEngine, CappedEngineMatchesTheGeneratorAndReportsTiers) {
  const auto& m = test::stories_model();
  const auto reqs = requests();
  auto gen = test::make_generator(m, base_options());
  const auto want = gen.generate(reqs);

  const size_t bb = m.model->kv_shape(16).block_bytes();
  EngineOptions eo;
  eo.generator = base_options();
  eo.generator.kv_tiers = test::tier_options(bb, 3, 64, test::fresh_dir("tier-engine"));
  eo.kv_blocks = 8;
  Engine engine(*m.model, *m.tokenizer, eo);
  test::Collector c;
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < reqs.size(); ++i) engine.submit(reqs[i], c.sink(round * 10 + i));
    ASSERT_TRUE(c.wait((round + 1) * reqs.size()));
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(c.get(i).ids, want[i].generated_ids) << i;
    EXPECT_EQ(c.get(10 + i).ids, want[i].generated_ids) << i;
  }
  const EngineMetrics em = engine.metrics();
  EXPECT_TRUE(em.kv_tiers.enabled);
  EXPECT_EQ(em.kv_tiers.placement, "disk");
  EXPECT_GT(em.kv_tiers.tiers.blocks_moved[0][1], 0u);
  EXPECT_GT(em.kv_tiers.promoted, 0);
  EXPECT_EQ(em.kv_tiers.tiers.tier[0].capacity_blocks, 8u);
  EXPECT_LE(em.kv_tiers.tiers.tier[1].used_blocks, 3u);

  // The breaker is the tier manager's.
  engine.trip_breaker("disk_offload", "maintenance");
  bool found = false;
  for (const auto& b : engine.breakers())
    if (b.name == "disk_offload") {
      found = true;
      EXPECT_TRUE(b.open);
      EXPECT_NE(b.reason.find("maintenance"), std::string::npos) << b.reason;
    }
  EXPECT_TRUE(found);
  EXPECT_TRUE(engine.metrics().kv_tiers.tiers.breaker_open);
  // While it is open, nothing more goes to disk, and outputs do not change.
  const uint64_t to_disk = engine.metrics().kv_tiers.tiers.blocks_moved[1][2] +
                           engine.metrics().kv_tiers.tiers.blocks_moved[0][2];
  for (size_t i = 0; i < reqs.size(); ++i) engine.submit(reqs[i], c.sink(20 + i));
  ASSERT_TRUE(c.wait(3 * reqs.size()));
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(c.get(20 + i).ids, want[i].generated_ids) << i;
  const auto& mv = engine.metrics().kv_tiers.tiers.blocks_moved;
  EXPECT_EQ(mv[1][2] + mv[0][2], to_disk);
  engine.reset_breaker("disk_offload");
  EXPECT_FALSE(engine.metrics().kv_tiers.tiers.breaker_open);
}

TEST(TierEngine, EngineWithoutTiersStillHasTheDiskOffloadBreaker) {
  const auto& m = test::stories_model();
  Engine engine(*m.model, *m.tokenizer, EngineOptions{});
  EXPECT_FALSE(engine.metrics().kv_tiers.enabled);
  engine.trip_breaker("disk_offload", "");
  for (const auto& b : engine.breakers())
    if (b.name == "disk_offload") {
      EXPECT_TRUE(b.open);
    }
  engine.reset_breaker("disk_offload");
  for (const auto& b : engine.breakers())
    if (b.name == "disk_offload") {
      EXPECT_FALSE(b.open);
    }
}

TEST(TierTrace, GeneratorWritesAChromeTraceWithForwardAndTransferSpans) {
  const auto& m = test::stories_model();
  const auto reqs = requests();
  const auto dir = test::fresh_dir("tier-trace");
  GeneratorOptions g = base_options();
  const size_t bb = m.model->kv_shape(16).block_bytes();
  g.kv_tiers = test::tier_options(bb, 3, 64, dir);
  g.kv_blocks = 8;
  g.trace_file = dir / "trace.json";
  auto gen = test::make_generator(m, g);
  const auto got = gen.generate(reqs);
  std::ifstream in(g.trace_file);
  ASSERT_TRUE(in);
  const auto doc = nlohmann::json::parse(in);
  size_t forwards = 0, demotes = 0, transfers_with_bytes = 0;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") != "X") continue;
    const std::string name = e.at("name");
    EXPECT_GE(e.at("dur").get<double>(), 0.0);
    if (name == "forward") ++forwards;
    if (name.rfind("demote", 0) == 0) ++demotes;
    if ((name.rfind("demote", 0) == 0 || name.rfind("wait", 0) == 0) &&
        e.at("args").at("bytes").get<size_t>() == bb)
      ++transfers_with_bytes;
  }
  EXPECT_EQ(forwards, size_t(gen.last_stats().n_forwards));
  EXPECT_GT(demotes, 0u);
  EXPECT_GT(transfers_with_bytes, demotes);  // promotions ("wait ...") carry bytes too
  EXPECT_GT(gen.tier_metrics().tiers.blocks_moved[0][1], 0u);
}

}  // namespace
}  // namespace fdl
