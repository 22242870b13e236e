// Fingerprint audit with a plain shadow, the breaker, its manual reset, and rollback
// returning every block to the pool.
#include "spec_test_support.h"

namespace fdl {
namespace {

GenerationRequest lily_request(int n) {
  return test::greedy_request(
      encode_prompt(*test::stories_model().tokenizer,
                    "Lily had a red ball. Lily had a red ball. Lily had a red ball. Lily had"),
      n);
}

GeneratorOptions audited(double fraction) {
  auto o = test::spec_options(SpecMode::Auto, 5);
  o.spec.audit_fraction = fraction;
  o.spec.breaker_threshold = 0.05;
  // Judge throughput only over a window longer than these runs: this test is about audits.
  o.spec.breaker_window = 100000;
  return o;
}

TEST(SpecAuditBreaker, HonestSpeculationPassesEveryAudit) {
  auto gen = test::make_generator(test::stories_model(), audited(1.0));
  auto plain = test::make_generator(test::stories_model());
  const std::vector<GenerationRequest> reqs(3, lily_request(96));
  test::expect_same_results(gen.generate(reqs), plain.generate(reqs));
  const SpecMetrics& m = gen.spec_metrics();
  EXPECT_GT(m.audited_steps, 0);
  EXPECT_EQ(m.audit_mismatches, 0);
  EXPECT_FALSE(m.breaker_open);
  test::expect_pool_full(gen);  // shadows are freed with their sequences
}

TEST(SpecAuditBreaker, ForcedMismatchTripsTheBreakerAndResetRestoresSpeculation) {
  auto gen = test::make_generator(test::stories_model(), audited(1.0));
  auto plain = test::make_generator(test::stories_model());
  const auto want = plain.generate({lily_request(96)});
  gen.force_audit_mismatches(1);
  // Output stays exact while the breaker opens: it only turns speculation off.
  test::expect_same_results(gen.generate({lily_request(96)}), want);
  SpecMetrics m = gen.spec_metrics();
  EXPECT_EQ(m.audit_mismatches, 1);
  EXPECT_TRUE(m.breaker_open);
  EXPECT_EQ(m.breaker_trips, 1);
  EXPECT_NE(m.breaker_reason.find("audit mismatch"), std::string::npos);
  test::expect_pool_full(gen);

  // Open: no drafts at all.
  const int64_t drafted = m.drafted;
  test::expect_same_results(gen.generate({lily_request(96)}), want);
  EXPECT_EQ(gen.spec_metrics().drafted, drafted);

  gen.reset_spec_breaker();
  EXPECT_FALSE(gen.spec_metrics().breaker_open);
  test::expect_same_results(gen.generate({lily_request(96)}), want);
  m = gen.spec_metrics();
  EXPECT_GT(m.drafted, drafted);
  EXPECT_FALSE(m.breaker_open);
  EXPECT_EQ(m.breaker_trips, 1);
  test::expect_pool_full(gen);
}

TEST(SpecAuditBreaker, SlowSpeculationTripsTheBreaker) {
  // Window 8 with drafts that are almost always wrong (a 1-gram lookahead pool on free
  // text) costs up to 9 tokens per emitted one: far below plain throughput.
  auto o = test::spec_options(SpecMode::Lookahead, 8);
  o.spec.breaker_threshold = 0.05;
  o.spec.breaker_window = 16;
  auto gen = test::make_generator(test::stories_model(), o);
  auto r = test::greedy_request(encode_prompt(*test::stories_model().tokenizer, "One day"), 200);
  r.sampling.temperature = 1.0f;  // free text: drafts rarely match
  r.sampling.seed = 3;
  gen.generate({r});
  const SpecMetrics& m = gen.spec_metrics();
  EXPECT_TRUE(m.breaker_open);
  EXPECT_NE(m.breaker_reason.find("plain throughput"), std::string::npos);
  test::expect_pool_full(gen);
}

TEST(SpecAuditBreaker, RollbackReturnsEveryBlockOnEveryStep) {
  // Block size 1: every rejected draft token is a whole block, so a leak would show at once.
  auto o = test::spec_options(SpecMode::Auto, 8);
  o.block_size = 1;
  o.n_ctx = 256;
  auto gen = test::make_generator(test::stories_model(), o);
  const size_t before = gen.block_pool().n_free();
  const auto res = gen.generate({lily_request(150), lily_request(40)});
  EXPECT_EQ(gen.block_pool().n_free(), before);
  EXPECT_GT(gen.spec_metrics().rejected, 0);
  EXPECT_EQ(res[0].generated_ids.size(), 150u);
}

}  // namespace
}  // namespace fdl
