// Ids-only steps (Model::forward_sample): when every row a step reads is one draw — greedy
// or sampled, with or without penalties, but without logprobs, drafts or audits — the
// scheduler asks a model that samples on its device (the CUDA model) for ids instead of
// logits, handing it each row's parameters, its penalty window's tokens and the uniform the
// sequence's own RNG gives next. A CPU model wrapped
// to prefer that stands in for the GPU here (Model's default forward_sample: forward, then
// the host sampler with the given uniform): outputs must equal the plain model's exactly —
// seeded sampling too, so the RNG streams are the ones sample() uses — the ids-only path
// must actually run, and any step with a row that needs logits (logprobs, speculation)
// must take the logits path.
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "device_sampling_model.h"
#include "engine_api_support.h"
#include "engine_test_support.h"
#include "scheduler_fixture.h"

namespace fdl::test {
namespace {

std::vector<std::vector<int32_t>> ids_of(const std::vector<GenerationResult>& rs) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& r : rs) out.push_back(r.generated_ids);
  return out;
}

TEST(GeneratorArgmax, GreedyBatchesUseIdsOnlyAndMatchThePlainModel) {
  for (const LoadedModel* m : {&stories_model(), &codelm_model()}) {
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 6; ++i) {
      std::vector<int32_t> p{1};
      for (int j = 0; j < 5 + 7 * i; ++j) p.push_back(int32_t(3 + (j * 37 + i * 11) % 250));
      reqs.push_back(greedy_request(p, 20 + 3 * i));
    }
    Generator plain = make_generator(*m);
    const auto want = ids_of(plain.generate(reqs));
    ArgmaxPreferringModel wrapped(*m->model);
    Generator g(wrapped, *m->tokenizer, {});
    EXPECT_EQ(ids_of(g.generate(reqs)), want);
    EXPECT_GT(wrapped.ids_steps, 0);
    EXPECT_EQ(wrapped.logit_steps, 0) << "every row of every step was plain greedy";
  }
}

TEST(GeneratorArgmax, SeededSamplingUsesIdsOnlyAndDrawsTheSameTokens) {
  // Every truncation stage, alone and together, in one batch with a greedy row: the ids-only
  // path must draw exactly what the logits path draws from the same seeds.
  const LoadedModel& m = stories_model();
  std::vector<GenerationRequest> reqs{greedy_request({1, 403, 407, 261}, 30)};
  for (int i = 0; i < 5; ++i) {
    GenerationRequest r = sampled_request({1, 403, int32_t(300 + 7 * i)}, 30, uint64_t(11 + i));
    r.sampling.temperature = 0.7f + 0.2f * float(i);
    r.sampling.top_k = 0;  // temperature only, unless set below
    r.sampling.top_p = 1.0f;
    if (i == 1) r.sampling.top_k = 12;
    if (i == 2) r.sampling.top_p = 0.8f;
    if (i == 3) r.sampling.min_p = 0.05f;
    if (i == 4) r.sampling.top_k = 40, r.sampling.top_p = 0.9f, r.sampling.min_p = 0.02f;
    reqs.push_back(r);
  }
  // Penalties go along as the window's tokens: a sampled and a greedy row with each kind.
  GenerationRequest pen = sampled_request({1, 77, 30}, 30, 5);
  pen.sampling.repeat_penalty = 1.3f;
  pen.sampling.frequency_penalty = 0.4f;
  reqs.push_back(pen);
  GenerationRequest gpen = greedy_request({1, 403, 407, 261, 403}, 30);
  gpen.sampling.presence_penalty = 2.0f;
  gpen.sampling.repeat_penalty = 1.5f;
  gpen.sampling.repeat_last_n = 16;
  reqs.push_back(gpen);
  Generator plain = make_generator(m);
  const auto want = ids_of(plain.generate(reqs));
  ArgmaxPreferringModel wrapped(*m.model);
  Generator g(wrapped, *m.tokenizer, {});
  EXPECT_EQ(ids_of(g.generate(reqs)), want);
  EXPECT_GT(wrapped.ids_steps, 0);
  EXPECT_GT(wrapped.sampled_rows, 0);
  EXPECT_GT(wrapped.penalty_tokens, 0);
  EXPECT_EQ(wrapped.logit_steps, 0) << "no row needed logits on the host";
  // The penalties changed the output (or this test would not see them go wrong).
  GenerationRequest no_pen = reqs.back();
  no_pen.sampling.presence_penalty = 0.0f;
  no_pen.sampling.repeat_penalty = 1.0f;
  EXPECT_NE(plain.generate({no_pen}).at(0).generated_ids, want.back());
}

TEST(GeneratorArgmax, StepsWithRowsThatNeedLogitsTakeTheLogitsPath) {
  const LoadedModel& m = stories_model();
  std::vector<GenerationRequest> reqs{greedy_request({1, 403, 407, 261}, 24)};
  GenerationRequest lp = greedy_request({1, 42, 43}, 24);
  lp.logprobs = 2;
  Generator plain = make_generator(m);
  ArgmaxPreferringModel wrapped(*m.model);
  Generator g(wrapped, *m.tokenizer, {});
  for (const auto& extra : {lp}) {
    const std::vector<GenerationRequest> batch{reqs[0], extra};
    const auto want = plain.generate(batch);
    wrapped.logit_steps = wrapped.ids_steps = 0;
    const auto got = g.generate(batch);
    EXPECT_EQ(ids_of(got), ids_of(want));
    EXPECT_GT(wrapped.logit_steps, 0);
  }
  // Speculation reads logits for verification: never ids-only.
  GeneratorOptions spec;
  spec.spec.mode = SpecMode::Lookup;
  Generator gs(wrapped, *m.tokenizer, spec);
  wrapped.logit_steps = wrapped.ids_steps = 0;
  const std::vector<GenerationRequest> one{reqs[0]};
  EXPECT_EQ(ids_of(gs.generate(one)), ids_of(plain.generate(one)));
  EXPECT_EQ(wrapped.ids_steps, 0);
}

TEST(GeneratorArgmax, ForwardSampleNeedsOneRowPerWantedToken) {
  const LoadedModel& m = stories_model();
  BlockPool pool(m.model->kv_shape(16), 8);
  KvCache kv(pool);
  const SeqId seq = kv.create_sequence();
  StepBatch b;
  const size_t first = kv.append_slots(seq, 2);
  b.add(1, int32_t(first), seq, false);
  b.add(403, int32_t(first + 1), seq, true);
  std::vector<int32_t> ids;
  const std::vector<RowSampling> none, two(2);
  const std::vector<PenaltyToken> no_pen;
  EXPECT_THROW(m.model->forward_sample(b, kv, none, no_pen, ids), std::invalid_argument);
  EXPECT_THROW(m.model->forward_sample(b, kv, two, no_pen, ids), std::invalid_argument);
  RowSampling bad;
  bad.temperature = 1.0f;
  bad.top_p = 0.0f;  // outside (0, 1]: the sampler's own check
  EXPECT_THROW(m.model->forward_sample(b, kv, std::vector<RowSampling>{bad}, no_pen, ids), std::invalid_argument);
  const std::vector<RowSampling> one(1);  // greedy
  for (const PenaltyToken p : {PenaltyToken{1, 5, 1}, PenaltyToken{0, -1, 1}, PenaltyToken{0, 512, 1},
                               PenaltyToken{0, 5, 0}})
    EXPECT_THROW(m.model->forward_sample(b, kv, one, std::vector<PenaltyToken>{p}, ids), std::invalid_argument)
        << p.row << " " << p.token << " " << p.count;
  // A token listed twice for one row (its count says how often it occurs).
  EXPECT_THROW(m.model->forward_sample(b, kv, one, std::vector<PenaltyToken>{{0, 5, 1}, {0, 7, 2}, {0, 5, 3}}, ids),
               std::invalid_argument);
  // Grammar masks: a row outside the step, a mask index past the given masks, words that are
  // not whole masks, indices that do not pair with rows, a row masked twice.
  const size_t wpr = TokenMasks::words_per_row(m.model->config().n_vocab);
  const std::vector<uint64_t> words(wpr, ~uint64_t(0));
  const std::vector<uint64_t> ragged(wpr + 1, ~uint64_t(0));
  const std::vector<int32_t> row0{0}, row1{1}, rows00{0, 0}, which0{0}, which1{1}, which00{0, 0};
  for (const TokenMasks& bad_masks : {TokenMasks{row1, which0, words}, TokenMasks{row0, which1, words},
                                      TokenMasks{row0, which0, ragged}, TokenMasks{row0, which00, words},
                                      TokenMasks{rows00, which00, words}})
    EXPECT_THROW(m.model->forward_sample(b, kv, one, no_pen, ids, bad_masks), std::invalid_argument);
  // A mask allowing one token draws it, whatever the logits say.
  std::vector<uint64_t> only(wpr, 0);
  only[7 / 64] = uint64_t(1) << (7 % 64);
  m.model->forward_sample(b, kv, one, no_pen, ids, TokenMasks{row0, which0, only});
  EXPECT_EQ(ids, std::vector<int32_t>{7});
  m.model->forward_sample(b, kv, one, no_pen, ids);
  std::vector<int32_t> want;
  m.model->forward_argmax(b, kv, want);  // the same step again: same slots, same logits
  EXPECT_EQ(ids, want);
}

// Runs `reqs` two sequences at a time (so prompts complete in steps where others decode) on
// the plain model and on the ids-only wrapper; expects the same ids, every request run to
// its length, and no logits step. Returns the wrapper's counters.
struct IdsPathCounts {
  int ids_steps = 0, penalty_tokens = 0;
};
IdsPathCounts expect_two_at_a_time_like_the_logits_path(const LoadedModel& m,
                                                        const std::vector<GenerationRequest>& reqs) {
  GeneratorOptions o;
  o.max_sequences = 2;
  Generator plain(*m.model, *m.tokenizer, o);
  const auto want = ids_of(plain.generate(reqs));
  ArgmaxPreferringModel wrapped(*m.model);
  Generator g(wrapped, *m.tokenizer, o);
  EXPECT_EQ(ids_of(g.generate(reqs)), want);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(int(want[i].size()), reqs[i].max_new_tokens) << "request " << i;
  EXPECT_EQ(wrapped.logit_steps, 0);
  return {wrapped.ids_steps, wrapped.penalty_tokens};
}

TEST(GeneratorArgmax, StepsMixingDecodesAndCompletingPromptsKeepTheRowOrder) {
  // At most two sequences: later requests' prompts complete in steps where others decode, so
  // a step's rows are decode rows and then prompt rows; each must get its own sequence's
  // parameters and uniform (a fresh-eyes review swapped them and the other tests still passed).
  const LoadedModel& m = stories_model();
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r = sampled_request({1, 403, int32_t(300 + 7 * i)}, 10 + 7 * i, uint64_t(11 + i));
    r.sampling.top_k = 0;
    r.sampling.top_p = 1.0f;
    r.sampling.temperature = 0.7f + 0.2f * float(i);
    reqs.push_back(r);
  }
  EXPECT_GT(expect_two_at_a_time_like_the_logits_path(m, reqs).ids_steps, 0);
}

TEST(GeneratorArgmax, PenaltyWindowsOfEveryKindMatchTheLogitsPath) {
  // The whole context (-1), off (0) with penalties set, a window sliding under a greedy row,
  // and extreme but valid penalties that saturate (a fresh-eyes review: before saturation a
  // repetition penalty of 1e-38 overflowed to +Inf on the ids path and failed every request
  // of the batch), mixed with a plain request, two sequences at a time.
  const LoadedModel& m = stories_model();
  std::vector<GenerationRequest> reqs{greedy_request({1, 403, 407, 261}, 24)};
  GenerationRequest whole = sampled_request({1, 77, 30, 77}, 24, 3);
  whole.sampling.repeat_last_n = -1, whole.sampling.frequency_penalty = 0.6f;
  GenerationRequest off = sampled_request({1, 77, 30, 77}, 24, 4);
  off.sampling.repeat_last_n = 0, off.sampling.repeat_penalty = 2.0f;
  GenerationRequest sliding = greedy_request({1, 403, 407, 261, 403, 407}, 24);
  sliding.sampling.repeat_last_n = 3, sliding.sampling.repeat_penalty = 1.8f;
  GenerationRequest extreme = sampled_request({1, 77, 30, 77, 30}, 24, 6);
  extreme.sampling.repeat_penalty = 1e-38f;
  reqs.insert(reqs.end(), {whole, off, sliding, extreme});
  EXPECT_GT(expect_two_at_a_time_like_the_logits_path(m, reqs).penalty_tokens, 0);
}

// Async scheduling (SchedulerOptions::async_scheduling): with a model that samples on its
// device, steps of decodes only are submitted before the previous step's ids are processed
// (their tokens previous_step_id). The results must be those of the synchronous loop —
// greedy and seeded sampling, requests ending by length at different steps, by a stop
// string (so a sequence ends while its next row is in flight) and with more requests than
// sequences (so the pipeline drains for admissions) — and the pipeline must actually run.
TEST(AsyncScheduling, SameResultsAsTheSynchronousLoop) {
  const LoadedModel& m = stories_model();
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p{1};
    for (int j = 0; j < 3 + 5 * i; ++j) p.push_back(int32_t(3 + (j * 41 + i * 13) % 250));
    reqs.push_back(i % 2 ? sampled_request(p, 18 + 5 * i, uint64_t(7 + i)) : greedy_request(p, 18 + 5 * i));
  }
  GeneratorOptions sync_opt;
  sync_opt.max_sequences = 4;
  sync_opt.async_scheduling = false;
  ArgmaxPreferringModel wrapped(*m.model);
  Generator sync(wrapped, *m.tokenizer, sync_opt);
  // A stop string that ends request 0 mid-way: a piece of its own text.
  const auto first = sync.generate({reqs[0]}).at(0);
  ASSERT_GT(first.text.size(), 20u);
  reqs[0].stop = {first.text.substr(first.text.size() / 2, 6)};
  wrapped.submits = 0;
  const auto want = sync.generate(reqs);
  EXPECT_EQ(wrapped.submits, 0);
  EXPECT_EQ(want[0].finish_reason, "stop");
  GeneratorOptions async_opt = sync_opt;
  async_opt.async_scheduling = true;
  Generator async(wrapped, *m.tokenizer, async_opt);
  const auto got = async.generate(reqs);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].generated_ids, want[i].generated_ids) << i;
    EXPECT_EQ(got[i].text, want[i].text) << i;
    EXPECT_EQ(got[i].finish_reason, want[i].finish_reason) << i;
  }
  EXPECT_GT(wrapped.submits, 0);
  EXPECT_GT(wrapped.chained_tokens, 0) << "no step was queued before the previous one's ids were back";
}

// Requests that wait for a free sequence slot (all --max-num-seqs running) do not stop the
// pipeline: each of three requests run one at a time decodes mostly through chained steps,
// and the outputs are the synchronous loop's.
TEST(AsyncScheduling, RequestsWaitingForASlotDoNotStopThePipeline) {
  const LoadedModel& m = stories_model();
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 3; ++i) reqs.push_back(greedy_request({1, int32_t(403 + i), 407, 261}, 30));
  GeneratorOptions o;
  o.max_sequences = 1;
  o.async_scheduling = false;
  ArgmaxPreferringModel wrapped(*m.model);
  Generator sync(wrapped, *m.tokenizer, o);
  const auto want = ids_of(sync.generate(reqs));
  o.async_scheduling = true;
  Generator async(wrapped, *m.tokenizer, o);
  wrapped.chained_tokens = 0;
  EXPECT_EQ(ids_of(async.generate(reqs)), want);
  // 29 decode steps per request; a request's first submitted step and the steps around its
  // end are not chained: well over two requests' worth means the waiting ones did not stop it.
  EXPECT_GT(wrapped.chained_tokens, 2 * 29);
}

// Aborting requests while a step is in flight: the pipeline drains first, the aborted
// requests end with "abort", the others with their synchronous tokens, and the pool gets
// every block back.
TEST(AsyncScheduling, AbortWhileAStepIsInFlight) {
  using namespace std::chrono_literals;
  const LoadedModel& m = stories_model();
  const GenerationRequest req = greedy_request({1, 403, 407, 261}, 200);
  GeneratorOptions sync_opt;
  sync_opt.async_scheduling = false;
  Generator plain(*m.model, *m.tokenizer, sync_opt);
  const auto want = plain.generate({req}).at(0).generated_ids;
  ArgmaxPreferringModel wrapped(*m.model);
  EngineOptions opt;
  opt.generator.max_sequences = 4;
  Engine engine(wrapped, *m.tokenizer, opt);
  Collector col;
  std::vector<RequestId> ids;
  for (size_t i = 0; i < 4; ++i) ids.push_back(engine.submit(req, col.sink(i)));
  for (int i = 0; i < 4000 && col.get(0).ids.size() < 20; ++i) std::this_thread::sleep_for(1ms);
  engine.abort(ids[1]);
  engine.abort(ids[3]);
  ASSERT_TRUE(col.wait(4));
  EXPECT_EQ(col.get(1).last.finish_reason, "abort");
  EXPECT_EQ(col.get(3).last.finish_reason, "abort");
  for (size_t i : {size_t(0), size_t(2)}) {
    EXPECT_EQ(col.get(i).last.finish_reason, "length") << i;
    EXPECT_EQ(col.get(i).ids, want) << i;
  }
  const auto metrics = engine.metrics();
  EXPECT_EQ(metrics.kv_blocks_free + metrics.kv_blocks_cached, metrics.kv_blocks_total);
  EXPECT_GT(wrapped.chained_tokens, 0);
}

// An abort drains the pipeline; when the step in flight fails there (a NaN row, a device
// error), its sequences cannot go on (their KV holds a slot whose token they never got): they
// end with "error" and the message, as a failed step ends what it ran in the synchronous
// loop, instead of continuing from a shifted cache (found by a review).
TEST(AsyncScheduling, AFailedStepFoundByAnAbortEndsItsSequencesWithTheError) {
  const LoadedModel& m = codelm_model();
  ArgmaxPreferringModel wrapped(*m.model);
  SchedulerFixture f(wrapped, *m.tokenizer, {}, {});
  f.add(0, greedy_request({1, 403, 407, 261, 990, 2020, 17, 5000}, 40));
  f.add(1, greedy_request({1, 300, 301, 302, 77, 88}, 40));
  for (int i = 0; i < 10 && wrapped.submitted_steps() == 0; ++i) f.scheduler.step();
  for (int i = 0; i < 3; ++i) f.scheduler.step();
  ASSERT_EQ(wrapped.submitted_steps(), 1u) << "a step is in flight";
  wrapped.fail_next_collect = true;
  // Both sequences ran in the failed step: both end with its error, the aborted one too (it
  // had ended before the abort applied, so abort() finds nothing left to abort).
  EXPECT_FALSE(f.scheduler.abort(1));
  EXPECT_FALSE(wrapped.fail_next_collect);
  f.run();
  for (RequestId id : {RequestId(0), RequestId(1)}) {
    EXPECT_EQ(f.records[id].finish_reason, "error") << id;
    EXPECT_TRUE(f.records[id].finished) << id;
  }
  EXPECT_EQ(wrapped.submitted_steps(), 0u);
  f.scheduler.clear_prefix_cache();
  EXPECT_EQ(f.pool.n_free(), f.pool.capacity());
}

// A sequence that ends with an error leaves nothing in the prefix cache: a prefill step that
// failed its checks wrote no KV into the blocks it had reserved, and those must not serve the
// same prompt afterwards (the engine ends everything with the error, as fail_all does here).
TEST(AsyncScheduling, ASequenceEndedByAnErrorIsNotCached) {
  const LoadedModel& m = codelm_model();
  ArgmaxPreferringModel wrapped(*m.model);
  SchedulerFixture f(wrapped, *m.tokenizer, {}, {});
  std::vector<int32_t> prompt{1};
  for (int i = 0; i < 47; ++i) prompt.push_back(int32_t(300 + (i * 37) % 900));  // three blocks
  f.add(0, greedy_request(prompt, 40));
  wrapped.fail_next_forward = true;
  EXPECT_THROW(f.scheduler.step(), std::runtime_error);  // the prompt's prefill
  f.scheduler.fail_all("error", "forward: injected failure");
  ASSERT_EQ(f.records[0].finish_reason, "error");
  f.add(1, greedy_request(prompt, 4));
  f.run();
  EXPECT_EQ(f.records[1].finish_reason, "length");
  EXPECT_EQ(f.records[1].cached_prompt_tokens, 0);
  // A sequence that ends normally is cached, as before.
  f.add(2, greedy_request(prompt, 4));
  f.run();
  EXPECT_GE(f.records[2].cached_prompt_tokens, 32);
}

}  // namespace
}  // namespace fdl::test
