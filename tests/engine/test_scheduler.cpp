// Scheduler policy, step by step: prefix sharing (hits, scopes, identical outputs), preemption
// under a small KV pool (recompute, identical outputs), length buckets and anti-starvation.
#include <gtest/gtest.h>

#include <random>

#include "engine/prefix_cache.h"
#include "scheduler_fixture.h"

namespace fdl {
namespace {

// Prompts of random ids (BOS first): scheduling does not care what the words are, and random
// ids make every block's hash distinct.
std::vector<int32_t> random_prompt(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(3, 511);
  std::vector<int32_t> p{1};
  while (p.size() < n) p.push_back(id(rng));
  return p;
}

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin() + 1, b.end());  // b's BOS dropped
  return a;
}

GeneratorOptions small_context() {
  GeneratorOptions g;
  g.n_ctx = 512;
  g.block_size = 16;
  g.max_sequences = 8;
  return g;
}

TEST(SchedulerPrefixCache, SharedSystemPromptIsComputedOnceAndOutputsDoNotChange) {
  const auto& m = test::stories_model();
  const auto system = random_prompt(200, 1);
  std::vector<GenerationRequest> reqs;
  for (uint32_t i = 0; i < 6; ++i)
    reqs.push_back(i % 2 ? test::sampled_request(concat(system, random_prompt(11, 100 + i)), 20, i)
                         : test::greedy_request(concat(system, random_prompt(11, 100 + i)), 20));
  ASSERT_EQ(reqs[0].prompt_ids.size(), 210u);

  SchedulerOptions off;
  off.prefix_cache = false;
  test::SchedulerFixture plain(m, small_context(), off);
  for (size_t i = 0; i < reqs.size(); ++i) plain.add(i, reqs[i]);
  plain.run();
  EXPECT_EQ(plain.scheduler.counters().prefill_computed, 6 * 210);

  test::SchedulerFixture shared(m, small_context(), SchedulerOptions{});
  shared.add(0, reqs[0]);
  shared.run();  // the first request fills the cache
  for (size_t i = 1; i < reqs.size(); ++i) shared.add(i, reqs[i]);
  shared.run();
  // Block 12 (tokens 192..207) already holds suffix tokens, so 12 whole blocks are shared.
  const int64_t shared_tokens = 12 * 16;
  const auto& c = shared.scheduler.counters();
  EXPECT_EQ(c.prefill_computed, 210 + 5 * (210 - shared_tokens));
  EXPECT_EQ(c.prefix_hits, 5 * shared_tokens);
  EXPECT_EQ(c.prefix_queries, 6 * 210);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(shared.records[i].ids, plain.records[i].ids) << "request " << i;
    EXPECT_EQ(shared.records[i].cached_prompt_tokens, i == 0 ? 0 : shared_tokens);
  }
  // Shared blocks are referenced, never copied.
  EXPECT_EQ(shared.kv.blocks_copied(), 0u);
  shared.scheduler.clear_prefix_cache();
  EXPECT_EQ(shared.pool.n_free(), shared.pool.capacity());
}

TEST(SchedulerPrefixCache, ScopesNeverShareBlocks) {
  const auto& m = test::stories_model();
  const auto prompt = random_prompt(100, 2);
  test::SchedulerFixture f(m, small_context(), SchedulerOptions{});
  auto a = test::greedy_request(prompt, 8);
  a.cache_scope = "tenant-a";
  auto b = a;
  b.cache_scope = "tenant-b";
  f.add(0, a);
  f.run();
  f.add(1, b);
  f.run();
  EXPECT_EQ(f.scheduler.counters().prefix_hits, 0);
  EXPECT_EQ(f.records[1].ids, f.records[0].ids);
  f.add(2, a);  // same scope again: a hit
  f.run();
  EXPECT_EQ(f.records[2].cached_prompt_tokens, 96);
  EXPECT_EQ(f.records[2].ids, f.records[0].ids);
}

TEST(SchedulerPrefixCache, CacheUnitLookupInsertEvict) {
  const auto& m = test::stories_model();
  BlockPool pool(m.model->kv_shape(4), 8);
  KvCache kv(pool);
  engine::PrefixCache cache(pool, 4);
  const std::vector<int32_t> tokens{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const SeqId s = kv.create_sequence();
  kv.append_slots(s, tokens.size());
  cache.insert("", tokens, kv.block_table(s));
  EXPECT_EQ(cache.size(), 2u);  // two full blocks; the partial third is not cached
  EXPECT_EQ(cache.n_evictable(), 0u);  // the sequence still holds them
  EXPECT_EQ(cache.match_blocks("", tokens, 10), 2u);
  EXPECT_EQ(cache.match_blocks("", tokens, 1), 1u);
  EXPECT_EQ(cache.match_blocks("other", tokens, 10), 0u);
  auto changed = tokens;
  changed[5] = 99;  // second block differs: only the first matches
  EXPECT_EQ(cache.match_blocks("", changed, 10), 1u);
  changed[0] = 98;  // first block differs: the chain breaks at once
  EXPECT_EQ(cache.match_blocks("", changed, 10), 0u);
  kv.free_sequence(s);
  EXPECT_EQ(pool.n_free(), 6u);  // the cache keeps two blocks alive
  EXPECT_EQ(cache.n_evictable(), 2u);
  EXPECT_EQ(cache.evict(1), 1u);  // the deeper block goes first: no hole in the chain
  EXPECT_EQ(cache.match_blocks("", tokens, 10), 1u);
  EXPECT_EQ(cache.evict(5), 1u);
  EXPECT_EQ(pool.n_free(), 8u);
  EXPECT_EQ(cache.size(), 0u);
}

TEST(SchedulerPreemption, ASmallPoolPreemptsAndRecomputesWithoutChangingOutputs) {
  const auto& m = test::stories_model();
  GeneratorOptions g;
  g.n_ctx = 128;
  g.block_size = 16;
  g.max_sequences = 4;
  std::vector<GenerationRequest> reqs;
  for (uint32_t i = 0; i < 6; ++i)
    reqs.push_back(i % 2 ? test::sampled_request(random_prompt(20 + i, 10 + i), 90, 40 + i)
                         : test::greedy_request(random_prompt(20 + i, 10 + i), 90));
  auto gen = test::make_generator(m, g);
  const auto want = gen.generate(reqs);
  for (bool prefix : {false, true}) {
    SCOPED_TRACE(prefix ? "prefix cache on" : "prefix cache off");
    SchedulerOptions s;
    s.prefix_cache = prefix;
    // One full context (8 blocks) for four sequences of up to 8 blocks each.
    test::SchedulerFixture f(m, g, s, /*kv_blocks=*/8);
    for (size_t i = 0; i < reqs.size(); ++i) f.add(i, reqs[i]);
    f.run();
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(f.records[i].ids, want[i].generated_ids) << "request " << i;
      EXPECT_EQ(f.records[i].finish_reason, "length");
    }
    EXPECT_GT(f.scheduler.counters().preemptions, 0);
    if (!prefix) {
      EXPECT_GT(f.scheduler.counters().recomputed, 0);
    }
    f.scheduler.clear_prefix_cache();
    EXPECT_EQ(f.pool.n_free(), f.pool.capacity());
  }
}

TEST(SchedulerAdmission, NeverRunsMoreThanMaxSequencesEvenWhenAllArriveTogether) {
  // Found by a fresh-eyes test: requests admitted in one step were not counted until the
  // end of the admission loop, so 16 ran at once with max_sequences 2 (and then preempted
  // each other, the pool being sized for 2).
  const auto& m = test::stories_model();
  GeneratorOptions g = small_context();
  g.max_sequences = 2;
  test::SchedulerFixture f(m, g, SchedulerOptions{});
  for (uint32_t i = 0; i < 16; ++i) f.add(i, test::greedy_request(random_prompt(8, 30 + i), 20));
  while (f.scheduler.has_work()) {
    f.scheduler.step();
    ASSERT_LE(f.scheduler.n_running(), 2u);
  }
  EXPECT_EQ(f.scheduler.counters().preemptions, 0);
  for (uint32_t i = 0; i < 16; ++i) EXPECT_EQ(f.records[i].ids.size(), 20u);
}

TEST(SchedulerBuckets, ShortPromptsOvertakeALongOneOnlyWithBuckets) {
  const auto& m = test::stories_model();
  GeneratorOptions g = small_context();
  g.n_ctx = 1024;
  auto run = [&](bool buckets) {
    SchedulerOptions s;
    s.length_buckets = buckets;
    s.prefix_cache = false;
    test::SchedulerFixture f(m, g, s);
    f.add(0, test::greedy_request(random_prompt(700, 5), 4));  // long, and first in line
    for (uint32_t i = 1; i <= 4; ++i) f.add(i, test::greedy_request(random_prompt(20, 5 + i), 4));
    f.run();
    return f.records;
  };
  const auto with = run(true);
  const auto fcfs = run(false);
  for (RequestId i = 1; i <= 4; ++i) {
    // Buckets: the shorts are prefilled in the first step, beside a 256-token chunk of the
    // long prompt; FCFS: the long prompt takes the first step's whole budget.
    EXPECT_EQ(with.at(i).first_token_step, 1) << i;
    EXPECT_LT(with.at(i).first_token_step, with.at(0).first_token_step) << i;
    EXPECT_GE(fcfs.at(i).first_token_step, fcfs.at(0).first_token_step) << i;
  }
  EXPECT_EQ(with.at(0).first_token_step, 3);  // 700 tokens in 256-token chunks
  EXPECT_EQ(fcfs.at(0).first_token_step, 2);  // 512 + 188
  for (RequestId i = 0; i <= 4; ++i) EXPECT_EQ(with.at(i).ids, fcfs.at(i).ids) << i;
}

TEST(SchedulerBuckets, OneLongPromptAtATimeUnlessAnotherHasWaitedTooLong) {
  const auto& m = test::stories_model();
  GeneratorOptions g = small_context();
  g.n_ctx = 1024;
  auto second_long_first_token = [&](int max_wait) {
    SchedulerOptions s;
    s.prefix_cache = false;
    s.max_wait_steps = max_wait;
    test::SchedulerFixture f(m, g, s);
    f.add(0, test::greedy_request(random_prompt(700, 7), 2));
    f.add(1, test::greedy_request(random_prompt(700, 8), 2));
    f.run();
    EXPECT_EQ(f.records.at(0).first_token_step, 3);
    return f.records.at(1).first_token_step;
  };
  EXPECT_EQ(second_long_first_token(1000), 6);  // isolated: starts after the first is done
  EXPECT_LT(second_long_first_token(1), 6);     // starved: admitted beside the first
}

}  // namespace
}  // namespace fdl
