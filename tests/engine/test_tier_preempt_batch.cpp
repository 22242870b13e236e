// Regression (found by bench/bench_multiturn.py): a returning turn's prompt chunk that needs
// blocks must not preempt a sequence whose tokens are already in the same step's batch
// (the forward then failed with "KvCache: no live sequence"). Multi-turn sessions with long
// prompts in a pool of two contexts, without and with lower tiers: every turn completes and
// equals an uncapped run.
#include <gtest/gtest.h>

#include "scheduler_fixture.h"
#include "test_tier_fixture.h"

namespace fdl {
namespace {

template <typename Fixture>
void sessions(Fixture& f, Generator& reference) {
  std::vector<std::vector<int32_t>> ctx(8);
  for (size_t s = 0; s < ctx.size(); ++s) ctx[s] = test::tier_prompt(128, uint32_t(s + 1));
  RequestId id = 0;
  for (int turn = 0; turn < 3; ++turn) {
    std::vector<GenerationRequest> reqs;
    for (size_t s = 0; s < ctx.size(); ++s) {
      if (turn > 0) {
        const auto msg = test::tier_prompt(33, uint32_t(1000 + turn * 10 + s));
        ctx[s].insert(ctx[s].end(), msg.begin() + 1, msg.end());
      }
      reqs.push_back(test::greedy_request(ctx[s], 32));
    }
    const auto want = reference.generate(reqs);
    const RequestId base = id;
    for (const auto& r : reqs) f.add(id++, r);
    f.run();
    for (size_t s = 0; s < ctx.size(); ++s) {
      const auto& rec = f.records[base + s];
      ASSERT_TRUE(rec.finished) << "turn " << turn << " session " << s;
      ASSERT_EQ(rec.finish_reason, "length");
      EXPECT_EQ(rec.ids, want[s].generated_ids) << "turn " << turn << " session " << s;
      ctx[s].insert(ctx[s].end(), rec.ids.begin(), rec.ids.end());
    }
  }
  EXPECT_GT(f.scheduler.counters().preemptions, 0);
}

GeneratorOptions options() {
  GeneratorOptions g;
  g.n_ctx = 288;  // 18 blocks: the last turn is 128 + 2 x 64 + 32 = 288 tokens
  g.block_size = 16;
  g.max_sequences = 4;
  return g;
}

TEST(TierPreemptBatch, PromptChunkNeverPreemptsASequenceInTheBatch) {
  const auto& m = test::stories_model();
  auto reference = test::make_generator(m, options());
  test::SchedulerFixture f(m, options(), SchedulerOptions{}, 36);
  sessions(f, reference);
}

TEST(TierPreemptBatch, SameWithLowerTiers) {
  const auto& m = test::stories_model();
  auto reference = test::make_generator(m, options());
  GeneratorOptions g = options();
  const size_t bb = m.model->kv_shape(16).block_bytes();
  g.kv_tiers = test::tier_options(bb, 16, 64, test::fresh_dir("tier-preempt-batch"));
  test::TierFixture f(m, g, SchedulerOptions{}, 36);
  sessions(f, reference);
  EXPECT_GT(f.offload->metrics().promoted, 0);
}

}  // namespace
}  // namespace fdl
