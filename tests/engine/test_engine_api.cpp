// Engine API: streamed output equals the Generator's, thread-safe submission, abort, drain,
// shutdown, sink failures, logprobs, breakers, validation.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <thread>

#include "engine_api_support.h"
#include "engine_test_support.h"

namespace fdl {
namespace {

using namespace std::chrono_literals;

std::vector<GenerationRequest> some_requests() {
  const auto& tok = *test::stories_model().tokenizer;
  const char* prompts[] = {"Once upon a time", "Lily had a red ball.", "The sun was hot",
                           "Tom and his dog", "One day, a little bird"};
  std::vector<GenerationRequest> reqs;
  for (size_t i = 0; i < std::size(prompts); ++i) {
    const auto ids = encode_prompt(tok, prompts[i]);
    reqs.push_back(i % 2 ? test::sampled_request(ids, 30 + int(i) * 7, 500 + i)
                         : test::greedy_request(ids, 30 + int(i) * 7, /*ignore_eos=*/false));
  }
  reqs[1].stop = {"."};
  return reqs;
}

/// What the Generator (no engine thread) makes of `reqs` on stories260K: the reference the
/// engine's streamed output must equal.
std::vector<GenerationResult> generator_reference(const std::vector<GenerationRequest>& reqs) {
  auto gen = test::make_generator(test::stories_model());
  return gen.generate(reqs);
}

size_t idle_free_blocks(const Engine& e) {
  const auto m = e.metrics();
  return m.kv_blocks_free + m.kv_blocks_cached;
}

TEST(EngineApi, StreamedOutputEqualsTheGenerator) {
  const auto& m = test::stories_model();
  const auto reqs = some_requests();
  const auto want = generator_reference(reqs);

  Engine engine(*m.model, *m.tokenizer);
  test::Collector col;
  for (size_t i = 0; i < reqs.size(); ++i) engine.submit(reqs[i], col.sink(i));
  ASSERT_TRUE(col.wait(reqs.size()));
  for (size_t i = 0; i < reqs.size(); ++i) {
    const auto got = col.get(i);
    SCOPED_TRACE("request " + std::to_string(i));
    EXPECT_EQ(got.ids, want[i].generated_ids);
    EXPECT_EQ(got.text, want[i].text);
    EXPECT_EQ(got.last.finish_reason, want[i].finish_reason);
    EXPECT_EQ(got.last.matched_stop, want[i].matched_stop);
    EXPECT_EQ(got.last.completion_tokens, int32_t(want[i].generated_ids.size()));
    EXPECT_EQ(got.last.prompt_tokens, int32_t(reqs[i].prompt_ids.size()));
    EXPECT_GT(got.last.timings.ttft_ms, 0.0);
    EXPECT_GE(got.last.queue_ms, 0.0);
    // Streaming: more than one delivery for a request of many tokens.
    EXPECT_GT(got.deliveries, 1u);
  }
  const auto metrics = engine.metrics();
  EXPECT_EQ(metrics.running, 0);
  EXPECT_EQ(metrics.waiting, 0);
  EXPECT_EQ(metrics.requests_finished, int64_t(reqs.size()));
  EXPECT_EQ(idle_free_blocks(engine), metrics.kv_blocks_total);
}

TEST(EngineApi, ThirtyTwoConcurrentSubmittersGetTheIdsOfOneAlone) {
  const auto& m = test::stories_model();
  const auto req = test::greedy_request(encode_prompt(*m.tokenizer, "Once upon a time"), 48);
  auto gen = test::make_generator(m);
  const auto alone = gen.generate({req}).at(0).generated_ids;

  EngineOptions opt;
  opt.generator.max_sequences = 8;  // 32 requests: admission and queueing are exercised
  Engine engine(*m.model, *m.tokenizer, opt);
  test::Collector col;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < 32; ++i)
    threads.emplace_back([&, i] { engine.submit(req, col.sink(i)); });
  for (auto& t : threads) t.join();
  ASSERT_TRUE(col.wait(32));
  for (size_t i = 0; i < 32; ++i) EXPECT_EQ(col.get(i).ids, alone) << "stream " << i;
}

TEST(EngineApi, AbortEndsWaitingAndRunningRequestsAndFreesTheirBlocks) {
  const auto& m = test::stories_model();
  EngineOptions opt;
  opt.generator.max_sequences = 2;
  Engine engine(*m.model, *m.tokenizer, opt);
  const size_t total = engine.metrics().kv_blocks_total;
  test::Collector col;
  std::vector<RequestId> ids;
  auto req = test::greedy_request(encode_prompt(*m.tokenizer, "Once upon a time"), -1);
  for (size_t i = 0; i < 6; ++i) ids.push_back(engine.submit(req, col.sink(i)));
  // Wait until the first has streamed something, then abort everything (2 running, 4 waiting).
  for (int i = 0; i < 2000 && col.get(0).ids.empty(); ++i) std::this_thread::sleep_for(1ms);
  for (RequestId id : ids) engine.abort(id);
  ASSERT_TRUE(col.wait(6));
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(col.get(i).last.finish_reason, "abort") << i;
  engine.abort(ids[0]);  // already finished: ignored
  engine.abort(987654);  // unknown: ignored
  const auto metrics = engine.metrics();
  EXPECT_EQ(metrics.running, 0);
  EXPECT_EQ(metrics.waiting, 0);
  EXPECT_EQ(metrics.requests_aborted, 6);
  EXPECT_EQ(idle_free_blocks(engine), total);
}

TEST(EngineApi, DrainWaitsForInFlightRequestsThenRefusesNewOnes) {
  const auto& m = test::stories_model();
  Engine engine(*m.model, *m.tokenizer);
  test::Collector col;
  const auto req = test::greedy_request(encode_prompt(*m.tokenizer, "Once upon a time"), 64);
  for (size_t i = 0; i < 4; ++i) engine.submit(req, col.sink(i));
  engine.drain();
  EXPECT_EQ(col.n_finished(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(col.get(i).last.finish_reason, "length");
  EXPECT_THROW(engine.submit(req, col.sink(9)), std::runtime_error);
}

TEST(EngineApi, DestroyingTheEngineAbortsWhatIsInFlight) {
  const auto& m = test::stories_model();
  test::Collector col;
  {
    EngineOptions opt;
    opt.generator.max_sequences = 1;
    Engine engine(*m.model, *m.tokenizer, opt);
    auto req = test::greedy_request(encode_prompt(*m.tokenizer, "Once upon a time"), -1);
    for (size_t i = 0; i < 3; ++i) engine.submit(req, col.sink(i));
  }
  ASSERT_EQ(col.n_finished(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const auto last = col.get(i).last;
    EXPECT_TRUE(last.finish_reason == "abort" || last.finish_reason == "length") << i;
  }
}

TEST(EngineApi, ASinkThatThrowsAbortsOnlyItsRequest) {
  const auto& m = test::stories_model();
  Engine engine(*m.model, *m.tokenizer);
  const auto req = test::greedy_request(encode_prompt(*m.tokenizer, "Once upon a time"), 40);
  std::atomic<int> calls{0};
  std::atomic<bool> got_final{false};
  std::string final_reason;
  std::mutex mu;
  engine.submit(req, [&](const RequestOutput& out) {
    if (out.finished) {
      std::lock_guard lk(mu);
      final_reason = out.finish_reason;
      got_final = true;
      return;
    }
    if (++calls == 2) throw std::runtime_error("client went away");
  });
  test::Collector col;
  engine.submit(req, col.sink(0));
  ASSERT_TRUE(col.wait(1));
  engine.drain();
  EXPECT_TRUE(got_final);
  EXPECT_EQ(final_reason, "abort");
  EXPECT_EQ(col.get(0).last.finish_reason, "length");
  EXPECT_EQ(col.get(0).ids.size(), 40u);
  EXPECT_EQ(idle_free_blocks(engine), engine.metrics().kv_blocks_total);
}

TEST(EngineApi, LogprobsDescribeTheModelsDistribution) {
  const auto& m = test::stories_model();
  Engine engine(*m.model, *m.tokenizer);
  test::Collector col;
  auto greedy = test::greedy_request(encode_prompt(*m.tokenizer, "Once upon a time"), 20);
  greedy.logprobs = 5;
  auto sampled = test::sampled_request(greedy.prompt_ids, 20, 7);
  sampled.logprobs = 0;
  engine.submit(greedy, col.sink(0));
  engine.submit(sampled, col.sink(1));
  ASSERT_TRUE(col.wait(2));
  for (const auto& t : col.get(0).tokens) {
    ASSERT_EQ(t.top.size(), 5u);
    EXPECT_EQ(t.top[0].id, t.id);  // greedy picks the most likely token
    EXPECT_FLOAT_EQ(t.top[0].logprob, t.logprob);
    double mass = 0;
    for (size_t i = 0; i < t.top.size(); ++i) {
      EXPECT_LE(t.top[i].logprob, 0.f);
      if (i > 0) {
        EXPECT_LE(t.top[i].logprob, t.top[i - 1].logprob);
      }
      mass += std::exp(double(t.top[i].logprob));
    }
    EXPECT_LE(mass, 1.0 + 1e-5);
  }
  for (const auto& t : col.get(1).tokens) {
    EXPECT_TRUE(t.top.empty());
    EXPECT_TRUE(std::isfinite(t.logprob));
    EXPECT_LE(t.logprob, 0.f);
  }
  // Without logprobs asked, none are computed.
  test::Collector plain;
  engine.submit(test::greedy_request(greedy.prompt_ids, 5), plain.sink(0));
  ASSERT_TRUE(plain.wait(1));
  for (const auto& t : plain.get(0).tokens) EXPECT_TRUE(std::isnan(t.logprob));
}

// Logprobs are the model's distribution, not the one sampling draws from: the first token's
// alternatives after the same prompt are the same with greedy decoding and with penalties,
// temperature and truncation (a prompt whose likely next token is in the prompt, so the
// repetition penalty would move it).
TEST(EngineApi, LogprobsDoNotDependOnTheSamplingParameters) {
  const auto& m = test::stories_model();
  Engine engine(*m.model, *m.tokenizer);
  test::Collector col;
  auto plain = test::greedy_request(encode_prompt(*m.tokenizer, "Lily had a red ball. Lily had a red"), 1);
  plain.logprobs = 5;
  auto shaped = test::sampled_request(plain.prompt_ids, 1, 11);
  shaped.logprobs = 5;
  shaped.sampling.temperature = 0.7f;
  shaped.sampling.top_k = 3;
  shaped.sampling.repeat_penalty = 1.5f;
  shaped.sampling.frequency_penalty = 0.5f;
  engine.submit(plain, col.sink(0));
  engine.submit(shaped, col.sink(1));
  ASSERT_TRUE(col.wait(2));
  ASSERT_EQ(col.get(0).tokens.size(), 1u);
  ASSERT_EQ(col.get(1).tokens.size(), 1u);
  const auto a = col.get(0).tokens[0].top;  // get() returns a copy
  const auto b = col.get(1).tokens[0].top;
  ASSERT_EQ(a.size(), 5u);
  ASSERT_EQ(b.size(), 5u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].id, b[i].id) << i;
    EXPECT_FLOAT_EQ(a[i].logprob, b[i].logprob) << i;
  }
  // The reported token's logprob is its entry in the same distribution.
  for (const auto& t : b) {
    if (t.id == col.get(1).tokens[0].id) {
      EXPECT_FLOAT_EQ(t.logprob, col.get(1).tokens[0].logprob);
    }
  }
}

TEST(EngineApi, BreakersTripAndResetByName) {
  const auto& m = test::stories_model();
  EngineOptions opt;
  opt.generator.spec.mode = SpecMode::Lookup;
  Engine engine(*m.model, *m.tokenizer, opt);
  auto find = [&](const std::string& name) {
    for (const auto& b : engine.breakers())
      if (b.name == name) return b;
    ADD_FAILURE() << "no breaker " << name;
    return BreakerState{};
  };
  EXPECT_FALSE(find("speculation").open);
  EXPECT_FALSE(find("disk_offload").open);
  engine.trip_breaker("speculation", "test");
  engine.trip_breaker("disk_offload", "");
  EXPECT_TRUE(find("speculation").open);
  EXPECT_EQ(find("speculation").reason, "manual trip: test");
  EXPECT_TRUE(find("disk_offload").open);
  EXPECT_EQ(find("disk_offload").reason, "manual trip: by an operator");
  EXPECT_EQ(find("disk_offload").trips, 1);
  // Speculation stays off while open: nothing is drafted.
  test::Collector col;
  const auto req = test::greedy_request(
      encode_prompt(*m.tokenizer, "Lily had a red ball. Lily had a red ball. Lily had"), 40);
  engine.submit(req, col.sink(0));
  ASSERT_TRUE(col.wait(1));
  EXPECT_EQ(engine.metrics().spec.drafted, 0);
  engine.reset_breaker("speculation");
  engine.reset_breaker("disk_offload");
  EXPECT_FALSE(find("speculation").open);
  EXPECT_FALSE(find("disk_offload").open);
  engine.submit(req, col.sink(1));
  ASSERT_TRUE(col.wait(2));
  EXPECT_GT(engine.metrics().spec.drafted, 0);
  EXPECT_EQ(col.get(1).ids, col.get(0).ids);
  EXPECT_THROW(engine.trip_breaker("warp_drive", ""), std::invalid_argument);
  EXPECT_THROW(engine.reset_breaker(""), std::invalid_argument);
}

TEST(EngineApi, InvalidRequestsAndOptionsThrowBeforeAnythingIsQueued) {
  const auto& m = test::stories_model();
  Engine engine(*m.model, *m.tokenizer);
  test::Collector col;
  GenerationRequest empty;
  EXPECT_THROW(engine.submit(empty, col.sink(0)), std::invalid_argument);
  auto bad = test::greedy_request({1, 2, 3}, 4);
  bad.logprobs = 21;
  EXPECT_THROW(engine.submit(bad, col.sink(0)), std::invalid_argument);
  bad.logprobs = -1;
  bad.prompt_ids = {1, 100000};
  EXPECT_THROW(engine.submit(bad, col.sink(0)), std::invalid_argument);
  bad.prompt_ids = {1, 2};
  bad.sampling.temperature = -1.f;
  EXPECT_THROW(engine.submit(bad, col.sink(0)), std::invalid_argument);
  EXPECT_EQ(engine.metrics().requests_submitted, 0);

  EngineOptions opt;
  opt.scheduler.max_num_batched_tokens = 4;  // fewer than max_num_seqs (8)
  EXPECT_THROW(Engine(*m.model, *m.tokenizer, opt), std::invalid_argument);
  opt = {};
  opt.generator.n_ctx = 256;
  opt.kv_blocks = 3;  // less than one context of 16 blocks
  EXPECT_THROW(Engine(*m.model, *m.tokenizer, opt), std::invalid_argument);
  opt = {};
  opt.scheduler.short_prompt_tokens = 600;  // above long_prompt_tokens (512)
  EXPECT_THROW(Engine(*m.model, *m.tokenizer, opt), std::invalid_argument);
}

TEST(EngineApi, ZeroMaxTokensFinishesAtOnceWithLength) {
  const auto& m = test::stories_model();
  Engine engine(*m.model, *m.tokenizer);
  test::Collector col;
  engine.submit(test::greedy_request({1, 2, 3}, 0), col.sink(0));
  ASSERT_TRUE(col.wait(1));
  EXPECT_EQ(col.get(0).last.finish_reason, "length");
  EXPECT_TRUE(col.get(0).ids.empty());
  EXPECT_EQ(engine.metrics().steps, 0);
}

TEST(EngineApi, MetricsPolledDuringGenerationAreConsistentAndChangeNothing) {
  // Eight threads poll metrics() while five requests generate: every answer is a consistent
  // between-steps view (counters never go back, running + waiting never exceed what was
  // submitted), answers come during the generation, not only after it, and the streamed ids
  // are the Generator's.
  const auto& m = test::stories_model();
  const auto reqs = some_requests();
  const auto want = generator_reference(reqs);
  Engine engine(*m.model, *m.tokenizer);
  test::Collector col;
  std::atomic<bool> done{false};
  std::atomic<int> seen_running{0}, answers{0};
  std::atomic<int64_t> slowest_us{0};
  std::vector<std::thread> pollers;
  for (int t = 0; t < 8; ++t)
    pollers.emplace_back([&] {
      int64_t last_steps = 0, last_generated = 0;
      while (!done.load()) {
        const auto t0 = std::chrono::steady_clock::now();
        const EngineMetrics mm = engine.metrics();
        const int64_t us =
            std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
        int64_t prev = slowest_us.load();
        while (us > prev && !slowest_us.compare_exchange_weak(prev, us)) {
        }
        EXPECT_GE(mm.steps, last_steps);
        EXPECT_GE(mm.generation_tokens, last_generated);
        EXPECT_LE(mm.running + mm.waiting, int64_t(reqs.size()));
        last_steps = mm.steps;
        last_generated = mm.generation_tokens;
        if (mm.running > 0) seen_running.fetch_add(1);
        answers.fetch_add(1);
      }
    });
  for (size_t i = 0; i < reqs.size(); ++i) engine.submit(reqs[i], col.sink(i));
  ASSERT_TRUE(col.wait(reqs.size()));
  done = true;
  for (auto& p : pollers) p.join();
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(col.get(i).ids, want[i].generated_ids) << "request " << i;
  EXPECT_GT(answers.load(), 8);
  EXPECT_GT(seen_running.load(), 0) << "no answer came while requests ran";
  EXPECT_LT(slowest_us.load(), int64_t(1'000'000 * test::kSlowBuild)) << "a metrics() call waited more than a second";
  const auto final_m = engine.metrics();
  EXPECT_EQ(final_m.requests_finished, int64_t(reqs.size()));
  EXPECT_EQ(final_m.running, 0);
}

TEST(EngineApi, MetricsCountEverySubmittedRequest) {
  // A request submit() has returned is in the inbox (counted as waiting) or in the scheduler
  // (counted as submitted), never in neither: pollers let in between the engine thread taking
  // the inbox and handing it to the scheduler used to miss it.
  const auto& m = test::stories_model();
  test::Collector col;
  Engine engine(*m.model, *m.tokenizer);
  std::atomic<bool> done{false};
  std::atomic<int64_t> api_submitted{0}, misses{0};
  std::vector<std::thread> pollers;
  for (int t = 0; t < 16; ++t)
    pollers.emplace_back([&] {
      while (!done.load()) {
        const int64_t before = api_submitted.load();
        const EngineMetrics mm = engine.metrics();
        if (mm.requests_submitted + mm.waiting < before) misses.fetch_add(1);
      }
    });
  const auto reqs = some_requests();
  const size_t n = 4 * reqs.size();
  for (size_t i = 0; i < n; ++i) {
    engine.submit(reqs[i % reqs.size()], col.sink(i));
    api_submitted.fetch_add(1);
    if (i % 3 == 0) std::this_thread::sleep_for(1ms);
  }
  const bool all_finished = col.wait(n);
  done = true;
  for (auto& p : pollers) p.join();
  ASSERT_TRUE(all_finished);
  EXPECT_EQ(misses.load(), 0) << "metrics() answers that counted a submitted request nowhere";
}

}  // namespace
}  // namespace fdl
